"""Worker URL to socket addresses, and the FNV-1a handshake-port hash (smg ``zmq_socket_addresses``)."""

from __future__ import annotations

import attrs

from smg_trio.errors import WorkerAddressError

__all__ = [
    "HANDSHAKE_PORT_BASE",
    "HANDSHAKE_PORT_SPAN",
    "WorkerAddresses",
    "client_data_plane",
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


def client_data_plane(path: str, client_index: int) -> tuple[str, str]:
    """The input and output ``ipc://`` addresses of frontend client ``client_index`` of the
    worker at ``path``: ``<path>-in.sock``/``<path>-out.sock`` for client 0 (smg's names, so
    one client is what smg and every engine expect), ``<path>-in-<i>.sock``/``-out-<i>.sock``
    for client ``i``. The one place these names are made."""
    if client_index < 0:
        raise WorkerAddressError(f"client index must be >= 0, got {client_index}")
    suffix = "" if client_index == 0 else f"-{client_index}"
    return f"ipc://{path}-in{suffix}.sock", f"ipc://{path}-out{suffix}.sock"


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
    """The three sockets of one worker, as seen by frontend client ``client_index`` of
    ``client_count``: its input ROUTER and output PULL (both ``ipc://``) and the handshake ROUTER
    (``tcp://``); a ``tcp://`` worker's input and output are tcp on the URL's host with ports
    the kernel picks, and its handshake is its URL. The gateway binds them; engines dial in.
    With several clients (vLLM's
    ``EngineZmqAddresses.inputs/outputs``), ``inputs``/``outputs`` list every client's pair, in
    client order, for INIT; each client binds its own pair."""

    url: str
    input: str
    output: str
    handshake: str
    client_index: int = 0
    client_count: int = 1

    @property
    def is_tcp(self) -> bool:
        """A remote-capable worker: every socket is tcp (engines on other hosts)."""
        return self.url.startswith("tcp://")

    @property
    def path(self) -> str:
        """The ipc path of the worker URL."""
        return ipc_path(self.url)

    @property
    def inputs(self) -> list[str]:
        """Every client's input address, in client order (INIT's ``inputs``)."""
        return [client_data_plane(self.path, i)[0] for i in range(self.client_count)]

    @property
    def outputs(self) -> list[str]:
        """Every client's output address, in client order (INIT's ``outputs``)."""
        return [client_data_plane(self.path, i)[1] for i in range(self.client_count)]

    def for_client(self, client_index: int) -> WorkerAddresses:
        """The same worker's addresses as client ``client_index`` sees them."""
        return worker_addresses(
            self.url,
            self.handshake,
            client_index=client_index,
            client_count=self.client_count,
        )


def worker_addresses(
    url: str,
    handshake_override: str | None = None,
    *,
    client_index: int = 0,
    client_count: int = 1,
) -> WorkerAddresses:
    """Derive ``<url>-in.sock``, ``<url>-out.sock`` and ``tcp://127.0.0.1:<fnv port>``.

    ``handshake_override`` is used verbatim and must start with ``tcp://`` (vLLM's headless
    engine can only dial TCP). ``client_index``/``client_count`` pick one frontend client's
    data plane (:func:`client_data_plane`). A ``tcp://HOST:PORT`` worker (remote engines,
    vLLM's ``--data-parallel-address HOST --data-parallel-rpc-port PORT``) binds its handshake
    at the URL and its input and output at ``tcp://HOST:*``; it serves one frontend client.
    Raises ``WorkerAddressError``.
    """
    if url.startswith("tcp://"):
        host, _ = tcp_host_port(url)
        if handshake_override is not None and handshake_override != url:
            raise WorkerAddressError(
                f"a tcp:// worker's handshake address is its URL ({url}); "
                f"zmq_handshake_address {handshake_override!r} does not apply"
            )
        if client_count != 1:
            raise WorkerAddressError(
                "a tcp:// worker serves one frontend client; --api-server-count above 1 "
                "works with ipc:// workers only"
            )
        wildcard = f"tcp://{host}:*"
        return WorkerAddresses(url=url, input=wildcard, output=wildcard, handshake=url)
    path = ipc_path(url)
    if not 0 <= client_index < client_count:
        raise WorkerAddressError(
            f"client index {client_index} is not below the client count {client_count}"
        )
    if handshake_override is not None:
        if not handshake_override.startswith("tcp://"):
            raise WorkerAddressError(
                f"zmq_handshake_address must be a tcp:// address, got {handshake_override!r}"
            )
        handshake = handshake_override
    else:
        handshake = f"tcp://127.0.0.1:{derive_handshake_port(path)}"
    inp, out = client_data_plane(path, client_index)
    return WorkerAddresses(
        url=url,
        input=inp,
        output=out,
        handshake=handshake,
        client_index=client_index,
        client_count=client_count,
    )
