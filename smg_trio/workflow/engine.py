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
from smg_trio.workflow.errors import StepTimeoutError, WorkflowError
from smg_trio.workflow.state import StepState, StepStatus, WorkflowStatus

__all__ = ["WorkflowEngine", "WorkflowHandle", "WorkflowResult"]

logger = logging.getLogger(__name__)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@attrs.frozen
class WorkflowResult:
    """How a run ended.

    Attributes:
        instance_id: The run's id.
        workflow_id: The definition's id.
        status: ``COMPLETED``, ``FAILED`` or ``CANCELLED``.
        steps: Final state of every step, the failure step included (all terminal).
        failed_step: The step whose failure failed the run, if any.
        error: That step's exception, or the engine fault, else ``None``.
    """

    instance_id: str
    workflow_id: str
    status: WorkflowStatus
    steps: Mapping[str, StepState]
    failed_step: str | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class _Run:
    """Mutable bookkeeping of one run, shared by its scheduler, its step tasks and its handle."""

    definition: WorkflowDefinition
    context: WorkflowContext
    steps: dict[str, StepState]
    status: WorkflowStatus = WorkflowStatus.RUNNING
    #: Cancels the run's nursery: a failing step, or an engine fault.
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
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
    view: WorkflowContext | None = None


class WorkflowHandle:
    """A started run: its live step states and a way to wait for its end."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    @property
    def instance_id(self) -> str:
        """The run's id."""
        return self._run.instance_id

    @property
    def status(self) -> WorkflowStatus:
        """``RUNNING`` until the run has recorded its final state."""
        return self._run.status

    @property
    def steps(self) -> Mapping[str, StepState]:
        """A snapshot of every step's latest state, the failure step included."""
        return dict(self._run.steps)

    @property
    def result(self) -> WorkflowResult | None:
        """The result once the run finished, else ``None``."""
        return self._run.result

    async def wait(self) -> WorkflowResult:
        """Wait until the run finishes and return its result (failed runs return too).

        Raises:
            WorkflowError: an engine fault ended the run.
        """
        await self._run.done.wait()
        if self._run.fault is not None:
            raise self._run.fault
        assert self._run.result is not None
        return self._run.result

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self._run.definition.id!r} {self.instance_id} {self.status}>"


class WorkflowEngine:
    """Runs :class:`WorkflowDefinition` DAGs.

    Each run is one trio nursery owned by whoever calls :meth:`run` (or the nursery passed to
    :meth:`start`); the engine keeps no background tasks and no state between runs: a run's
    states live on its handle and result, so nothing accumulates.
    """

    def __init__(self, *, rng: random.Random | None = None) -> None:
        """Create an engine.

        Args:
            rng: Source of retry jitter draws; pass ``random.Random(seed)`` for reproducible
                waits.
        """
        self._rng = rng if rng is not None else random.Random()

    async def run(
        self,
        definition: WorkflowDefinition,
        context: WorkflowContext | None = None,
        *,
        task_status: trio.TaskStatus[WorkflowHandle] = trio.TASK_STATUS_IGNORED,
    ) -> WorkflowResult:
        """Run ``definition`` to the end in a nursery of its own.

        Under ``nursery.start`` it reports a :class:`WorkflowHandle` at once. A step failure is
        an outcome, not an exception: it returns a ``FAILED`` result once the definition's
        ``on_failure`` step (if any) has run. Cancelling the caller's own scope records the run
        as cancelled and lets ``trio.Cancelled`` propagate.

        Args:
            definition: What to run.
            context: The root context (fresh and empty by default). One run per context.

        Raises:
            WorkflowError: the context already ran, or an internal fault.
        """
        run, handle = self._prepare(definition, context)
        task_status.started(handle)
        return await self._execute(run)

    async def start(
        self,
        nursery: trio.Nursery,
        definition: WorkflowDefinition,
        context: WorkflowContext | None = None,
    ) -> WorkflowHandle:
        """Start ``definition`` in ``nursery`` and return its handle.

        Unlike :meth:`run` under ``nursery.start``, no outcome of the run ever raises into
        ``nursery``: an engine fault is logged and re-raised by :meth:`WorkflowHandle.wait`.

        Raises:
            WorkflowError: the context already ran (nothing ran).
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
        run, handle = self._prepare(definition, context)
        task_status.started(handle)
        try:
            await self._execute(run)
        except WorkflowError:
            pass  # already logged by _finalize and kept on the handle for wait() to re-raise

    def _prepare(
        self, definition: WorkflowDefinition, context: WorkflowContext | None
    ) -> tuple[_Run, WorkflowHandle]:
        ctx = context if context is not None else WorkflowContext()
        ctx._bind()
        steps = {step.id: StepState(step.id) for step in definition.steps}
        if definition.on_failure is not None:
            steps[definition.on_failure.id] = StepState(definition.on_failure.id)
        run = _Run(definition=definition, context=ctx, steps=steps)
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
            # Here every step has ended. A caller's cancellation skips this (and propagates).
            if run.failed_step is not None or run.fault is not None:
                await self._compensate(run)
        finally:
            self._finalize(run)  # synchronous: records the end even while being cancelled
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
        received, and each step task records its terminal state *before* it publishes its one
        completion (``_step_task``, with no checkpoint in between). While a step is unaccounted
        for, the loop is blocked in ``receive()``; there is no window in which a finished step
        looks absent.
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
            if completion.status is StepStatus.FAILED:
                # The step task already called run.fail(), cancelling the run's scope and with
                # it every running sibling (fail fast); nothing more will be scheduled.
                return
            satisfied.add(completion.step_id)
            for dependent_id in definition.dependents(completion.step_id):
                dependent = definition.step(dependent_id)
                if dependent_id not in started and all(
                    dep in satisfied for dep in dependent.depends_on
                ):
                    launch(dependent)
        if len(started) != len(definition.steps):
            # Unreachable for a validated definition; fail loudly rather than hang or lie.
            stuck = [s.id for s in definition.steps if s.id not in started]
            run.set_fault(WorkflowError(f"workflow stalled: steps {stuck} never became ready"))

    async def _step_task(
        self, run: _Run, step: StepDefinition, completions: trio.MemorySendChannel[_Completion]
    ) -> None:
        outcome = await self._drive_step(run, step)
        # From the recorded terminal state to the published completion there is no checkpoint:
        # the context merge, the state and the completion happen as one atomic step of this
        # task (see _schedule for the smg race this rules out).
        self._record(run, step, outcome)
        if outcome.status is StepStatus.FAILED:
            run.fail(step.id, outcome.error)
        completions.send_nowait(_Completion(step.id, outcome.status))

    async def _compensate(self, run: _Run) -> None:
        """Run the definition's ``on_failure`` step after a failed run (every step has ended)."""
        step = run.definition.on_failure
        if step is None:
            return
        outcome = await self._drive_step(run, step)
        self._record(run, step, outcome)
        if outcome.status is StepStatus.FAILED:
            logger.error(
                "workflow %r (%s): failure step %r failed: %s",
                run.definition.id,
                run.instance_id,
                step.id,
                _describe(outcome.error) if outcome.error else "?",
            )

    def _record(self, run: _Run, step: StepDefinition, outcome: _Outcome) -> None:
        prior = run.steps[step.id]
        run.steps[step.id] = StepState(
            step.id,
            outcome.status,
            attempt=outcome.attempt,
            last_error=_describe(outcome.error) if outcome.error else prior.last_error,
            started_at=outcome.started_at,
            finished_at=trio.current_time(),
        )
        if outcome.status is StepStatus.SUCCEEDED and outcome.view is not None:
            run.context._merge(outcome.view)

    async def _drive_step(self, run: _Run, step: StepDefinition) -> _Outcome:
        """Evaluate ``run_if``, then attempt the step with retries. Returns its terminal outcome;
        raises only ``trio.Cancelled``."""
        if step.run_if is not None:
            try:
                should_run = bool(step.run_if(run.context))
            except Exception as exc:
                return _Outcome(StepStatus.FAILED, 0, None, error=exc)
            if not should_run:
                return _Outcome(StepStatus.SKIPPED, 0, None)
        first_started: float | None = None
        last_error: str | None = None
        attempt = 0
        while True:
            attempt += 1
            now = trio.current_time()
            first_started = now if first_started is None else first_started
            run.steps[step.id] = StepState(
                step.id, StepStatus.RUNNING, attempt, last_error, first_started
            )
            view = run.context._view(step.id)
            try:
                await _attempt(step, view, attempt)
            except Exception as exc:
                error: Exception = exc
            else:
                return _Outcome(StepStatus.SUCCEEDED, attempt, first_started, view=view)
            retryable = step.is_retryable is None or step.is_retryable(error)
            if attempt >= step.retry.max_attempts or not retryable:
                return _Outcome(StepStatus.FAILED, attempt, first_started, error=error)
            last_error = _describe(error)
            delay = step.retry.delay_s(attempt, self._rng)
            logger.warning(
                "workflow %r (%s): step %r attempt %d failed (%s); retrying in %.2f s",
                run.definition.id,
                run.instance_id,
                step.id,
                attempt,
                last_error,
                delay,
            )
            run.steps[step.id] = StepState(
                step.id, StepStatus.RUNNING, attempt, last_error, first_started
            )
            await trio.sleep(delay)

    def _finalize(self, run: _Run) -> None:
        """Mark unfinished steps, record the run's final state, wake waiters."""
        compensation = run.definition.on_failure
        dag_done = all(run.steps[s.id].status.terminal for s in run.definition.steps)
        if run.fault is not None or run.failed_step is not None:
            status = WorkflowStatus.FAILED
        elif not dag_done:
            status = WorkflowStatus.CANCELLED
        else:
            status = WorkflowStatus.COMPLETED
        now = trio.current_time()
        for step_id, state in list(run.steps.items()):
            if state.status.terminal:
                continue
            skipped = (
                compensation is not None
                and step_id == compensation.id
                and status is WorkflowStatus.COMPLETED
                and state.status is StepStatus.PENDING
            )
            end = StepStatus.SKIPPED if skipped else StepStatus.CANCELLED
            run.steps[step_id] = attrs.evolve(state, status=end, finished_at=now)
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
        if run.fault is not None:
            logger.error(
                "workflow %r (%s) failed: %s",
                run.definition.id,
                run.instance_id,
                run.fault,
                exc_info=run.fault,
            )
        run.done.set()


async def _attempt(step: StepDefinition, view: WorkflowContext, attempt: int) -> None:
    """One attempt under the step's ``timeout_s``. Raises ``StepTimeoutError`` on timeout."""
    timeout_s = step.timeout_s
    with trio.move_on_after(math.inf if timeout_s is None else timeout_s) as scope:
        await step.run(view)
        return
    assert scope.cancelled_caught
    assert timeout_s is not None
    raise StepTimeoutError(step.id, timeout_s, attempt)
