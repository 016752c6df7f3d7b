"""The OpenAI error envelope and the exception -> HTTP status mapping of the HTTP front."""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
import trio

from smg_trio.backend import NoWorkerAvailable
from smg_trio.errors import (
    ClientClosed,
    ConflictError,
    DuplicateRequestId,
    EngineDeadError,
    RequestError,
    RequestStreamClosed,
    ValidationError,
)
from smg_trio.protocol.types import EngineError

__all__ = [
    "ApiError",
    "Envelope",
    "anthropic_envelope",
    "EngineRequestFailed",
    "RETRY_AFTER_S",
    "engine_failure",
    "ErrorBody",
    "ErrorDetail",
    "error_type_for",
    "model_not_found",
    "to_api_error",
]

log = logging.getLogger(__name__)


class ErrorDetail(msgspec.Struct):
    """``{"message", "type", "param", "code"}``; ``code`` is a string or null (OpenAI/smg)."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    """The envelope ``{"error": ErrorDetail}``, also the payload of an SSE error event."""

    error: ErrorDetail


#: ``Retry-After`` seconds on a 503 for an engine's retryable request error, or for a known
#: model with no ready worker.
RETRY_AFTER_S = 1


class EngineRequestFailed(RequestError):
    """The engine ended a request with ``error``, or aborted it without being asked
    (``abort`` finish or an out-of-band finish). ``code`` is ``engine_error`` or
    ``engine_aborted`` (HTTP 500) unless the engine detailed the error
    (:func:`engine_failure`); ``retryable`` errors are 503 with ``Retry-After``."""

    def __init__(
        self, message: str, code: str, *, status: int = 500, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.retryable = retryable


def engine_failure(error: EngineError | None) -> EngineRequestFailed:
    """The failure for an ``error`` finish. With the engine's details (vLLM 0.33+):
    ``validation_error`` is a 400 with the engine's message, a retryable error a 503
    (retried once elsewhere by :meth:`RequestCall.run_with_retry`), anything else a 500
    ``engine_error`` with the message. Without details: the 500 ``engine_error`` as before."""
    if error is None:
        return EngineRequestFailed(
            "the engine failed the request (see the engine logs)", "engine_error"
        )
    if error.code == "validation_error":
        return EngineRequestFailed(error.message, "validation_error", status=400)
    if error.retryable:
        return EngineRequestFailed(error.message, error.code, status=503, retryable=True)
    return EngineRequestFailed(error.message, "engine_error")


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def error_type_for(status: int) -> str:
    """OpenAI ``error.type`` for an HTTP status: ``invalid_request_error`` for most 4xx,
    ``server_error`` for 5xx."""
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


class ApiError(Exception):
    """A fully decided error response: HTTP ``status`` plus the envelope fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message, error_type or error_type_for(status), param, code)
        #: Extra response headers (``retry-after`` on a 429 or a retryable 503).
        self.headers: dict[str, str] = {}
        if retry_after is not None:
            self.headers["retry-after"] = str(retry_after)

    def body(self) -> bytes:
        """The JSON envelope."""
        return msgspec.json.encode(ErrorBody(self.detail))


#: Renders an error response body (OpenAI's envelope, ``ApiError.body``, unless an API has
#: its own: Anthropic's for ``/v1/messages``).
Envelope = Callable[[ApiError], bytes]

_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class _AnthropicDetail(msgspec.Struct):
    type: str
    message: str


class _AnthropicError(msgspec.Struct):
    error: _AnthropicDetail
    type: str = "error"


def anthropic_envelope(err: ApiError) -> bytes:
    """Anthropic's error envelope ``{"type": "error", "error": {"type", "message"}}``; the
    HTTP status is the same as for OpenAI's (400, 401, 404, 413, 429, 500, 503)."""
    kind = _ANTHROPIC_TYPES.get(
        err.status, "invalid_request_error" if err.status < 500 else "api_error"
    )
    message = err.detail.message
    if err.detail.param and err.detail.param not in message:
        message = f"{err.detail.param}: {message}"
    return msgspec.json.encode(_AnthropicError(_AnthropicDetail(kind, message)))


def model_not_found(model: str) -> ApiError:
    """404 ``model_not_found`` (raised before any tokenization or engine traffic)."""
    return ApiError(
        404, f"The model '{model}' does not exist.", param="model", code="model_not_found"
    )


#: The message for a request whose JSON nests deeper than the decoder or renderer can follow.
TOO_DEEP = "the request JSON is nested too deeply"


def to_api_error(exc: BaseException) -> ApiError:
    """Map any exception to its response. Client input errors are 4xx, an unavailable or
    dead engine 503, an engine-side failure 500; never raises."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        status = 409 if isinstance(exc, ConflictError) else 400
        return ApiError(status, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, NoWorkerAvailable):  # no worker now; one may be back soon
        return ApiError(
            503,
            str(exc) or "no engine available",
            code="service_unavailable",
            retry_after=RETRY_AFTER_S,
        )
    if isinstance(exc, (EngineDeadError, ClientClosed)):
        return ApiError(503, str(exc) or "no engine available", code="service_unavailable")
    if isinstance(exc, EngineRequestFailed):
        retry = RETRY_AFTER_S if exc.retryable else None
        return ApiError(exc.status, str(exc), code=exc.code, retry_after=retry)
    if isinstance(exc, DuplicateRequestId):  # engine ids are unique by construction
        return ApiError(409, str(exc), code="duplicate_request_id")
    if isinstance(exc, RequestStreamClosed):
        return ApiError(
            500, "the engine ended the request without finishing it", code="engine_aborted"
        )
    if isinstance(exc, trio.TooSlowError):
        return ApiError(504, "the engine did not answer in time", code="timeout")
    if isinstance(exc, RecursionError):  # a nested structure in the request (tool schemas...)
        return ApiError(400, TOO_DEEP, code="invalid_value")
    log.exception("internal error", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error")
