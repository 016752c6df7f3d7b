"""The Responses API's store shared by every frontend process (``--api-server-count`` > 1):
the bounds of :class:`ResponseStore`, kept in one SQLite file in the private run directory."""

from __future__ import annotations

import sqlite3
import threading

from smg_trio.gateway.config import DEFAULT_RESPONSES_STORE_MAX_BYTES
from smg_trio.gateway.openai.responses_store import StoredResponse

__all__ = ["SharedResponseStore", "create_shared_store"]

#: How long a writer waits for another process's write to finish (SQLite's busy timeout).
_BUSY_MS = 5000
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS responses ("
    " id TEXT PRIMARY KEY, response BLOB NOT NULL, history BLOB NOT NULL,"
    " nbytes INTEGER NOT NULL, used INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS responses_used ON responses (used)",
)


def create_shared_store(path: str) -> None:
    """Make the store's file at ``path`` (WAL journal, schema) before the processes that
    share it start. Each of them then finds the file in WAL already: switching a new file to
    WAL takes a lock SQLite does not always wait for, and two frontends switching at once
    could fail with ``database is locked``."""
    SharedResponseStore(path, 0).close()


class SharedResponseStore:
    """At most ``size`` responses of at most ``max_bytes`` together, in the SQLite file at
    ``path``, which every frontend opens: a response stored by one frontend is found by
    ``previous_response_id``, ``GET`` and ``DELETE`` on any other. The least recently stored
    or read is evicted first. Entries are kept and returned as their JSON bytes (decoded by
    the reader), so ``nbytes`` counts the bytes the file holds, and a process holds only the
    entries it is reading. Each call is one short transaction (WAL journal); safe to call
    from a worker thread. ``path`` is the caller's (the run directory), never a request's."""

    def __init__(
        self, path: str, size: int, max_bytes: int = DEFAULT_RESPONSES_STORE_MAX_BYTES
    ) -> None:
        if size < 0:
            raise ValueError(f"the responses store size must be >= 0, got {size}")
        self.size = size
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            path, timeout=_BUSY_MS / 1000, isolation_level=None, check_same_thread=False
        )
        with self._lock:
            self._db.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = OFF")  # a cache: a crash may lose it
            for statement in _SCHEMA:
                self._db.execute(statement)

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    @property
    def nbytes(self) -> int:
        """The stored responses' size as the store counts it."""
        with self._lock:
            row = self._db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM responses").fetchone()
            return int(row[0])

    def close(self) -> None:
        """Close this process's connection."""
        with self._lock:
            self._db.close()

    def _next_used(self) -> int:
        row = self._db.execute("SELECT COALESCE(MAX(used), 0) + 1 FROM responses").fetchone()
        return int(row[0])

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.size == 0 or entry.nbytes > self.max_bytes:
            return
        response, history = entry.response_json, entry.history_json
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                    (response_id, response, history, entry.nbytes, self._next_used()),
                )
                while True:
                    count, total = db.execute(
                        "SELECT COUNT(*), COALESCE(SUM(nbytes), 0) FROM responses"
                    ).fetchone()
                    if count <= self.size and total <= self.max_bytes:
                        break
                    db.execute(
                        "DELETE FROM responses WHERE id = "
                        "(SELECT id FROM responses ORDER BY used LIMIT 1)"
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT response, history, nbytes FROM responses WHERE id = ?",
                    (response_id,),
                ).fetchone()
                if row is not None:
                    db.execute(
                        "UPDATE responses SET used = ? WHERE id = ?",
                        (self._next_used(), response_id),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        if row is None:
            return None
        return StoredResponse(bytes(row[0]), bytes(row[1]))

    def delete(self, response_id: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return cursor.rowcount > 0
