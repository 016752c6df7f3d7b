"""Frontends sharing one listening socket each accept while they hold no more than the others.

``--api-server-count`` frontends inherit one listening socket, and the kernel wakes all of
them for each new connection: the one that runs first takes it, and then every other one that
is waiting in the accept queue (a burst of connects went 25 to 7 between two frontends). The
frontend holding more connections then saturates first, while the other has room.
:class:`BalancedListener` makes a frontend that holds more than ``slack`` connections above
the fewest any other holds leave a waiting connection to the others for up to ``defer_s``
(then it takes it: a busy or stalled peer never strands a client). The counts live in a
:class:`ConnectionShare` (shared memory across the frontends, :mod:`smg_trio.serve.conn_share`).
"""

from __future__ import annotations

import select
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import trio

__all__ = [
    "BALANCE_DEFER_S",
    "BALANCE_POLL_S",
    "BALANCE_SLACK",
    "BalancedListener",
    "ConnectionShare",
    "counted",
]

#: Connections a frontend may hold above the fewest another holds before it defers.
BALANCE_SLACK: Final = 1
#: The longest a waiting connection is left to the other frontends.
BALANCE_DEFER_S: Final = 0.005
#: How often a deferring frontend looks whether the connection was taken.
BALANCE_POLL_S: Final = 0.0005


class ConnectionShare(Protocol):
    """This frontend's open connections, as every frontend sees them."""

    def opened(self) -> None:
        """One more connection here."""

    def closed(self) -> None:
        """One connection fewer here."""

    def excess(self) -> int:
        """This frontend's open connections minus the fewest any other frontend holds."""


def _waiting(sock: trio.socket.SocketType) -> bool:
    """Whether a connection is waiting in the listening socket's accept queue (no wait)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class BalancedListener(trio.abc.Listener[trio.SocketStream]):
    """A :class:`trio.SocketListener` that accepts only its fair share of connections
    (``share``); each accepted connection counts as opened (the handler, wrapped with
    :func:`counted`, counts it closed)."""

    def __init__(
        self,
        listener: trio.SocketListener,
        share: ConnectionShare,
        *,
        slack: int = BALANCE_SLACK,
        defer_s: float = BALANCE_DEFER_S,
        poll_s: float = BALANCE_POLL_S,
    ) -> None:
        self.listener = listener
        self.share = share
        self._slack = slack
        self._defer_s = defer_s
        self._poll_s = poll_s
        #: Connections left to the other frontends (and how many were taken after all).
        self.deferred = 0
        self.taken_anyway = 0

    async def accept(self) -> trio.SocketStream:
        sock = self.listener.socket
        while True:
            await trio.lowlevel.wait_readable(sock)
            if self.share.excess() <= self._slack:
                break
            self.deferred += 1
            with trio.move_on_after(self._defer_s) as waited:
                # the counts are other processes': there is no event to wait on
                while self.share.excess() > self._slack and _waiting(sock):  # noqa: ASYNC110
                    await trio.sleep(self._poll_s)
            if waited.cancelled_caught:
                self.taken_anyway += 1
                break
            if self.share.excess() <= self._slack:
                break  # it is this frontend's turn now, if the connection is still there
            # taken by another frontend: wait for the next one
        stream = await self.listener.accept()
        self.share.opened()
        return stream

    async def aclose(self) -> None:
        await self.listener.aclose()


def counted(
    handler: Callable[[trio.SocketStream], Awaitable[None]], share: ConnectionShare
) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """``handler`` for connections accepted by a :class:`BalancedListener`: the connection
    counts as closed once the handler returns, however it ends."""

    async def serve(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        finally:
            share.closed()

    return serve
