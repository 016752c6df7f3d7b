"""In-flight counts that every frontend process sees: one shared-memory int64 per (worker
slot, frontend) and per (worker slot, DP rank, frontend), each written by its own frontend
only and summed by all of them."""

from __future__ import annotations

import mmap
import os

import attrs

__all__ = [
    "MAX_SHARED_RANKS",
    "MAX_WORKER_SLOTS",
    "SharedLoad",
    "SharedWorkerRanks",
    "create_shared_load",
]

#: Workers a supervisor can track at once (slots are reused after a removal).
MAX_WORKER_SLOTS = 1024
#: DP ranks per worker whose counts are shared; a rank index above this is scored by each
#: frontend's own count and the engine's report.
MAX_SHARED_RANKS = 64
_CELL = 8


def _cells(frontends: int) -> int:
    # worker cells (slot-major), then rank cells (frontend-major: one contiguous block each)
    return MAX_WORKER_SLOTS * frontends + frontends * MAX_WORKER_SLOTS * MAX_SHARED_RANKS


def create_shared_load(path: str, frontends: int) -> None:
    """Create (or reset) the zeroed table file at ``path``, owner-only."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, _cells(frontends) * _CELL)
    finally:
        os.close(fd)


class SharedLoad:
    """One frontend's view of the table made by :func:`create_shared_load`. A single aligned
    8-byte store per update: readers see the old or the new count, never a torn one.
    ``index=None``: a read-only view (the supervisor's): it resets and publishes nothing."""

    def __init__(self, path: str, frontends: int, index: int | None) -> None:
        if index is not None and not 0 <= index < frontends:
            raise ValueError(f"frontend {index} is not below {frontends}")
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            self._map = mmap.mmap(fd, _cells(frontends) * _CELL)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("q")
        self.frontends = frontends
        self.index = index
        self._ranks_base = MAX_WORKER_SLOTS * frontends
        self._block = MAX_WORKER_SLOTS * MAX_SHARED_RANKS  # one frontend's rank cells
        if index is None:
            return
        for slot in range(MAX_WORKER_SLOTS):  # a restarted frontend's old counts are gone
            self._cells[slot * frontends + index] = 0
        start = (self._ranks_base + index * self._block) * _CELL
        self._map[start : start + self._block * _CELL] = bytes(self._block * _CELL)

    def publish(self, slot: int, inflight: int) -> None:
        """Record this frontend's in-flight count on the worker in ``slot``."""
        if self.index is not None and 0 <= slot < MAX_WORKER_SLOTS:
            self._cells[slot * self.frontends + self.index] = inflight

    def total(self, slot: int) -> int:
        """Every frontend's in-flight count on the worker in ``slot``, summed."""
        if not 0 <= slot < MAX_WORKER_SLOTS:
            return 0
        base = slot * self.frontends
        return sum(self._cells[base : base + self.frontends])

    def _rank_cell(self, slot: int, rank: int) -> int | None:
        if 0 <= slot < MAX_WORKER_SLOTS and 0 <= rank < MAX_SHARED_RANKS:
            return self._ranks_base + slot * MAX_SHARED_RANKS + rank
        return None

    def publish_rank(self, slot: int, rank: int, inflight: int) -> None:
        """Record this frontend's in-flight count on DP rank ``rank`` of the worker in
        ``slot``."""
        cell = self._rank_cell(slot, rank)
        if cell is not None and self.index is not None:
            self._cells[cell + self.index * self._block] = inflight

    def rank_total(self, slot: int, rank: int) -> int:
        """Every frontend's in-flight count on DP rank ``rank`` of the worker in ``slot``."""
        cell = self._rank_cell(slot, rank)
        if cell is None:
            return 0
        cells, block = self._cells, self._block
        return sum(cells[cell + f * block] for f in range(self.frontends))

    def ranks(self, slot: int) -> SharedWorkerRanks:
        """The per-rank view of the worker in ``slot`` (a connector ``SharedRankLoad``)."""
        return SharedWorkerRanks(self, slot)

    def close(self) -> None:
        """Unmap the table."""
        self._cells.release()
        self._map.close()


@attrs.frozen
class SharedWorkerRanks:
    """The DP ranks of one worker slot in a :class:`SharedLoad` (what an engine client's rank
    router publishes to and scores by)."""

    table: SharedLoad
    slot: int

    def publish(self, rank: int, inflight: int) -> None:
        """This frontend's in-flight count on ``rank``."""
        self.table.publish_rank(self.slot, rank, inflight)

    def total(self, rank: int) -> int:
        """Every frontend's in-flight count on ``rank``."""
        return self.table.rank_total(self.slot, rank)
