"""Remote engines over tcp: heartbeats, the advertised host, and the engine peer allow-list."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

import attrs
import zmq

__all__ = [
    "DEFAULT_HEARTBEAT_IVL_S",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "TcpOptions",
    "advertised",
    "configure_heartbeat",
    "endpoint_port",
    "inet_names",
    "is_wildcard_host",
    "peer_host",
    "shut_down_connection",
]

logger = logging.getLogger(__name__)

#: ZMTP PING interval on a tcp worker's input and output sockets (``ZMQ_HEARTBEAT_IVL``).
DEFAULT_HEARTBEAT_IVL_S = 1.0
#: No traffic (a PONG included) for this long after a PING closes the connection
#: (``ZMQ_HEARTBEAT_TIMEOUT``): how a vanished host is seen where no ipc close exists. The
#: input socket's monitor then reports it like an ipc close, and the disconnect grace applies.
DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0


def _hosts(hosts: Iterable[str]) -> tuple[str, ...]:
    return tuple(h.strip("[]").lower() for h in hosts)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() == "localhost"


@attrs.frozen(kw_only=True)
class TcpOptions:
    """How a ``tcp://`` worker's sockets are set up.

    - ``advertise_host``: the host engines are told to dial in INIT (``None``: the host the
      sockets are bound on, which must then not be a wildcard).
    - ``heartbeat_ivl_s``/``heartbeat_timeout_s``: ZMTP heartbeats on the input and output
      sockets.
    - ``allowed_hosts``/``allow_loopback``: the peer addresses (IPs, lower case) an engine may
      connect from; any other peer is refused at the handshake (logged) and its connections
      are shut down.
    - ``allowed_uids``: a peer on this host (loopback, or any of its addresses) must also
      connect from a socket owned by one of these uids (``None``: root and the gateway's
      effective uid); see :mod:`smg_trio.transport.peer_guard`.
    """

    advertise_host: str | None = None
    heartbeat_ivl_s: float = DEFAULT_HEARTBEAT_IVL_S
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=_hosts)
    allow_loopback: bool = True
    allowed_uids: tuple[int, ...] | None = None

    def uid_allowed(self, uid: int) -> bool:
        """Whether a peer socket on this host owned by ``uid`` may be an engine's."""
        allowed = self.allowed_uids if self.allowed_uids is not None else (0, os.geteuid())
        return uid in allowed

    def peer_allowed(self, host: str) -> bool:
        """Whether an engine may connect from ``host`` (an IP address)."""
        host = host.lower()
        if host.startswith("::ffff:"):  # an IPv4 peer on a dual-stack socket
            host = host.removeprefix("::ffff:")
        return (self.allow_loopback and _loopback(host)) or host in self.allowed_hosts


def configure_heartbeat(sock: zmq.Socket[bytes], opts: TcpOptions) -> None:
    """ZMTP heartbeats: PING every interval, close after the timeout without traffic; the
    peer is told (``TTL``) to drop us after the same timeout."""
    ivl_ms = max(1, round(opts.heartbeat_ivl_s * 1000))
    timeout_ms = max(1, round(opts.heartbeat_timeout_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, ivl_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, min(timeout_ms, 6_553_500))  # libzmq's limit


def is_wildcard_host(host: str) -> bool:
    """``*``, ``0.0.0.0`` or ``::``: a bind on every interface, which no engine can dial."""
    bare = host.strip("[]")
    return bare in ("*", "0.0.0.0", "::")


def advertised(address: str, host: str | None) -> str:
    """``address`` (a resolved ``tcp://HOST:PORT`` endpoint) with its host replaced by
    ``host``; other addresses, or ``host=None``, unchanged."""
    if host is None or not address.startswith("tcp://"):
        return address
    port = address.rpartition(":")[2]
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{shown}:{port}"


def peer_host(fd: int | None, local_port: int | None = None) -> str | None:
    """The peer IP of a tcp connection by its descriptor (libzmq's ``ZMQ_SRCFD`` or a monitor
    event), or ``None`` when it is not a connected inet socket (gone, or ipc). With
    ``local_port``, also ``None`` unless the connection is to that port: a monitor event is
    read after the fact, and by then the number may belong to another connection (an HTTP
    client's, say), which must not be judged, let alone shut down, as an engine's."""
    if fd is None or fd < 0:
        return None
    names = inet_names(fd)
    if names is None:
        return None
    local, peer = names
    if local_port is not None and local[1] != local_port:
        return None
    return str(peer[0])


def inet_names(fd: int) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """The local and peer addresses (``getsockname``, ``getpeername``) of the connected inet
    socket with descriptor ``fd``, or ``None`` when it is not one (gone, ipc, unconnected).
    The descriptor is only borrowed: it stays its owner's (libzmq's)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays libzmq's


def endpoint_port(address: str) -> int | None:
    """The port of a resolved ``tcp://HOST:PORT`` endpoint, else ``None``."""
    port = address.rpartition(":")[2]
    return int(port) if address.startswith("tcp://") and port.isdigit() else None


def shut_down_connection(fd: int) -> None:
    """End a refused peer's tcp connection: ``shutdown(2)``, never ``close(2)`` (the
    descriptor stays libzmq's, which then sees the connection end and closes it itself, so
    the number cannot be reused under it)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()
