"""A fix for hypercorn 0.18's trio connection close: take the send lock, never wait forever.

``hypercorn/trio/tcp_server.py`` (``TCPServer``) writes every chunk under ``send_lock``, in a
shielded scope, but closes the connection (``_close``: ``send_eof`` then ``aclose``) without
the lock. Two failures follow, both reproduced against smg_trio (``docs/upstream.md``):

* A close racing a write. When the app's last response message closes the connection while
  the connection's reader is writing hypercorn's own 400 for a malformed follow-up request,
  trio's ``SocketStream`` raises ``BusyResourceError`` in the reader. Nothing catches it, and
  it takes the whole server down (one unauthenticated client could do this).
* A write that never ends. A client that stops reading leaves a shielded ``send_all`` blocked
  for as long as it stays connected, so shutdown never finishes.

:class:`ClosingTCPServer` (a ``TCPServer`` subclass, used only by the servers smg_trio starts,
:mod:`smg_trio.gateway.server.serve`) closes after waiting for the send lock for at most
:data:`CLOSE_LOCK_WAIT_S`, shielded from cancellation (a close must happen). If a write still
holds the lock then, that write is stuck on a client that is not reading: the socket is closed
under it, which makes the write fail with ``ClosedResourceError``, a case hypercorn already
handles. A stuck write also keeps its connection's task group (and so the server) from ever
finishing a cancellation: each server's :class:`Connections` closes those sockets when the
server is being stopped (:meth:`Connections.close_blocked_writes`), and while it runs
(:meth:`Connections.drop_stalled_writes`, the write timeout): each write records when it
started, and one that has been blocked longer than the timeout gets its socket closed, so the
app sees the client go away (its engine requests are ABORTed, its buffers freed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Final, Protocol

import trio
from hypercorn.config import Config
from hypercorn.protocol import ProtocolWrapper
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr

from smg_trio.gateway.server.fixes import Fix, missing_attrs, probe_config

__all__ = [
    "BLOCKED_WRITE_GRACE_S",
    "CLOSE_LOCK_WAIT_S",
    "FIX",
    "ClosingTCPServer",
    "Connections",
]

log = logging.getLogger(__name__)

#: How long closing a connection waits for an in-progress write. A write to a client that is
#: reading finishes in microseconds; one that is still blocked after this is stuck.
CLOSE_LOCK_WAIT_S: Final = 1.0
#: How long a stopping server lets in-progress writes finish before it closes their sockets.
BLOCKED_WRITE_GRACE_S: Final = 0.5


class Served(Protocol):
    """What :class:`Connections` reads of a connection (a :class:`ClosingTCPServer`)."""

    send_lock: trio.Lock
    stream: Any
    #: True while the connection's own close holds the send lock (it is not a stuck write).
    closing: bool
    #: ``trio.current_time()`` at the start of the write in progress, else None.
    write_since: float | None


def _busy(server: Served) -> bool:
    """Whether a write (not the connection's own close) holds ``server``'s send lock."""
    return server.send_lock.locked() and not server.closing


def _socket(server: Served) -> Any:
    return getattr(getattr(server, "stream", None), "socket", None)


class Connections:
    """The connections one server is serving, for the stuck-write sweeps."""

    def __init__(self) -> None:
        self._live: set[Served] = set()

    def add(self, server: Served) -> None:
        self._live.add(server)

    def discard(self, server: Served) -> None:
        self._live.discard(server)

    def __iter__(self) -> Iterator[Served]:
        return iter(list(self._live))

    def __len__(self) -> int:
        return len(self._live)

    async def close_blocked_writes(self, grace_s: float = BLOCKED_WRITE_GRACE_S) -> int:
        """Close the socket of every connection whose write is still in progress after
        ``grace_s`` seconds (its client stopped reading); the write then fails with
        ``ClosedResourceError`` and the connection unwinds. A write that merely happens to be
        in progress finishes within the grace and is left alone. Called, shielded, when the
        server is stopping. Returns how many connections were closed."""
        busy = [server for server in self if _busy(server)]
        if not busy:
            return 0
        with trio.move_on_after(grace_s):
            for server in busy:
                await server.send_lock.acquire()  # FIFO: the write in progress finishes first
                server.send_lock.release()
        closed = 0
        for server in busy:
            sock = _socket(server)
            if _busy(server) and sock is not None:
                sock.close()  # notify_closing wakes the blocked sender
                closed += 1
        return closed

    async def drop_stalled_writes(self, timeout_s: float) -> None:
        """Run until cancelled: every so often, close the socket of each connection whose
        current write has been blocked for ``timeout_s`` seconds or more (its client stopped
        reading). The write then fails, hypercorn tells the app that the client went away, and
        the request is cancelled."""
        interval = min(1.0, timeout_s / 4)
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for server in self:
                since = server.write_since
                if since is None or now - since < timeout_s:
                    continue
                sock = _socket(server)
                if sock is not None and sock.fileno() >= 0:
                    log.warning(
                        "dropping a connection whose client stopped reading (a write was "
                        "blocked for %.0f s; --write-timeout-secs %g)",
                        now - since,
                        timeout_s,
                    )
                    sock.close()  # notify_closing wakes the blocked sender
                server.write_since = None


class ClosingTCPServer(TCPServer):
    """hypercorn's trio connection, closed under its send lock and tracked in a
    :class:`Connections`; its protocol is built by :attr:`protocol_wrapper`."""

    #: Builds the connection's protocol (hypercorn's ``ProtocolWrapper`` signature).
    protocol_wrapper: type[ProtocolWrapper] = ProtocolWrapper

    def __init__(
        self,
        app: Any,
        config: Config,
        context: WorkerContext,
        state: Any,
        stream: Any,
        *,
        connections: Connections,
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self.connections = connections
        self.closing = False
        self.write_since: float | None = None

    async def run(self) -> None:
        self.connections.add(self)
        try:
            await self._serve()
        finally:
            self.connections.discard(self)

    async def _serve(self) -> None:
        """hypercorn 0.18's ``TCPServer.run``, with the protocol from :attr:`protocol_wrapper`."""
        try:
            try:
                with trio.fail_after(self.config.ssl_handshake_timeout):
                    await self.stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError):
                return  # Handshake failed
            alpn_protocol = self.stream.selected_alpn_protocol()
            socket = self.stream.transport_stream.socket
            ssl = True
        except AttributeError:  # Not SSL
            alpn_protocol = "http/1.1"
            socket = self.stream.socket
            ssl = False

        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())

            async with TaskGroup() as task_group:
                self._task_group = task_group
                self.protocol = self.protocol_wrapper(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    ssl,
                    client,
                    server,
                    self.protocol_send,
                    alpn_protocol,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    async def protocol_send(self, event: Any) -> None:
        self.write_since = trio.current_time()
        try:
            await super().protocol_send(event)
        finally:
            self.write_since = None

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_LOCK_WAIT_S):
                async with self.send_lock:
                    self.closing = True
                    await super()._close()
                    return
            # a write holds the lock, blocked on a client that stopped reading
            await self.stream.aclose()


def _probe() -> list[str]:
    server = TCPServer(None, probe_config(), WorkerContext(None), {}, None)  # type: ignore[arg-type]
    missing = missing_attrs(server, ("app", "config", "context", "send_lock", "idle_task"))
    if not isinstance(getattr(server, "send_lock", None), trio.Lock):
        missing.append("TCPServer().send_lock (a trio.Lock)")
    return missing


FIX: Final = Fix(
    name="close under the send lock (gateway/server/hypercorn_close.py)",
    verified={"hypercorn": "0.18"},
    targets=(
        "hypercorn.trio.tcp_server:TCPServer.run",
        "hypercorn.trio.tcp_server:TCPServer.protocol_send",
        "hypercorn.trio.tcp_server:TCPServer._close",
        "hypercorn.trio.tcp_server:TCPServer._read_data",
        "hypercorn.trio.tcp_server:TCPServer._idle_timeout",
        "hypercorn.trio.task_group:TaskGroup",
        "hypercorn.protocol:ProtocolWrapper.initiate",
        "hypercorn.utils:parse_socket_addr",
    ),
    probe=_probe,
)
