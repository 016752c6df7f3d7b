"""A stream whose client vanished leaves no reference cycle: its objects are freed by
reference counting when the request ends, not by a later full collection (which, after a
disconnect storm, stalled the gateway for hundreds of milliseconds and grew its RSS with
every storm: ``bench/abort_storm.py --gc-log``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from smg_trio.gateway.http import sse
from tests.helpers.engines import wait_until
from tests.helpers.gateway import DEADLINE_S, HarnessFactory
from tests.helpers.raw_sse import RawSSE


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counting frees objects while the test runs."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _chat(max_tokens: int) -> dict[str, Any]:
    body = {"model": "M", "messages": [{"role": "user", "content": "hi"}]}
    return {**body, "max_tokens": max_tokens, "stream": True}


async def test_a_vanished_clients_stream_is_freed_without_the_collector(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, no_collector: None
) -> None:
    bodies: list[weakref.ref[sse.StreamBody]] = []
    real_init = sse.StreamBody.__init__

    def init(self: sse.StreamBody, *args: Any, **kw: Any) -> None:
        real_init(self, *args, **kw)
        bodies.append(weakref.ref(self))

    monkeypatch.setattr(sse.StreamBody, "__init__", init)
    with trio.fail_after(DEADLINE_S):
        async with harness(step_s=0.002) as h:
            stream = await RawSSE.post(h.base_url, "/v1/chat/completions", _chat(2000))
            await stream.until(lambda evs: len(evs) >= 5)
            await stream.aclose()  # the client vanishes mid-stream
            rid = h.engine.requests[0].request_id
            await h.wait_aborted([rid])
            assert h.client.inflight_count == 0

            def finished() -> bool:
                body = bodies[0]()
                return body is None or body._state == sse._DONE

            await wait_until(finished)
            # One more whole request: the vanished one's task has long unwound by its end.
            resp = await h.chat(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            assert resp.status_code == 200
            assert bodies[0]() is None, "the failed stream is kept alive by a reference cycle"
