"""Step and workflow statuses, and the recorded state of one step."""

from __future__ import annotations

import enum

import attrs

__all__ = ["StepState", "StepStatus", "WorkflowStatus"]


class StepStatus(enum.StrEnum):
    """Where one step of one run stands."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: ``run_if`` returned False; or, for the failure step, the run did not fail.
    SKIPPED = "skipped"
    #: The run stopped (cancelled, or failed elsewhere) before this step finished or started.
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the step is finished for good."""
        return self not in (StepStatus.PENDING, StepStatus.RUNNING)


class WorkflowStatus(enum.StrEnum):
    """Where one run stands."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the run is finished."""
        return self is not WorkflowStatus.RUNNING


@attrs.frozen
class StepState:
    """One step's state. Times are ``trio.current_time()`` seconds.

    ``attempt`` counts attempts started so far (0 when the step never ran: pending, skipped by
    ``run_if``, failed in ``run_if``, or cancelled before starting). ``last_error`` is
    ``"ExceptionType: message"`` of the latest failed attempt.
    """

    step_id: str
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0
    last_error: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
