"""The workflow engine: scheduling, run_if, any-of, retries, timeouts, failure, cancellation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from smg_trio.workflow import (
    ContextKey,
    RetryPolicy,
    SkipStep,
    StepDefinition,
    StepStatus,
    StepTimeoutError,
    WorkflowCancelled,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowEngine,
    WorkflowError,
    WorkflowFailed,
    WorkflowStatus,
)

#: Generous wall-clock bound for tests on the real clock; none of them should get near it.
LIMIT_S = 5.0

StepFn = Callable[[WorkflowContext], Awaitable[Any]]


class Recorder:
    """Step bodies that log which step ran, in order."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def fn(self, step_id: str, value: object = None) -> StepFn:
        async def run(ctx: WorkflowContext) -> object:
            self.ran.append(step_id)
            return value

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
    assert result.raise_for_status() is result


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


async def test_context_sharing_and_results() -> None:
    mode: ContextKey[str] = ContextKey("connection_mode")

    async def detect(ctx: WorkflowContext) -> int:
        ctx.set(mode, "zmq")
        return 42

    async def create(ctx: WorkflowContext) -> str:
        assert ctx.instance_id == "run-1"
        assert ctx.workflow_id == "ctx"
        return f"{ctx.get(mode)}:{ctx.result('detect')}:{ctx.get('url')}"

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
    assert ctx.result("create") == "zmq:42:ipc:///tmp/e"
    assert ctx.get(mode) == "zmq"


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


async def test_skip_step_raised_by_a_step_discards_its_writes() -> None:
    async def external_only(ctx: WorkflowContext) -> None:
        ctx.set("connection_mode", "stale")
        raise SkipStep("local worker")

    async def local(ctx: WorkflowContext) -> None:
        ctx.set("connection_mode", "zmq")

    rec = Recorder()
    wf = WorkflowDefinition(
        "skip_raise",
        [
            StepDefinition("external", external_only, retry=RetryPolicy(max_attempts=3)),
            StepDefinition("local", local),
            rec.step("after", "external", "local"),
        ],
    )
    ctx = WorkflowContext()
    result = await _run(wf, ctx)
    assert result.steps["external"].status is StepStatus.SKIPPED
    assert result.steps["external"].attempt == 1  # a skip is never retried
    assert ctx.get("connection_mode") == "zmq"  # the smg #2013 clobber cannot happen
    assert rec.ran == ["after"]


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


# -- any-of -------------------------------------------------------------------------------


async def test_depends_on_any_runs_once_after_first_dependency() -> None:
    gate = trio.Event()
    rec = Recorder()

    async def slow(ctx: WorkflowContext) -> None:
        await gate.wait()
        rec.ran.append("slow")

    async def joiner(ctx: WorkflowContext) -> None:
        rec.ran.append("join")
        gate.set()

    wf = WorkflowDefinition(
        "any",
        [
            StepDefinition("slow", slow),
            rec.step("fast"),
            StepDefinition("join", joiner, depends_on_any=("slow", "fast")),
        ],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert rec.ran == ["fast", "join", "slow"]


async def test_depends_on_any_combined_with_depends_on() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "any_all",
        [
            rec.step("base"),
            rec.step("x", "base"),
            rec.step("y", run_if=lambda ctx: False),
            StepDefinition("join", rec.fn("join"), depends_on=("base", "x"), depends_on_any=("y",)),
        ],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert rec.ran.count("join") == 1
    assert rec.ran.index("join") > rec.ran.index("x")


async def test_depends_on_any_one_fails_one_succeeds() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "any_one_fails",
        [
            StepDefinition("bad", _fails(), on_failure="continue"),
            rec.step("good"),
            StepDefinition("join", rec.fn("join"), depends_on_any=("bad", "good")),
        ],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert result.steps["bad"].status is StepStatus.FAILED
    assert rec.ran.count("join") == 1


async def test_depends_on_any_all_fail_blocks_dependent() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "any_all_fail",
        [
            StepDefinition("a", _fails("a broke")),
            StepDefinition("b", _fails("b broke")),
            StepDefinition("join", rec.fn("join"), depends_on_any=("a", "b")),
        ],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert result.failed_step in {"a", "b"}
    assert result.steps["join"].status is StepStatus.CANCELLED
    assert rec.ran == []


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
    with pytest.raises(WorkflowFailed, match="failed at step 'a'") as info:
        result.raise_for_status()
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_on_failure_continue_lets_dependents_run() -> None:
    rec = Recorder()
    wf = WorkflowDefinition(
        "continue",
        [
            StepDefinition("detect_backend", _fails(), on_failure="continue"),
            rec.step("discover", "detect_backend"),
        ],
    )
    result = await _run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert result.steps["detect_backend"].status is StepStatus.FAILED
    assert result.steps["detect_backend"].last_error == "RuntimeError: boom"
    assert rec.ran == ["discover"]


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
    engine = WorkflowEngine()
    events = engine.subscribe()
    result = await engine.run(
        WorkflowDefinition("retry", [StepDefinition("a", flaky, retry=policy)])
    )
    assert result.status is WorkflowStatus.COMPLETED
    assert result.steps["a"].attempt == 4
    t0 = times[0]
    assert [t - t0 for t in times] == [0.0, 1.0, 3.0, 6.0]  # waits 1, 2, then 4 capped to 3
    retrying = []
    while True:
        try:
            event = events.receive_nowait()
        except trio.WouldBlock:
            break
        if event.kind == "step_retrying":
            retrying.append((event.attempt, event.delay_s, event.error))
    assert retrying == [
        (1, 1.0, "ConnectionError: not yet"),
        (2, 2.0, "ConnectionError: not yet"),
        (3, 3.0, "ConnectionError: not yet"),
    ]


async def test_per_step_timeout(autojump_clock: trio.testing.MockClock) -> None:
    times: list[float] = []

    async def wedged(ctx: WorkflowContext) -> None:
        times.append(trio.current_time())
        await trio.sleep_forever()

    wf = WorkflowDefinition(
        "timeout",
        [StepDefinition("a", wedged, timeout_s=5.0, retry=RetryPolicy.fixed(1.0, max_attempts=2))],
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


async def test_handle_cancel_cancels_running_steps() -> None:
    started = trio.Event()
    saw_cancelled = False
    rec = Recorder()

    async def long_step(ctx: WorkflowContext) -> None:
        nonlocal saw_cancelled
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            saw_cancelled = True
            raise

    engine = WorkflowEngine()
    wf = WorkflowDefinition(
        "cancel", [StepDefinition("long", long_step), rec.step("after", "long")]
    )
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            handle = await engine.start(nursery, wf)
            assert not handle.status.terminal
            await started.wait()
            assert handle.steps["long"].status is StepStatus.RUNNING
            handle.cancel()
            result = await handle.wait()
    assert saw_cancelled
    assert result.status is WorkflowStatus.CANCELLED
    assert handle.status is WorkflowStatus.CANCELLED
    assert result.steps["long"].status is StepStatus.CANCELLED
    assert result.steps["after"].status is StepStatus.CANCELLED
    assert rec.ran == []
    stored = await engine.store.load_workflow(handle.instance_id)
    assert stored is not None
    assert stored.status is WorkflowStatus.CANCELLED
    with pytest.raises(WorkflowCancelled):
        result.raise_for_status()


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
        stored = await engine.store.load_steps(handle.instance_id)
    assert stored["long"].status is StepStatus.CANCELLED


# -- lifecycle events --------------------------------------------------------------------------


async def test_events_arrive_in_order() -> None:
    rec = Recorder()
    engine = WorkflowEngine()
    events = engine.subscribe()
    wf = WorkflowDefinition(
        "events",
        [rec.step("a"), rec.step("b", "a", run_if=lambda ctx: False), rec.step("c", "b")],
    )
    with trio.fail_after(LIMIT_S):
        result = await engine.run(wf)
    engine.close()
    seen = [(e.kind.value, e.step_id) async for e in events]
    assert seen == [
        ("workflow_started", None),
        ("step_started", "a"),
        ("step_succeeded", "a"),
        ("step_skipped", "b"),
        ("step_started", "c"),
        ("step_succeeded", "c"),
        ("workflow_completed", None),
    ]
    assert result.status is WorkflowStatus.COMPLETED


async def test_failure_events() -> None:
    engine = WorkflowEngine()
    events = engine.subscribe()
    wf = WorkflowDefinition("fail_events", [StepDefinition("a", _fails("nope"))])
    with trio.fail_after(LIMIT_S):
        await engine.run(wf)
    engine.close()
    seen = [(e.kind.value, e.step_id, e.error) async for e in events]
    assert seen == [
        ("workflow_started", None, None),
        ("step_started", "a", None),
        ("step_failed", "a", "RuntimeError: nope"),
        ("workflow_failed", "a", "RuntimeError: nope"),
    ]


async def test_slow_subscriber_never_blocks_the_engine() -> None:
    rec = Recorder()
    engine = WorkflowEngine()
    slow = engine.subscribe(max_buffer=2)  # never read until the end
    wf = WorkflowDefinition("busy", [rec.step("a"), rec.step("b", "a"), rec.step("c", "b")])
    with trio.fail_after(LIMIT_S):
        result = await engine.run(wf)
    assert result.status is WorkflowStatus.COMPLETED
    assert engine.dropped_events == 8 - 2  # 8 events, 2 delivered
    assert slow.receive_nowait().kind == "workflow_started"


async def test_closed_subscriber_is_dropped_and_closed_engine_refuses_runs() -> None:
    rec = Recorder()
    engine = WorkflowEngine()
    engine.subscribe().close()
    with trio.fail_after(LIMIT_S):
        await engine.run(WorkflowDefinition("x", [rec.step("a")]))
    assert engine.dropped_events == 0
    engine.close()
    with pytest.raises(WorkflowError, match="closed"):
        await engine.run(WorkflowDefinition("x", [rec.step("a")]))


# -- many runs, one engine ----------------------------------------------------------------


async def test_concurrent_runs_share_one_engine() -> None:
    engine = WorkflowEngine()
    gate = trio.Event()

    async def wait_gate(ctx: WorkflowContext) -> str:
        await gate.wait()
        return ctx.instance_id

    wf = WorkflowDefinition(
        "many",
        [StepDefinition("a", wait_gate), StepDefinition("b", _fails(), run_if=lambda c: False)],
    )
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            handles = [await engine.start(nursery, wf) for _ in range(20)]
            handles[0].cancel()
            cancelled = await handles[0].wait()
            gate.set()
            results = [await h.wait() for h in handles[1:]]
    assert cancelled.status is WorkflowStatus.CANCELLED
    assert {r.status for r in results} == {WorkflowStatus.COMPLETED}
    assert len({h.instance_id for h in handles}) == 20
    assert all(h.context.result("a") == h.instance_id for h in handles[1:])
    handles[0].cancel()  # no effect once finished
    assert handles[0].status is WorkflowStatus.CANCELLED
