"""Engine request ids stay unique whatever ids clients send (issue 15, item 5): hostile
``x-request-id`` values that look like other requests' ``n>1`` sub-request ids, and one id
from 100 clients at once. Every request is in flight at the same time (the engine is stalled
until it has seen all of them), every one succeeds, and the engine sees distinct ids."""

from __future__ import annotations

from typing import Any

import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.call import Gateway
from smg_trio.gateway.http.metrics import GatewayMetrics
from smg_trio.gateway.openai.fanout import sub_request_id
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory, steps_of

#: (x-request-id, endpoint, n): ``1`` fans out to the ids ``1-0``/``1-1`` would have, and the
#: others collide with those or with each other's sub-request ids.
HOSTILE: list[tuple[str, str, int]] = [
    ("1", "chat", 2),
    ("1-0", "chat", 1),
    ("chatcmpl-1-1", "chat", 1),
    ("1", "completions", 3),
    ("1-2", "completions", 1),
    ("cmpl-1-0", "completions", 2),
    ("0_1", "chat", 2),
    ("a_b-1", "chat", 1),
    ("a_b", "chat", 2),
    ("x-y-z_0-1", "completions", 1),
    ("x-y-z_0", "completions", 2),
]


async def _all_in_flight_then_finish(
    h: Harness, calls: list[tuple[str, str, int]]
) -> list[tuple[str, str, Any]]:
    """Send every call with the engine stalled, wait until the engine holds all of their
    sub-requests, resume it, and return ``(id sent, endpoint, response)`` per call."""
    expected = len(h.engine.requests) + sum(n for _, _, n in calls)
    results: list[tuple[str, str, Any]] = []

    async def one(rid: str, endpoint: str, n: int) -> None:
        path, body = (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
            if endpoint == "chat"
            else ("/v1/completions", {"prompt": "hello"})
        )
        r = await h.post(
            path, {"model": "M", "n": n, "max_tokens": 2, **body}, headers={"x-request-id": rid}
        )
        results.append((rid, endpoint, r))
        if r.status_code != 200:  # a failed call: stop waiting, let the test report it
            failed.set()
            h.engine.request_event.set()

    failed = trio.Event()
    h.engine.stall()
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(one, *call)
        while len(h.engine.requests) < expected and not failed.is_set():
            await h.engine.request_event.wait()
        h.engine.resume()
    return results


def _assert_all_ok(results: list[tuple[str, str, Any]]) -> None:
    for rid, endpoint, r in results:
        assert r.status_code == 200, (rid, r.text)
        prefix = "chatcmpl-" if endpoint == "chat" else "cmpl-"
        # the ids the client sees are unchanged: the header echoes it, the response id is it
        assert r.headers["x-request-id"] == rid
        assert r.json()["id"] == (rid if rid.startswith(prefix) else prefix + rid)


async def test_hostile_ids_never_collide_on_the_engine(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a", "b")) as h:
            results = await _all_in_flight_then_finish(h, HOSTILE)
            _assert_all_ok(results)
            ids = [r.request_id for r in h.engine.requests]
            assert len(ids) == sum(n for _, _, n in HOSTILE)
            assert len(set(ids)) == len(ids), sorted(ids)
            assert not h.engine.active


async def test_one_id_from_100_clients(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(3 * DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            results = await _all_in_flight_then_finish(h, [("dup-0", "chat", 1)] * 100)
            _assert_all_ok(results)
            ids = [r.request_id for r in h.engine.requests]
            assert len(ids) == 100
            assert len(set(ids)) == 100
            assert all(i.startswith("chatcmpl-dup-0-") for i in ids)


def test_engine_ids_parse_back_to_one_request() -> None:
    """The structural rule behind the uniqueness: a wire id's token (its last ``-``
    component, or the one before when the last is a choice index) names one request."""
    gw = Gateway(None, GatewayHttpConfig(), GatewayMetrics())  # type: ignore[arg-type]
    seen: dict[str, str] = {}
    for client_id in ["1", "1-0", "1-0-1", "0", "0_0", "a-0_1", "a"] * 3:
        base = gw.engine_id(client_id)
        token = base.rsplit("-", 1)[1]
        assert "_" in token  # never all digits: it cannot pass for a choice index
        for n in (1, 3):
            for i in range(n):
                wire = sub_request_id(base, i, n)
                assert seen.setdefault(wire, base) == base, wire
