"""A tcp worker's data-plane gate: a ZAP handler that lets a connection finish its ZMTP
handshake, and so become routable, only once its peer is verified (an allowed host and, for a
peer on this host, a socket owned by an allowed uid).

Why ZAP (issue 28, item 2): on a loopback ``tcp://`` worker any local process can dial the
input ROUTER with an engine's routing id, and ``ROUTER_HANDOVER`` gives it the identity: the
next prompt goes to it. A socket monitor sees the connection only after the fact, and the
ROUTER can route to it as soon as its handshake is done, so shutting it down from the monitor
leaves a window. With ``ZMQ_ZAP_DOMAIN`` set (and ``ZMQ_ZAP_ENFORCE_DOMAIN``, so that no
handler means no connection), libzmq holds every new connection's handshake until the handler
answers: no pipe, no routing id, nothing sent to it. Real engines need no change (the NULL
mechanism; ZAP is the server's business).

A ZAP request names the peer's IP but not its port, so the handler cannot tell which
connection asks. It judges every open connection from that IP to the socket
(``/proc/net/tcp``): all allowed, it says 200; none allowed, 400 (libzmq then closes it, and
the peer does not redial); both, it shuts the refused ones down, waits until libzmq has closed
them, and then says 200 (the request was an allowed one's, or its session is gone). A refused
connection never completes a handshake, so it never holds an identity, and a real engine's
is never refused (which would stop it redialing).

Each guard has its own ``zmq.Context``: a ZAP handler is per context, and this one is owned by
one task for the life of the worker's data sockets.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio
import zmq

from smg_trio.exc_groups import sole_exception
from smg_trio.transport.peercred import (
    Address,
    IpAddress,
    TcpEntry,
    normalize_ip,
    read_tcp_tables,
)
from smg_trio.transport.tcp import TcpOptions, inet_names
from smg_trio.transport.zsocket import ZmqSocket, ZmqSocketError

__all__ = [
    "ZAP_ENDPOINT",
    "PeerGuard",
    "Verdict",
    "judge",
    "judge_connection",
    "open_peer_guard",
]

logger = logging.getLogger(__name__)

#: Where libzmq sends ZAP requests (RFC 27), in the socket's context.
ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
#: While an allowed and a refused connection from one IP both wait, the table is read again
#: this often (seconds) until libzmq has closed the refused ones ...
MIXED_POLL_S: Final = 0.005
#: ... for at most this long; then the request is left unanswered (libzmq's handshake
#: timeout closes that connection, and an engine redials).
MIXED_WAIT_S: Final = 5.0
#: Refusals logged at WARNING per guard; the rest at DEBUG (a flood must not flood the log).
REFUSAL_LOG_LIMIT: Final = 10
_LISTEN: Final = 0x0A


@attrs.frozen
class Verdict:
    """Whether a peer may be an engine's: ``peer`` describes it (``IP:PORT``, its uid when it
    is on this host), ``why`` says why it is refused."""

    allowed: bool
    peer: str
    why: str = ""


def _shown(addr: Address) -> str:
    ip, port = addr
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def judge(ours: Address, peer: Address, table: list[TcpEntry] | None, opts: TcpOptions) -> Verdict:
    """The verdict on a connection from ``peer`` to our ``ours``: the host must be allowed
    (:meth:`TcpOptions.peer_allowed`); a peer whose socket is in ``table`` (it is on this host)
    must hold it as an allowed uid (:meth:`TcpOptions.uid_allowed`); a loopback peer not in the
    table cannot be verified and is refused."""
    shown = _shown(peer)
    if not opts.peer_allowed(str(peer[0])):
        return Verdict(False, shown, "the host is not loopback or in --allowed-engine-hosts")
    theirs = None
    if table is not None:
        theirs = next((e for e in table if e.local == peer and e.remote == ours), None)
    if theirs is None:
        if peer[0].is_loopback:
            return Verdict(False, shown, "the owner of its socket cannot be read")
        return Verdict(True, shown)  # another host: the host allow-list decides
    if theirs.inode == 0:
        return Verdict(False, shown, "its socket is closed")
    shown += f" (uid {theirs.uid})"
    if not opts.uid_allowed(theirs.uid):
        return Verdict(False, shown, "its socket is not owned by an allowed uid")
    return Verdict(True, shown)


def judge_connection(fd: int, local_port: int, opts: TcpOptions) -> Verdict | None:
    """The verdict on the tcp connection with descriptor ``fd`` (a socket monitor's), or
    ``None`` when ``fd`` is not (or no longer) a connection to ``local_port``: the number may
    have been reused by another socket, which must not be judged, let alone shut down."""
    names = inet_names(fd)
    if names is None:
        return None
    local, peer = names
    if local[1] != local_port:
        return None
    ours = (normalize_ip(local[0]), int(local[1]))
    theirs = (normalize_ip(peer[0]), int(peer[1]))
    return judge(ours, theirs, read_tcp_tables(local_port), opts)


def _shut_down_inode(inode: int) -> None:
    """``shutdown(2)`` our socket with ``inode`` (found in /proc/self/fd, checked on a
    duplicate of its descriptor, so a number reused meanwhile is never touched; libzmq keeps
    its descriptor and closes it once it sees the connection end)."""
    target = f"socket:[{inode}]"
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") != target:
                continue
            dup = os.dup(int(name))
        except (OSError, ValueError):
            continue
        try:
            if os.fstat(dup).st_ino != inode:
                continue
            sock = socket.socket(fileno=dup)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.detach()
        finally:
            os.close(dup)
        return


@attrs.frozen
class _Endpoint:
    name: str
    ip: IpAddress | None  # None: bound on a wildcard
    port: int

    def mine(self, entry: TcpEntry, peer_ip: IpAddress) -> bool:
        """Whether ``entry`` is one of our connections to this socket from ``peer_ip``."""
        return (
            entry.inode != 0
            and entry.state != _LISTEN
            and entry.local[1] == self.port
            and (self.ip is None or entry.local[0] == self.ip)
            and entry.remote[0] == peer_ip
        )


def _endpoint(name: str, address: str) -> _Endpoint:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    ip: IpAddress | None = None
    if host not in ("*", "0.0.0.0", "::"):
        ip = normalize_ip(host)
    return _Endpoint(name, ip, int(port))


class PeerGuard:
    """The ZAP handler of one tcp worker's data sockets; see the module. Create it with
    :func:`open_peer_guard`; :meth:`protect` each socket before its bind, :meth:`bound` after."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], opts: TcpOptions) -> None:
        #: The context the guarded sockets must be created in (the handler's).
        self.context = context
        self.opts = opts
        self._endpoints: dict[bytes, _Endpoint] = {}
        self._refusals = 0

    def protect(self, sock: zmq.Socket[bytes], name: str) -> None:
        """Hold ``sock``'s new connections until this guard admits them (before its bind)."""
        sock.setsockopt(zmq.ZAP_DOMAIN, name.encode())
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no handler: no connection

    def bound(self, name: str, address: str) -> None:
        """``protect``-ed socket ``name`` is bound at ``address`` (resolved ``tcp://``)."""
        self._endpoints[name.encode()] = _endpoint(name, address)

    async def serve(self, zap: ZmqSocket) -> None:
        """Answer ZAP requests until cancelled or the socket closes."""
        try:
            while True:
                frames = await zap.recv_multipart()
                reply = await self._answer(frames)
                if reply is not None:
                    zap.send_multipart_nowait(reply)
        except (ZmqSocketError, trio.ClosedResourceError) as exc:
            logger.warning("tcp engine peer guard stopped: %s", exc)

    async def _answer(self, frames: list[bytes]) -> list[bytes] | None:
        """The reply to one ZAP request (``None``: none, the handshake times out)."""
        if len(frames) < 8 or frames[1] != b"" or frames[2] != b"1.0":
            return None  # not libzmq's
        routing, _, _, request_id, domain, address = frames[:6]

        def reply(code: bytes, text: bytes) -> list[bytes]:
            return [routing, b"", b"1.0", request_id, code, text, b"", b""]

        endpoint = self._endpoints.get(domain)
        if endpoint is None:
            return None
        try:
            peer_ip = normalize_ip(address.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return reply(b"400", b"unknown peer address")
        with trio.move_on_after(MIXED_WAIT_S):
            while True:
                # off the event loop, and only the rows of this socket's port: the table
                # grows with every tcp socket of the host, which a local user can multiply
                table = await trio.to_thread.run_sync(read_tcp_tables, endpoint.port)
                if table is None:  # no table: only other hosts can be judged (by address)
                    ok = not peer_ip.is_loopback and self.opts.peer_allowed(str(peer_ip))
                    return reply(b"200", b"OK") if ok else reply(b"400", b"refused")
                judged = [
                    (e, judge(e.local, e.remote, table, self.opts))
                    for e in table
                    if endpoint.mine(e, peer_ip)
                ]
                if not judged:
                    # The asking connection is gone (libzmq holds its descriptor while it
                    # waits, so it would be listed): no answer can matter. Fail closed anyway.
                    logger.debug(
                        "ZAP: no open connection from %s to the %s socket", peer_ip, endpoint.name
                    )
                    return None
                refused = [(e, v) for e, v in judged if not v.allowed]
                if not refused:
                    return reply(b"200", b"OK")
                for entry, verdict in refused:
                    if entry.open:  # logged once: shut down, it is no longer open
                        self._log_refusal(endpoint.name, verdict)
                if len(refused) == len(judged):
                    return reply(b"400", b"refused")
                for entry, _ in refused:
                    if entry.open:
                        _shut_down_inode(entry.inode)
                await trio.sleep(MIXED_POLL_S)
        return None

    def _log_refusal(self, name: str, verdict: Verdict) -> None:
        self._refusals += 1
        level = logging.WARNING if self._refusals <= REFUSAL_LOG_LIMIT else logging.DEBUG
        logger.log(
            level,
            "refused a connection to the %s socket from %s: %s",
            name,
            verdict.peer,
            verdict.why,
        )
        if self._refusals == REFUSAL_LOG_LIMIT:
            logger.warning("further refused engine connections are logged at DEBUG only")


@asynccontextmanager
async def open_peer_guard(opts: TcpOptions) -> AsyncIterator[PeerGuard]:
    """A :class:`PeerGuard` answering in a task for the block; its context (and every socket
    left in it) is destroyed on exit, so the guarded sockets must be closed by then."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=1)
    try:
        raw = context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        zap = ZmqSocket(raw)
        try:
            raw.bind(ZAP_ENDPOINT)
            guard = PeerGuard(context, opts)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(guard.serve, zap)
                    try:
                        yield guard
                    finally:
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:  # the body's exception, as it raised it
                raise sole_exception(group) from None
        finally:
            zap.close()
    finally:
        context.destroy(linger=0)
