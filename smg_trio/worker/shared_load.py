"""In-flight counts that every frontend process sees: one shared-memory int64 per (worker
slot, frontend), each written by its own frontend only and summed by all of them."""

from __future__ import annotations

import mmap
import os

__all__ = ["MAX_WORKER_SLOTS", "SharedLoad", "create_shared_load"]

#: Workers a supervisor can track at once (slots are reused after a removal).
MAX_WORKER_SLOTS = 1024
_CELL = 8


def create_shared_load(path: str, frontends: int) -> None:
    """Create (or reset) the zeroed table file at ``path``, owner-only."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, MAX_WORKER_SLOTS * frontends * _CELL)
    finally:
        os.close(fd)


class SharedLoad:
    """One frontend's view of the table made by :func:`create_shared_load`. A single aligned
    8-byte store per update: readers see the old or the new count, never a torn one."""

    def __init__(self, path: str, frontends: int, index: int) -> None:
        if not 0 <= index < frontends:
            raise ValueError(f"frontend {index} is not below {frontends}")
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            self._map = mmap.mmap(fd, MAX_WORKER_SLOTS * frontends * _CELL)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("q")
        self.frontends = frontends
        self.index = index
        for slot in range(MAX_WORKER_SLOTS):  # a restarted frontend's old counts are gone
            self._cells[slot * frontends + index] = 0

    def publish(self, slot: int, inflight: int) -> None:
        """Record this frontend's in-flight count on the worker in ``slot``."""
        if 0 <= slot < MAX_WORKER_SLOTS:
            self._cells[slot * self.frontends + self.index] = inflight

    def total(self, slot: int) -> int:
        """Every frontend's in-flight count on the worker in ``slot``, summed."""
        if not 0 <= slot < MAX_WORKER_SLOTS:
            return 0
        base = slot * self.frontends
        return sum(self._cells[base : base + self.frontends])

    def close(self) -> None:
        """Unmap the table."""
        self._cells.release()
        self._map.close()
