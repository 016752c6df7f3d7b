"""The registration workflow's timing (per-step timeouts, retries) and its DP-group check."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from smg_trio.connector.tasks import TASKS_TIMEOUT_S
from smg_trio.errors import (
    EngineError,
    HandshakeError,
    SocketDirError,
    UnexpectedHandshakeMessage,
)
from smg_trio.transport.handshake import EngineRegistration
from smg_trio.workflow import RetryPolicy, StepTimeoutError

__all__ = [
    "DpGroup",
    "DpGroupError",
    "RegistrationTiming",
    "bind_retryable",
    "check_dp_group",
    "handshake_retryable",
    "tokenizer_retryable",
]


def _transient() -> RetryPolicy:
    return RetryPolicy(max_attempts=3, initial_s=1.0, multiplier=2.0, max_s=10.0, jitter_ratio=0.1)


@attrs.frozen
class RegistrationTiming:
    """Per-attempt timeouts (seconds) and retries of the registration steps.

    ``handshake_timeout_s`` ``None`` means three times the manager's per-stage handshake
    deadline (HELLO, READY, input registration), a backstop behind the handshake's own
    per-stage timeouts.
    """

    tokenizer_timeout_s: float = 120.0
    tokenizer_retry: RetryPolicy = attrs.field(factory=_transient)
    bind_timeout_s: float = 10.0
    bind_retry: RetryPolicy = attrs.field(factory=_transient)
    handshake_timeout_s: float | None = None
    handshake_retry: RetryPolicy = attrs.field(factory=_transient)
    #: discover_metadata, check_dp_group and activate: synchronous bookkeeping.
    step_timeout_s: float = 10.0
    #: The failure step: closing the sockets and forgetting the worker.
    cleanup_timeout_s: float = 10.0
    #: The bound on the engine's ``get_supported_tasks`` answer (asked beside the
    #: registration, not in it); unanswered, the engine is taken as generate-only.
    tasks_timeout_s: float = TASKS_TIMEOUT_S


def tokenizer_retryable(exc: Exception) -> bool:
    """A tokenizer load is retried after an I/O error (a file still being written, a network
    filesystem hiccup). A validation error (a path outside the model roots, not a model
    directory, a malformed file) fails at once, and so does a timeout: the abandoned read may
    still hold the filesystem."""
    return isinstance(exc, OSError)


def bind_retryable(exc: Exception) -> bool:
    """A handshake bind is retried when the address is busy (another gateway still stopping),
    not when the socket directory or path is unsafe."""
    return isinstance(exc, EngineError | OSError | StepTimeoutError) and not isinstance(
        exc, SocketDirError
    )


def handshake_retryable(exc: Exception) -> bool:
    """A handshake is retried after a timeout (an engine restarted or still starting) and
    after an aborted attempt; not after an incompatible engine's message, nor when the
    socket directory is unsafe."""
    if isinstance(exc, UnexpectedHandshakeMessage | SocketDirError):
        return False
    return isinstance(exc, HandshakeError | EngineError | OSError | StepTimeoutError)


class DpGroupError(EngineError):
    """The engines of a DP worker do not form the group its spec asked for."""


@attrs.frozen
class DpGroup:
    """What a DP worker's engines agreed on."""

    ranks: tuple[int | None, ...]
    lockstep: bool
    max_model_len: int


def check_dp_group(dp_size: int, engines: Sequence[EngineRegistration]) -> DpGroup:
    """Check that ``engines`` are one DP group of ``dp_size`` ranks.

    - exactly ``dp_size`` engines, whose 2-byte indices are distinct ranks below ``dp_size``;
    - every rank reports the same ``data_parallel_size``; for a lockstep (MoE) group it is
      ``dp_size`` and each rank's reported ``data_parallel_rank`` is its index, or the
      gateway's wave wake-ups would miss a member;
    - ranks may report different ``max_model_len`` (auto-fitted to each GPU's memory): the
      smallest is the worker's, so no rank gets a prompt it cannot hold.

    Raises:
        DpGroupError: naming what disagrees.
    """
    if len(engines) != dp_size:
        raise DpGroupError(f"expected {dp_size} engines, {len(engines)} completed the handshake")
    ranks = tuple(e.index for e in engines)
    indexed = [r for r in ranks if r is not None]
    if len(set(indexed)) != len(indexed) or any(r >= dp_size for r in indexed):
        raise DpGroupError(
            f"engine ranks {sorted(indexed)} are not distinct ranks below dp_size {dp_size}"
        )
    sizes = sorted({e.ready.data_parallel_size for e in engines})
    if len(sizes) != 1:
        raise DpGroupError(f"engines disagree on data_parallel_size: {sizes}")
    lockstep = sizes[0] > 1
    if lockstep:
        if sizes[0] != dp_size:
            raise DpGroupError(
                f"engines report a DP group of {sizes[0]}, but the worker has dp_size {dp_size}"
            )
        wrong = [(e.index, e.ready.data_parallel_rank) for e in engines]
        wrong = [(i, r) for i, r in wrong if i != r]
        if wrong:
            pairs = ", ".join(f"engine {i} says rank {r}" for i, r in wrong)
            raise DpGroupError(f"lockstep ranks do not match their identities: {pairs}")
    max_len = min(e.ready.max_model_len for e in engines)
    return DpGroup(ranks=ranks, lockstep=lockstep, max_model_len=max_len)
