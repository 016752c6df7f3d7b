"""Worker URL to socket addresses, and the FNV-1a handshake-port hash (smg ``zmq_socket_addresses``)."""

from __future__ import annotations

import attrs

from smg_trio.errors import WorkerAddressError

__all__ = [
    "HANDSHAKE_PORT_BASE",
    "HANDSHAKE_PORT_SPAN",
    "WorkerAddresses",
    "derive_handshake_port",
    "ipc_path",
    "tcp_host_port",
    "worker_addresses",
]

#: Derived handshake ports lie in 20000..29999, below Linux's ephemeral range (32768..60999).
HANDSHAKE_PORT_BASE = 20000
HANDSHAKE_PORT_SPAN = 10000
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def derive_handshake_port(path: str) -> int:
    """64-bit FNV-1a of the UTF-8 path (an ``ipc://`` prefix is stripped) folded into
    ``20000..29999``. Same as smg's Rust ``derive_handshake_port`` and Python
    ``_zmq_handshake_port`` (smg 1.13.0)."""
    path = path.removeprefix("ipc://")
    h = _FNV_OFFSET
    for b in path.encode():
        h = ((h ^ b) * _FNV_PRIME) & _MASK64
    return HANDSHAKE_PORT_BASE + h % HANDSHAKE_PORT_SPAN


def ipc_path(url: str) -> str:
    """The filesystem path of an ``ipc://<path>`` worker URL. Raises ``WorkerAddressError``."""
    if not url.startswith("ipc://") or len(url) == len("ipc://"):
        raise WorkerAddressError(f"ZMQ worker URL must be ipc://<path>, got {url!r}")
    return url[len("ipc://") :]


def tcp_host_port(url: str) -> tuple[str, int]:
    """Host and port of a ``tcp://HOST:PORT`` worker URL (an IPv6 host in brackets). Raises
    ``WorkerAddressError``."""
    host, sep, port = url.removeprefix("tcp://").rpartition(":")
    if (
        not url.startswith("tcp://")
        or not sep
        or not host
        or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536)
        or host == "*"
    ):
        raise WorkerAddressError(f"a tcp worker URL must be tcp://HOST:PORT, got {url!r}")
    return host, int(port)


@attrs.frozen
class WorkerAddresses:
    """The three sockets of one worker: input ROUTER, output PULL (``ipc://``, or for a
    ``tcp://`` worker tcp on the URL's host with ports the kernel picks), handshake ROUTER
    (``tcp://``; a tcp worker's is its URL). The gateway binds all three; engines dial in."""

    url: str
    input: str
    output: str
    handshake: str

    @property
    def is_tcp(self) -> bool:
        """A remote-capable worker: every socket is tcp (engines on other hosts)."""
        return self.url.startswith("tcp://")

    @property
    def path(self) -> str:
        """The ipc path of the worker URL."""
        return ipc_path(self.url)


def worker_addresses(url: str, handshake_override: str | None = None) -> WorkerAddresses:
    """Derive ``<url>-in.sock``, ``<url>-out.sock`` and ``tcp://127.0.0.1:<fnv port>``.

    ``handshake_override`` is used verbatim and must start with ``tcp://`` (vLLM's headless
    engine can only dial TCP). A ``tcp://HOST:PORT`` worker (remote engines, vLLM's
    ``--data-parallel-address HOST --data-parallel-rpc-port PORT``) binds its handshake at the
    URL and its input and output at ``tcp://HOST:*``. Raises ``WorkerAddressError``.
    """
    if url.startswith("tcp://"):
        host, _ = tcp_host_port(url)
        if handshake_override is not None and handshake_override != url:
            raise WorkerAddressError(
                f"a tcp:// worker's handshake address is its URL ({url}); "
                f"zmq_handshake_address {handshake_override!r} does not apply"
            )
        wildcard = f"tcp://{host}:*"
        return WorkerAddresses(url=url, input=wildcard, output=wildcard, handshake=url)
    path = ipc_path(url)
    if handshake_override is not None:
        if not handshake_override.startswith("tcp://"):
            raise WorkerAddressError(
                f"zmq_handshake_address must be a tcp:// address, got {handshake_override!r}"
            )
        handshake = handshake_override
    else:
        handshake = f"tcp://127.0.0.1:{derive_handshake_port(path)}"
    return WorkerAddresses(
        url=url, input=f"ipc://{path}-in.sock", output=f"ipc://{path}-out.sock", handshake=handshake
    )
