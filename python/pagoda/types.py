"""Request, parameter and response types of the pagoda Python API.

Requests and responses follow OpenAI's chat/completions shapes (attribute access:
``res.choices[0].message.content``, ``res.usage.prompt_tokens``); offline batches follow vLLM's
``SamplingParams`` / ``RequestOutput``. Every type is a plain dataclass; ``to_dict()`` gives the
JSON-shaped dict.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union


class PagedCacheType(enum.Enum):
    """Element type of the KV cache (``Runner(pa_cache_type=...)``)."""

    Auto = "auto"
    """f16 for a GGUF model on the CPU, else the compute dtype."""
    F8E4M3 = "f8e4m3"
    """FP8 E4M3 with per-layer scales: twice the tokens of bf16 in the same memory."""
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"


class Which:
    """The seeds' model selector: ``Runner(which=Which.Plain(model_id=...))``."""

    @dataclass
    class Plain:
        """A plain (unquantized or GGUF) model: an HF directory or a ``.gguf`` file."""

        model_id: Optional[str] = None
        tokenizer_json: Optional[str] = None
        arch: Optional[str] = None


class _Dict:
    def to_dict(self) -> Dict[str, Any]:
        """The object as a JSON-shaped dict (None fields kept)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass
class SamplingParams(_Dict):
    """Sampling parameters of one request (vLLM's names and defaults).

    ``temperature=0`` is greedy. ``seed=None`` draws from the Runner's seed (random when that is
    None too); a fixed seed makes the output a function of seed and prompt. ``logprobs=k``
    reports each token's logprob and the k most likely tokens (0: the sampled one only).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: Optional[Union[str, Sequence[str]]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[Dict[int, float]] = None
    logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    beam_width: int = 1
    length_penalty: float = 1.0


@dataclass
class ChatCompletionRequest(_Dict):
    """An OpenAI chat completion request. ``messages``: list of ``{"role", "content"}`` dicts
    (``tool_calls`` / ``tool_call_id`` pass through to the chat template). ``tools``: OpenAI
    function definitions, rendered by the template; calls in the output are parsed into
    ``message.tool_calls``. ``stream=True`` makes the Runner return an iterator of chunks."""

    messages: List[Dict[str, Any]]
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    n: int = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop: Optional[Union[str, Sequence[str]]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    seed: Optional[int] = None
    logit_bias: Optional[Dict[int, float]] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool = False
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Any] = None


@dataclass
class CompletionRequest(_Dict):
    """An OpenAI (legacy) completion request: ``prompt`` is text (BOS added as the tokenizer
    says) or a list of token ids. ``stream=True`` makes the Runner return an iterator."""

    prompt: Union[str, List[int]]
    model: Optional[str] = None
    max_tokens: Optional[int] = 16
    n: int = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop: Optional[Union[str, Sequence[str]]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    seed: Optional[int] = None
    logit_bias: Optional[Dict[int, float]] = None
    logprobs: Optional[int] = None
    min_tokens: int = 0
    ignore_eos: bool = False
    echo: bool = False
    stream: bool = False


# ---- responses ----------------------------------------------------------------------------


@dataclass
class PromptTokensDetails(_Dict):
    cached_tokens: int = 0


@dataclass
class Usage(_Dict):
    """Token counts and speed of one request. ``cached_tokens``: prompt tokens served by the
    prefix cache; ``tokens_per_second``: completion tokens / seconds from the first token to the
    last; ``time_to_first_token`` and ``total_time`` in seconds."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = field(default_factory=PromptTokensDetails)
    tokens_per_second: float = 0.0
    time_to_first_token: float = 0.0
    total_time: float = 0.0


@dataclass
class FunctionCall(_Dict):
    name: str
    arguments: str


@dataclass
class ToolCall(_Dict):
    id: str
    function: FunctionCall
    type: str = "function"


@dataclass
class TokenLogprob(_Dict):
    token: str
    logprob: float
    bytes: List[int]
    top_logprobs: List["TopLogprob"] = field(default_factory=list)


@dataclass
class TopLogprob(_Dict):
    token: str
    logprob: float
    bytes: List[int]


@dataclass
class ChoiceLogprobs(_Dict):
    content: List[TokenLogprob] = field(default_factory=list)


@dataclass
class ResponseMessage(_Dict):
    content: Optional[str]
    role: str = "assistant"
    tool_calls: Optional[List[ToolCall]] = None


@dataclass
class Choice(_Dict):
    index: int
    message: ResponseMessage
    finish_reason: Optional[str]
    logprobs: Optional[ChoiceLogprobs] = None


@dataclass
class ChatCompletionResponse(_Dict):
    id: str
    created: int
    model: str
    choices: List[Choice]
    usage: Usage
    object: str = "chat.completion"


@dataclass
class Delta(_Dict):
    content: Optional[str] = None
    role: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None


@dataclass
class ChunkChoice(_Dict):
    index: int
    delta: Delta
    finish_reason: Optional[str] = None
    logprobs: Optional[ChoiceLogprobs] = None


@dataclass
class ChatCompletionChunk(_Dict):
    """One streamed piece: ``choices[i].delta.content`` is the new text of sample i. The last
    chunk has empty choices and ``usage`` set."""

    id: str
    created: int
    model: str
    choices: List[ChunkChoice]
    usage: Optional[Usage] = None
    object: str = "chat.completion.chunk"


@dataclass
class CompletionLogprobs(_Dict):
    tokens: List[str] = field(default_factory=list)
    token_logprobs: List[float] = field(default_factory=list)
    top_logprobs: Optional[List[Dict[str, float]]] = None
    text_offset: List[int] = field(default_factory=list)


@dataclass
class CompletionChoice(_Dict):
    index: int
    text: str
    finish_reason: Optional[str]
    logprobs: Optional[CompletionLogprobs] = None


@dataclass
class CompletionResponse(_Dict):
    """A completion (``choices[i].text``); when streamed, each chunk has this shape with the
    new text in ``text`` and the final one with empty choices and ``usage``."""

    id: str
    created: int
    model: str
    choices: List[CompletionChoice]
    usage: Optional[Usage] = None
    object: str = "text_completion"


@dataclass
class CompletionOutput(_Dict):
    """One sample of an offline request (vLLM's CompletionOutput). ``logprobs``: per token, a
    dict id -> logprob (the sampled token and the top ones) when asked for."""

    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[List[Dict[int, float]]] = None


@dataclass
class RequestOutput(_Dict):
    """The result of one prompt of ``Runner.generate`` (vLLM's RequestOutput)."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[List[int]]
    outputs: List[CompletionOutput]
    usage: Usage
    finished: bool = True


@dataclass
class Stats(_Dict):
    """``Runner.stats()``: a snapshot taken after the engine's last step."""

    num_blocks: int
    block_size: int
    free_blocks: int
    running: int
    waiting: int
    kv_usage: float
    kv_peak_usage: float
    kv_waste_fraction: float
    prefix_queries: int
    prefix_hits: int
    prefix_hit_rate: float
    prefix_evictions: int
    preemptions: int
    steps: int
    prompt_tokens_computed: int
    generated_tokens: int
    paged: bool
    queued: int
    active: int
    submitted: int
    finished: int
    rejected_busy: int
    aborted: int
    accepting: bool
    step_failures: int
