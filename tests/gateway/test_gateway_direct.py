"""The direct-write streaming path: chunks written by the engine output loop, and the fall back
to the request's task (and ASGI backpressure) when the client's socket is full."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

from smg_trio.gateway.http.fastroute import AsgiRequest
from smg_trio.gateway.server.direct import DirectSocket, DirectWriter
from smg_trio.gateway.server.fast_http1 import FastExchange
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of
from tests.helpers.raw_sse import RawSSE


class WriteSpy:
    """Counts direct ``try_write`` outcomes (on either server's writer); ``fell_back`` is set by
    the first write that could not complete (socket full: ``None`` or a partial tail)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sndbuf: int | None = None) -> None:
        self.whole = 0
        self.partial = 0
        self.refused = 0
        self.fell_back = trio.Event()
        self.attached = 0  # distinct writers looked up (a request looks its own up twice)
        self._seen: list[object] = []  # their sockets
        self.last = b""  # the last chunk written whole
        real_of = DirectWriter.of

        def spy(cls: type[DirectWriter]) -> None:
            real_write, real_last = cls.try_write, cls.try_write_last

            def count(data: bytes, tail: bytes | None) -> bytes | None:
                if tail is None:
                    self.refused += 1
                elif tail:
                    self.partial += 1
                else:
                    self.whole += 1
                    self.last = data
                if tail is None or tail:
                    self.fell_back.set()
                return tail

            def try_write(ds: DirectWriter, data: bytes) -> bytes | None:
                return count(data, real_write(ds, data))

            def try_write_last(ds: DirectWriter, data: bytes) -> bytes | None:
                return count(data, real_last(ds, data))

            monkeypatch.setattr(cls, "try_write", try_write)
            if "try_write_last" in vars(cls):  # the default one calls try_write, counted above
                monkeypatch.setattr(cls, "try_write_last", try_write_last)

        def of(server_send: object) -> DirectWriter | None:
            ds = real_of(server_send)
            if ds is not None and all(ds.socket is not seen for seen in self._seen):
                self._seen.append(ds.socket)
                self.attached += 1
                if sndbuf is not None:
                    ds.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            return ds

        for cls in (DirectSocket, FastExchange):
            spy(cls)
        monkeypatch.setattr(DirectWriter, "of", staticmethod(of))


@pytest.fixture
def harness(harness_both: HarnessFactory) -> HarnessFactory:
    """Every test here runs on the fast path and on hypercorn's."""
    return harness_both


def chat(max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {
        "model": "M",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        **kw,
    }


def content_of(events: list[Any]) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for ev in events
        if isinstance(ev, dict)
        for c in ev.get("choices", [])
    )


async def test_stream_chunks_are_written_by_the_output_loop(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over plain HTTP/1.1 every content chunk and the final frames go out through direct
    writes, and the client sees exactly the ASGI path's stream (framing, order, [DONE] once)."""
    spy = WriteSpy(monkeypatch)
    words = [f"w{i} " for i in range(20)]
    steps = steps_of(tok, *words)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            resp, events = await h.stream(
                "/v1/chat/completions",
                chat(400, stream_options={"include_usage": True}),
            )
            assert resp.status_code == 200
    assert spy.attached == 1
    assert spy.whole >= len(words)
    assert spy.last.endswith(b"data: [DONE]\n\n")  # the last frames too; ASGI only ends it
    assert spy.partial == spy.refused == 0
    assert content_of(events) == "".join(words)
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    assert events[-2]["usage"]["completion_tokens"] == sum(map(len, steps))


async def test_full_socket_falls_back_and_loses_nothing(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that stops reading fills the socket: the output loop hands the rest to the
    request's task (partial chunk tail first), and once the client reads again it gets every
    byte, in order, correctly framed."""
    spy = WriteSpy(monkeypatch, sndbuf=4096)
    words = [f"lighthouse keeper {i} " for i in range(1500)]
    steps = steps_of(tok, *words)
    total = sum(map(len, steps))
    with trio.fail_after(4 * DEADLINE_S):
        async with harness(plan=lambda r: steps, step_s=0.0002, max_model_len=65536) as h:
            sse = await RawSSE.post(
                h.base_url, "/v1/chat/completions", chat(total, stream=True), rcvbuf=4096
            )
            await spy.fell_back.wait()  # the client has not read the body yet
            events = await sse.rest()
            assert sse.status == 200
            await sse.aclose()
            assert h.client.inflight_count == 0
    assert spy.refused + spy.partial > 0
    assert spy.whole > 0
    assert content_of(events) == "".join(words)
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1


async def test_disconnect_while_writes_are_direct_aborts_the_engine(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the connection while the output loop writes the chunks: the writer task is
    cancelled, the engine gets ABORT, the registry empties."""
    spy = WriteSpy(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness(step_s=0.002) as h:
            sse = await RawSSE.post(h.base_url, "/v1/chat/completions", chat(2000, stream=True))
            await sse.until(lambda evs: len(evs) >= 5)
            assert spy.whole > 0
            await sse.aclose()
            assert len(h.engine.requests) == 1
            rid = h.engine.requests[0].request_id
            await h.wait_aborted([rid])
            assert h.client.inflight_count == 0  # retired before the ABORT was sent


async def test_a_failed_direct_write_aborts_the_engine_from_the_output_loop(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first sign of a vanished client is often a direct write failing (EPIPE or
    ECONNRESET): the output loop ABORTs the engine request right there, without waiting for
    the request's task to be woken, fail its own write and unwind. Here the disconnect watcher
    never fires, so that failed write is the only way the engine can learn of it."""

    async def never(self: AsgiRequest) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(AsgiRequest, "_watch_disconnect", never)
    spy = WriteSpy(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness(step_s=0.002) as h:
            sse = await RawSSE.post(h.base_url, "/v1/chat/completions", chat(2000, stream=True))
            await sse.until(lambda evs: len(evs) >= 5)
            assert spy.whole > 0
            await sse.aclose()
            rid = h.engine.requests[0].request_id
            await h.wait_aborted([rid])
            assert h.client.inflight_count == 0


async def test_without_a_direct_socket_the_stream_is_the_same(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where direct writes are not possible (TLS, HTTP/2, HTTP/1.0: no ``DirectWriter``),
    every frame goes through ASGI and the client sees the same stream."""
    monkeypatch.setattr(DirectWriter, "of", staticmethod(lambda send: None))
    words = [f"w{i} " for i in range(20)]
    steps = steps_of(tok, *words)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            resp, events = await h.stream(
                "/v1/chat/completions",
                chat(400, stream_options={"include_usage": True}),
            )
            assert resp.status_code == 200
            assert h.client.inflight_count == 0
    assert content_of(events) == "".join(words)
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    assert events[-2]["usage"]["completion_tokens"] == sum(map(len, steps))
