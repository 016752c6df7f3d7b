"""Connection events of a socket monitor (an engine's connection accepted or closed), decoded
at the transport boundary so that nothing above it reads libzmq's monitor frames."""

from __future__ import annotations

import logging
from typing import Literal

import attrs
import zmq
from zmq.utils.monitor import parse_monitor_message

from smg_trio.transport.zsocket import ZmqSocket

__all__ = ["INPUT_MONITOR_EVENTS", "ConnectionEvent", "ConnectionMonitor", "EventKind"]

logger = logging.getLogger(__name__)

#: What the input ROUTER's monitor reports: an engine's connection accepted, its ZMTP
#: handshake done, and closed. Accepted and closed name the connection's file descriptor; a
#: registration's ``ZMQ_SRCFD`` ties that descriptor to the engine's identity (see the
#: connector's connection watch). The handshake event names no descriptor (libzmq sends 0),
#: but it comes after its connection's ``ACCEPTED``, and by then the session has handed the
#: ROUTER the new pipe and the peer's routing id: only from then on can the ROUTER route to
#: that identity over the new connection (before it, a send can fail with ``EHOSTUNREACH``,
#: or even go into the closed connection's pipe and be lost).
INPUT_MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED

EventKind = Literal["accepted", "handshake", "closed"]
_KINDS: dict[int, EventKind] = {
    zmq.EVENT_ACCEPTED: "accepted",
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "handshake",
    zmq.EVENT_DISCONNECTED: "closed",
}


@attrs.frozen
class ConnectionEvent:
    """A peer's connection was ``accepted``, finished its ZMTP ``handshake`` (``fd`` is then
    -1: libzmq does not name it) or ``closed``."""

    kind: EventKind
    fd: int

    @property
    def accepted(self) -> bool:
        return self.kind == "accepted"

    @property
    def handshaken(self) -> bool:
        """The connection finished its ZMTP handshake: the peer is routable from now on."""
        return self.kind == "handshake"


class ConnectionMonitor:
    """The PAIR a socket monitor reports on; one task receives from it."""

    __slots__ = ("_pair",)

    def __init__(self, pair: ZmqSocket) -> None:
        self._pair = pair

    async def receive(self) -> ConnectionEvent | None:
        """The next event; ``None`` for one that is undecodable or of another kind. Raises
        :class:`~smg_trio.transport.zsocket.ZmqSocketError` and
        :class:`trio.ClosedResourceError` like :meth:`ZmqSocket.recv_multipart`."""
        frames = await self._pair.recv_multipart()
        try:
            event = parse_monitor_message(frames)
        except (ValueError, TypeError, IndexError) as exc:  # pragma: no cover - libzmq's own
            logger.warning("undecodable socket monitor event: %s", exc)
            return None
        kind = _KINDS.get(int(event["event"]))
        if kind is None:
            return None
        fd = -1 if kind == "handshake" else int(event["value"])
        return ConnectionEvent(kind=kind, fd=fd)

    def close(self) -> None:
        """Close the PAIR; idempotent."""
        self._pair.close()
