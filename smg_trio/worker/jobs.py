"""Registration jobs (``GET /workers/jobs/{id}``) and the table that expires finished ones."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from smg_trio.workflow import StepState, WorkflowHandle

if TYPE_CHECKING:
    from smg_trio.worker.spec import WorkerSpec

__all__ = ["DEFAULT_JOB_TTL_S", "DEFAULT_MAX_FINISHED_JOBS", "JobTable", "RegistrationJob"]

#: Finished jobs kept for ``GET /workers/jobs/{id}`` (the oldest beyond this expire first).
DEFAULT_MAX_FINISHED_JOBS = 1000
#: Seconds a finished job stays readable.
DEFAULT_JOB_TTL_S = 3600.0

JobStatus = Literal["pending", "running", "succeeded", "failed", "cancelled"]


@attrs.define(eq=False)
class RegistrationJob:
    """One registration workflow run. While it runs, ``run`` is its workflow handle, so the
    job document shows each step's live status and attempt count; :meth:`finish` keeps only
    the final step states (a finished job holds no reference to the worker)."""

    job_id: str
    spec: WorkerSpec
    status: JobStatus = "pending"
    worker_id: str | None = None
    error: str | None = None
    run: WorkflowHandle | None = None
    final_states: Mapping[str, StepState] | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    @property
    def states(self) -> Mapping[str, StepState]:
        """Each step's latest state (empty until the workflow started)."""
        if self.final_states is not None:
            return self.final_states
        return {} if self.run is None else self.run.steps

    @property
    def steps(self) -> dict[str, str]:
        """Each step's status."""
        return {k: str(v.status) for k, v in self.states.items()}

    def finish(self, status: JobStatus, error: str | None = None) -> None:
        """Record the end and wake waiters."""
        self.status, self.error = status, error
        self.final_states = dict(self.states)
        self.run = None
        self.done.set()

    def to_json(self) -> dict[str, Any]:
        """The job status document. ``attempts`` counts the attempts of each step that ran."""
        states = self.states
        return {
            "job_id": self.job_id,
            "status": self.status,
            "worker_id": self.worker_id,
            "url": self.spec.url,
            "error": self.error,
            "steps": self.steps,
            "attempts": {k: v.attempt for k, v in states.items() if v.attempt},
        }


class JobTable(Mapping[str, RegistrationJob]):
    """Registration jobs by id. Running jobs are kept; finished ones (:meth:`finished`) expire
    once more than ``max_finished`` have finished after them, or ``ttl_s`` seconds after they
    finished. Expiry is lazy (on every add, finish and read), so no task runs for it."""

    def __init__(
        self,
        *,
        max_finished: int = DEFAULT_MAX_FINISHED_JOBS,
        ttl_s: float = DEFAULT_JOB_TTL_S,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if max_finished < 0:
            raise ValueError(f"max_finished must be >= 0, got {max_finished}")
        if not ttl_s >= 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self.max_finished = max_finished
        self.ttl_s = ttl_s
        self._clock = clock
        self._jobs: dict[str, RegistrationJob] = {}
        #: Finished job ids, oldest first, with when they finished.
        self._finished: OrderedDict[str, float] = OrderedDict()

    def add(self, job: RegistrationJob) -> None:
        """Record a new (running) job."""
        self._expire()
        self._jobs[job.job_id] = job

    def finished(self, job: RegistrationJob) -> None:
        """Start ``job``'s expiry clock."""
        if job.job_id in self._jobs:
            self._finished[job.job_id] = self._clock()
            self._finished.move_to_end(job.job_id)
        self._expire()

    def _expire(self) -> None:
        cutoff = -math.inf if math.isinf(self.ttl_s) else self._clock() - self.ttl_s
        while self._finished:
            job_id, at = next(iter(self._finished.items()))
            if len(self._finished) <= self.max_finished and at > cutoff:
                break
            del self._finished[job_id]
            self._jobs.pop(job_id, None)

    def __getitem__(self, job_id: str) -> RegistrationJob:
        self._expire()
        return self._jobs[job_id]

    def __iter__(self) -> Iterator[str]:
        self._expire()
        return iter(list(self._jobs))

    def __len__(self) -> int:
        self._expire()
        return len(self._jobs)
