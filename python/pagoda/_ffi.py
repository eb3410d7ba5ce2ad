"""ctypes bindings of libpagoda's public API (include/pagoda.h).

The struct layouts below mirror the C header field by field; keep them in the same order when
the header changes. Only the functions the package uses are declared.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import List, Optional

# enum pagoda_status
OK = 0
ERR_INVALID_ARG = 1
ERR_IO = 2
ERR_FORMAT = 3
ERR_UNSUPPORTED = 4
ERR_OUT_OF_MEMORY = 5
ERR_TOO_LONG = 6
ERR_NOT_FOUND = 7
ERR_BACKEND = 8
ERR_BUSY = 9
ERR_CLOSED = 10
ERR_TIMEOUT = 11

# enum pagoda_finish_reason
FINISH_NONE = 0
FINISH_STOP = 1
FINISH_LENGTH = 2
FINISH_ABORT = 3

_c_int = ctypes.c_int
_c_double = ctypes.c_double
_c_float = ctypes.c_float
_c_i64 = ctypes.c_int64
_c_i32p = ctypes.POINTER(ctypes.c_int32)
_c_fp = ctypes.POINTER(ctypes.c_float)

ON_OUTPUT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class EngineParams(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p),
        ("revision", ctypes.c_char_p),
        ("hf_file", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("threads", _c_int),
        ("paged_attn", _c_int),
        ("block_size", _c_int),
        ("pa_memory_mb", _c_double),
        ("pa_memory_fraction", _c_double),
        ("pa_context_len", _c_int),
        ("cache_type", _c_int),
        ("prefix_cache_n", _c_int),
        ("max_num_seqs", _c_int),
        ("max_num_batched_tokens", _c_int),
        ("prefill_chunk_size", _c_int),
        ("max_model_len", _c_int),
        ("on_output", ctypes.c_void_p),
        ("user", ctypes.c_void_p),
        ("isq", ctypes.c_char_p),
        ("tp", _c_int),
        ("tp_rank", _c_int),
        ("tp_world", _c_int),
        ("tp_master", ctypes.c_char_p),
    ]


class SamplingParams(ctypes.Structure):
    _fields_ = [
        ("n", _c_int),
        ("temperature", _c_float),
        ("top_k", _c_int),
        ("top_p", _c_float),
        ("min_p", _c_float),
        ("seed", _c_i64),
        ("max_tokens", _c_int),
        ("min_tokens", _c_int),
        ("ignore_eos", _c_int),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", _c_int),
        ("stop_token_ids", _c_i32p),
        ("n_stop_token_ids", _c_int),
        ("presence_penalty", _c_float),
        ("frequency_penalty", _c_float),
        ("repetition_penalty", _c_float),
        ("logit_bias_ids", _c_i32p),
        ("logit_bias_values", _c_fp),
        ("n_logit_bias", _c_int),
        ("beam_width", _c_int),
        ("length_penalty", _c_float),
        ("skip_special_tokens", _c_int),
        ("logprobs", _c_int),
        ("top_logprobs", _c_int),
        ("prompt_logprobs", _c_int),
    ]


class Usage(ctypes.Structure):
    _fields_ = [
        ("prompt_tokens", _c_int),
        ("completion_tokens", _c_int),
        ("cached_prompt_tokens", _c_int),
    ]


class Event(ctypes.Structure):
    _fields_ = [
        ("index", _c_int),
        ("token_ids", _c_i32p),
        ("num_token_ids", _c_int),
        ("text", ctypes.c_char_p),  # NUL-terminated too: read as bytes without a call
        ("text_len", ctypes.c_size_t),
        ("logprobs", _c_fp),
        ("top_logprob_ids", _c_i32p),
        ("top_logprobs", _c_fp),
        ("num_top_logprobs", _c_int),
        ("finish_reason", _c_int),
        ("usage", Usage),
    ]


class EngineStats(ctypes.Structure):
    _fields_ = [
        ("num_blocks", _c_int),
        ("block_size", _c_int),
        ("free_blocks", _c_int),
        ("running", _c_int),
        ("waiting", _c_int),
        ("kv_usage", _c_double),
        ("kv_peak_usage", _c_double),
        ("kv_waste_fraction", _c_double),
        ("prefix_queries", _c_i64),
        ("prefix_hits", _c_i64),
        ("prefix_evictions", _c_i64),
        ("preemptions", _c_i64),
        ("steps", _c_i64),
        ("prompt_tokens_computed", _c_i64),
        ("generated_tokens", _c_i64),
        ("paged", _c_int),
    ]


class AsyncParams(ctypes.Structure):
    _fields_ = [("max_waiting", _c_int)]


class AsyncStats(ctypes.Structure):
    _fields_ = [
        ("engine", EngineStats),
        ("queued", _c_int),
        ("active", _c_int),
        ("submitted", _c_i64),
        ("finished", _c_i64),
        ("rejected_busy", _c_i64),
        ("aborted", _c_i64),
        ("accepting", _c_int),
        ("step_failures", _c_i64),
    ]


def _candidates() -> List[Path]:
    """Where libpagoda is looked for, in order: $PAGODA_LIBRARY, next to this package, the
    repository's build/ directory (when running from a checkout), then the system's search path."""
    here = Path(__file__).resolve().parent
    names = ["libpagoda.so", "libpagoda.dylib"]
    out: List[Path] = []
    for name in names:
        out.append(here / name)
    root = here.parent.parent  # python/pagoda -> repository root
    for name in names:
        out.append(root / "build" / name)
    return out


def _load() -> ctypes.CDLL:
    env = os.environ.get("PAGODA_LIBRARY")
    if env:
        if not Path(env).is_file():
            raise ImportError(f"error: PAGODA_LIBRARY={env}: no such file (point it at libpagoda.so)")
        return ctypes.CDLL(env)
    for p in _candidates():
        if p.is_file():
            return ctypes.CDLL(str(p))
    found = ctypes.util.find_library("pagoda")
    if found:
        return ctypes.CDLL(found)
    raise ImportError(
        "error: libpagoda not found: build it (cmake --build build) or set PAGODA_LIBRARY to the "
        "path of libpagoda.so; looked in " + ", ".join(str(p) for p in _candidates()))


_lib: Optional[ctypes.CDLL] = None

# The ctypes mirrors above against the library's own sizeof (pagoda_struct_size): a library
# built from another version of pagoda.h is refused here instead of corrupting memory.
_MIRRORS = {"engine_params": EngineParams, "sampling_params": SamplingParams, "usage": Usage,
            "engine_stats": EngineStats, "async_params": AsyncParams, "event": Event,
            "async_stats": AsyncStats}


def _check_layout(L: ctypes.CDLL) -> None:
    fn = L.pagoda_struct_size
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p]
    for name, cls in _MIRRORS.items():
        want = fn(name.encode())
        if want != ctypes.sizeof(cls):
            raise ImportError(f"error: {L._name}: struct pagoda_{name} is {want} bytes in the library but "
                              f"{ctypes.sizeof(cls)} in the pagoda Python package: they come from different "
                              "versions of pagoda (rebuild the library or reinstall the package)")


def lib() -> ctypes.CDLL:
    """The loaded library with its function signatures declared (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    L = _load()
    vp = ctypes.c_void_p
    sigs = {
        "pagoda_last_error": (ctypes.c_char_p, []),
        "pagoda_engine_params_default": (None, [ctypes.POINTER(EngineParams)]),
        "pagoda_sampling_params_default": (None, [ctypes.POINTER(SamplingParams)]),
        "pagoda_async_params_default": (None, [ctypes.POINTER(AsyncParams)]),
        "pagoda_async_create": (_c_int, [ctypes.POINTER(EngineParams), ctypes.POINTER(AsyncParams),
                                         ctypes.POINTER(vp)]),
        "pagoda_async_shutdown": (None, [vp, _c_int]),
        "pagoda_async_free": (None, [vp]),
        "pagoda_async_engine": (vp, [vp]),
        "pagoda_async_submit": (_c_int, [vp, ctypes.c_char_p, _c_i32p, _c_int,
                                         ctypes.POINTER(SamplingParams), ctypes.POINTER(vp)]),
        "pagoda_stream_next": (_c_int, [vp, ctypes.POINTER(Event), _c_int]),
        "pagoda_stream_abort": (None, [vp]),
        "pagoda_stream_id": (ctypes.c_uint64, [vp]),
        "pagoda_stream_free": (None, [vp]),
        "pagoda_async_stats": (_c_int, [vp, ctypes.POINTER(AsyncStats)]),
        "pagoda_max_model_len": (_c_int, [vp]),
        "pagoda_vocab_size": (_c_int, [vp]),
        "pagoda_tokenize": (_c_int, [vp, ctypes.c_char_p, ctypes.c_size_t, _c_int, _c_int, _c_i32p, _c_int]),
        "pagoda_detokenize": (_c_int, [vp, _c_i32p, _c_int, _c_int, ctypes.POINTER(vp),
                                       ctypes.POINTER(ctypes.c_size_t)]),
        "pagoda_token_piece": (_c_int, [vp, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]),
        "pagoda_has_chat_template": (_c_int, [vp]),
        "pagoda_chat_template": (ctypes.c_char_p, [vp]),
        "pagoda_render_chat_ext": (_c_int, [vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _c_int,
                                            ctypes.POINTER(vp)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(L, name)
        fn.restype = res
        fn.argtypes = args
    _check_layout(L)
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [vp]
    libc.free.restype = None
    L._free = libc.free  # type: ignore[attr-defined]
    _lib = L
    return L


def last_error() -> str:
    """pagoda_last_error() of this thread, decoded."""
    msg = lib().pagoda_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error"


def take_string(p: ctypes.c_void_p, n: Optional[int] = None) -> str:
    """Copies a malloc'd C string into Python and frees it."""
    try:
        raw = ctypes.string_at(p, n) if n is not None else ctypes.string_at(p)
        return raw.decode("utf-8", "replace")
    finally:
        lib()._free(p)
