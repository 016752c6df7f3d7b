"""The one exception tree of smg_trio; names follow smg's ``error.rs`` and vLLM."""

from __future__ import annotations

__all__ = [
    "ClientClosed",
    "CodecError",
    "ConflictError",
    "DecodeError",
    "DuplicateRequestId",
    "EncodeError",
    "EngineDeadError",
    "EngineError",
    "HandshakeError",
    "HandshakeTimeout",
    "InputRegistrationTimeout",
    "InvalidDataParallelRank",
    "ModelPathError",
    "RequestError",
    "RequestStreamClosed",
    "SmgError",
    "SocketDirError",
    "UnexpectedHandshakeMessage",
    "UnsupportedField",
    "UtilityCallFailed",
    "UtilityUnsupported",
    "ValidationError",
    "TransportError",
    "WorkerAddressError",
]


class SmgError(Exception):
    """Base class of every error smg_trio raises on purpose."""


# -- codec ---------------------------------------------------------------------------------


class CodecError(SmgError):
    """A message could not be encoded or decoded."""


class EncodeError(CodecError):
    """A request could not be encoded for the engine."""


class DecodeError(CodecError):
    """An engine message was malformed: wrong tag, wrong shape, bad tensor, bad dtype."""


# -- engine / transport --------------------------------------------------------------------


class EngineError(SmgError):
    """The engine connection failed."""


class EngineDeadError(EngineError):
    """The engine is gone: the ``ENGINE_CORE_DEAD`` sentinel, a transport error, a stuck send,
    persistent decode errors, or silence while requests were in flight. Latches the client."""


class TransportError(EngineError):
    """A socket operation failed in libzmq (for example ``EHOSTUNREACH`` from a
    ``ROUTER_MANDATORY`` send to an identity that is not connected). ``errno`` is libzmq's."""

    errno: int | None


class HandshakeError(EngineError):
    """The HELLO / INIT / READY / registration sequence failed."""


class HandshakeTimeout(HandshakeError):
    """No handshake message arrived within the per-stage deadline."""


class InputRegistrationTimeout(HandshakeTimeout):
    """An engine said READY but never registered on the input socket in time."""


class UnexpectedHandshakeMessage(HandshakeError):
    """A duplicate or unknown identity, a wrong status, or a malformed handshake frame."""


class SocketDirError(EngineError):
    """The ipc socket directory or a socket path is unsafe or unusable."""


class WorkerAddressError(SmgError, ValueError):
    """A worker URL or handshake override is invalid (must be ``ipc://`` / ``tcp://``)."""


class UtilityCallFailed(EngineError):
    """The engine answered a utility call with a failure (vLLM ``UtilityOutput.failure_message``,
    e.g. sleep mode not enabled); the engine itself is fine."""

    def __init__(self, method: str, rank: int, message: str) -> None:
        super().__init__(f"engine {rank} refused {method}: {message}")
        self.method = method
        self.rank = rank
        self.failure_message = message


class UtilityUnsupported(EngineError):
    """The engine's wire has no utility calls (TokenSpeed)."""

    def __init__(self, engine: str, method: str) -> None:
        super().__init__(f"{engine} engines take no utility calls ({method})")
        self.engine = engine
        self.method = method


class ClientClosed(EngineError):
    """The engine client is shutting down or its output stream ended."""


# -- request -------------------------------------------------------------------------------


class RequestError(SmgError):
    """A single request was refused or ended abnormally."""


class ValidationError(RequestError, ValueError):
    """Client input is invalid. ``param`` names the offending OpenAI field, if any; ``code``
    is the envelope's machine-readable code. The gateway decides the HTTP status (400)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ConflictError(ValidationError):
    """The input is valid but clashes with what exists (a worker URL or handshake address
    already registered); the gateway answers 409."""


class UnsupportedField(ValidationError):
    """The engine's wire cannot carry this field; never narrowed silently."""

    def __init__(self, param: str, engine: str, detail: str = "") -> None:
        msg = f"'{param}' is not supported over the {engine} ZMQ backend"
        if detail:
            msg = f"{msg}: {detail}"
        super().__init__(msg, param=param, code="unsupported_field")


class ModelPathError(ValidationError):
    """A model directory, or a file read from one, resolves outside the allowed model roots
    (``--allowed-model-dirs``). The message never says whether the outside path exists."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model_path", code="model_path_not_allowed")


class InvalidDataParallelRank(ValidationError):
    """A pinned ``data_parallel_rank`` has no engine of that index."""

    def __init__(self, rank: int, engine_count: int) -> None:
        super().__init__(
            f"data parallel rank {rank} is out of range for {engine_count} engine(s)",
            param="data_parallel_rank",
            code="invalid_data_parallel_rank",
        )


class DuplicateRequestId(RequestError):
    """A request id is already in flight on this client; nothing was sent."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request id {request_id!r} is already in flight")
        self.request_id = request_id


class RequestStreamClosed(RequestError):
    """A request's stream ended without a terminal output; it must never look complete."""

    def __init__(self, request_id: str, reason: str = "stream closed before finishing") -> None:
        super().__init__(f"request {request_id!r}: {reason}")
        self.request_id = request_id
