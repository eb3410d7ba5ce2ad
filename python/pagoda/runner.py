"""Runner: one libpagoda engine (its own thread, continuous batching) driven from Python.

Every public method may be called from any Python thread; requests from several threads (or
asyncio tasks) are batched together by the engine. The engine thread runs in C without the GIL,
and ctypes releases the GIL around every blocking call.
"""
from __future__ import annotations

import asyncio
import ctypes
import json
import os
import random
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import (Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Tuple, Union)

from . import _ffi
from .errors import EngineClosedError, ModelLoadError, raise_status
from .types import (ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, Choice,
                    ChoiceLogprobs, ChunkChoice, CompletionChoice, CompletionLogprobs,
                    CompletionOutput, CompletionRequest, CompletionResponse, Delta, FunctionCall,
                    PagedCacheType, PromptTokensDetails, RequestOutput, ResponseMessage,
                    SamplingParams, Stats, TokenLogprob, ToolCall, TopLogprob, Usage, Which)

_FINISH = {_ffi.FINISH_NONE: None, _ffi.FINISH_STOP: "stop", _ffi.FINISH_LENGTH: "length",
           _ffi.FINISH_ABORT: "abort"}
_CACHE_TYPES = {"auto": 0, "f8e4m3": 1, "fp8": 1, "f32": 2, "f16": 3, "bf16": 4}
_PAGED = {"auto": 0, "on": 1, "off": 2, True: 1, False: 2}
_ISQ = ("q4_0", "q4_k", "q5_k", "q6_k", "q8_0", "4", "8")  # --isq values (docs/model-formats.md)
_TEXT_OFFSET = _ffi.Event.text.offset
_POLL_MS = 200  # stream_next timeout: lets Ctrl-C and Runner.close() through


def _check_int(name: str, v: Any, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name}: expected an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
        raise ValueError(f"{name}: must be {rng}, got {v}")
    return v


def _check_float(name: str, v: Any, lo: Optional[float] = None, hi: Optional[float] = None,
                 lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name}: expected a number, got {v!r}")
    f = float(v)
    if f != f or (lo is not None and (f < lo or (lo_open and f == lo))) or (hi is not None and f > hi):
        lo_s = "" if lo is None else (f"> {lo}" if lo_open else f">= {lo}")
        hi_s = "" if hi is None else f"<= {hi}"
        raise ValueError(f"{name}: must be {' and '.join(s for s in (lo_s, hi_s) if s)}, got {v}")
    return f


class _CSampling:
    """A C pagoda_sampling_params built from SamplingParams, with the arrays it points to."""

    def __init__(self, sp: SamplingParams, seed: int) -> None:
        c = _ffi.SamplingParams()
        _ffi.lib().pagoda_sampling_params_default(ctypes.byref(c))
        c.n = _check_int("n", sp.n, 1, 1024)
        c.temperature = _check_float("temperature", sp.temperature, 0.0)
        c.top_p = _check_float("top_p", sp.top_p, 0.0, 1.0, lo_open=True)
        c.top_k = _check_int("top_k", sp.top_k, -1)
        c.min_p = _check_float("min_p", sp.min_p, 0.0, 1.0)
        c.seed = seed
        if sp.max_tokens is None:
            c.max_tokens = -1
        else:
            c.max_tokens = _check_int("max_tokens", sp.max_tokens, 1)
        c.min_tokens = _check_int("min_tokens", sp.min_tokens, 0)
        c.ignore_eos = 1 if sp.ignore_eos else 0
        stop = sp.stop
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        stop = list(stop)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: expected non-empty strings, got {s!r}")
        self._stop = (ctypes.c_char_p * max(1, len(stop)))(*[s.encode() for s in stop])
        c.stop = self._stop
        c.n_stop = len(stop)
        ids = [_check_int("stop_token_ids", i, 0) for i in (sp.stop_token_ids or [])]
        self._stop_ids = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        c.stop_token_ids = self._stop_ids
        c.n_stop_token_ids = len(ids)
        c.presence_penalty = _check_float("presence_penalty", sp.presence_penalty, -2.0, 2.0)
        c.frequency_penalty = _check_float("frequency_penalty", sp.frequency_penalty, -2.0, 2.0)
        c.repetition_penalty = _check_float("repetition_penalty", sp.repetition_penalty, 0.0,
                                            lo_open=True)
        bias = sp.logit_bias or {}
        if not isinstance(bias, dict):
            raise ValueError(f"logit_bias: expected a dict token id -> bias, got {bias!r}")
        bias_ids = [_check_int("logit_bias", int(k) if isinstance(k, str) and k.isdigit() else k, 0)
                    for k in bias]
        bias_vals = [_check_float("logit_bias", v, -100.0, 100.0) for v in bias.values()]
        self._bias_ids = (ctypes.c_int32 * max(1, len(bias_ids)))(*bias_ids)
        self._bias_vals = (ctypes.c_float * max(1, len(bias_vals)))(*bias_vals)
        c.logit_bias_ids = self._bias_ids
        c.logit_bias_values = self._bias_vals
        c.n_logit_bias = len(bias_ids)
        c.beam_width = _check_int("beam_width", sp.beam_width, 1)
        c.length_penalty = _check_float("length_penalty", sp.length_penalty)
        c.skip_special_tokens = 1 if sp.skip_special_tokens else 0
        if sp.logprobs is not None:
            c.logprobs = 1
            c.top_logprobs = _check_int("logprobs", sp.logprobs, 0, 20)
        self.c = c
        self.n = c.n if c.beam_width <= 1 else c.beam_width


class _Sample:
    """What one sample (index) of a request accumulated."""

    __slots__ = ("text", "token_ids", "finish", "logprobs", "top")

    def __init__(self) -> None:
        self.text: List[str] = []
        self.token_ids: List[int] = []
        self.finish: Optional[str] = None
        self.logprobs: List[float] = []
        self.top: List[List[Tuple[int, float]]] = []


class _Event:
    """One event of a stream, copied out of C memory."""

    __slots__ = ("index", "token_ids", "text", "finish", "usage", "logprobs", "top")

    def __init__(self, ev: _ffi.Event) -> None:
        # The hot path of every generated token: read each field once, touch usage and
        # logprobs only when present (ctypes field reads cost ~0.1-0.5 us each).
        n = ev.num_token_ids
        self.index: int = ev.index
        self.token_ids: List[int] = ev.token_ids[:n] if n else []
        tl = ev.text_len
        if tl:
            raw = ev.text
            if len(raw) != tl:  # an embedded NUL: copy by length
                addr = ctypes.c_void_p.from_buffer(ev, _TEXT_OFFSET).value
                raw = ctypes.string_at(addr, tl)
            self.text: str = raw.decode("utf-8", "replace")
        else:
            self.text = ""
        fr = ev.finish_reason
        self.finish: Optional[str] = _FINISH.get(fr) if fr else None
        if fr:
            u = ev.usage
            self.usage: Tuple[int, int, int] = (u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)
        else:
            self.usage = (0, 0, 0)
        self.logprobs: Optional[List[float]] = None
        self.top: Optional[List[List[Tuple[int, float]]]] = None
        if n and ev.logprobs:
            self.logprobs = ev.logprobs[:n]
            k = ev.num_top_logprobs
            if k and ev.top_logprob_ids:
                ids = ev.top_logprob_ids[:n * k]
                lps = ev.top_logprobs[:n * k]
                self.top = [list(zip(ids[i * k:(i + 1) * k], lps[i * k:(i + 1) * k])) for i in range(n)]


class _Stream:
    """One submitted request: iterate for its events. Closing it (or dropping it, or breaking out
    of a loop over a public stream) aborts the request; its KV blocks return to the pool within
    one engine step."""

    def __init__(self, runner: "Runner", handle: ctypes.c_void_p, n: int) -> None:
        self._runner = runner
        self._h: Optional[ctypes.c_void_p] = handle
        self._ev = _ffi.Event()
        self._lock = threading.Lock()
        self.n = n
        self.t_submit = time.perf_counter()
        self.t_first: Optional[float] = None
        self.t_last: Optional[float] = None
        runner._streams.add(self)

    @property
    def request_id(self) -> int:
        h = self._h
        return int(_ffi.lib().pagoda_stream_id(h)) if h else 0

    def next_event(self) -> Optional[_Event]:
        """The next event, or None when every sample finished (or the stream was closed)."""
        L = _ffi.lib()
        with self._lock:
            while self._h is not None:
                st = L.pagoda_stream_next(self._h, ctypes.byref(self._ev), _POLL_MS)
                if st == _ffi.OK:
                    e = _Event(self._ev)
                    now = time.perf_counter()
                    if self.t_first is None and e.token_ids:
                        self.t_first = now
                    self.t_last = now
                    return e
                if st == _ffi.ERR_NOT_FOUND:
                    return None
                if st != _ffi.ERR_TIMEOUT:
                    raise_status(st)
            return None

    def abort(self) -> None:
        """Aborts the request (from any thread); the stream then reports finish "abort"."""
        h = self._h
        if h is not None:
            _ffi.lib().pagoda_stream_abort(h)

    def close(self) -> None:
        """Aborts the request if it still runs and frees the stream. Idempotent."""
        h = self._h
        if h is None:
            return
        _ffi.lib().pagoda_stream_abort(h)
        with self._lock:
            if self._h is not None:
                _ffi.lib().pagoda_stream_free(self._h)
                self._h = None
        self._runner._streams.discard(self)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def usage(self, u: Tuple[int, int, int]) -> Usage:
        """The Usage for the engine's final counts U, with this stream's timings."""
        end = self.t_last or time.perf_counter()
        ttft = (self.t_first - self.t_submit) if self.t_first else 0.0
        decode = (end - self.t_first) if self.t_first else 0.0
        tps = (u[1] - self.n) / decode if decode > 0 and u[1] > self.n else 0.0
        return Usage(prompt_tokens=u[0], completion_tokens=u[1], total_tokens=u[0] + u[1],
                     cached_tokens=u[2], prompt_tokens_details=PromptTokensDetails(u[2]),
                     tokens_per_second=tps, time_to_first_token=ttft,
                     total_time=end - self.t_submit)


# ---- tool calls ---------------------------------------------------------------------------


def _tool_format(template: Optional[str]) -> str:
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3"
    return "hermes"


def _as_call(obj: Any, k: int, prefix: str) -> Optional[ToolCall]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    arg_text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"))
    return ToolCall(id=f"call_{prefix}{k}", function=FunctionCall(obj["name"], arg_text))


def parse_tool_calls(fmt: str, text: str) -> Tuple[str, Optional[List[ToolCall]]]:
    """Splits model output TEXT into (content, tool calls) for the template's format: Hermes/Qwen
    ``<tool_call>{json}</tool_call>``, Llama 3.1 JSON ``{"name", "parameters"}`` (optionally after
    ``<|python_tag|>``, several joined by ';'), Mistral ``[TOOL_CALLS][{...}]``."""
    dec = json.JSONDecoder()
    calls: List[ToolCall] = []
    prefix = uuid.uuid4().hex[:16] + "_"  # ids unique across requests

    def add(obj: Any) -> bool:
        c = _as_call(obj, len(calls), prefix)
        if c:
            calls.append(c)
        return c is not None

    content = text
    if fmt in ("hermes", "mistral"):
        marker = "<tool_call>" if fmt == "hermes" else "[TOOL_CALLS]"
        p = text.find(marker)
        if p < 0:
            return text, None
        content = text[:p]
        while p >= 0:
            i = p + len(marker)
            while i < len(text) and text[i].isspace():
                i += 1
            try:
                obj, i = dec.raw_decode(text, i)
            except ValueError:
                break
            if isinstance(obj, list):
                for o in obj:
                    add(o)
            else:
                add(obj)
            p = text.find(marker, i)
    else:
        s = text.lstrip()
        if s.startswith("<|python_tag|>"):
            s = s[len("<|python_tag|>"):].lstrip()
        while s.startswith("{"):
            try:
                obj, i = dec.raw_decode(s)
            except ValueError:
                break
            if not add(obj):
                break
            s = s[i:].lstrip()
            if not s.startswith(";"):
                break
            s = s[1:].lstrip()
        if calls:
            content = ""
    if not calls:
        return text, None
    return content, calls


# ---- the runner ---------------------------------------------------------------------------


class Runner:
    """An inference engine over one model.

    Args:
        model: HF directory or ``.gguf`` file; None: the library's default model
            (``PAGODA_MODEL``, then the built-in default).
        device: ``"cpu"`` or ``"cuda"``; None: cuda when a GPU is present.
        paged_attn: ``"auto"`` (= on), ``"on"``/True (PagedAttention block pool) or
            ``"off"``/False (contiguous cache per sequence).
        pa_memory_mb: MiB for the KV pool. At most one of the three budgets may be set.
        pa_memory_fraction: fraction (0, 1] of the memory free after the weights.
        pa_context_len: room for ``max_num_seqs`` sequences of this many tokens.
        pa_block_size: tokens per KV block: 8, 16 or 32.
        pa_cache_type: ``"auto"``, ``"f8e4m3"``, ``"f32"``, ``"f16"``, ``"bf16"`` or a
            :class:`PagedCacheType`.
        prefix_cache_n: prefix cache on (> 0) or off (0).
        isq: in-situ quantization of a safetensors model's weights at load: ``"q4_0"``,
            ``"q4_k"``, ``"q5_k"``, ``"q6_k"``, ``"q8_0"``, ``"4"`` (q4_k) or ``"8"`` (q8_0); None: none.
        max_num_seqs: sequences per engine step.
        seed: seeds requests that give none (a deterministic sequence of seeds); None: random.
        threads: CPU threads (0: all cores).
        tp: tensor parallelism over this many GPUs (0: $PAGODA_TP, else 1; docs/distributed.md).
        max_model_len: longest prompt + output (None: the model's context).
        max_num_batched_tokens: tokens per step.
        chat_template: a Jinja chat template (file path or text) replacing the model's.
        max_waiting: requests waiting for their first token at most (beyond: EngineBusyError).
        which: the seeds' ``Which.Plain(model_id=...)`` (alias of ``model``).
        pa_gpu_mem, pa_blk_size: the seeds' names for ``pa_memory_mb`` and ``pa_block_size``.

    Raises:
        ValueError: an argument is invalid (the message names it).
        ModelLoadError, PagodaError: the engine could not start (its message says why).
    """

    def __init__(self, model: Optional[str] = None, device: Optional[str] = None,
                 paged_attn: Union[str, bool] = "auto", pa_memory_mb: Optional[float] = None,
                 pa_memory_fraction: Optional[float] = None, pa_context_len: Optional[int] = None,
                 pa_block_size: int = 32, pa_cache_type: Union[str, PagedCacheType] = "auto",
                 prefix_cache_n: int = 16, isq: Optional[str] = None, max_num_seqs: int = 256,
                 seed: Optional[int] = None, *, threads: int = 0, tp: int = 0,
                 max_model_len: Optional[int] = None, max_num_batched_tokens: Optional[int] = None,
                 chat_template: Optional[str] = None, max_waiting: int = 1024,
                 which: Optional[Which.Plain] = None, pa_gpu_mem: Optional[float] = None,
                 pa_blk_size: Optional[int] = None) -> None:
        self._a: Optional[ctypes.c_void_p] = None
        self._streams: "weakref.WeakSet[_Stream]" = weakref.WeakSet()
        if which is not None:
            if not isinstance(which, Which.Plain):
                raise ValueError(f"which: expected Which.Plain(model_id=...), got {which!r}")
            if model is not None and which.model_id is not None and model != which.model_id:
                raise ValueError("which: give the model either as model= or as which=, not both")
            model = model if model is not None else which.model_id
        if pa_gpu_mem is not None:
            if pa_memory_mb is not None:
                raise ValueError("pa_gpu_mem: alias of pa_memory_mb; give only one")
            pa_memory_mb = pa_gpu_mem
        if pa_blk_size is not None:
            pa_block_size = pa_blk_size
        if model is None and os.environ.get("PAGODA_MODEL"):
            model = os.environ["PAGODA_MODEL"]
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise ValueError(f"model: expected a path, got {model!r}")
        if device is not None and device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu', 'cuda' or None, got {device!r}")
        if paged_attn not in _PAGED:
            raise ValueError(f"paged_attn: expected 'auto', 'on', 'off', True or False, got {paged_attn!r}")
        ct = pa_cache_type.value if isinstance(pa_cache_type, PagedCacheType) else pa_cache_type
        if not isinstance(ct, str) or ct.lower() not in _CACHE_TYPES:
            raise ValueError(f"pa_cache_type: expected one of {sorted(_CACHE_TYPES)} or a PagedCacheType, "
                             f"got {pa_cache_type!r}")
        if isq is not None:
            isq = str(isq).lower()
            if isq not in _ISQ:
                raise ValueError(f"isq: expected one of {', '.join(_ISQ)}, got {isq!r}")
        budgets = [n for n, v in (("pa_memory_mb", pa_memory_mb), ("pa_memory_fraction", pa_memory_fraction),
                                  ("pa_context_len", pa_context_len)) if v is not None]
        if len(budgets) > 1:
            raise ValueError(f"{budgets[1]}: set at most one of pa_memory_mb, pa_memory_fraction, "
                             f"pa_context_len (got {', '.join(budgets)})")
        if seed is not None:
            _check_int("seed", seed, 0)
        ep = _ffi.EngineParams()
        L = _ffi.lib()
        L.pagoda_engine_params_default(ctypes.byref(ep))
        self._model_b = os.fspath(model).encode() if model is not None else None
        self._device_b = device.encode() if device else None
        self._isq_b = isq.encode() if isq is not None else None
        ep.isq = self._isq_b
        ep.model = self._model_b
        ep.device = self._device_b
        ep.threads = _check_int("threads", threads, 0)
        ep.tp = _check_int("tp", tp, 0)
        ep.paged_attn = _PAGED[paged_attn]
        ep.block_size = _check_int("pa_block_size", pa_block_size)
        if ep.block_size not in (8, 16, 32):
            raise ValueError(f"pa_block_size: must be 8, 16 or 32, got {pa_block_size}")
        if pa_memory_mb is not None:
            ep.pa_memory_mb = _check_float("pa_memory_mb", pa_memory_mb, 0.0, lo_open=True)
        if pa_memory_fraction is not None:
            ep.pa_memory_fraction = _check_float("pa_memory_fraction", pa_memory_fraction, 0.0, 1.0,
                                                 lo_open=True)
        if pa_context_len is not None:
            ep.pa_context_len = _check_int("pa_context_len", pa_context_len, 1)
        ep.cache_type = _CACHE_TYPES[ct.lower()]
        ep.prefix_cache_n = _check_int("prefix_cache_n", prefix_cache_n, 0)
        ep.max_num_seqs = _check_int("max_num_seqs", max_num_seqs, 1)
        if max_model_len is not None:
            ep.max_model_len = _check_int("max_model_len", max_model_len, 1)
        if max_num_batched_tokens is not None:
            ep.max_num_batched_tokens = _check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        self._template: Optional[str] = None
        if chat_template is not None:
            if not isinstance(chat_template, str):
                raise ValueError(f"chat_template: expected a file path or template text, got {chat_template!r}")
            if "{" not in chat_template:
                try:
                    with open(chat_template, encoding="utf-8") as f:
                        chat_template = f.read()
                except OSError as e:
                    raise ValueError(f"chat_template: cannot read {chat_template}: {e.strerror}") from None
            self._template = chat_template
        self._template_b = self._template.encode() if self._template is not None else None
        ap = _ffi.AsyncParams()
        L.pagoda_async_params_default(ctypes.byref(ap))
        ap.max_waiting = _check_int("max_waiting", max_waiting, 1)
        a = ctypes.c_void_p()
        st = L.pagoda_async_create(ctypes.byref(ep), ctypes.byref(ap), ctypes.byref(a))
        if st == _ffi.ERR_NOT_FOUND:  # at creation: the model path or repo id names nothing
            raise ModelLoadError(_ffi.last_error(), st)
        if st != _ffi.OK:
            raise_status(st)
        self._a = a
        self._e = L.pagoda_async_engine(a)
        self.model_id: str = os.fspath(model) if model is not None else "default"
        self._seed_rng = random.Random(seed) if seed is not None else None
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        tmpl = self._template
        if tmpl is None and L.pagoda_has_chat_template(self._e):
            t = L.pagoda_chat_template(self._e)
            tmpl = t.decode("utf-8", "replace") if t else None
        self._tool_fmt = _tool_format(tmpl)

    # ---- lifecycle ----

    def close(self, grace_s: float = 0.0) -> None:
        """Stops the engine: running requests may finish for GRACE_S seconds, the rest are
        aborted; then every open stream is closed and the engine freed. Idempotent."""
        a = self._a
        if a is None:
            return
        L = _ffi.lib()
        L.pagoda_async_shutdown(a, int(grace_s * 1000))
        for s in list(self._streams):
            s.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._a = None
        L.pagoda_async_free(a)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _handle(self) -> ctypes.c_void_p:
        if self._a is None:
            raise EngineClosedError("error: the Runner is closed", _ffi.ERR_CLOSED)
        return self._a

    # ---- model helpers ----

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> List[int]:
        """Encodes TEXT with the model's tokenizer."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a string, got {type(text).__name__}")
        self._handle()
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        L = _ffi.lib()
        while True:
            buf = (ctypes.c_int32 * cap)()
            n = L.pagoda_tokenize(self._e, raw, len(raw), int(add_special), int(parse_special), buf, cap)
            if n < 0:
                raise_status(_ffi.ERR_INVALID_ARG, "tokenize")
            if n <= cap:
                return buf[:n]
            cap = n

    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes token IDS to text."""
        self._handle()
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        st = _ffi.lib().pagoda_detokenize(self._e, arr, len(ids), int(skip_special_tokens),
                                          ctypes.byref(out), ctypes.byref(n))
        if st != _ffi.OK:
            raise_status(st, "detokenize")
        return _ffi.take_string(out, n.value)

    def apply_chat_template(self, messages: List[Dict[str, Any]],
                            tools: Optional[List[Dict[str, Any]]] = None,
                            add_generation_prompt: bool = True) -> str:
        """Renders MESSAGES (and TOOLS) with the chat template (the Runner's, else the model's)."""
        self._handle()
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: expected a non-empty list of {'role', 'content'} dicts")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages: each message needs a 'role' string, got {m!r}")
        extra = None
        if tools:
            if not isinstance(tools, list):
                raise ValueError("tools: expected a list of {'type': 'function', 'function': {...}}")
            for t in tools:
                fn = t.get("function") if isinstance(t, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ValueError(f"tools: each tool needs {{'type': 'function', 'function': {{'name': ...}}}}, got {t!r}")
            extra = json.dumps({"tools": tools}).encode()
        out = ctypes.c_void_p()
        st = _ffi.lib().pagoda_render_chat_ext(self._e, self._template_b, json.dumps(messages).encode(),
                                               extra, int(add_generation_prompt), ctypes.byref(out))
        if st != _ffi.OK:
            if st == _ffi.ERR_NOT_FOUND:
                raise ValueError("messages: the model has no chat template: use "
                                 "send_completion_request, or Runner(chat_template=FILE)")
            raise_status(st, "chat template")
        return _ffi.take_string(out)

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output the engine accepts."""
        self._handle()
        return int(_ffi.lib().pagoda_max_model_len(self._e))

    # ---- submission ----

    def _seed(self, seed: Optional[int]) -> int:
        if seed is not None:
            return _check_int("seed", seed, 0, (1 << 63) - 1)
        if self._seed_rng is None:
            return -1
        with self._lock:
            return self._seed_rng.getrandbits(62)

    def _submit(self, prompt: Union[str, Sequence[int]], sp: SamplingParams) -> _Stream:
        a = self._handle()
        cs = _CSampling(sp, self._seed(sp.seed))
        L = _ffi.lib()
        h = ctypes.c_void_p()
        if isinstance(prompt, str):
            st = L.pagoda_async_submit(a, prompt.encode("utf-8"), None, 0, ctypes.byref(cs.c), ctypes.byref(h))
        else:
            ids = list(prompt)
            if not ids:
                raise ValueError("prompt: empty token list")
            for i in ids:
                _check_int("prompt", i, 0)
            arr = (ctypes.c_int32 * len(ids))(*ids)
            st = L.pagoda_async_submit(a, None, arr, len(ids), ctypes.byref(cs.c), ctypes.byref(h))
        if st != _ffi.OK:
            raise_status(st)
        return _Stream(self, h, cs.n)

    @staticmethod
    def _req_sampling(req: Union[ChatCompletionRequest, CompletionRequest], logprobs: Optional[int]) -> SamplingParams:
        sp = SamplingParams(max_tokens=req.max_tokens, n=req.n, seed=req.seed, stop=req.stop,
                            stop_token_ids=req.stop_token_ids, logit_bias=req.logit_bias,
                            logprobs=logprobs, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos)
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            v = getattr(req, name)
            if v is not None:
                setattr(sp, name, v)
        return sp

    def _chat_prompt(self, req: ChatCompletionRequest) -> Tuple[List[int], bool]:
        if not isinstance(req, ChatCompletionRequest):
            raise ValueError(f"request: expected a ChatCompletionRequest, got {type(req).__name__}")
        use_tools = bool(req.tools) and req.tool_choice != "none"
        text = self.apply_chat_template(req.messages, req.tools if use_tools else None)
        return self.tokenize(text, add_special=False, parse_special=True), use_tools

    def _chat_logprobs(self, req: ChatCompletionRequest) -> Optional[int]:
        if req.top_logprobs is not None and not req.logprobs:
            raise ValueError("top_logprobs: needs logprobs=True")
        return (req.top_logprobs or 0) if req.logprobs else None

    def _piece(self, tid: int) -> str:
        buf = ctypes.create_string_buffer(256)
        n = _ffi.lib().pagoda_token_piece(self._e, tid, buf, 256)
        return buf.raw[:max(n, 0)].decode("utf-8", "replace")

    def _chat_logprobs_of(self, ids: List[int], lps: List[float], top: Optional[List[List[Tuple[int, float]]]]) -> List[TokenLogprob]:
        out = []
        for i, (tid, lp) in enumerate(zip(ids, lps)):
            p = self._piece(tid)
            tops = [TopLogprob(self._piece(t), l, list(self._piece(t).encode())) for t, l in (top[i] if top else [])]
            out.append(TokenLogprob(p, lp, list(p.encode()), tops))
        return out

    # ---- chat ----

    def send_chat_completion_request(self, request: ChatCompletionRequest
                                     ) -> Union[ChatCompletionResponse, Iterator[ChatCompletionChunk]]:
        """Runs a chat completion. Returns a :class:`ChatCompletionResponse`, or with
        ``request.stream`` an iterator of :class:`ChatCompletionChunk` (breaking out of it, or
        closing it, aborts the request).

        Raises:
            ValueError: a request field is invalid (the message names it).
            PromptTooLongError: the prompt + max_tokens cannot fit.
            EngineBusyError, EngineClosedError, PagodaError: engine failures.
        """
        ids, tools = self._chat_prompt(request)
        sp = self._req_sampling(request, self._chat_logprobs(request))
        s = self._submit(ids, sp)
        if request.stream:
            return _ChatStream(self, s, request, tools)
        return self._collect_chat(s, request, tools)

    def _collect(self, s: _Stream) -> Tuple[List[_Sample], Tuple[int, int, int]]:
        """Reads stream S to its end into one _Sample per sample, then frees it. This is the
        per-token hot path of generate() and the non-streaming requests: events are read in
        place (no per-event object) to keep the Python cost per token low."""
        samples = [_Sample() for _ in range(s.n)]
        usage = (0, 0, 0)
        nxt = _ffi.lib().pagoda_stream_next
        ev = s._ev
        evp = ctypes.byref(ev)
        perf = time.perf_counter
        try:
            with s._lock:
                h = s._h
                while h is not None:
                    st = nxt(h, evp, _POLL_MS)
                    if st == _ffi.ERR_TIMEOUT:
                        h = s._h
                        continue
                    if st == _ffi.ERR_NOT_FOUND:
                        break
                    if st != _ffi.OK:
                        raise_status(st)
                    n = ev.num_token_ids
                    smp = samples[ev.index]
                    if n:
                        if s.t_first is None:
                            s.t_first = perf()
                        if n == 1:
                            smp.token_ids.append(ev.token_ids[0])
                        else:
                            smp.token_ids.extend(ev.token_ids[:n])
                        if ev.logprobs:
                            smp.logprobs.extend(ev.logprobs[:n])
                            k = ev.num_top_logprobs
                            if k and ev.top_logprob_ids:
                                ids = ev.top_logprob_ids[:n * k]
                                lps = ev.top_logprobs[:n * k]
                                smp.top.extend(list(zip(ids[i * k:(i + 1) * k], lps[i * k:(i + 1) * k]))
                                               for i in range(n))
                    tl = ev.text_len
                    if tl:
                        raw = ev.text
                        if len(raw) != tl:
                            raw = ctypes.string_at(ctypes.c_void_p.from_buffer(ev, _TEXT_OFFSET).value, tl)
                        smp.text.append(raw)
                    fr = ev.finish_reason
                    if fr:
                        smp.finish = _FINISH.get(fr)
                        u = ev.usage
                        usage = (u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)
            s.t_last = perf()
        finally:
            s.close()
        for smp in samples:  # bytes pieces are complete UTF-8: join once, decode once
            smp.text = [b"".join(smp.text).decode("utf-8", "replace")]  # type: ignore[list-item]
        return samples, usage

    def _collect_chat(self, s: _Stream, req: ChatCompletionRequest, tools: bool) -> ChatCompletionResponse:
        samples, u = self._collect(s)
        choices = []
        for i, smp in enumerate(samples):
            text = "".join(smp.text)
            calls = None
            if tools:
                text, calls = parse_tool_calls(self._tool_fmt, text)
            lp = None
            if req.logprobs:
                lp = ChoiceLogprobs(self._chat_logprobs_of(smp.token_ids, smp.logprobs, smp.top or None))
            finish = "tool_calls" if calls else smp.finish
            choices.append(Choice(i, ResponseMessage(content=text, tool_calls=calls), finish, lp))
        return ChatCompletionResponse(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()),
                                      model=req.model or self.model_id, choices=choices, usage=s.usage(u))

    # ---- completion ----

    def send_completion_request(self, request: CompletionRequest
                                ) -> Union[CompletionResponse, Iterator[CompletionResponse]]:
        """Runs a text completion of ``request.prompt``. Returns a :class:`CompletionResponse`,
        or with ``request.stream`` an iterator of them (one per piece of new text; the last has
        empty choices and ``usage``). Raises as :meth:`send_chat_completion_request`."""
        if not isinstance(request, CompletionRequest):
            raise ValueError(f"request: expected a CompletionRequest, got {type(request).__name__}")
        if not isinstance(request.prompt, (str, list)):
            raise ValueError(f"prompt: expected a string or a list of token ids, got {type(request.prompt).__name__}")
        if request.logprobs is not None:
            _check_int("logprobs", request.logprobs, 0, 5)
        sp = self._req_sampling(request, request.logprobs)
        s = self._submit(request.prompt, sp)
        if request.stream:
            return _CompletionStream(self, s, request)
        samples, u = self._collect(s)
        echo = ""
        if request.echo:
            echo = request.prompt if isinstance(request.prompt, str) else self.detokenize(request.prompt)
        choices = []
        for i, smp in enumerate(samples):
            lp = None
            if request.logprobs is not None:
                lp = self._completion_logprobs(smp.token_ids, smp.logprobs, smp.top)
            choices.append(CompletionChoice(i, echo + "".join(smp.text), smp.finish, lp))
        return CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()),
                                  model=request.model or self.model_id, choices=choices, usage=s.usage(u))

    def _completion_logprobs(self, ids: List[int], lps: List[float], top: List[List[Tuple[int, float]]]
                             ) -> CompletionLogprobs:
        toks = [self._piece(t) for t in ids]
        offs, o = [], 0
        for t in toks:
            offs.append(o)
            o += len(t)
        tops = [{self._piece(t): l for t, l in row} for row in top] if top else None
        return CompletionLogprobs(toks, list(lps), tops, offs)

    # ---- asyncio ----

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="pagoda")
            return self._pool

    async def send_chat_completion_request_async(self, request: ChatCompletionRequest
                                                 ) -> Union[ChatCompletionResponse, AsyncIterator[ChatCompletionChunk]]:
        """Asyncio variant of :meth:`send_chat_completion_request`: awaits the response, or with
        ``request.stream`` returns an async iterator of chunks (``async for``)."""
        loop = asyncio.get_running_loop()
        r = await loop.run_in_executor(self._executor(), self.send_chat_completion_request, request)
        return _AsyncIter(self, r) if request.stream else r  # type: ignore[return-value,arg-type]

    async def send_completion_request_async(self, request: CompletionRequest
                                            ) -> Union[CompletionResponse, AsyncIterator[CompletionResponse]]:
        """Asyncio variant of :meth:`send_completion_request`."""
        loop = asyncio.get_running_loop()
        r = await loop.run_in_executor(self._executor(), self.send_completion_request, request)
        return _AsyncIter(self, r) if request.stream else r  # type: ignore[return-value,arg-type]

    async def generate_async(self, prompts: Union[str, Sequence[Union[str, List[int]]]],
                             sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None
                             ) -> List[RequestOutput]:
        """Asyncio variant of :meth:`generate`."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.generate, prompts, sampling_params)

    # ---- offline batches ----

    def generate(self, prompts: Union[str, List[int], Sequence[Union[str, List[int]]]],
                 sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
                 ) -> List[RequestOutput]:
        """Runs PROMPTS (texts, or token id lists) as one offline batch, like vLLM's
        ``LLM.generate``: every prompt is submitted at once and the engine batches them
        continuously. SAMPLING_PARAMS: one for all prompts or one per prompt (None: defaults).
        Returns one :class:`RequestOutput` per prompt, in order.

        Raises:
            ValueError: a prompt or parameter is invalid (nothing is left running then).
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            sps: List[SamplingParams] = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            sps = [sampling_params] * len(prompts)
        else:
            sps = list(sampling_params)
            if len(sps) != len(prompts):
                raise ValueError(f"sampling_params: {len(sps)} given for {len(prompts)} prompts")
        for i, p in enumerate(prompts):
            if not isinstance(p, (str, list)):
                raise ValueError(f"prompts[{i}]: expected a string or a list of token ids")
        streams: List[Optional[_Stream]] = [None] * len(prompts)
        # pagoda_async_submit returns once the engine thread took the request (up to one step):
        # submitting from several threads at once lets the whole batch start in the same step.
        workers = min(len(prompts), 32)
        try:
            if workers > 1:
                with ThreadPoolExecutor(max_workers=workers) as ex:
                    futs = [ex.submit(self._submit, p, sp) for p, sp in zip(prompts, sps)]
                    err: Optional[BaseException] = None
                    for i, f in enumerate(futs):
                        try:
                            streams[i] = f.result()
                        except BaseException as e:  # keep collecting: every stream gets closed
                            err = err or e
                    if err:
                        raise err
            else:
                for i, (p, sp) in enumerate(zip(prompts, sps)):
                    streams[i] = self._submit(p, sp)
            outs = []
            for i, s in enumerate(streams):
                assert s is not None
                rid = str(s.request_id)
                samples, u = self._collect(s)
                p = prompts[i]
                outs.append(RequestOutput(
                    request_id=rid, prompt=p if isinstance(p, str) else None,
                    prompt_token_ids=None if isinstance(p, str) else list(p),
                    outputs=[CompletionOutput(j, "".join(m.text), m.token_ids, m.finish,
                                              sum(m.logprobs) if m.logprobs else None,
                                              [dict([(t, lp)] + list(top)) for t, lp, top in
                                               zip(m.token_ids, m.logprobs, m.top or [[]] * len(m.logprobs))]
                                              if sps[i].logprobs is not None else None)
                             for j, m in enumerate(samples)],
                    usage=s.usage(u)))
            return outs
        finally:
            for s in streams:
                if s is not None:
                    s.close()

    # ---- stats ----

    def stats(self) -> Stats:
        """KV usage, prefix-cache hit rate, preemptions and request counters (a snapshot taken
        after the engine's last step)."""
        s = _ffi.AsyncStats()
        st = _ffi.lib().pagoda_async_stats(self._handle(), ctypes.byref(s))
        if st != _ffi.OK:
            raise_status(st, "stats")
        e = s.engine
        return Stats(num_blocks=e.num_blocks, block_size=e.block_size, free_blocks=e.free_blocks,
                     running=e.running, waiting=e.waiting, kv_usage=e.kv_usage, kv_peak_usage=e.kv_peak_usage,
                     kv_waste_fraction=e.kv_waste_fraction, prefix_queries=e.prefix_queries,
                     prefix_hits=e.prefix_hits,
                     prefix_hit_rate=e.prefix_hits / e.prefix_queries if e.prefix_queries else 0.0,
                     prefix_evictions=e.prefix_evictions, preemptions=e.preemptions, steps=e.steps,
                     prompt_tokens_computed=e.prompt_tokens_computed, generated_tokens=e.generated_tokens,
                     paged=bool(e.paged), queued=s.queued, active=s.active, submitted=s.submitted,
                     finished=s.finished, rejected_busy=s.rejected_busy, aborted=s.aborted,
                     accepting=bool(s.accepting), step_failures=s.step_failures)


# ---- streams ------------------------------------------------------------------------------


class _PublicStream:
    """Base of the iterators returned for ``stream=True``: ``close()`` (or breaking out of a
    ``for`` loop and dropping the iterator, or leaving a ``with`` block) aborts the request."""

    def __init__(self, runner: Runner, s: _Stream) -> None:
        self._runner = runner
        self._s = s
        self._done = False
        self.id = ""

    def __iter__(self) -> "_PublicStream":
        return self

    def close(self) -> None:
        """Aborts the request if it still runs; its KV blocks return within one engine step."""
        self._done = True
        self._s.close()

    def __enter__(self) -> "_PublicStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _ChatStream(_PublicStream):
    def __init__(self, runner: Runner, s: _Stream, req: ChatCompletionRequest, tools: bool) -> None:
        super().__init__(runner, s)
        self._req = req
        self._tools = tools
        self._started = [False] * s.n
        self._held = [""] * s.n
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = req.model or runner.model_id
        self._finished = 0
        self._pending: Optional[ChatCompletionChunk] = None

    def _chunk(self, choices: List[ChunkChoice], usage: Optional[Usage] = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(self.id, self._created, self._model, choices, usage)

    def __next__(self) -> ChatCompletionChunk:
        while not self._done:
            e = self._s.next_event()
            if e is None:
                self.close()
                raise StopIteration
            i = e.index
            role = None if self._started[i] else "assistant"
            self._started[i] = True
            text: Optional[str] = e.text
            calls = None
            finish = e.finish
            if self._tools:  # tool calls are parsed from the whole output: held to the end
                self._held[i] += e.text
                text = None
                if e.finish:
                    text, calls = parse_tool_calls(self._runner._tool_fmt, self._held[i])
                    if calls:
                        finish = "tool_calls"
            lp = None
            if self._req.logprobs and e.logprobs is not None:
                lp = ChoiceLogprobs(self._runner._chat_logprobs_of(e.token_ids, e.logprobs, e.top))
            if not text and not calls and not finish and role is None and lp is None:
                continue
            choice = ChunkChoice(i, Delta(content=text, role=role, tool_calls=calls), finish, lp)
            if e.finish:
                self._finished += 1
                if self._finished == self._s.n:
                    self._pending = self._chunk([], self._s.usage(e.usage))
                    self._s.close()
                    self._done = True
            return self._chunk([choice])
        if self._pending is not None:
            p, self._pending = self._pending, None
            return p
        raise StopIteration


class _CompletionStream(_PublicStream):
    def __init__(self, runner: Runner, s: _Stream, req: CompletionRequest) -> None:
        super().__init__(runner, s)
        self._req = req
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = req.model or runner.model_id
        self._finished = 0
        self._pending: Optional[CompletionResponse] = None

    def __next__(self) -> CompletionResponse:
        while not self._done:
            e = self._s.next_event()
            if e is None:
                self.close()
                raise StopIteration
            if not e.text and not e.finish:
                continue
            lp = None
            if self._req.logprobs is not None and e.logprobs is not None:
                lp = self._runner._completion_logprobs(e.token_ids, e.logprobs, e.top or [])
            ch = CompletionChoice(e.index, e.text, e.finish, lp)
            if e.finish:
                self._finished += 1
                if self._finished == self._s.n:
                    self._pending = CompletionResponse(self.id, self._created, self._model, [], self._s.usage(e.usage))
                    self._s.close()
                    self._done = True
            return CompletionResponse(self.id, self._created, self._model, [ch])
        if self._pending is not None:
            p, self._pending = self._pending, None
            return p
        raise StopIteration


class _AsyncIter:
    """``async for`` over a stream: each step waits in the Runner's thread pool. ``aclose()``
    (or leaving the loop early and dropping it) aborts the request."""

    def __init__(self, runner: Runner, it: _PublicStream) -> None:
        self._runner = runner
        self._it = it

    def __aiter__(self) -> "_AsyncIter":
        return self

    async def __anext__(self) -> Any:
        loop = asyncio.get_running_loop()
        sentinel = object()
        v = await loop.run_in_executor(self._runner._executor(), next, self._it, sentinel)
        if v is sentinel:
            raise StopAsyncIteration
        return v

    async def aclose(self) -> None:
        self._it.close()

    def close(self) -> None:
        self._it.close()
