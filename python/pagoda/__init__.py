"""pagoda: an LLM inference engine built around PagedAttention, from Python.

    import pagoda
    runner = pagoda.Runner(model="model.gguf")
    res = runner.send_chat_completion_request(pagoda.ChatCompletionRequest(
        messages=[{"role": "user", "content": "Hi"}], max_tokens=16))
    print(res.choices[0].message.content, res.usage)

See docs/python.md. The shared library libpagoda is looked up in $PAGODA_LIBRARY, next to this
package, then in the repository's build/ directory.
"""
from .errors import (EngineBusyError, EngineClosedError, InvalidRequestError, ModelLoadError,
                     PagodaError, PromptTooLongError, UnsupportedError)
from .runner import Runner, parse_tool_calls
from .types import (ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, Choice,
                    ChunkChoice, CompletionChoice, CompletionOutput, CompletionRequest,
                    CompletionResponse, Delta, PagedCacheType, RequestOutput, ResponseMessage,
                    SamplingParams, Stats, ToolCall, Usage, Which)

__version__ = "0.1.0"

__all__ = [
    "Runner", "Which", "PagedCacheType", "SamplingParams", "ChatCompletionRequest",
    "CompletionRequest", "ChatCompletionResponse", "ChatCompletionChunk", "CompletionResponse",
    "Choice", "ChunkChoice", "CompletionChoice", "CompletionOutput", "Delta", "RequestOutput",
    "ResponseMessage", "Stats", "ToolCall", "Usage", "PagodaError", "InvalidRequestError",
    "PromptTooLongError", "UnsupportedError", "EngineBusyError", "EngineClosedError", "ModelLoadError",
    "parse_tool_calls",
]
