"""Runs workflow DAGs: one trio nursery per run, scheduling driven by a channel of completions."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping

import attrs
import trio

from smg_trio.workflow.context import WorkflowContext
from smg_trio.workflow.definition import StepDefinition, WorkflowDefinition
from smg_trio.workflow.errors import (
    SkipStep,
    StateStoreError,
    StepTimeoutError,
    WorkflowCancelled,
    WorkflowError,
    WorkflowFailed,
)
from smg_trio.workflow.events import (
    DEFAULT_SUBSCRIBER_BUFFER,
    EventBus,
    EventKind,
    WorkflowEvent,
)
from smg_trio.workflow.state import (
    InMemoryStateStore,
    StateStore,
    StepState,
    StepStatus,
    WorkflowState,
    WorkflowStatus,
)

__all__ = ["FINALIZE_TIMEOUT_S", "WorkflowEngine", "WorkflowHandle", "WorkflowResult"]

logger = logging.getLogger(__name__)

#: How long a finishing run may spend recording its final states, in seconds. This work is
#: shielded from cancellation (a cancelled run must still record itself as cancelled), so it
#: needs its own bound: a wedged store must not keep a cancelled run alive.
FINALIZE_TIMEOUT_S = 10.0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@attrs.frozen
class WorkflowResult:
    """How a run ended.

    Attributes:
        instance_id: The run's id.
        workflow_id: The definition's id.
        status: ``COMPLETED``, ``FAILED`` or ``CANCELLED``.
        steps: Final state of every step (all terminal).
        failed_step: The step whose failure failed the run, if any.
        error: That step's exception, or the engine fault (``StateStoreError``), else ``None``.
    """

    instance_id: str
    workflow_id: str
    status: WorkflowStatus
    steps: Mapping[str, StepState]
    failed_step: str | None = None
    error: BaseException | None = None

    def raise_for_status(self) -> WorkflowResult:
        """Return ``self`` if the run completed.

        Raises:
            WorkflowFailed: the run failed; ``__cause__`` is the step's exception.
            WorkflowCancelled: the run was cancelled.
        """
        if self.status is WorkflowStatus.FAILED:
            where = f" at step {self.failed_step!r}" if self.failed_step else ""
            detail = f": {_describe(self.error)}" if self.error is not None else ""
            raise WorkflowFailed(
                f"workflow {self.workflow_id!r} ({self.instance_id}) failed{where}{detail}", self
            ) from self.error
        if self.status is WorkflowStatus.CANCELLED:
            raise WorkflowCancelled(
                f"workflow {self.workflow_id!r} ({self.instance_id}) was cancelled", self
            )
        return self


@attrs.define(eq=False)
class _Run:
    """Mutable bookkeeping of one run, shared by its scheduler, its step tasks and its handle."""

    definition: WorkflowDefinition
    context: WorkflowContext
    started_at: float
    steps: dict[str, StepState]
    status: WorkflowStatus = WorkflowStatus.RUNNING
    #: Cancels the run's nursery: ``WorkflowHandle.cancel``, a failing step, or an engine fault.
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    cancel_requested: bool = False
    failed_step: str | None = None
    failure: BaseException | None = None
    fault: WorkflowError | None = None
    result: WorkflowResult | None = None
    done: trio.Event = attrs.Factory(trio.Event)

    @property
    def instance_id(self) -> str:
        return self.context.instance_id

    def fail(self, step_id: str, error: BaseException | None) -> None:
        if self.failed_step is None and self.fault is None:
            self.failed_step = step_id
            self.failure = error
        self.scope.cancel()

    def set_fault(self, fault: WorkflowError) -> None:
        if self.fault is None:
            self.fault = fault
        self.scope.cancel()


@attrs.frozen
class _Completion:
    """A step task's one message to its scheduler, sent after its terminal state is recorded."""

    step_id: str
    status: StepStatus


@attrs.frozen
class _Outcome:
    status: StepStatus
    attempt: int
    started_at: float | None
    error: BaseException | None = None
    reason: str | None = None
    view: WorkflowContext | None = None
    value: object = None


class WorkflowHandle:
    """A started run: its live status, a way to wait for it, and a way to cancel it."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    @property
    def instance_id(self) -> str:
        """The run's id."""
        return self._run.instance_id

    @property
    def workflow_id(self) -> str:
        """The definition's id."""
        return self._run.definition.id

    @property
    def context(self) -> WorkflowContext:
        """The run's root context."""
        return self._run.context

    @property
    def status(self) -> WorkflowStatus:
        """``RUNNING`` until the run has recorded its final state."""
        return self._run.status

    @property
    def steps(self) -> Mapping[str, StepState]:
        """A snapshot of every step's latest state."""
        return dict(self._run.steps)

    @property
    def result(self) -> WorkflowResult | None:
        """The result once the run finished, else ``None``."""
        return self._run.result

    def cancel(self) -> None:
        """Cancel the run: its running steps see ``trio.Cancelled``, unfinished steps end
        ``CANCELLED`` and the run ends ``CANCELLED``. Idempotent; no effect once finished."""
        if not self._run.status.terminal:
            self._run.cancel_requested = True
            self._run.scope.cancel()

    async def wait(self) -> WorkflowResult:
        """Wait until the run finishes and return its result (failed runs return too).

        Raises:
            StateStoreError: the run failed because its state store failed.
            WorkflowError: another engine fault ended the run.
        """
        await self._run.done.wait()
        if self._run.fault is not None:
            raise self._run.fault
        assert self._run.result is not None
        return self._run.result

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.workflow_id!r} {self.instance_id} {self.status}>"


class WorkflowEngine:
    """Runs :class:`WorkflowDefinition` DAGs.

    Each run is one trio nursery owned by whoever calls :meth:`run` (or the nursery passed to
    :meth:`start`); the engine keeps no background tasks. Runs are independent: an engine can
    run any number at once, all recording into one state store and publishing to one event bus.
    """

    def __init__(
        self, *, store: StateStore | None = None, rng: random.Random | None = None
    ) -> None:
        """Create an engine.

        Args:
            store: Where step and workflow states are recorded; an :class:`InMemoryStateStore`
                by default.
            rng: Source of retry jitter draws; pass ``random.Random(seed)`` for reproducible
                waits.
        """
        self.store: StateStore = store if store is not None else InMemoryStateStore()
        self._rng = rng if rng is not None else random.Random()
        self._events = EventBus()
        self._closed = False

    # -- public API ----------------------------------------------------------------------

    def subscribe(
        self, max_buffer: int = DEFAULT_SUBSCRIBER_BUFFER
    ) -> trio.MemoryReceiveChannel[WorkflowEvent]:
        """A channel of every lifecycle event from now on, in the order they happen.

        Delivery never blocks the engine: when this subscriber's ``max_buffer`` is full, new
        events are dropped for it, counted in :attr:`dropped_events` and logged as a warning.
        Close the channel to unsubscribe; :meth:`close` ends every subscription.

        Raises:
            ValueError: ``max_buffer < 1``.
            trio.ClosedResourceError: the engine was closed.
        """
        return self._events.subscribe(max_buffer)

    @property
    def dropped_events(self) -> int:
        """Events dropped because a subscriber's buffer was full."""
        return self._events.dropped

    def close(self) -> None:
        """Refuse new runs and end every event subscription. Runs in progress continue."""
        self._closed = True
        self._events.close()

    async def run(
        self,
        definition: WorkflowDefinition,
        context: WorkflowContext | None = None,
        *,
        task_status: trio.TaskStatus[WorkflowHandle] = trio.TASK_STATUS_IGNORED,
    ) -> WorkflowResult:
        """Run ``definition`` to the end in a nursery of its own.

        Under ``nursery.start`` it reports a :class:`WorkflowHandle` once the run is recorded
        as started. A step failure is an outcome, not an exception: it returns a ``FAILED``
        result (call ``raise_for_status()`` to turn it into :class:`WorkflowFailed`). A
        :meth:`WorkflowHandle.cancel` returns a ``CANCELLED`` result. Cancelling the caller's
        own scope records the run as cancelled and lets ``trio.Cancelled`` propagate.

        Args:
            definition: What to run.
            context: The root context (fresh and empty by default). One run per context.

        Raises:
            StateStoreError: the state store failed; running steps were cancelled and the run
                recorded (best effort) as failed. Raised even after ``task_status.started``.
            WorkflowError: the engine is closed, the context already ran, or an internal fault.
        """
        run, handle = await self._prepare(definition, context)
        task_status.started(handle)
        return await self._execute(run)

    async def start(
        self,
        nursery: trio.Nursery,
        definition: WorkflowDefinition,
        context: WorkflowContext | None = None,
    ) -> WorkflowHandle:
        """Start ``definition`` in ``nursery`` and return its handle once it is recorded as
        started.

        Unlike :meth:`run` under ``nursery.start``, no outcome of the run ever raises into
        ``nursery``: a state-store fault is logged and re-raised by :meth:`WorkflowHandle.wait`.

        Raises:
            StateStoreError: the store failed to record the start (nothing ran).
            WorkflowError: as for :meth:`run`, before anything ran.
        """
        handle: WorkflowHandle = await nursery.start(self._run_detached, definition, context)
        return handle

    # -- run lifecycle -------------------------------------------------------------------

    async def _run_detached(
        self,
        definition: WorkflowDefinition,
        context: WorkflowContext | None,
        *,
        task_status: trio.TaskStatus[WorkflowHandle] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        run, handle = await self._prepare(definition, context)
        task_status.started(handle)
        try:
            await self._execute(run)
        except WorkflowError:
            # Already logged by _execute and kept on the handle for wait() to re-raise.
            pass

    async def _prepare(
        self, definition: WorkflowDefinition, context: WorkflowContext | None
    ) -> tuple[_Run, WorkflowHandle]:
        if self._closed:
            raise WorkflowError("the workflow engine is closed")
        ctx = context if context is not None else WorkflowContext()
        ctx._bind(definition)
        now = trio.current_time()
        run = _Run(
            definition=definition,
            context=ctx,
            started_at=now,
            steps={step.id: StepState(step.id) for step in definition.steps},
        )
        await self._save_workflow(
            run, WorkflowState(run.instance_id, definition.id, run.status, now)
        )
        for state in run.steps.values():
            await self._save_step(run, state)
        self._emit(run, EventKind.WORKFLOW_STARTED)
        return run, WorkflowHandle(run)

    async def _execute(self, run: _Run) -> WorkflowResult:
        try:
            with run.scope:
                try:
                    # The run's one nursery: the scheduler is its body, every step a child.
                    async with trio.open_nursery() as nursery:
                        await self._schedule(run, nursery)
                except Exception as exc:  # an ExceptionGroup: a bug, not a step failure
                    fault = WorkflowError(
                        f"internal error in workflow {run.definition.id!r} ({run.instance_id})"
                    )
                    fault.__cause__ = exc
                    run.set_fault(fault)
        finally:
            # Record the end even when the caller is cancelling us (bounded; see constant).
            with trio.CancelScope(shield=True):
                await self._finalize(run)
        if run.fault is not None:
            raise run.fault
        assert run.result is not None
        return run.result

    async def _schedule(self, run: _Run, nursery: trio.Nursery) -> None:
        """Start steps as their dependencies are satisfied, one completion at a time.

        Only this function decides what is ready, and only from the completions it has
        received; it never inspects which steps are "running". smg's scheduler did (commit
        386be7a47, #2036): a step task removed itself from the shared ``running`` set *before*
        sending its completion, so the scheduler could see nothing running, nothing ready and
        nothing received, and declare a spurious "Workflow deadlocked". Here that state cannot
        be reached: ``outstanding`` counts started steps whose completion this loop has not yet
        received, and each step task records its terminal state in the store *before* it
        publishes its one completion (``_step_task``). While a step is unaccounted for, the loop
        is blocked in ``receive()``; there is no window in which a finished step looks absent.
        """
        definition = run.definition
        # Buffer = step count: each step task sends exactly one completion, so send_nowait can
        # never raise WouldBlock and no step ever waits on the scheduler.
        send, receive = trio.open_memory_channel[_Completion](len(definition.steps))
        satisfied: set[str] = set()
        started: set[str] = set()
        outstanding = 0

        def launch(step: StepDefinition) -> None:
            nonlocal outstanding
            started.add(step.id)
            outstanding += 1
            nursery.start_soon(
                self._step_task, run, step, send, name=f"workflow:{definition.id}:{step.id}"
            )

        for step_id in definition.roots:
            launch(definition.step(step_id))
        while outstanding:
            completion = await receive.receive()
            outstanding -= 1
            step = definition.step(completion.step_id)
            if completion.status is StepStatus.FAILED and step.on_failure == "fail_workflow":
                # The step task already called run.fail(), cancelling the run's scope and with
                # it every running sibling (fail fast); nothing more will be scheduled.
                return
            satisfied.add(step.id)
            for dependent_id in definition.dependents(step.id):
                dependent = definition.step(dependent_id)
                if dependent_id not in started and _ready(dependent, satisfied):
                    launch(dependent)
        if len(started) != len(definition.steps):
            # Unreachable for a validated definition; fail loudly rather than hang or lie.
            stuck = [s.id for s in definition.steps if s.id not in started]
            run.set_fault(WorkflowError(f"workflow stalled: steps {stuck} never became ready"))

    async def _step_task(
        self, run: _Run, step: StepDefinition, completions: trio.MemorySendChannel[_Completion]
    ) -> None:
        try:
            outcome = await self._drive_step(run, step)
            prior = run.steps[step.id]
            state = StepState(
                step.id,
                outcome.status,
                attempt=outcome.attempt,
                last_error=_describe(outcome.error) if outcome.error else prior.last_error,
                started_at=outcome.started_at,
                finished_at=trio.current_time(),
            )
            await self._save_step(run, state)
        except StateStoreError as exc:
            run.set_fault(exc)
            return
        # From the recorded terminal state to the published completion there is no checkpoint:
        # the context merge, the in-memory state, the event and the completion happen as one
        # atomic step of this task (see _schedule for the smg race this rules out).
        run.steps[step.id] = state
        run.context._finish(step.id, outcome.status, view=outcome.view, value=outcome.value)
        if outcome.status is StepStatus.FAILED and step.on_failure == "fail_workflow":
            run.fail(step.id, outcome.error)
        kind = {
            StepStatus.SUCCEEDED: EventKind.STEP_SUCCEEDED,
            StepStatus.FAILED: EventKind.STEP_FAILED,
            StepStatus.SKIPPED: EventKind.STEP_SKIPPED,
        }[outcome.status]
        error = _describe(outcome.error) if outcome.error is not None else outcome.reason
        self._emit(run, kind, step_id=step.id, attempt=outcome.attempt, error=error)
        completions.send_nowait(_Completion(step.id, outcome.status))

    async def _drive_step(self, run: _Run, step: StepDefinition) -> _Outcome:
        """Evaluate ``run_if``, then attempt the step with retries. Returns its terminal outcome;
        raises only ``StateStoreError`` (and ``trio.Cancelled``)."""
        if step.run_if is not None:
            try:
                should_run = bool(step.run_if(run.context))
            except Exception as exc:
                return _Outcome(StepStatus.FAILED, 0, None, error=exc)
            if not should_run:
                return _Outcome(StepStatus.SKIPPED, 0, None, reason="run_if returned False")
        first_started: float | None = None
        last_error: str | None = None
        attempt = 0
        while True:
            attempt += 1
            now = trio.current_time()
            first_started = now if first_started is None else first_started
            running = StepState(step.id, StepStatus.RUNNING, attempt, last_error, first_started)
            await self._save_step(run, running)
            run.steps[step.id] = running
            self._emit(run, EventKind.STEP_STARTED, step_id=step.id, attempt=attempt)
            view = run.context._view(step.id)
            try:
                value = await _attempt(step, view, attempt)
            except SkipStep as skip:
                return _Outcome(
                    StepStatus.SKIPPED, attempt, first_started, reason=skip.reason or "SkipStep"
                )
            except Exception as exc:
                error: Exception = exc
            else:
                return _Outcome(
                    StepStatus.SUCCEEDED, attempt, first_started, view=view, value=value
                )
            retryable = step.is_retryable is None or step.is_retryable(error)
            if attempt >= step.retry.max_attempts or not retryable:
                return _Outcome(StepStatus.FAILED, attempt, first_started, error=error)
            last_error = _describe(error)
            delay = step.retry.delay_s(attempt, self._rng)
            self._emit(
                run,
                EventKind.STEP_RETRYING,
                step_id=step.id,
                attempt=attempt,
                delay_s=delay,
                error=last_error,
            )
            await trio.sleep(delay)

    async def _finalize(self, run: _Run) -> None:
        """Mark unfinished steps cancelled, record the run's final state, publish, wake waiters.
        Runs shielded; bounded by ``FINALIZE_TIMEOUT_S``."""
        all_terminal = all(s.status.terminal for s in run.steps.values())
        if run.fault is not None or run.failed_step is not None:
            status = WorkflowStatus.FAILED
        elif not all_terminal:
            status = WorkflowStatus.CANCELLED
        else:
            status = WorkflowStatus.COMPLETED
        now = trio.current_time()
        with trio.move_on_after(FINALIZE_TIMEOUT_S) as bound:
            try:
                for step_id, state in list(run.steps.items()):
                    if state.status.terminal:
                        continue
                    cancelled = attrs.evolve(state, status=StepStatus.CANCELLED, finished_at=now)
                    await self._save_step(run, cancelled)
                    run.steps[step_id] = cancelled
                    run.context._finish(step_id, StepStatus.CANCELLED)
                    self._emit(
                        run, EventKind.STEP_CANCELLED, step_id=step_id, attempt=state.attempt
                    )
                error = run.fault if run.fault is not None else run.failure
                await self._save_workflow(
                    run,
                    WorkflowState(
                        run.instance_id,
                        run.definition.id,
                        status,
                        run.started_at,
                        finished_at=now,
                        failed_step=run.failed_step,
                        error=_describe(error) if error is not None else None,
                    ),
                )
            except StateStoreError as exc:
                run.set_fault(exc)
                status = WorkflowStatus.FAILED
        if bound.cancelled_caught:
            run.set_fault(
                StateStoreError(
                    f"the state store did not record the end of workflow {run.definition.id!r} "
                    f"({run.instance_id}) within {FINALIZE_TIMEOUT_S:g} s"
                )
            )
            status = WorkflowStatus.FAILED
        # Steps that never got a terminal record (store fault) still end cancelled in memory.
        for step_id, state in list(run.steps.items()):
            if not state.status.terminal:
                run.steps[step_id] = attrs.evolve(
                    state, status=StepStatus.CANCELLED, finished_at=now
                )
                run.context._finish(step_id, StepStatus.CANCELLED)
        error = run.fault if run.fault is not None else run.failure
        run.status = status
        run.result = WorkflowResult(
            instance_id=run.instance_id,
            workflow_id=run.definition.id,
            status=status,
            steps=dict(run.steps),
            failed_step=run.failed_step,
            error=error,
        )
        kind = {
            WorkflowStatus.COMPLETED: EventKind.WORKFLOW_COMPLETED,
            WorkflowStatus.FAILED: EventKind.WORKFLOW_FAILED,
            WorkflowStatus.CANCELLED: EventKind.WORKFLOW_CANCELLED,
        }[status]
        self._emit(
            run,
            kind,
            step_id=run.failed_step,
            error=_describe(error) if error is not None else None,
        )
        if run.fault is not None:
            logger.error(
                "workflow %r (%s) failed: %s",
                run.definition.id,
                run.instance_id,
                run.fault,
                exc_info=run.fault,
            )
        run.done.set()

    # -- store and events ------------------------------------------------------------------

    async def _save_workflow(self, run: _Run, state: WorkflowState) -> None:
        try:
            await self.store.save_workflow(state)
        except Exception as exc:
            raise StateStoreError(
                f"state store failed to record workflow {run.definition.id!r} ({run.instance_id}) "
                f"as {state.status}: {_describe(exc)}"
            ) from exc

    async def _save_step(self, run: _Run, state: StepState) -> None:
        try:
            await self.store.save_step(run.instance_id, state)
        except Exception as exc:
            raise StateStoreError(
                f"state store failed to record step {state.step_id!r} of workflow "
                f"{run.definition.id!r} ({run.instance_id}) as {state.status}: {_describe(exc)}"
            ) from exc

    def _emit(
        self,
        run: _Run,
        kind: EventKind,
        *,
        step_id: str | None = None,
        attempt: int | None = None,
        delay_s: float | None = None,
        error: str | None = None,
    ) -> None:
        self._events.publish(
            WorkflowEvent(
                kind=kind,
                workflow_id=run.definition.id,
                instance_id=run.instance_id,
                time=trio.current_time(),
                step_id=step_id,
                attempt=attempt,
                delay_s=delay_s,
                error=error,
            )
        )


def _ready(step: StepDefinition, satisfied: set[str]) -> bool:
    """All-of dependencies satisfied and, if any-of ones exist, at least one of them."""
    if not all(dep in satisfied for dep in step.depends_on):
        return False
    return not step.depends_on_any or any(dep in satisfied for dep in step.depends_on_any)


async def _attempt(step: StepDefinition, view: WorkflowContext, attempt: int) -> object:
    """One attempt under the step's ``timeout_s``. Raises ``StepTimeoutError`` on timeout."""
    timeout_s = step.timeout_s
    with trio.move_on_after(math.inf if timeout_s is None else timeout_s) as scope:
        return await step.run(view)
    assert scope.cancelled_caught
    assert timeout_s is not None
    raise StepTimeoutError(step.id, timeout_s, attempt)
