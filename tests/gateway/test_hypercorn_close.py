"""``close_blocked_writes`` closes only connections whose write is still blocked after the
grace period: not a write that finishes within it, and not a connection whose own close holds
the send lock (either would log a misleading warning)."""

from __future__ import annotations

import attrs
import trio

from smg_trio.gateway.server import hypercorn_close


@attrs.define(eq=False)
class _Sock:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@attrs.define(eq=False)
class _Stream:
    socket: _Sock = attrs.Factory(_Sock)


@attrs.define(eq=False)
class _Server:
    send_lock: trio.Lock = attrs.Factory(trio.Lock)
    stream: _Stream = attrs.Factory(_Stream)
    closing: bool = False  # set while the connection's own close holds the send lock
    write_since: float | None = None


async def _hold(lock: trio.Lock, until: trio.Event, task_status: trio.TaskStatus[None]) -> None:
    async with lock:
        task_status.started()
        await until.wait()


async def _set(event: trio.Event) -> None:
    event.set()


async def test_only_stuck_writes_are_closed() -> None:
    stuck, finishing, closing, idle = _Server(), _Server(), _Server(), _Server()
    never, soon = trio.Event(), trio.Event()
    closing.closing = True
    servers = (stuck, finishing, closing, idle)
    connections = hypercorn_close.Connections()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(_hold, stuck.send_lock, never)
            await nursery.start(_hold, finishing.send_lock, soon)
            await nursery.start(_hold, closing.send_lock, never)
            nursery.start_soon(_set, soon)  # this write ends within the grace
            for server in servers:
                connections.add(server)
            assert await connections.close_blocked_writes(grace_s=0.2) == 1
            nursery.cancel_scope.cancel()
    assert stuck.stream.socket.closed
    assert not finishing.stream.socket.closed
    assert not closing.stream.socket.closed
    assert not idle.stream.socket.closed
