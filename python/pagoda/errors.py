"""Exceptions raised by the pagoda package. Engine failures carry the engine's own message
(pagoda_last_error) and its status code."""
from __future__ import annotations

from . import _ffi


class PagodaError(RuntimeError):
    """An engine failure: ``status`` is the pagoda_status code, ``str(e)`` the engine's message."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class InvalidRequestError(PagodaError, ValueError):
    """The engine refused a request's parameters or token ids (PAGODA_ERR_INVALID_ARG)."""


class PromptTooLongError(InvalidRequestError):
    """The request can never fit: prompt + max_tokens over the context, or over the KV pool."""


class EngineBusyError(PagodaError):
    """The waiting queue is full (``Runner(max_waiting=...)``); retry later."""


class EngineClosedError(PagodaError):
    """The Runner was closed; no new requests."""


class ModelLoadError(PagodaError, OSError):
    """The model file could not be read or is malformed."""


class UnsupportedError(PagodaError):
    """Valid but not supported by this build (a dtype, an architecture, a KV cache type)."""


def raise_status(status: int, context: str = "") -> None:
    """Raises the exception for STATUS (not OK) with this thread's pagoda_last_error()."""
    msg = _ffi.last_error()
    if context:
        msg = f"{context}: {msg}"
    cls = {
        _ffi.ERR_INVALID_ARG: InvalidRequestError,
        _ffi.ERR_TOO_LONG: PromptTooLongError,
        _ffi.ERR_BUSY: EngineBusyError,
        _ffi.ERR_CLOSED: EngineClosedError,
        _ffi.ERR_IO: ModelLoadError,
        _ffi.ERR_FORMAT: ModelLoadError,
        _ffi.ERR_UNSUPPORTED: UnsupportedError,
    }.get(status, PagodaError)
    raise cls(msg, status)
