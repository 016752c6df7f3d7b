"""A raw handshake peer for tests: a DEALER that sends whatever it is told (a stranger, or an
engine whose HELLO must land at a precise moment) and can wait until its connection is up."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import zmq

from smg_trio.transport.zsocket import Frame, ZmqSocket, zmq_context

__all__ = ["RawPeer", "open_raw_peer"]


@attrs.define
class RawPeer:
    """A connected DEALER (``sock``) and a monitor of its connection events."""

    sock: ZmqSocket
    _monitor: ZmqSocket

    async def send(self, *frames: Frame) -> None:
        """Queue one message (it is delivered once the connection is up)."""
        await self.sock.send_multipart(list(frames))

    async def recv(self) -> list[bytes]:
        """Receive one message."""
        return await self.sock.recv_multipart()

    async def wait_connected(self) -> None:
        """Wait until the ZMTP handshake with the peer succeeded: from then on, queued messages
        are on their way (libzmq flushes them at once)."""
        await self.wait_event(zmq.EVENT_HANDSHAKE_SUCCEEDED)

    async def wait_event(self, event: int) -> None:
        """Wait for the next monitor event ``event`` (earlier other events are skipped)."""
        while True:
            frames: Sequence[bytes] = await self._monitor.recv_multipart()
            (kind,) = struct.unpack("=H", frames[0][:2])
            if kind == event:
                return


@asynccontextmanager
async def open_raw_peer(address: str, identity: bytes) -> AsyncIterator[RawPeer]:
    """A DEALER with ``identity`` connected to ``address``; closed (linger 0) on exit."""
    with contextlib.ExitStack() as stack:  # runs bottom-up: unmonitor, close monitor, close
        raw = zmq_context().socket(zmq.DEALER)
        stack.callback(raw.close, 0)
        sock = ZmqSocket(raw)
        stack.callback(sock.close)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.IDENTITY, identity)
        monitor_raw = raw.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        stack.callback(monitor_raw.close, 0)
        monitor = ZmqSocket(monitor_raw)
        stack.callback(monitor.close)
        stack.callback(raw.disable_monitor)
        raw.connect(address)
        yield RawPeer(sock, monitor)
