"""Engine control races and floods: an answer that comes back after another control call changed the
worker's held state must not undo it (a read-back of the engines' state, or a wake-up or resume
overtaken by a sleep or pause, released a worker whose engine was then paused or asleep)."""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.testing
from quart import Blueprint
from quart_trio import QuartTrio

from smg_trio.serve.engine_control import add_engine_control_routes

DEADLINE_S = 10.0


class _Client:
    """An engine whose answers to ``slow`` methods wait for ``gate`` (sent as of the call's
    arrival, as an engine that answers in order)."""

    alive = True
    ranks = (0,)
    engines: tuple[object, ...] = ()

    def __init__(self, slow: str) -> None:
        self.slow = slow
        self.gate = trio.Event()
        self.paused = False
        self.asleep = False
        self.calls: list[str] = []

    async def call_utility(self, method: str, *args: Any, rank: int) -> Any:
        self.calls.append(method)
        answer: Any = None
        if method == "is_scheduler_paused":
            answer = self.paused
        elif method == "is_sleeping":
            answer = self.paused or self.asleep
        elif method == "pause_scheduler":
            self.paused = True
        elif method == "resume_scheduler":
            self.paused = False
        elif method == "sleep":
            self.asleep = self.paused = True
        elif method == "wake_up":
            self.asleep = self.paused = False
            answer = True
        if method == self.slow:
            await self.gate.wait()
        return answer


@attrs.define(eq=False)
class _Worker:
    engine_client: _Client
    worker_id: str = "w"
    url: str = "ipc:///tmp/w"
    status: str = "ready"
    model_id: str = "m"
    held: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "held": self.held}


@attrs.define
class _Manager:
    worker: _Worker

    @property
    def workers(self) -> list[_Worker]:
        return [self.worker]

    def get_worker(self, worker_id: str) -> _Worker | None:
        return self.worker if worker_id == self.worker.worker_id else None


def _app(manager: _Manager) -> QuartTrio:
    app = QuartTrio(__name__)
    bp = Blueprint("control", __name__)
    add_engine_control_routes(bp, manager, bound_s=5.0)  # type: ignore[arg-type]
    app.register_blueprint(bp)
    return app


async def _race(slow: str, first: tuple[str, str], second: tuple[str, str]) -> _Worker:
    """``first`` is sent (its answer held back at the engine), then ``second`` completes, then
    ``first``'s answer arrives."""
    worker = _Worker(_Client(slow))
    client = _app(_Manager(worker)).test_client()
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def send_first() -> None:
                resp = await client.open(first[1], method=first[0])
                assert resp.status_code == 200, await resp.get_data()
                done.set()

            nursery.start_soon(send_first)
            await trio.testing.wait_all_tasks_blocked()
            resp = await client.open(second[1], method=second[0])
            assert resp.status_code == 200, await resp.get_data()
            worker.engine_client.gate.set()
            await done.wait()
    return worker


async def test_a_stale_is_paused_answer_does_not_release_a_paused_worker() -> None:
    worker = await _race("is_scheduler_paused", ("GET", "/is_paused"), ("POST", "/pause"))
    assert worker.engine_client.paused
    assert worker.held == "paused"


async def test_a_stale_is_sleeping_answer_does_not_release_a_sleeping_worker() -> None:
    worker = await _race("is_sleeping", ("GET", "/is_sleeping"), ("POST", "/sleep"))
    assert worker.engine_client.asleep
    assert worker.held == "sleeping"


async def test_a_wake_up_overtaken_by_a_sleep_leaves_the_worker_held() -> None:
    worker = await _race("wake_up", ("POST", "/wake_up"), ("POST", "/sleep"))
    assert worker.engine_client.asleep  # the engine took the wake-up, then the sleep
    assert worker.held == "sleeping"


async def test_a_resume_overtaken_by_a_pause_leaves_the_worker_held() -> None:
    worker = await _race("resume_scheduler", ("POST", "/resume"), ("POST", "/pause"))
    assert worker.engine_client.paused
    assert worker.held == "paused"


async def test_concurrent_reads_share_one_call_per_engine() -> None:
    """``GET /is_sleeping`` and ``/is_paused`` are open without an admin key: each made a
    utility call to every engine, held for up to the control bound by an engine that does not
    answer, so a flood of anonymous reads piled up calls on every engine. Reads of the same
    state that overlap share one call per engine, and every reader gets its answer."""
    worker = _Worker(_Client("is_sleeping"))
    client = _app(_Manager(worker)).test_client()
    answers: list[Any] = []
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                resp = await client.get("/is_sleeping")
                answers.append((resp.status_code, await resp.get_json()))

            for _ in range(5):
                nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert worker.engine_client.calls == ["is_sleeping"]
            worker.engine_client.gate.set()
    assert [status for status, _ in answers] == [200] * 5
    assert all(doc["is_sleeping"] is False for _, doc in answers)
    # a read after those is a call of its own (the engine's state may have changed)
    resp = await client.get("/is_sleeping")
    assert resp.status_code == 200
    assert worker.engine_client.calls == ["is_sleeping", "is_sleeping"]


async def test_a_reader_that_goes_away_does_not_fail_the_others() -> None:
    """The first reader's call is shared: when that reader is cancelled (its client went),
    the others make the call again rather than fail."""
    worker = _Worker(_Client("is_scheduler_paused"))
    client = _app(_Manager(worker)).test_client()
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()
            answers: list[int] = []

            async def leader() -> None:
                with first:
                    await client.get("/is_paused")

            async def follower() -> None:
                resp = await client.get("/is_paused")
                answers.append(resp.status_code)

            nursery.start_soon(leader)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(follower)
            await trio.testing.wait_all_tasks_blocked()
            first.cancel()
            await trio.testing.wait_all_tasks_blocked()
            worker.engine_client.gate.set()
    assert answers == [200]
