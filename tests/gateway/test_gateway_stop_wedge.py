"""Stopping the HTTP server never waits on a client that stopped reading, whenever the write
to it started (issue 18 finding 9: a gateway once ignored two SIGTERMs).

``serve_http`` closes writes still blocked after a grace when it stops. It did so once, at the
moment stopping began: a write that started later (a response's last message is sent under a
shield, so a cancelled handler can still start one) stayed blocked for as long as its client
stayed connected, and the server, so the process, never finished stopping.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from smg_trio.gateway.http.app import serve_http
from smg_trio.gateway.server import hypercorn_close

DEADLINE_S = 10.0
#: Far more than loopback socket buffers hold, so the write blocks on a client not reading.
BIG = 64 << 20


async def _lifespan(receive: Any, send: Any) -> None:
    """Answer the ASGI lifespan messages until shutdown."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


async def _client_that_never_reads(base_url: str) -> trio.SocketStream:
    """A connection with a small receive buffer that sends one GET and then reads nothing."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    client = trio.SocketStream(sock)
    await client.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    return client


SERVERS = pytest.mark.parametrize("fast", [True, False], ids=["fast_http1", "hypercorn"])


@SERVERS
async def test_a_write_that_blocks_after_stopping_began_is_closed(
    monkeypatch: Any, fast: bool
) -> None:
    first_pass = trio.Event()
    real = hypercorn_close.Connections.close_blocked_writes

    async def spy(
        self: hypercorn_close.Connections, grace_s: float = hypercorn_close.BLOCKED_WRITE_GRACE_S
    ) -> int:
        closed = await real(self, grace_s)
        first_pass.set()
        return closed

    monkeypatch.setattr(hypercorn_close.Connections, "close_blocked_writes", spy)
    responding = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        head = [(b"content-length", str(BIG + 1).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        responding.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):  # the shape of a shielded last message
                await first_pass.wait()  # begins after the server's first sweep
                await send({"type": "http.response.body", "body": b"x" * BIG})

    stopped = trio.Event()
    async with trio.open_nursery() as outer:
        server_scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            with server_scope:
                await serve_http(app, "127.0.0.1", 0, fast_http1=fast, task_status=task_status)  # type: ignore[arg-type]
            stopped.set()

        binds = await outer.start(run)
        client = await _client_that_never_reads(binds[0])
        with trio.fail_after(DEADLINE_S):
            await responding.wait()
        server_scope.cancel()  # stop, as the drain does; the client never reads
        with trio.move_on_after(DEADLINE_S):
            await stopped.wait()
        in_time = stopped.is_set()
        await client.aclose()  # unblocks a wedged server, so this test never hangs itself
    assert in_time, "the server kept waiting on a client that is not reading"


@SERVERS
async def test_a_triggered_stop_closes_a_write_still_blocked_after_the_graceful_timeout(
    fast: bool,
) -> None:
    """The shutdown trigger (not a cancel): in-flight requests get the graceful timeout, then
    a write still blocked on a client that is not reading is closed and the server returns."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        head = [(b"content-length", str(BIG).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        responding.set()
        await send({"type": "http.response.body", "body": b"x" * BIG})

    responding, stop, stopped = trio.Event(), trio.Event(), trio.Event()
    async with trio.open_nursery() as outer:

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            await serve_http(
                app,  # type: ignore[arg-type]
                "127.0.0.1",
                0,
                shutdown_trigger=stop.wait,
                graceful_timeout_s=0.2,
                fast_http1=fast,
                task_status=task_status,
            )
            stopped.set()

        binds = await outer.start(run)
        client = await _client_that_never_reads(binds[0])
        with trio.fail_after(DEADLINE_S):
            await responding.wait()
        stop.set()  # the client never reads
        with trio.move_on_after(DEADLINE_S):
            await stopped.wait()
        in_time = stopped.is_set()
        await client.aclose()  # unblocks a wedged server, so this test never hangs itself
    assert in_time, "the server kept waiting on a client that is not reading"
