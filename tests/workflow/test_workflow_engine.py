"""The workflow engine: scheduling, run_if, retries, timeouts, failure, the failure step and
cancellation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from smg_trio.workflow import (
    ContextKey,
    RetryPolicy,
    StepDefinition,
    StepStatus,
    StepTimeoutError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowEngine,
    WorkflowError,
    WorkflowStatus,
)

#: Generous wall-clock bound for tests on the real clock; none of them should get near it.
LIMIT_S = 5.0

StepFn = Callable[[WorkflowContext], Awaitable[Any]]


class Recorder:
    """Step bodies that log which step ran, in order."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def fn(self, step_id: str) -> StepFn:
        async def run(ctx: WorkflowContext) -> None:
            self.ran.append(step_id)

        return run

    def step(self, step_id: str, *deps: str, **kwargs: Any) -> StepDefinition:
        return StepDefinition(step_id, self.fn(step_id), depends_on=deps, **kwargs)


def _fails(message: str = "boom") -> StepFn:
    async def run(ctx: WorkflowContext) -> None:
        await trio.lowlevel.checkpoint()
        raise RuntimeError(message)

    return run


async def _run(definition: WorkflowDefinition, context: WorkflowContext | None = None) -> Any:
    with trio.fail_after(LIMIT_S):
        return await WorkflowEngine().run(definition, context)


# -- basic scheduling -----------------------------------------------------------------------


async def test_linear_workflow_completes_in_order() -> None:
    rec = Recorder()
    wf = WorkflowDefinition("linear", [rec.step("a"), rec.step("b", "a"), rec.step("c", "b")])
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert rec.ran == ["a", "b", "c"]
    assert {s.status for s in result.steps.values()} == {StepStatus.SUCCEEDED}


async def test_diamond_respects_dependencies() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "diamond",
        [rec.step("d", "b", "c"), rec.step("b", "a"), rec.step("c", "a"), rec.step("a")],
    )
    await _run(wf)
    assert rec.ran[0] == "a"
    assert rec.ran[-1] == "d"
    assert sorted(rec.ran[1:3]) == ["b", "c"]


async def test_independent_steps_run_concurrently() -> None:
    # Each step waits for the other to have started: only completes if they overlap.
    a_started, b_started = trio.Event(), trio.Event()

    async def a(ctx: WorkflowContext) -> None:
        a_started.set()
        await b_started.wait()

    async def b(ctx: WorkflowContext) -> None:
        b_started.set()
        await a_started.wait()

    result = await _run(
        WorkflowDefinition("parallel", [StepDefinition("a", a), StepDefinition("b", b)])
    )
    assert result.status is WorkflowStatus.COMPLETED


async def test_context_sharing() -> None:
    mode: ContextKey[str] = ContextKey("connection_mode")

    async def detect(ctx: WorkflowContext) -> None:
        ctx.set(mode, "zmq")

    async def create(ctx: WorkflowContext) -> None:
        assert ctx.instance_id == "run-1"
        assert ctx.step_id == "create"
        ctx.set("made", f"{ctx.get(mode)}:{ctx.get('url')}")
        with pytest.raises(KeyError, match="missing"):
            ctx.get("missing")

    ctx = WorkflowContext({"url": "ipc:///tmp/e"}, instance_id="run-1")
    wf = WorkflowDefinition(
        "ctx",
        [
            StepDefinition("detect", detect),
            StepDefinition("create", create, depends_on=("detect",)),
        ],
    )
    result = await _run(wf, ctx)
    assert result.status is WorkflowStatus.COMPLETED
    assert result.instance_id == "run-1"
    assert ctx.get("made") == "zmq:ipc:///tmp/e"
    assert ctx.get(mode) == "zmq"
    assert ctx.get("connection_mode") == "zmq"  # a ContextKey and its name are one value


async def test_context_runs_once() -> None:
    rec = Recorder()
    wf = WorkflowDefinition("once", [rec.step("a")])
    ctx = WorkflowContext()
    await _run(wf, ctx)
    with pytest.raises(WorkflowError, match="already ran"):
        await _run(wf, ctx)


# -- run_if and skips -------------------------------------------------------------------------


async def test_run_if_false_mid_chain_completes() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "skip_mid",
        [rec.step("a"), rec.step("b", "a", run_if=lambda ctx: False), rec.step("c", "b")],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert rec.ran == ["a", "c"]
    assert result.steps["b"].status is StepStatus.SKIPPED
    assert result.steps["b"].attempt == 0
    assert result.steps["c"].status is StepStatus.SUCCEEDED


async def test_run_if_skip_chain_never_hangs() -> None:
    """Regression for smg 386be7a47 / #2036: instantly-skipped steps must never deadlock."""
    for _ in range(50):
        rec = Recorder()
        wf = WorkflowDefinition(
            "skip_chain",
            [
                rec.step("root", run_if=lambda ctx: False),
                rec.step("mid", "root", run_if=lambda ctx: False),
                rec.step("leaf", "mid"),
            ],
        )
        with trio.fail_after(1):
            result = await WorkflowEngine().run(wf)
        assert result.status is WorkflowStatus.COMPLETED
        assert rec.ran == ["leaf"]


async def test_run_if_reads_context() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "ctx_if",
        [
            rec.step("zmq_only", run_if=lambda ctx: ctx.get("mode") == "zmq"),
            rec.step("http_only", run_if=lambda ctx: ctx.get("mode") == "http"),
        ],
    )
    await _run(wf, WorkflowContext({"mode": "zmq"}))
    assert rec.ran == ["zmq_only"]


async def test_run_if_raising_fails_the_step() -> None:
    rec = Recorder()

    def broken(ctx: WorkflowContext) -> bool:
        raise LookupError("no such label")

    wf = WorkflowDefinition("bad_if", [rec.step("a", run_if=broken), rec.step("b", "a")])
    result = await _run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert result.failed_step == "a"
    assert isinstance(result.error, LookupError)
    assert result.steps["a"].status is StepStatus.FAILED
    assert result.steps["b"].status is StepStatus.CANCELLED
    assert rec.ran == []


async def test_failed_attempt_writes_are_discarded_parallel_writes_merge() -> None:
    attempts = 0

    async def flaky(ctx: WorkflowContext) -> None:
        nonlocal attempts
        attempts += 1
        ctx.set(f"attempt{attempts}", True)
        ctx.set("shared", attempts)
        if attempts == 1:
            raise RuntimeError("first attempt fails")

    async def other(ctx: WorkflowContext) -> None:
        ctx.set("other", "x")

    wf = WorkflowDefinition(
        "merge",
        [
            StepDefinition("flaky", flaky, retry=RetryPolicy(max_attempts=2, initial_s=0.0)),
            StepDefinition("other", other),
        ],
    )
    ctx = WorkflowContext()
    await _run(wf, ctx)
    assert ctx.snapshot() == {"attempt2": True, "shared": 2, "other": "x"}


# -- failure handling ---------------------------------------------------------------------


async def test_dependency_failure_blocks_dependents_and_cancels_siblings() -> None:
    rec = Recorder()
    sibling_cancelled = False

    async def sibling(ctx: WorkflowContext) -> None:
        nonlocal sibling_cancelled
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            sibling_cancelled = True
            raise

    wf = WorkflowDefinition(
        "fail",
        [
            StepDefinition("a", _fails("disk on fire")),
            rec.step("b", "a"),
            StepDefinition("sibling", sibling),
        ],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert result.failed_step == "a"
    assert result.steps["a"].last_error == "RuntimeError: disk on fire"
    assert result.steps["b"].status is StepStatus.CANCELLED
    assert result.steps["sibling"].status is StepStatus.CANCELLED
    assert sibling_cancelled
    assert rec.ran == []
    assert isinstance(result.error, RuntimeError)


async def test_failure_after_max_retries(autojump_clock: trio.testing.MockClock) -> None:
    wf = WorkflowDefinition(
        "max_retries", [StepDefinition("a", _fails(), retry=RetryPolicy(max_attempts=3))]
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert result.steps["a"].status is StepStatus.FAILED
    assert result.steps["a"].attempt == 3


async def test_non_retryable_error_fails_on_first_attempt() -> None:
    wf = WorkflowDefinition(
        "no_retry",
        [
            StepDefinition(
                "a",
                _fails(),
                retry=RetryPolicy(max_attempts=5),
                is_retryable=lambda exc: not isinstance(exc, RuntimeError),
            )
        ],
    )
    result = await _run(wf)
    assert result.steps["a"].attempt == 1


# -- time: retries, backoff, timeouts (autojump clock) --------------------------------------


async def test_retry_backoff_attempt_times(autojump_clock: trio.testing.MockClock) -> None:
    times: list[float] = []

    async def flaky(ctx: WorkflowContext) -> str:
        times.append(trio.current_time())
        if len(times) < 4:
            raise ConnectionError("not yet")
        return "up"

    policy = RetryPolicy(max_attempts=5, initial_s=1.0, multiplier=2.0, max_s=3.0)
    async with trio.open_nursery() as nursery:
        handle = await WorkflowEngine().start(
            nursery, WorkflowDefinition("retry", [StepDefinition("a", flaky, retry=policy)])
        )
        await trio.sleep(0.5)  # mock clock: during the first backoff
        live = handle.steps["a"]
        assert (live.status, live.attempt) == (StepStatus.RUNNING, 1)
        assert live.last_error == "ConnectionError: not yet"
    result = await handle.wait()
    assert result.status is WorkflowStatus.COMPLETED
    assert result.steps["a"].attempt == 4
    t0 = times[0]
    assert [t - t0 for t in times] == [0.0, 1.0, 3.0, 6.0]  # waits 1, 2, then 4 capped to 3


async def test_per_step_timeout(autojump_clock: trio.testing.MockClock) -> None:
    times: list[float] = []

    async def wedged(ctx: WorkflowContext) -> None:
        times.append(trio.current_time())
        await trio.sleep_forever()

    wf = WorkflowDefinition(
        "timeout",
        [
            StepDefinition(
                "a", wedged, timeout_s=5.0, retry=RetryPolicy(max_attempts=2, initial_s=1.0)
            )
        ],
    )
    start = trio.current_time()
    result = await WorkflowEngine().run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert isinstance(result.error, StepTimeoutError)
    assert result.error.attempt == 2
    assert [t - start for t in times] == [0.0, 6.0]
    assert trio.current_time() - start == 11.0
    assert (
        result.steps["a"].last_error == "StepTimeoutError: step 'a' attempt 2 timed out after 5 s"
    )


async def test_timeout_that_is_not_hit_does_not_fire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def quick(ctx: WorkflowContext) -> str:
        await trio.sleep(4.0)
        return "ok"

    result = await WorkflowEngine().run(
        WorkflowDefinition("quick", [StepDefinition("a", quick, timeout_s=5.0)])
    )
    assert result.status is WorkflowStatus.COMPLETED


# -- cancellation -----------------------------------------------------------------------------


async def test_outer_cancellation_records_cancelled_and_propagates() -> None:
    started = trio.Event()
    engine = WorkflowEngine()

    async def long_step(ctx: WorkflowContext) -> None:
        started.set()
        await trio.sleep_forever()

    wf = WorkflowDefinition("outer", [StepDefinition("long", long_step)])
    with trio.fail_after(LIMIT_S):
        with trio.CancelScope() as outer:
            async with trio.open_nursery() as nursery:
                handle = await nursery.start(engine.run, wf)
                await started.wait()
                outer.cancel()
        assert outer.cancelled_caught
        assert handle.status is WorkflowStatus.CANCELLED
    assert handle.steps["long"].status is StepStatus.CANCELLED


# -- many runs, one engine ----------------------------------------------------------------


async def test_concurrent_runs_share_one_engine() -> None:
    engine = WorkflowEngine()
    gate = trio.Event()

    async def wait_gate(ctx: WorkflowContext) -> None:
        await gate.wait()
        ctx.set("me", ctx.instance_id)

    wf = WorkflowDefinition(
        "many",
        [StepDefinition("a", wait_gate), StepDefinition("b", _fails(), run_if=lambda c: False)],
    )
    contexts = [WorkflowContext() for _ in range(20)]
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            handles = [await engine.start(nursery, wf, ctx) for ctx in contexts]
            assert {h.status for h in handles} == {WorkflowStatus.RUNNING}
            gate.set()
            results = [await h.wait() for h in handles]
    assert {r.status for r in results} == {WorkflowStatus.COMPLETED}
    assert len({h.instance_id for h in handles}) == 20
    assert all(c.get("me") == c.instance_id for c in contexts)


# -- the failure step (compensation) -------------------------------------------------------


def _cleanup(log: list[str]) -> StepFn:
    async def cleanup(ctx: WorkflowContext) -> None:
        await trio.lowlevel.checkpoint()
        log.append(f"cleanup saw {ctx.get('made')}")

    return cleanup


async def _make(ctx: WorkflowContext) -> None:
    ctx.set("made", "socket")


async def test_failure_step_runs_after_a_failure_with_what_succeeded() -> None:
    log: list[str] = []
    sibling_ended = False

    async def sibling(ctx: WorkflowContext) -> None:
        nonlocal sibling_ended
        try:
            await trio.sleep_forever()
        finally:
            sibling_ended = True
            log.append("sibling ended")

    wf = WorkflowDefinition(
        "compensate",
        [
            StepDefinition("make", _make),
            StepDefinition("use", _fails("engine gone"), depends_on=("make",)),
            StepDefinition("sibling", sibling, depends_on=("make",)),
        ],
        on_failure=StepDefinition("cleanup", _cleanup(log)),
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert result.failed_step == "use"
    assert isinstance(result.error, RuntimeError)
    assert log == ["sibling ended", "cleanup saw socket"]  # after every other step ended
    assert sibling_ended
    assert result.steps["cleanup"].status is StepStatus.SUCCEEDED
    assert result.steps["cleanup"].attempt == 1


async def test_failure_step_is_skipped_when_the_run_completes() -> None:
    log: list[str] = []
    wf = WorkflowDefinition(
        "fine", [StepDefinition("make", _make)], on_failure=StepDefinition("cleanup", _cleanup(log))
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert log == []
    assert result.steps["cleanup"].status is StepStatus.SKIPPED


async def test_failing_failure_step_keeps_the_run_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def wedged(ctx: WorkflowContext) -> None:
        await trio.sleep_forever()

    wf = WorkflowDefinition(
        "bad_cleanup",
        [StepDefinition("a", _fails("first"))],
        on_failure=StepDefinition("cleanup", wedged, timeout_s=2.0),
    )
    result = await WorkflowEngine().run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert result.failed_step == "a"
    assert str(result.error) == "first"
    assert result.steps["cleanup"].status is StepStatus.FAILED
    assert result.steps["cleanup"].last_error == (
        "StepTimeoutError: step 'cleanup' attempt 1 timed out after 2 s"
    )


async def test_failure_step_does_not_run_when_the_caller_cancels() -> None:
    log: list[str] = []
    started = trio.Event()

    async def long_step(ctx: WorkflowContext) -> None:
        started.set()
        await trio.sleep_forever()

    wf = WorkflowDefinition(
        "cancelled",
        [StepDefinition("make", _make), StepDefinition("long", long_step, depends_on=("make",))],
        on_failure=StepDefinition("cleanup", _cleanup(log)),
    )
    with trio.fail_after(LIMIT_S):
        with trio.CancelScope() as outer:
            async with trio.open_nursery() as nursery:
                handle = await nursery.start(WorkflowEngine().run, wf)
                await started.wait()
                outer.cancel()
    assert handle.status is WorkflowStatus.CANCELLED
    assert handle.steps["cleanup"].status is StepStatus.CANCELLED
    assert log == []
