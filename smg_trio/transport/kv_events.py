"""The KV event sockets: a SUB on an engine's publisher and a DEALER on its replay ROUTER.

vLLM's ``ZmqEventPublisher`` binds its PUB on a wildcard, ``ipc://`` or ``inproc://``
endpoint (a subscriber connects) and connects to any other tcp endpoint (a subscriber must
bind it); its replay ROUTER always binds. Each socket here has one owner, the engine's feed
task (``worker/kv_feed.py``), which uses it sequentially. The SUB's receive queue is bounded
(``RCVHWM``: past it libzmq drops messages, which the feed sees as a sequence gap) and so is a
message's size (``MAXMSGSIZE``: a larger one closes that connection), so a flooding publisher
cannot grow the gateway's memory. A SUB bound on tcp (an engine dials it) is guarded as the
tcp data plane is (:mod:`~smg_trio.transport.peer_guard`): on loopback any local user could
otherwise connect a PUB and feed the router made-up events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final

import trio
import zmq

from smg_trio.errors import EngineError
from smg_trio.transport.peer_guard import PeerGuard, open_peer_guard
from smg_trio.transport.tcp import TcpOptions
from smg_trio.transport.zsocket import ZmqSocket, zmq_context

__all__ = [
    "KV_EVENTS_MAX_MESSAGE_BYTES",
    "KV_EVENTS_MAX_QUEUED_BYTES",
    "KV_EVENTS_RCVHWM",
    "KvEventSocket",
    "open_kv_replay",
    "open_kv_subscriber",
]

#: The most bytes a SUB's queue may hold: ``RCVHWM`` x ``MAXMSGSIZE`` (libzmq counts
#: messages, not bytes; 10000 x 16 MiB let a flooding publisher make it hold 156 GiB).
KV_EVENTS_MAX_QUEUED_BYTES: Final = 1 << 30
#: The largest event message accepted; a larger one drops the publisher's connection. A
#: step's batch carries the token ids of the blocks it filled: 4 MiB holds about 800k.
KV_EVENTS_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
#: Messages queued on a SUB before libzmq drops new ones (the feed then sees a gap): 256
#: steps of an engine, seconds of backlog behind a busy event loop.
KV_EVENTS_RCVHWM: Final = KV_EVENTS_MAX_QUEUED_BYTES // KV_EVENTS_MAX_MESSAGE_BYTES


class KvEventSocket:
    """A SUB or DEALER of the KV event wire (one owner task)."""

    def __init__(self, socket: ZmqSocket, endpoint: str) -> None:
        self.socket = socket
        #: The endpoint connected or bound (resolved, for a bind).
        self.endpoint = endpoint

    async def receive(self) -> list[bytes]:
        """The next multipart message (cancel-atomic)."""
        return await self.socket.recv_multipart()

    def receive_nowait(self) -> list[bytes] | None:
        """A waiting message, or ``None``; not a checkpoint."""
        return self.socket.recv_multipart_nowait()

    async def send(self, frames: list[bytes]) -> None:
        """Send one multipart message (a DEALER's replay request)."""
        await self.socket.send_multipart(frames)


def _open(
    socket_type: int, endpoint: str, *, bind: bool, guard: PeerGuard | None = None
) -> KvEventSocket:
    sock = (guard.context if guard is not None else zmq_context()).socket(socket_type)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, KV_EVENTS_RCVHWM)
        sock.setsockopt(zmq.MAXMSGSIZE, KV_EVENTS_MAX_MESSAGE_BYTES)
        if guard is not None:
            guard.protect(sock, "kv_events")
        if bind:
            sock.bind(endpoint)
            resolved = sock.get(zmq.LAST_ENDPOINT)
            endpoint = resolved.decode() if isinstance(resolved, bytes) else endpoint
            if guard is not None:
                guard.bound("kv_events", endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        verb = "bind" if bind else "connect"
        raise EngineError(f"cannot {verb} the KV event socket to {endpoint}: {exc}") from exc
    return KvEventSocket(ZmqSocket(sock), endpoint)


@asynccontextmanager
async def open_kv_subscriber(
    endpoint: str, topic: str, *, bind: bool = False, peers: TcpOptions | None = None
) -> AsyncIterator[KvEventSocket]:
    """A SUB subscribed to ``topic`` (a prefix, as ZMQ matches it), connected to ``endpoint``
    or, with ``bind``, bound there; a ``tcp://`` bind with ``peers`` admits only the peers
    they allow (an allowed host and, on this host, an allowed uid). Raises ``EngineError``
    when libzmq refuses the endpoint."""
    async with AsyncExitStack() as stack:
        guard = None
        if bind and peers is not None and endpoint.startswith("tcp://"):
            guard = await stack.enter_async_context(open_peer_guard(peers))
        kv = _open(zmq.SUB, endpoint, bind=bind, guard=guard)
        try:
            kv.socket.raw.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
            await trio.lowlevel.checkpoint()
            yield kv
        finally:
            kv.socket.close()


@asynccontextmanager
async def open_kv_replay(endpoint: str) -> AsyncIterator[KvEventSocket]:
    """A DEALER connected to an engine's replay ROUTER at ``endpoint``."""
    kv = _open(zmq.DEALER, endpoint, bind=False)
    try:
        await trio.lowlevel.checkpoint()
        yield kv
    finally:
        kv.socket.close()
