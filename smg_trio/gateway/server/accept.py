"""The accept loop of the plain-TCP listeners: every waiting connection taken per wake-up.

``trio.serve_listeners`` accepts one connection per pass of the scheduler (each ``accept``
is a checkpoint). Under load a pass is long (an engine output burst, the requests' own
work), so a burst of new connections queued in the kernel for seconds: with ``vllm bench
serve`` opening 256 at once, the last requests of the burst waited 2.2 s for their first
token while the others streamed. This loop takes up to :data:`ACCEPT_BATCH` waiting
connections each time the socket is readable, as asyncio's server does, with
``trio.serve_listeners``' handling of errors (transient ones skipped, resource exhaustion
logged and retried after :data:`CAPACITY_SLEEP_S`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Final, NoReturn

import trio

__all__ = ["ACCEPT_BATCH", "serve_batched"]

#: The most connections taken per wake-up of the listening socket.
ACCEPT_BATCH: Final = 128
#: ``accept(2)`` errors of a connection that went away before it was taken (as trio).
_SKIP: Final = frozenset(
    getattr(errno, name)
    for name in (
        "EPERM",
        "ECONNABORTED",
        "EPROTO",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
    )
    if hasattr(errno, name)
)
#: The system is out of descriptors or memory: wait before accepting again (as trio).
_CAPACITY: Final = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS))
CAPACITY_SLEEP_S: Final = 0.1

log = logging.getLogger(__name__)

Handler = Callable[[trio.SocketStream], Awaitable[object]]


async def _run_handler(stream: trio.SocketStream, handler: Handler) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)


async def _serve_one(sock: socket.socket, handler: Handler, nursery: trio.Nursery) -> NoReturn:
    sock.setblocking(False)
    try:
        while True:
            await trio.lowlevel.wait_readable(sock)
            for _ in range(ACCEPT_BATCH):
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _SKIP:
                        continue
                    if exc.errno not in _CAPACITY:
                        raise
                    log.error(
                        "accept returned %s (%s); retrying in %s seconds",
                        errno.errorcode[exc.errno],
                        os.strerror(exc.errno),
                        CAPACITY_SLEEP_S,
                    )
                    await trio.sleep(CAPACITY_SLEEP_S)
                    break
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
                nursery.start_soon(_run_handler, stream, handler)
    finally:
        sock.close()


async def serve_batched(
    handler: Handler, socks: list[socket.socket], *, handler_nursery: trio.Nursery
) -> NoReturn:
    """``trio.serve_listeners(handler, listeners, handler_nursery=...)`` for the listening
    ``socks`` (this loop closes them), taking every waiting connection per wake-up."""
    async with trio.open_nursery() as nursery:
        for sock in socks:
            nursery.start_soon(_serve_one, sock, handler, handler_nursery)
    raise AssertionError("_serve_one never returns")  # pragma: no cover
