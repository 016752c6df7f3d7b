"""The admission gate orders waiters by priority then arrival, lets a more urgent request take
the least urgent waiter's place when the queue is full, and leaves nothing behind; the
request's ``priority`` reaches vLLM's ``EngineCoreRequest.priority``."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from smg_trio.gateway.http import admission
from smg_trio.gateway.http.admission import AdmissionGate
from smg_trio.gateway.openai.errors import ApiError
from tests.helpers.gateway import DEADLINE_S, HarnessFactory


class Req:
    """A borrower (the gate holds slots on behalf of objects, as of ``RequestCall``)."""

    def __init__(self, name: str) -> None:
        self.name = name


async def _queue(
    gate: AdmissionGate, nursery: trio.Nursery, reqs: list[tuple[Req, int]], served: list[str]
) -> None:
    """Arrive and wait each (in this order), recording the order they get their slot."""

    async def one(req: Req, priority: int) -> None:
        await gate.wait_turn(req, priority)
        served.append(req.name)

    for req, priority in reqs:
        gate.arrive(req)
        nursery.start_soon(one, req, priority)
        await trio.testing.wait_all_tasks_blocked()


async def test_waiters_are_served_by_priority_then_arrival() -> None:
    gate = AdmissionGate(limit=1, queue_size=8, timeout_s=DEADLINE_S)
    first = Req("first")
    gate.arrive(first)
    await gate.wait_turn(first)
    assert gate.active == 1
    served: list[str] = []
    reqs = [(Req("low"), 5), (Req("urgent"), -1), (Req("default-a"), 0), (Req("default-b"), 0)]
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            await _queue(gate, nursery, reqs, served)
            assert gate.waiting == 4
            holder = first
            for _ in reqs:
                gate.leave(holder)
                await trio.testing.wait_all_tasks_blocked()
                holder = next(r for r, _ in reqs if r.name == served[-1])
            gate.leave(holder)
    assert served == ["urgent", "default-a", "default-b", "low"]
    assert gate.active == 0
    assert gate.waiting == 0


async def test_urgent_arrival_takes_the_least_urgent_place_in_a_full_queue() -> None:
    gate = AdmissionGate(limit=1, queue_size=2, timeout_s=DEADLINE_S)
    first = Req("first")
    gate.arrive(first)
    served: list[str] = []
    refused: list[str] = []
    low_a, low_b, urgent = Req("low-a"), Req("low-b"), Req("urgent")

    async def waiter(req: Req, priority: int) -> None:
        try:
            await gate.wait_turn(req, priority)
        except ApiError as exc:
            refused.append(f"{req.name} {exc.status} {exc}")
            gate.leave(req)
            return
        served.append(req.name)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            for req in (low_a, low_b):
                gate.arrive(req)
                nursery.start_soon(waiter, req, 5)
            await trio.testing.wait_all_tasks_blocked()
            gate.arrive(urgent)  # the queue is full: an overflow place, its body read
            # the one overflow place is taken: the next arrival is refused before its body
            with pytest.raises(ApiError, match="queue is full"):
                gate.arrive(Req("next"))
            nursery.start_soon(waiter, urgent, -10)
            await trio.testing.wait_all_tasks_blocked()
            (refusal,) = refused  # the least urgent, latest arrival
            assert refusal.startswith("low-b 429 ")
            assert "more urgent request took this one's place" in refusal
            gate.leave(first)
            await trio.testing.wait_all_tasks_blocked()
            assert served == ["urgent"]
            gate.leave(urgent)
            await trio.testing.wait_all_tasks_blocked()
            assert served == ["urgent", "low-a"]
            gate.leave(low_a)
    assert (gate.active, gate.waiting) == (0, 0)
    assert gate.rejected == 2


async def test_overflow_arrival_no_more_urgent_is_refused() -> None:
    gate = AdmissionGate(limit=1, queue_size=1, timeout_s=DEADLINE_S)
    first, queued, late = Req("first"), Req("queued"), Req("late")
    gate.arrive(first)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            gate.arrive(queued)
            nursery.start_soon(gate.wait_turn, queued, 0)
            await trio.testing.wait_all_tasks_blocked()
            gate.arrive(late)
            with pytest.raises(ApiError, match="priority 0 or more urgent"):
                await gate.wait_turn(late, 0)
            gate.leave(late)
            gate.leave(first)
    assert gate.active == 1  # queued got the slot
    gate.leave(queued)
    assert (gate.active, gate.waiting) == (0, 0)


async def test_cancelled_waiter_leaves_nothing() -> None:
    gate = AdmissionGate(limit=1, queue_size=4, timeout_s=DEADLINE_S)
    first, waiting = Req("first"), Req("waiting")
    gate.arrive(first)
    with trio.fail_after(DEADLINE_S):
        with trio.CancelScope() as scope:
            gate.arrive(waiting)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(gate.wait_turn, waiting, 3)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
    gate.leave(waiting)  # what RequestCall.close does
    assert gate.waiting == 0
    gate.leave(first)
    assert gate.active == 0
    # a later request takes the free slot at once
    again = Req("again")
    gate.arrive(again)
    await gate.wait_turn(again, 0)
    assert gate.active == 1


async def test_a_body_being_read_does_not_hold_back_free_slots() -> None:
    gate = AdmissionGate(limit=2, queue_size=1, timeout_s=DEADLINE_S)
    a, b, c = Req("a"), Req("b"), Req("c")
    gate.arrive(a)
    gate.arrive(b)
    gate.arrive(c)  # queued: both slots held
    gate.leave(a)
    gate.leave(b)
    d = Req("d")
    gate.arrive(d)  # a free slot, nobody waiting for one (c is still reading its body)
    assert gate.active == 1
    await gate.wait_turn(c, 0)
    assert gate.active == 2


async def test_priority_reaches_the_engine(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            assert (await h.chat(max_tokens=2, priority=-7)).status_code == 200
            assert (await h.complete(max_tokens=2)).status_code == 200
            assert [r.raw.priority for r in h.engine.requests] == [-7, 0]


async def test_tokenspeed_refuses_a_priority(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(protocol="tokenspeed") as h:
            resp = await h.chat(max_tokens=2, priority=1)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == "priority"
            assert (await h.chat(max_tokens=2, priority=0)).status_code == 200


async def test_queued_bodies_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued request reads its body only within the queue's byte budget; past it (or with
    no Content-Length) it waits unread, at the default priority, so the bodies in memory stay
    bounded by the slots' plus the budget."""
    monkeypatch.setattr(admission, "QUEUED_BODIES_MAX_BYTES", 100)
    gate = AdmissionGate(limit=1, queue_size=4, timeout_s=DEADLINE_S)
    first, small, big, chunked = Req("first"), Req("small"), Req("big"), Req("chunked")
    gate.arrive(first)
    assert gate.may_read_body(first, 10**9)  # a slot holder reads whatever the body limit allows
    for req in (small, big, chunked):
        gate.arrive(req)
    assert gate.may_read_body(small, 60)
    assert not gate.may_read_body(big, 60)  # 60 + 60 > 100
    assert not gate.may_read_body(chunked, None)
    assert gate.queued_body_bytes == 60
    gate.leave(small)
    assert gate.queued_body_bytes == 0
    # an overflow place is there only to read its priority: no room, no place
    tight = AdmissionGate(limit=1, queue_size=1, timeout_s=DEADLINE_S)
    one, queued, over = Req("one"), Req("queued"), Req("over")
    for req in (one, queued, over):
        tight.arrive(req)
    with pytest.raises(ApiError, match="queue is full"):
        tight.may_read_body(over, None)
    assert tight.waiting == 1
