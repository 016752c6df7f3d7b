"""The workflow engine's errors, all under :class:`smg_trio.errors.SmgError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from smg_trio.errors import SmgError

if TYPE_CHECKING:
    from smg_trio.workflow.engine import WorkflowResult

__all__ = [
    "SkipStep",
    "StateStoreError",
    "StepResultUnavailable",
    "StepTimeoutError",
    "WorkflowCancelled",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowFailed",
]


class WorkflowError(SmgError):
    """Base class of workflow errors; raised as is for engine faults (closed engine, reused
    context, internal inconsistency)."""


class WorkflowDefinitionError(WorkflowError, ValueError):
    """A definition is invalid: a duplicate step id, a missing dependency, a cycle, or a bad
    retry/timeout setting. Raised when the definition is built, never at run time."""


class StateStoreError(WorkflowError):
    """The state store failed to record a step or workflow state. The run fails at once (its
    running steps are cancelled) and the store's exception is the ``__cause__``."""


class StepTimeoutError(WorkflowError):
    """One attempt of a step ran longer than the step's ``timeout_s``. Retryable."""

    def __init__(self, step_id: str, timeout_s: float, attempt: int) -> None:
        super().__init__(f"step {step_id!r} attempt {attempt} timed out after {timeout_s:g} s")
        self.step_id = step_id
        self.timeout_s = timeout_s
        self.attempt = attempt


class StepResultUnavailable(WorkflowError, LookupError):
    """A step's result was asked for but the step did not succeed (yet), is unknown, or is a
    dependent of the asking step (waiting on it would deadlock)."""


class WorkflowFailed(WorkflowError):
    """Raised by :meth:`WorkflowResult.raise_for_status` for a failed run; ``__cause__`` is the
    failing step's exception."""

    def __init__(self, message: str, result: WorkflowResult) -> None:
        super().__init__(message)
        self.result = result


class WorkflowCancelled(WorkflowError):
    """Raised by :meth:`WorkflowResult.raise_for_status` for a cancelled run."""

    def __init__(self, message: str, result: WorkflowResult) -> None:
        super().__init__(message)
        self.result = result


class SkipStep(Exception):
    """Raise from a step's ``run`` to end it as *skipped* (never retried). Its context writes
    are discarded and its dependents proceed, as smg's ``StepResult::Skip``."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
