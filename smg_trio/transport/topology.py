"""The frontend's socket set for one worker: bind input ROUTER, output PULL, handshake ROUTER."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio
import zmq

from smg_trio.errors import EngineError, SocketDirError
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.transport.monitor import INPUT_MONITOR_EVENTS, ConnectionMonitor
from smg_trio.transport.peer_guard import PeerGuard, open_peer_guard
from smg_trio.transport.sockdir import (
    check_ipc_path,
    ensure_ipc_socket_dir,
    restrict_socket_file,
    unlink_stale_socket,
)
from smg_trio.transport.tcp import TcpOptions, advertised, configure_heartbeat
from smg_trio.transport.zsocket import ZmqSocket, zmq_context

__all__ = [
    "INPUT_MONITOR_EVENTS",
    "BoundSockets",
    "HandshakeSocket",
    "bind_handshake_socket",
    "bind_worker_sockets",
    "init_addresses",
]

logger = logging.getLogger(__name__)


@attrs.frozen
class BoundSockets:
    """The three bound sockets of one worker and their resolved addresses.

    ``input`` is the ROUTER engines register on and receive requests from (frontend sends
    ``[identity, type_byte, payload, *aux]``); ``input_monitor`` is the PAIR its socket
    monitor reports on (:data:`INPUT_MONITOR_EVENTS`: an engine's connection opened or closed,
    which is how an engine that dies is seen at once, whatever started it); ``output`` is the PULL every engine PUSHes results
    to; ``handshake`` is the ROUTER for HELLO/INIT/READY. The ``*_address`` strings are the
    endpoints as libzmq resolved them (``LAST_ENDPOINT``), so a wildcard port such as
    ``tcp://127.0.0.1:*`` comes back as the real port; INIT carries these. A frontend client
    that attaches to engines another process handshook (``--api-server-count``) has no
    handshake socket (``None``).
    """

    input: ZmqSocket
    output: ZmqSocket
    handshake: ZmqSocket | None
    input_monitor: ConnectionMonitor
    input_address: str
    output_address: str
    handshake_address: str | None
    #: A ``tcp://`` worker's settings (advertised host, heartbeats, peer allow-list); ``None``
    #: for an ipc worker.
    tcp: TcpOptions | None = None
    #: A tcp worker's output PULL monitor (its peers are checked against the allow-list).
    output_monitor: ConnectionMonitor | None = None


def init_addresses(sockets: BoundSockets) -> tuple[str, str]:
    """The input and output addresses INIT gives engines: the bound ones, with a tcp
    worker's advertised host in place of the bind host."""
    host = sockets.tcp.advertise_host if sockets.tcp is not None else None
    return advertised(sockets.input_address, host), advertised(sockets.output_address, host)


def _configure_router(sock: zmq.Socket[bytes]) -> None:
    # A send to an identity that never connected or has gone raises EHOSTUNREACH instead of
    # being dropped silently, so a vanished engine is an error (the connector maps it to
    # EngineDeadError).
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # An engine restarted with the same identity replaces the old connection instead of being
    # rejected as a duplicate (vLLM's make_zmq_socket(router_handover=True)).
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)


def _configure_input_router(sock: zmq.Socket[bytes]) -> None:
    _configure_router(sock)
    # Unbounded queues, as vLLM's make_zmq_socket does for its own input ROUTER: requests are
    # never dropped or refused by ZMQ; the gateway's own admission control bounds them.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)


def _configure_output_pull(sock: zmq.Socket[bytes]) -> None:
    # Never make an engine's PUSH block on us: the single reader task drains as fast as it can.
    sock.setsockopt(zmq.RCVHWM, 0)


def _bind(
    stack: contextlib.ExitStack,
    socket_type: int,
    address: str,
    role: str,
    configure: Callable[[zmq.Socket[bytes]], None],
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
) -> tuple[ZmqSocket, str]:
    """Create (in ``context``, default the process's), configure and bind one socket;
    register its close on ``stack``."""
    sock = (context or zmq_context()).socket(socket_type)
    stack.callback(sock.close, 0)  # a no-op after wrapped.close(); covers a failing wrap
    wrapped = ZmqSocket(sock)
    stack.callback(wrapped.close)
    sock.setsockopt(zmq.LINGER, 0)
    configure(sock)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        msg = f"cannot bind the {role} socket to {address}: {exc.strerror}"
        if exc.errno == errno.EADDRINUSE:
            msg += (
                " (another gateway serving the same worker, or a port collision; pick another "
                "--worker-base-port, or pass --zmq-handshake-address)"
            )
        if address.startswith("ipc://"):
            raise SocketDirError(msg) from exc
        raise EngineError(msg) from exc
    resolved = sock.get(zmq.LAST_ENDPOINT)
    assert isinstance(resolved, bytes)
    return wrapped, resolved.decode()


@attrs.frozen
class HandshakeSocket:
    """A bound handshake ROUTER and its resolved address, kept across a worker's engine lives.

    A re-bind would drop whatever a restarted engine already sent: its HELLO (which it sends
    once and never repeats) can reach the closing socket, or sit in its queue, and be lost with
    it; the engine then waits for an INIT that never comes (vLLM for 5 minutes). So a worker
    binds this once (:func:`bind_handshake_socket`) and passes it to every
    :func:`bind_worker_sockets`; a HELLO that arrives while the data plane is being re-bound
    waits in its queue.
    """

    socket: ZmqSocket
    address: str


@asynccontextmanager
async def bind_handshake_socket(address: str) -> AsyncIterator[HandshakeSocket]:
    """Bind the handshake ROUTER at ``address`` for as long as the block runs (closed on exit).

    Raises:
        EngineError: the bind failed (for example, the port is in use).
    """
    with contextlib.ExitStack() as stack:
        hs, resolved = _bind(stack, zmq.ROUTER, address, "handshake ROUTER", _configure_router)
        await trio.lowlevel.checkpoint()
        yield HandshakeSocket(socket=hs, address=resolved)


#: Numbers the monitors' inproc endpoints (never reused in a process).
_MONITOR_SEQ = itertools.count()


def _monitor(
    stack: contextlib.ExitStack, sock: zmq.Socket[bytes], events: int = INPUT_MONITOR_EVENTS
) -> ConnectionMonitor:
    """Start ``sock``'s socket monitor and return the PAIR it reports on.

    Only the ``ACCEPTED``/``DISCONNECTED`` events of connections made after this call are
    reported; the monitor is started before the bind, so none is missed. (Before INIT is not
    enough: a frontend client's engines know its address from INIT long before it binds, and
    one that re-binds after a restart is dialed again by engines that retry all the while;
    they connect the moment the path exists.) The engines' ipc connection closes when their process
    dies (the kernel closes its sockets), so this sees a SIGKILL in milliseconds.

    (libzmq's ``ZMQ_ROUTER_NOTIFY``, which would name the identity directly, is a draft option
    that pyzmq's wheels do not build: setting it fails with ``EINVAL``.)
    """
    # A fresh name each time: libzmq unregisters a stopped monitor's inproc endpoint
    # asynchronously, so a reused name (``id(sock)`` of a socket just closed) can still be
    # bound (EADDRINUSE).
    address = f"inproc://smg-input-monitor-{os.getpid()}-{next(_MONITOR_SEQ)}"
    sock.monitor(address, events)
    pair = sock.context.socket(zmq.PAIR)  # inproc: the monitored socket's context
    stack.callback(pair.close, 0)
    pair.setsockopt(zmq.LINGER, 0)
    # No high-water mark on the reader: libzmq's monitor sends its events (and the final
    # MONITOR_STOPPED) with a blocking send from whichever thread calls into the ROUTER, so a
    # full pipe, or a reader already gone, would block the event loop for good.
    pair.setsockopt(zmq.RCVHWM, 0)
    pair.connect(address)
    monitored = ZmqSocket(pair)
    stack.callback(monitored.close)
    # Registered last, so it runs first: the monitor stops while its reader is still
    # connected (a peerless PAIR's send would block disable_monitor forever).
    stack.callback(sock.disable_monitor)
    return ConnectionMonitor(monitored)


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _unlink_if_same(path: str, inode: tuple[int, int] | None) -> None:
    """Remove our socket file, unless something else has replaced it meanwhile."""
    if inode is None or _inode(path) != inode:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@asynccontextmanager
async def bind_worker_sockets(
    addresses: WorkerAddresses,
    *,
    handshake: HandshakeSocket | None = None,
    tcp: TcpOptions | None = None,
    with_handshake: bool = True,
) -> AsyncIterator[BoundSockets]:
    """Bind one worker's socket set, as smg does: input ROUTER, output PULL, handshake ROUTER.

    Before binding, the parent directory of the worker's ipc path is made safe
    (:func:`~smg_trio.transport.sockdir.ensure_ipc_socket_dir`), both ipc paths are checked
    against the ``sun_path`` limit, and stale ``-in.sock``/``-out.sock`` sockets are unlinked;
    the bound socket files get mode ``0600`` whatever the umask. On exit every socket is closed (``linger=0``) and the socket files this call created are
    removed. With ``handshake``, that already-bound ROUTER is used (and left open on exit)
    instead of binding ``addresses.handshake``; with ``with_handshake=False`` no handshake
    socket is bound at all (a frontend client attaching to engines that another process
    handshook: only its own data-plane pair).

    A ``tcp://`` worker (``addresses.is_tcp``) binds its input and output on the URL's host
    with kernel-chosen ports, with ZMTP heartbeats (``tcp``, default :class:`TcpOptions`),
    and its output PULL gets a monitor too (for the peer allow-list). Both are gated by a
    :class:`~smg_trio.transport.peer_guard.PeerGuard` (in a context of their own): a
    connection becomes routable only once its peer is an allowed host and, on this host, an
    allowed uid.

    Raises:
        SocketDirError: the socket directory or an ipc path is unusable, or an ipc bind failed.
        EngineError: the tcp handshake bind failed (for example, the port is in use); the
            message names the address.
        WorkerAddressError: an input/output address is not ``ipc://``.
    """
    if addresses.is_tcp:
        tcp = tcp or TcpOptions()
        async with (
            open_peer_guard(tcp) as guard,
            _bind_sockets(
                addresses, handshake, tcp, None, None, with_handshake=with_handshake, guard=guard
            ) as sockets,
        ):
            yield sockets
        return
    input_path = check_ipc_path(addresses.input)
    output_path = check_ipc_path(addresses.output)
    socket_dir = os.path.dirname(addresses.path)
    if socket_dir:
        ensure_ipc_socket_dir(socket_dir)
    unlink_stale_socket(input_path)
    unlink_stale_socket(output_path)
    async with _bind_sockets(
        addresses, handshake, None, input_path, output_path, with_handshake=with_handshake
    ) as sockets:
        yield sockets


@asynccontextmanager
async def _bind_sockets(
    addresses: WorkerAddresses,
    handshake: HandshakeSocket | None,
    tcp: TcpOptions | None,
    input_path: str | None,
    output_path: str | None,
    *,
    with_handshake: bool = True,
    guard: PeerGuard | None = None,
) -> AsyncIterator[BoundSockets]:
    context = guard.context if guard is not None else None

    def input_config(sock: zmq.Socket[bytes]) -> None:
        _configure_input_router(sock)
        if tcp is not None:
            configure_heartbeat(sock, tcp)
        if guard is not None:
            guard.protect(sock, "input")

    def output_config(sock: zmq.Socket[bytes]) -> None:
        _configure_output_pull(sock)
        if tcp is not None:
            configure_heartbeat(sock, tcp)
        if guard is not None:
            guard.protect(sock, "output")

    with contextlib.ExitStack() as stack:
        monitors: list[ConnectionMonitor] = []

        def configure_input(sock: zmq.Socket[bytes]) -> None:
            input_config(sock)
            monitors.append(_monitor(stack, sock))  # before the bind: see _monitor

        inp, input_address = _bind(
            stack, zmq.ROUTER, addresses.input, "input ROUTER", configure_input, context
        )
        if guard is not None:  # no checkpoint since the bind: no request was answered yet
            guard.bound("input", input_address)
        if input_path is not None:
            stack.callback(_unlink_if_same, input_path, _inode(input_path))
            restrict_socket_file(input_path)
        (monitor,) = monitors
        out, output_address = _bind(
            stack, zmq.PULL, addresses.output, "output PULL", output_config, context
        )
        if guard is not None:
            guard.bound("output", output_address)
        if output_path is not None:
            stack.callback(_unlink_if_same, output_path, _inode(output_path))
            restrict_socket_file(output_path)
        output_monitor = _monitor(stack, out.raw, zmq.EVENT_ACCEPTED) if tcp is not None else None
        hs: ZmqSocket | None
        handshake_address: str | None
        if not with_handshake:
            hs, handshake_address = None, None
        elif handshake is None:
            hs, handshake_address = _bind(
                stack, zmq.ROUTER, addresses.handshake, "handshake ROUTER", _configure_router
            )
        else:
            hs, handshake_address = handshake.socket, handshake.address
        logger.debug(
            "bound worker sockets: input %s, output %s, handshake %s",
            input_address,
            output_address,
            handshake_address,
        )
        await trio.lowlevel.checkpoint()
        yield BoundSockets(
            input=inp,
            output=out,
            handshake=hs,
            input_monitor=monitor,
            input_address=input_address,
            output_address=output_address,
            handshake_address=handshake_address,
            tcp=tcp,
            output_monitor=output_monitor,
        )
