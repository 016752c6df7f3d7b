"""Step and workflow states, and the ``StateStore`` the engine records them in."""

from __future__ import annotations

import enum
from typing import Protocol

import attrs
import trio

__all__ = [
    "InMemoryStateStore",
    "StateStore",
    "StepState",
    "StepStatus",
    "WorkflowState",
    "WorkflowStatus",
]


class StepStatus(enum.StrEnum):
    """Where one step of one run stands."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
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
    """One step's recorded state. Times are ``trio.current_time()`` seconds.

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


@attrs.frozen
class WorkflowState:
    """One run's recorded state. Times are ``trio.current_time()`` seconds."""

    instance_id: str
    workflow_id: str
    status: WorkflowStatus
    started_at: float
    finished_at: float | None = None
    failed_step: str | None = None
    error: str | None = None


class StateStore(Protocol):
    """Where the engine records states, e.g. for ``GET /workers/{id}`` job status.

    The engine awaits each call. A call that raises fails the run at once with
    :class:`~smg_trio.workflow.StateStoreError` (the store's exception as ``__cause__``); it
    never retries and never hangs on a store error. Calls made while the run is finishing are
    shielded from cancellation and bounded by ``FINALIZE_TIMEOUT_S``.
    """

    async def save_workflow(self, state: WorkflowState) -> None:
        """Insert or replace the workflow record for ``state.instance_id``."""
        ...

    async def save_step(self, instance_id: str, state: StepState) -> None:
        """Insert or replace the record of ``state.step_id`` in run ``instance_id``."""
        ...

    async def load_workflow(self, instance_id: str) -> WorkflowState | None:
        """The workflow record of ``instance_id``, or ``None``."""
        ...

    async def load_steps(self, instance_id: str) -> dict[str, StepState]:
        """The step records of ``instance_id`` by step id (empty if unknown)."""
        ...

    async def delete(self, instance_id: str) -> None:
        """Forget ``instance_id``; a no-op if unknown."""
        ...


class InMemoryStateStore:
    """The default :class:`StateStore`: dictionaries. Every method is a trio checkpoint."""

    def __init__(self) -> None:
        self._workflows: dict[str, WorkflowState] = {}
        self._steps: dict[str, dict[str, StepState]] = {}

    async def save_workflow(self, state: WorkflowState) -> None:
        await trio.lowlevel.checkpoint()
        self._workflows[state.instance_id] = state
        self._steps.setdefault(state.instance_id, {})

    async def save_step(self, instance_id: str, state: StepState) -> None:
        await trio.lowlevel.checkpoint()
        self._steps.setdefault(instance_id, {})[state.step_id] = state

    async def load_workflow(self, instance_id: str) -> WorkflowState | None:
        await trio.lowlevel.checkpoint()
        return self._workflows.get(instance_id)

    async def load_steps(self, instance_id: str) -> dict[str, StepState]:
        await trio.lowlevel.checkpoint()
        return dict(self._steps.get(instance_id, {}))

    async def delete(self, instance_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self._workflows.pop(instance_id, None)
        self._steps.pop(instance_id, None)

    def prune_terminal(self, older_than_s: float) -> int:
        """Forget runs that finished more than ``older_than_s`` seconds ago (by
        ``trio.current_time()``); returns how many. smg's gateway sweeps with a 300 s TTL."""
        cutoff = trio.current_time() - older_than_s
        stale = [
            iid
            for iid, wf in self._workflows.items()
            if wf.finished_at is not None and wf.finished_at <= cutoff
        ]
        for iid in stale:
            del self._workflows[iid]
            self._steps.pop(iid, None)
        return len(stale)

    def __len__(self) -> int:
        return len(self._workflows)
