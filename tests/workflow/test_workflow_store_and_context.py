"""State-store recording and failures, and the workflow context's values and results."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from smg_trio.workflow import (
    FINALIZE_TIMEOUT_S,
    ContextKey,
    InMemoryStateStore,
    StateStoreError,
    StepDefinition,
    StepResultUnavailable,
    StepState,
    StepStatus,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowEngine,
    WorkflowState,
    WorkflowStatus,
)

LIMIT_S = 5.0


class StoreDown(Exception):
    pass


class FlakyStore(InMemoryStateStore):
    """Fails (or wedges) on the first save matching a predicate."""

    def __init__(
        self,
        *,
        step: tuple[str, StepStatus] | None = None,
        workflow: WorkflowStatus | None = None,
        hang: bool = False,
    ) -> None:
        super().__init__()
        self.fail_step = step
        self.fail_workflow = workflow
        self.hang = hang

    async def _trip(self) -> None:
        if self.hang:
            await trio.sleep_forever()
        raise StoreDown("database unreachable")

    async def save_step(self, instance_id: str, state: StepState) -> None:
        if self.fail_step == (state.step_id, state.status):
            await self._trip()
        await super().save_step(instance_id, state)

    async def save_workflow(self, state: WorkflowState) -> None:
        if self.fail_workflow is state.status:
            await self._trip()
        await super().save_workflow(state)


async def _ok(ctx: WorkflowContext) -> str:
    await trio.lowlevel.checkpoint()
    return "ok"


async def test_store_records_every_state() -> None:
    engine = WorkflowEngine()
    wf = WorkflowDefinition(
        "recorded",
        [
            StepDefinition("a", _ok),
            StepDefinition("b", _ok, depends_on=("a",), run_if=lambda ctx: False),
        ],
    )
    ctx = WorkflowContext(instance_id="iid")
    with trio.fail_after(LIMIT_S):
        await engine.run(wf, ctx)
        wf_state = await engine.store.load_workflow("iid")
        steps = await engine.store.load_steps("iid")
    assert wf_state is not None
    assert wf_state.status is WorkflowStatus.COMPLETED
    assert wf_state.finished_at is not None
    assert steps["a"].status is StepStatus.SUCCEEDED
    assert steps["a"].attempt == 1
    assert steps["b"].status is StepStatus.SKIPPED


async def test_failing_store_fails_the_workflow_loudly() -> None:
    sibling_cancelled = trio.Event()
    sibling_started = trio.Event()

    async def sibling(ctx: WorkflowContext) -> None:
        sibling_started.set()
        try:
            await trio.sleep_forever()
        finally:
            sibling_cancelled.set()

    async def a(ctx: WorkflowContext) -> None:
        await sibling_started.wait()

    store = FlakyStore(step=("a", StepStatus.SUCCEEDED))
    engine = WorkflowEngine(store=store)
    events = engine.subscribe()
    wf = WorkflowDefinition(
        "store_fault",
        [
            StepDefinition("a", a),
            StepDefinition("b", _ok, depends_on=("a",)),
            StepDefinition("sibling", sibling),
        ],
    )
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            handle = await engine.start(nursery, wf)
            with pytest.raises(StateStoreError, match=r"step 'a'.*as succeeded") as info:
                await handle.wait()
    assert isinstance(info.value.__cause__, StoreDown)
    assert sibling_cancelled.is_set()
    assert handle.status is WorkflowStatus.FAILED
    assert handle.result is not None
    assert handle.result.error is info.value
    wf_state = await store.load_workflow(handle.instance_id)
    assert wf_state is not None
    assert wf_state.status is WorkflowStatus.FAILED
    assert "database unreachable" in (wf_state.error or "")
    engine.close()
    kinds = [e.kind.value async for e in events]
    assert kinds[-1] == "workflow_failed"


async def test_failing_store_raises_from_run() -> None:
    engine = WorkflowEngine(store=FlakyStore(step=("a", StepStatus.RUNNING)))
    with trio.fail_after(LIMIT_S), pytest.raises(StateStoreError) as info:
        await engine.run(WorkflowDefinition("x", [StepDefinition("a", _ok)]))
    assert isinstance(info.value.__cause__, StoreDown)


async def test_store_failure_at_start_raises_from_start() -> None:
    engine = WorkflowEngine(store=FlakyStore(workflow=WorkflowStatus.RUNNING))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            with pytest.raises(StateStoreError, match="as running"):
                await engine.start(nursery, WorkflowDefinition("x", [StepDefinition("a", _ok)]))


async def test_store_failure_in_a_started_run_never_crashes_the_nursery() -> None:
    engine = WorkflowEngine(store=FlakyStore(workflow=WorkflowStatus.COMPLETED))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            handle = await engine.start(
                nursery, WorkflowDefinition("x", [StepDefinition("a", _ok)])
            )
            with pytest.raises(StateStoreError, match="as completed"):
                await handle.wait()
    assert handle.status is WorkflowStatus.FAILED


async def test_wedged_store_at_finalize_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    engine = WorkflowEngine(store=FlakyStore(workflow=WorkflowStatus.COMPLETED, hang=True))
    start = trio.current_time()
    with pytest.raises(StateStoreError, match="did not record"):
        await engine.run(WorkflowDefinition("x", [StepDefinition("a", _ok)]))
    assert trio.current_time() - start == FINALIZE_TIMEOUT_S


def test_prune_terminal() -> None:
    async def main() -> None:
        store = InMemoryStateStore()
        engine = WorkflowEngine(store=store)
        await engine.run(WorkflowDefinition("x", [StepDefinition("a", _ok)]))
        assert len(store) == 1
        assert store.prune_terminal(60.0) == 0
        await trio.sleep(61.0)
        assert store.prune_terminal(60.0) == 1
        assert len(store) == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- context ---------------------------------------------------------------------------------


def test_context_values() -> None:
    port: ContextKey[int] = ContextKey("port")
    ctx = WorkflowContext({"url": "ipc:///x"})
    ctx.set(port, 5557)
    assert ctx.get(port) == 5557
    assert ctx.get("port") == 5557
    assert "url" in ctx
    assert port in ctx
    assert ctx.get_or("missing", None) is None
    with pytest.raises(KeyError, match="missing"):
        ctx.get("missing")
    assert ctx.workflow_id is None
    with pytest.raises(StepResultUnavailable, match="not been run"):
        ctx.result("a")


async def test_wait_result_of_a_parallel_step() -> None:
    async def producer(ctx: WorkflowContext) -> int:
        await trio.lowlevel.checkpoint()
        return 7

    async def consumer(ctx: WorkflowContext) -> int:
        value: int = await ctx.wait_result("producer")
        return value + 1

    ctx = WorkflowContext()
    wf = WorkflowDefinition(
        "wait", [StepDefinition("consumer", consumer), StepDefinition("producer", producer)]
    )
    with trio.fail_after(LIMIT_S):
        await WorkflowEngine().run(wf, ctx)
    assert ctx.result("consumer") == 8


async def test_wait_result_on_a_dependent_fails_instead_of_deadlocking() -> None:
    async def early(ctx: WorkflowContext) -> None:
        await ctx.wait_result("late")

    wf = WorkflowDefinition(
        "deadlock",
        [StepDefinition("early", early), StepDefinition("late", _ok, depends_on=("early",))],
    )
    with trio.fail_after(LIMIT_S):
        result = await WorkflowEngine().run(wf)
    assert result.status is WorkflowStatus.FAILED
    assert isinstance(result.error, StepResultUnavailable)


async def test_result_of_skipped_or_unknown_step_is_unavailable() -> None:
    ctx = WorkflowContext()
    wf = WorkflowDefinition("skip", [StepDefinition("a", _ok, run_if=lambda c: False)])
    with trio.fail_after(LIMIT_S):
        await WorkflowEngine().run(wf, ctx)
    with pytest.raises(StepResultUnavailable, match="skipped"):
        ctx.result("a")
    with pytest.raises(StepResultUnavailable, match="no step 'zz'"):
        ctx.result("zz")
