"""The workflow engine's errors, all under :class:`smg_trio.errors.SmgError`."""

from __future__ import annotations

from smg_trio.errors import SmgError

__all__ = ["StepTimeoutError", "WorkflowDefinitionError", "WorkflowError"]


class WorkflowError(SmgError):
    """Base class of workflow errors; raised as is for engine faults (a reused context, an
    internal inconsistency)."""


class WorkflowDefinitionError(WorkflowError, ValueError):
    """A definition is invalid: a duplicate step id, a missing dependency, a cycle, or a bad
    retry/timeout setting. Raised when the definition is built, never at run time."""


class StepTimeoutError(WorkflowError):
    """One attempt of a step ran longer than the step's ``timeout_s``. Retryable unless the
    step's ``is_retryable`` says otherwise."""

    def __init__(self, step_id: str, timeout_s: float, attempt: int) -> None:
        super().__init__(f"step {step_id!r} attempt {attempt} timed out after {timeout_s:g} s")
        self.step_id = step_id
        self.timeout_s = timeout_s
        self.attempt = attempt
