"""``close_blocked_writes`` counts and closes only connections whose send lock is held by a
write, not by the connection's own close (which would log a misleading warning)."""

from __future__ import annotations

import attrs
import trio

from smg_trio.gateway import hypercorn_close


@attrs.define(eq=False)
class _Sock:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@attrs.define(eq=False)
class _Stream:
    socket: _Sock = attrs.Factory(_Sock)


@attrs.define(eq=False, slots=False)  # the close marks itself with an attribute
class _Server:
    send_lock: trio.Lock = attrs.Factory(trio.Lock)
    stream: _Stream = attrs.Factory(_Stream)


async def test_only_stuck_writes_are_closed() -> None:
    writing, closing, idle = _Server(), _Server(), _Server()
    writing.send_lock.acquire_nowait()
    closing.send_lock.acquire_nowait()
    setattr(closing, hypercorn_close._CLOSING, True)
    for server in (writing, closing, idle):
        hypercorn_close._LIVE.add(server)
    try:
        assert hypercorn_close.close_blocked_writes() == 1
        assert writing.stream.socket.closed
        assert not closing.stream.socket.closed
        assert not idle.stream.socket.closed
    finally:
        for server in (writing, closing, idle):
            hypercorn_close._LIVE.discard(server)
