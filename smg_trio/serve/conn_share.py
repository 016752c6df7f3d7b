"""Each frontend's open client connections in shared memory, for a balanced accept."""

from __future__ import annotations

import mmap
import os

__all__ = ["SharedConnections", "create_shared_connections"]

_CELL = 8


def create_shared_connections(path: str, frontends: int) -> None:
    """Create (or reset) the zeroed table at ``path``, one cell per frontend, owner-only."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, frontends * _CELL)
    finally:
        os.close(fd)


class SharedConnections:
    """Frontend ``index``'s view of the table made by :func:`create_shared_connections` (a
    :class:`~smg_trio.gateway.server.balance.ConnectionShare`): it writes its own cell only
    (one aligned 8-byte store: never torn) and reads the others'. Opening it resets its cell:
    a restarted frontend holds no connections."""

    def __init__(self, path: str, frontends: int, index: int) -> None:
        if not 0 <= index < frontends:
            raise ValueError(f"frontend {index} is not below {frontends}")
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            self._map = mmap.mmap(fd, frontends * _CELL)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("q")
        self._others = [i for i in range(frontends) if i != index]
        self.index = index
        self.count = 0
        self._cells[index] = 0

    def opened(self) -> None:
        self.count += 1
        self._cells[self.index] = self.count

    def closed(self) -> None:
        self.count -= 1
        self._cells[self.index] = self.count

    def excess(self) -> int:
        cells = self._cells
        fewest = min((cells[i] for i in self._others), default=self.count)
        return self.count - fewest

    def close(self) -> None:
        """Unmap the table."""
        self._cells.release()
        self._map.close()
