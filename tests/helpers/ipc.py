"""Short, unique ``ipc://`` endpoints for tests (smg's ``IpcNamespace``)."""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
from types import TracebackType

import trio

from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses

__all__ = [
    "ANY_LOCAL_TCP",
    "IpcNamespace",
    "free_handshake_address",
    "tcp_listener_gone",
    "wait_tcp_listener_gone",
]

#: A wildcard handshake address: libzmq picks a free port, so parallel tests never collide on
#: the derived FNV port. ``BoundSockets.handshake_address`` reports the real one.
ANY_LOCAL_TCP = "tcp://127.0.0.1:*"


#: Where :func:`free_handshake_address` picks ports: below Linux's ephemeral range (32768 and
#: up by default) and below the derived FNV band (20000..29999).
_HANDSHAKE_TEST_PORTS = range(10000, 20000)


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_handshake_address() -> str:
    """``tcp://127.0.0.1:<port>`` free right now, for a handshake an engine dials before the
    frontend binds (or re-binds, after a restart).

    The port is never from the kernel's ephemeral range: a DEALER connecting to an unbound
    ephemeral-range port on loopback can be given that same port as its source and connect to
    itself (TCP simultaneous open), after which the frontend cannot bind and the engine's
    HELLO goes nowhere. Raises ``RuntimeError`` if no port in the band is free.
    """
    floor = _ephemeral_floor()
    ports = [p for p in _HANDSHAKE_TEST_PORTS if p < floor]
    for port in random.sample(ports, min(len(ports), 200)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return f"tcp://127.0.0.1:{port}"
    raise RuntimeError("no free handshake port below the ephemeral range")


def tcp_listener_gone(address: str) -> bool:
    """Whether nothing listens on ``tcp://host:port`` any more: a probe binds it with
    ``SO_REUSEADDR``, as libzmq does. libzmq closes a socket's listener in its I/O thread,
    after ``close()`` returns. Until then the old listener can still accept an engine that
    dials the address again, and that engine's HELLO (sent once) is lost with it."""
    if not address.startswith("tcp://"):
        raise ValueError(f"not a tcp address: {address}")
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError:
            return False
    return True


async def wait_tcp_listener_gone(address: str) -> None:
    """Poll :func:`tcp_listener_gone` (kernel state: there is no event to wait on); callers
    bound it with ``fail_after``."""
    while not tcp_listener_gone(address):  # noqa: ASYNC110 (kernel state, no event)
        await trio.sleep(0.005)


class IpcNamespace:
    """A private temporary directory of ipc endpoints for one test.

    The directory comes from ``tempfile.mkdtemp(prefix="smg-")`` (mode 0700, short path under
    the system temp dir) because AF_UNIX paths are limited to 107 bytes and pytest's
    ``tmp_path`` is often longer. Use it as a context manager or call :meth:`cleanup`.
    """

    def __init__(self, prefix: str = "smg-") -> None:
        self.directory: str = tempfile.mkdtemp(prefix=prefix)

    def worker_url(self, name: str) -> str:
        """``ipc://<directory>/<name>``: a worker URL whose sockets live in this namespace."""
        return f"ipc://{self.directory}/{name}"

    def addresses(self, name: str, handshake: str | None = ANY_LOCAL_TCP) -> WorkerAddresses:
        """The socket addresses of worker ``name``. The handshake defaults to a wildcard local
        port; pass ``None`` for smg's derived FNV port, or an explicit ``tcp://`` address."""
        return worker_addresses(self.worker_url(name), handshake)

    def cleanup(self) -> None:
        """Remove the directory and everything in it."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> IpcNamespace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
