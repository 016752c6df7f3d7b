"""A connection's fault stays in its connection, on both server paths, in one log line at most
(issue 28 item 3: a WebSocket upgrade followed by one more byte took the process down under
``--disable-fast-http1`` and wrote an 8.7 KB traceback per connection on the fast path)."""

from __future__ import annotations

import json
import logging
from typing import Any

import h11
import pytest
import trio
import trio.lowlevel

from smg_trio.gateway.http.app import hyper_config
from smg_trio.gateway.server import faults, serve
from smg_trio.gateway.server.hypercorn_errors import EnvelopeH11Protocol
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, hostport

UPGRADE = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
WS_KEY = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"

#: The issue's bytes and variants: trailing bytes after the handshake, in one write or two.
UPGRADES_WITH_TRAILING_BYTES: list[list[bytes]] = [
    [UPGRADE + b"\r\nX"],
    [UPGRADE + WS_KEY + b"\r\nX"],
    [UPGRADE + WS_KEY + b"\r\n\x81\x85junk-frame"],
    [UPGRADE + WS_KEY + b"\r\n", b"X"],
    [UPGRADE + b"\r\n" + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"],
    [UPGRADE + b"Content-Length: 3\r\n\r\nabcX"],
]


def _problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Tracebacks and ERROR lines anywhere, and fault lines of :mod:`faults`."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR or (r.exc_info and r.levelno > logging.DEBUG)
    ]


def _fault_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == faults.__name__ and r.levelno >= logging.INFO
    ]


async def _talk(base_url: str, writes: list[bytes]) -> bytes:
    host, port = hostport(base_url)
    data = b""
    async with await trio.open_tcp_stream(host, port) as stream:
        for chunk in writes:
            try:
                await stream.send_all(chunk)
            except trio.BrokenResourceError:
                break
            await trio.lowlevel.checkpoint()
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except trio.BrokenResourceError:
            pass
    return data


@pytest.mark.parametrize("fast_http1", [True, False], ids=["fast", "hypercorn"])
@pytest.mark.parametrize("case", range(len(UPGRADES_WITH_TRAILING_BYTES)))
async def test_an_upgrade_with_trailing_bytes_stays_in_its_connection(
    harness: HarnessFactory, caplog: pytest.LogCaptureFixture, fast_http1: bool, case: int
) -> None:
    """Before: hypercorn's WSStream answered the trailing bytes with a 400 of its own while
    the app's refusal was being written; h11 raised, the error left the connection and the
    server stopped (the harness's nursery fails the test), or on the fast path a traceback
    was logged. Now: the refusal envelope, the connection closed, no traceback, and the
    server goes on serving."""
    caplog.set_level(logging.INFO)
    with trio.fail_after(DEADLINE_S):
        async with harness(fast_http1=fast_http1) as h:
            for _ in range(3):
                data = await _talk(h.base_url, UPGRADES_WITH_TRAILING_BYTES[case])
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 400 "), data
                assert b"connection: close" in head.lower()
                err = json.loads(body)["error"]
                assert err["code"] == "websocket_not_supported"
            assert (await h.http.get("/health")).status_code == 200
    assert not _problems(caplog)


async def _serve_app(app: Any, nursery: trio.Nursery, *, fast_http1: bool) -> str:
    cfg = hyper_config("127.0.0.1", 0, 1.0)
    binds: list[str] = await nursery.start(
        lambda task_status: serve.serve(app, cfg, fast_http1=fast_http1, task_status=task_status)
    )
    return binds[0]


async def _app_over_its_content_length(scope: Any, receive: Any, send: Any) -> None:
    """An app whose response breaks HTTP/1.1 (more body than its ``content-length``): h11
    raises ``LocalProtocolError`` inside the app's ``send``."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/ok":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]}
    )
    await send({"type": "http.response.body", "body": b"far too long"})


async def test_a_local_protocol_error_closes_its_connection_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """h11's ``LocalProtocolError`` while sending (the error the WebSocket race raised) closes
    its connection with one fault line: no traceback from the app, none from the
    connection, and the server serves the next connection."""
    caplog.set_level(logging.INFO)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            base = await _serve_app(_app_over_its_content_length, nursery, fast_http1=False)
            for _ in range(2):
                data = await _talk(base, [b"GET /bad HTTP/1.1\r\nHost: x\r\n\r\n"])
                assert b"far too long" not in data
            ok = await _talk(base, [b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"])
            assert ok.startswith(b"HTTP/1.1 200 ")
            assert b"\r\nok\r\n" in ok
            nursery.cancel_scope.cancel()
    assert not _problems(caplog)
    lines = _fault_lines(caplog)
    assert len(lines) == 2, lines  # one per connection
    assert all("LocalProtocolError" in line for line in lines)


@pytest.mark.parametrize("fast_http1", [True, False], ids=["fast", "hypercorn"])
async def test_any_fault_in_a_handed_over_connection_stays_in_it(
    harness: HarnessFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    fast_http1: bool,
) -> None:
    """The whole kind: an unexpected exception from hypercorn's side of a connection (here
    planted in the h11 protocol) closes that connection only, in one line."""
    caplog.set_level(logging.INFO)
    real = EnvelopeH11Protocol._create_stream

    async def faulty(self: EnvelopeH11Protocol, request: h11.Request) -> None:
        if any(name == b"x-boom" for name, _ in request.headers):
            raise RuntimeError("boom\nwith a second line")
        await real(self, request)

    monkeypatch.setattr(EnvelopeH11Protocol, "_create_stream", faulty)
    # chunked: handed over to hypercorn by the fast path too
    raw = b"POST /v1/models HTTP/1.1\r\nHost: x\r\nX-Boom: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    with trio.fail_after(DEADLINE_S):
        async with harness(fast_http1=fast_http1) as h:
            assert await _talk(h.base_url, [raw]) == b""
            assert (await h.http.get("/health")).status_code == 200
    assert not _problems(caplog)
    lines = _fault_lines(caplog)
    assert len(lines) == 1, lines
    assert "RuntimeError" in lines[0]
    assert "\n" not in lines[0]


def test_fault_lines_are_one_per_connection_and_rate_limited(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(faults.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(faults, "_LIMITER", faults._Limiter())
    caplog.set_level(logging.INFO, logger=faults.__name__)
    for _ in range(3 * faults.BURST):
        with faults.connection_scope():
            for _ in range(3):  # three faults, one connection: one line
                faults.note("test", ValueError("x"))
    assert len(_fault_lines(caplog)) == faults.BURST
    now[0] += faults.REFILL_S
    with faults.connection_scope():
        faults.note("test", ValueError("x"))
    lines = _fault_lines(caplog)
    assert len(lines) == faults.BURST + 1
    assert f"({2 * faults.BURST} similar line(s) held back)" in lines[-1]


def test_contain_raises_cancellation_on() -> None:
    group = BaseExceptionGroup("g", [ValueError("v"), KeyboardInterrupt()])
    with pytest.raises(BaseExceptionGroup) as info:
        faults.contain("test", group)
    assert [type(e) for e in info.value.exceptions] == [KeyboardInterrupt]
    with pytest.raises(KeyboardInterrupt):
        faults.contain("test", KeyboardInterrupt())
    faults.contain("test", ExceptionGroup("g", [ValueError("v")]))  # contained
