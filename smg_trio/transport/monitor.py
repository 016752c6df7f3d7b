"""Connection events of a socket monitor (an engine's connection accepted or closed), decoded
at the transport boundary so that nothing above it reads libzmq's monitor frames."""

from __future__ import annotations

import logging

import attrs
import zmq
from zmq.utils.monitor import parse_monitor_message

from smg_trio.transport.zsocket import ZmqSocket

__all__ = ["INPUT_MONITOR_EVENTS", "ConnectionEvent", "ConnectionMonitor"]

logger = logging.getLogger(__name__)

#: What the input ROUTER's monitor reports: an engine's connection accepted, and closed. Each
#: event names the connection's file descriptor; a registration's ``ZMQ_SRCFD`` ties that
#: descriptor to the engine's identity (see the connector's connection watch). A finished ZMTP
#: handshake (the peer's identity is routable from then on) is reported too: a frontend client
#: that attaches to engines waits for it (``handshaken``).
INPUT_MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


@attrs.frozen
class ConnectionEvent:
    """A peer's connection was ``accepted`` (else: it closed), named by its descriptor;
    ``handshaken``: that connection finished its ZMTP handshake (``accepted`` is False then,
    and it is not a close)."""

    accepted: bool
    fd: int
    handshaken: bool = False


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
        kind = int(event["event"])
        fd = int(event["value"])
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return ConnectionEvent(accepted=False, fd=fd, handshaken=True)
        if kind not in (zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED):
            return None
        return ConnectionEvent(accepted=kind == zmq.EVENT_ACCEPTED, fd=fd)

    def close(self) -> None:
        """Close the PAIR; idempotent."""
        self._pair.close()
