"""A fix for hypercorn 0.18's trio connection close: take the send lock, never wait forever.

``hypercorn/trio/tcp_server.py`` (``TCPServer``) writes every chunk under ``send_lock``, in a
shielded scope, but closes the connection (``_close``: ``send_eof`` then ``aclose``) without
the lock. Two failures follow, both reproduced against smg_trio:

* A close racing a write. When the app's last response message closes the connection while
  the connection's reader is writing hypercorn's own 400 for a malformed follow-up request,
  trio's ``SocketStream`` raises ``BusyResourceError`` in the reader. Nothing catches it, and
  it takes the whole server down (one unauthenticated client could do this).
* A write that never ends. A client that stops reading leaves a shielded ``send_all`` blocked
  for as long as it stays connected, so shutdown never finishes.

The replacement ``_close`` waits for the send lock for at most :data:`CLOSE_LOCK_WAIT_S`,
shielded from cancellation (a close must happen). If a write still holds the lock then, that
write is stuck on a client that is not reading: the socket is closed under it, which makes the
write fail with ``ClosedResourceError``, a case hypercorn already handles. A stuck write also
keeps its connection's task group (and so the server) from ever finishing a cancellation;
:func:`close_blocked_writes` closes those sockets when the server is being stopped, and
:func:`drop_stalled_writes` (the write timeout) while it runs: each write records when it
started, and one that has been blocked longer than the timeout gets its socket closed, so the
app sees the client go away (its engine requests are ABORTed, its buffers freed). Installed
once, by :func:`install`, from :func:`smg_trio.gateway.http.app.serve_http`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio
from hypercorn.trio.tcp_server import TCPServer

__all__ = [
    "BLOCKED_WRITE_GRACE_S",
    "CLOSE_LOCK_WAIT_S",
    "close_blocked_writes",
    "drop_stalled_writes",
    "install",
]

log = logging.getLogger(__name__)

#: How long closing a connection waits for an in-progress write. A write to a client that is
#: reading finishes in microseconds; one that is still blocked after this is stuck.
CLOSE_LOCK_WAIT_S: Final = 1.0
#: How long a stopping server lets in-progress writes finish before it closes their sockets.
BLOCKED_WRITE_GRACE_S: Final = 0.5

_MARK = "_smg_trio_close_under_send_lock"
#: Set on a connection while its close holds the send lock (that holder is not a stuck write).
_CLOSING = "_smg_trio_closing"
#: Set on a connection while a write is in progress: ``trio.current_time()`` at its start.
_WRITE_SINCE = "_smg_trio_write_since"
#: The connections being served (TCPServer instances), for close_blocked_writes.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _busy(server: Any) -> bool:
    """Whether a write (not the connection's own close) holds ``server``'s send lock."""
    lock = getattr(server, "send_lock", None)
    return isinstance(lock, trio.Lock) and lock.locked() and not getattr(server, _CLOSING, False)


async def close_blocked_writes(grace_s: float = BLOCKED_WRITE_GRACE_S) -> int:
    """Close the socket of every connection whose write is still in progress after
    ``grace_s`` seconds (its client stopped reading); the write then fails with
    ``ClosedResourceError`` and the connection unwinds. A write that merely happens to be in
    progress finishes within the grace and is left alone. Called, shielded, when the server is
    stopping. Returns how many connections were closed."""
    busy = [server for server in list(_LIVE) if _busy(server)]
    if not busy:
        return 0
    with trio.move_on_after(grace_s):
        for server in busy:
            lock: trio.Lock = server.send_lock
            await lock.acquire()  # FIFO: the write in progress finishes first
            lock.release()
    closed = 0
    for server in busy:
        sock = getattr(getattr(server, "stream", None), "socket", None)
        if _busy(server) and sock is not None:
            sock.close()  # notify_closing wakes the blocked sender
            closed += 1
    return closed


async def drop_stalled_writes(config: object, timeout_s: float) -> None:
    """Run until cancelled: every so often, close the socket of each connection served with
    hypercorn ``config`` whose current write has been blocked for ``timeout_s`` seconds or
    more (its client stopped reading). The write then fails, hypercorn tells the app that the
    client went away, and the request is cancelled."""
    interval = min(1.0, timeout_s / 4)
    while True:
        await trio.sleep(interval)
        now = trio.current_time()
        for server in list(_LIVE):
            since = getattr(server, _WRITE_SINCE, None)
            if since is None or now - since < timeout_s or server.config is not config:
                continue
            sock = getattr(getattr(server, "stream", None), "socket", None)
            if sock is not None and sock.fileno() >= 0:
                log.warning(
                    "dropping a connection whose client stopped reading (a write was blocked "
                    "for %.0f s; --write-timeout-secs %g)",
                    now - since,
                    timeout_s,
                )
                sock.close()  # notify_closing wakes the blocked sender
            setattr(server, _WRITE_SINCE, None)


def install() -> None:
    """Replace ``TCPServer._close`` once per process (idempotent). Logs and does nothing if
    this hypercorn no longer has the attributes the fix relies on."""
    original: Callable[[Any], Awaitable[None]] | None = getattr(TCPServer, "_close", None)
    if original is None or getattr(original, _MARK, False):
        return

    async def _close(self: Any) -> None:
        lock = getattr(self, "send_lock", None)
        if not isinstance(lock, trio.Lock):
            await original(self)
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_LOCK_WAIT_S):
                async with lock:
                    setattr(self, _CLOSING, True)
                    await original(self)
                    return
            # a write holds the lock, blocked on a client that stopped reading
            await self.stream.aclose()

    original_run: Callable[[Any], Awaitable[None]] = TCPServer.run
    original_send: Callable[[Any, Any], Awaitable[None]] = TCPServer.protocol_send

    async def protocol_send(self: Any, event: Any) -> None:
        setattr(self, _WRITE_SINCE, trio.current_time())
        try:
            await original_send(self, event)
        finally:
            setattr(self, _WRITE_SINCE, None)

    async def run(self: Any) -> None:
        _LIVE.add(self)
        try:
            await original_run(self)
        finally:
            _LIVE.discard(self)

    setattr(_close, _MARK, True)
    TCPServer._close = _close  # type: ignore[method-assign]
    TCPServer.run = run  # type: ignore[method-assign]
    TCPServer.protocol_send = protocol_send  # type: ignore[method-assign]
    log.debug("hypercorn TCPServer._close now takes the send lock")
