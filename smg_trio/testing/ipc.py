"""Short, unique ``ipc://`` endpoints for tests (smg's ``IpcNamespace``)."""

from __future__ import annotations

import shutil
import tempfile
from types import TracebackType

from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses

__all__ = ["ANY_LOCAL_TCP", "IpcNamespace"]

#: A wildcard handshake address: libzmq picks a free port, so parallel tests never collide on
#: the derived FNV port. ``BoundSockets.handshake_address`` reports the real one.
ANY_LOCAL_TCP = "tcp://127.0.0.1:*"


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
