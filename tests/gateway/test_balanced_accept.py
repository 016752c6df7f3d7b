"""Frontends sharing a listening socket take their share of its connections: one that holds
more than the others leaves a waiting connection to them, for a bounded time."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from smg_trio.gateway.server.balance import BalancedListener, counted
from smg_trio.serve.conn_share import SharedConnections, create_shared_connections

DEADLINE_S = 10.0


class FakeShare:
    def __init__(self, excess: int = 0) -> None:
        self.more = excess  # what the other frontends hold fewer
        self.count = 0

    def opened(self) -> None:
        self.count += 1

    def closed(self) -> None:
        self.count -= 1

    def excess(self) -> int:
        return self.more


@pytest.fixture
async def listening() -> AsyncIterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def _listener(sock: socket.socket, share: FakeShare, **kw: float) -> BalancedListener:
    inner = trio.SocketListener(trio.socket.from_stdlib_socket(sock.dup()))
    return BalancedListener(inner, share, **kw)  # type: ignore[arg-type]


async def _connect(sock: socket.socket) -> trio.SocketStream:
    return await trio.open_tcp_stream(*sock.getsockname())


async def _deferring(
    listener: BalancedListener,
    sock: socket.socket,
    nursery: trio.Nursery,
    got: list[trio.SocketStream],
) -> trio.SocketStream:
    """A client connected while ``listener`` accepts in the background (into ``got``), once
    the listener has deferred that connection."""

    async def accept() -> None:
        got.append(await listener.accept())

    nursery.start_soon(accept)
    client = await _connect(sock)
    while not listener.deferred:
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.001)
    return client


async def test_within_its_share_a_frontend_accepts_at_once(listening: socket.socket) -> None:
    share = FakeShare(excess=1)  # the slack
    listener = _listener(listening, share)
    with trio.fail_after(DEADLINE_S):
        client = await _connect(listening)
        stream = await listener.accept()
    assert (share.count, listener.deferred) == (1, 0)
    await stream.aclose()
    await client.aclose()
    await listener.aclose()


async def test_above_its_share_it_waits_until_its_turn(listening: socket.socket) -> None:
    share = FakeShare(excess=3)
    listener = _listener(listening, share, defer_s=3600)
    got: list[trio.SocketStream] = []
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            client = await _deferring(listener, listening, nursery, got)
            assert not got
            assert share.count == 0
            share.more = 0  # the others caught up: its turn
    assert len(got) == 1
    assert share.count == 1
    await got[0].aclose()
    await client.aclose()
    await listener.aclose()


async def test_a_connection_nobody_else_takes_is_taken_after_the_wait(
    listening: socket.socket, autojump_clock: trio.testing.MockClock
) -> None:
    share = FakeShare(excess=5)  # a stalled peer holding none never takes it
    listener = _listener(listening, share, defer_s=0.5, poll_s=0.01)
    with trio.fail_after(DEADLINE_S):
        client = await _connect(listening)
        stream = await listener.accept()
    assert (listener.deferred, listener.taken_anyway, share.count) == (1, 1, 1)
    await stream.aclose()
    await client.aclose()
    await listener.aclose()


async def test_a_connection_another_frontend_took_is_not_counted(
    listening: socket.socket,
) -> None:
    share = FakeShare(excess=2)
    listener = _listener(listening, share, defer_s=3600)
    got: list[trio.SocketStream] = []
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            first = await _deferring(listener, listening, nursery, got)
            taken, _ = listening.accept()  # another frontend takes it
            share.more = 0  # and the next connection is this frontend's
            second = await _connect(listening)
    assert len(got) == 1
    assert share.count == 1
    # what it accepted is the second connection, not the one taken
    assert got[0].socket.getpeername() == second.socket.getsockname()
    taken.close()
    for s in (got[0], first, second):
        await s.aclose()
    await listener.aclose()


async def test_a_connection_counts_until_its_handler_returns() -> None:
    share = FakeShare()
    share.count = 1
    done = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        await done.wait()
        raise OSError("the connection failed")

    serve = counted(handler, share)  # type: ignore[arg-type]
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                with pytest.raises(OSError):
                    await serve(None)  # type: ignore[arg-type]

            nursery.start_soon(run)
            await trio.testing.wait_all_tasks_blocked()
            assert share.count == 1
            done.set()
    assert share.count == 0


def test_each_frontend_sees_the_others_counts(tmp_path: Path) -> None:
    path = str(tmp_path / "connections")
    create_shared_connections(path, 3)
    a, b, c = (SharedConnections(path, 3, i) for i in range(3))
    for _ in range(4):
        a.opened()
    b.opened()
    b.opened()
    c.opened()
    assert (a.excess(), b.excess(), c.excess()) == (3, 1, -1)
    a.closed()
    assert a.excess() == 2
    restarted = SharedConnections(path, 3, 2)  # a restarted frontend holds none
    assert (restarted.excess(), a.excess()) == (-2, 3)
    for view in (a, b, c, restarted):
        view.close()
    with pytest.raises(ValueError):
        SharedConnections(path, 3, 3)


def test_a_frontend_without_the_table_serves_unbalanced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing table (a supervisor of another version) costs the balance, not the frontend."""
    from smg_trio.serve.frontend import _share

    assert _share(str(tmp_path), 1, 2) is None
    assert "accepted unbalanced" in caplog.text
    create_shared_connections(str(tmp_path / "connections"), 2)
    share = _share(str(tmp_path), 2, 2)
    assert share is not None
    assert share.index == 1
    share.close()
