"""The Responses store the frontends share (``--api-server-count`` > 1): what one process
stores, another finds, reads (refreshing its place in the LRU), and deletes; the entry and
byte bounds hold across processes' writes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from smg_trio.gateway.openai.responses_shared import SharedResponseStore, create_shared_store
from smg_trio.gateway.openai.responses_store import StoredResponse


def _entry(n: int, nbytes: int = 10) -> StoredResponse:
    """An entry of exactly ``nbytes`` held bytes (its JSON padded with spaces)."""
    return StoredResponse(f'{{"n":{n}}}'.encode().ljust(nbytes - 2), b"[]")


def test_one_process_stores_another_finds_and_deletes(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.sqlite3")
    a, b = SharedResponseStore(path, 10), SharedResponseStore(path, 10)
    a.put("resp_1", _entry(1))
    got = b.get("resp_1")
    assert got == _entry(1)
    assert b.get("resp_2") is None
    assert b.delete("resp_1")
    assert not a.delete("resp_1")
    assert a.get("resp_1") is None
    a.close()
    b.close()


def test_entry_and_byte_bounds_evict_the_least_recently_used(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.sqlite3")
    a, b = SharedResponseStore(path, 3, max_bytes=100), SharedResponseStore(path, 3, 100)
    for n in (1, 2, 3):
        (a if n % 2 else b).put(f"resp_{n}", _entry(n))
    assert b.get("resp_1") is not None  # read: now the most recently used
    a.put("resp_4", _entry(4))  # one over the entry bound: resp_2 goes
    assert [n for n in (1, 2, 3, 4) if b.get(f"resp_{n}") is not None] == [1, 3, 4]
    assert len(a) == 3
    b.put("resp_5", _entry(5, nbytes=80))  # 4 entries: the oldest (1) goes; 100 bytes fit
    assert [n for n in (1, 3, 4, 5) if a.get(f"resp_{n}") is not None] == [3, 4, 5]
    assert a.nbytes == 100
    b.put("resp_big", _entry(6, nbytes=101))  # larger than the budget: not kept
    assert a.get("resp_big") is None
    assert len(b) == 3
    b.put("resp_4", _entry(44, nbytes=20))  # replaced, counted once: 110 bytes, 3 goes
    assert a.nbytes == 100
    assert a.get("resp_3") is None
    assert a.get("resp_4") == _entry(44, nbytes=20)


def test_size_zero_keeps_nothing_and_negative_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.sqlite3")
    store = SharedResponseStore(path, 0)
    store.put("resp_1", _entry(1))
    assert store.get("resp_1") is None
    with pytest.raises(ValueError, match=">= 0"):
        SharedResponseStore(path, -1)


def test_a_prepared_store_opens_while_another_process_reads_it(tmp_path: Path) -> None:
    """Frontends starting together each open the store. On a file already made by
    ``create_shared_store`` (WAL), opening needs no lock that a reader in another process
    holds; on a new file, the switch to WAL needs one and fails ("database is locked")."""
    path = str(tmp_path / "responses.sqlite3")
    create_shared_store(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN")
        other.execute("SELECT COUNT(*) FROM responses").fetchone()  # a read in flight
        store = SharedResponseStore(path, 10)
        store.put("resp_1", _entry(1))
        assert store.get("resp_1") is not None
        store.close()
    finally:
        other.close()


def test_both_stores_count_the_bytes_they_hold(tmp_path: Path) -> None:
    """An entry is its JSON bytes (decoded by the reader): what the budget counts is what the
    store holds, in memory and in the SQLite file alike, and a read decodes a fresh copy."""
    from smg_trio.gateway.openai.responses_store import ResponseStore

    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(50)}}
    entry = StoredResponse.encode({"id": "resp_1", "text": schema}, [{"role": "user"}])
    assert entry.nbytes == len(entry.response_json) + len(entry.history_json)
    memory = ResponseStore(10)
    shared = SharedResponseStore(str(tmp_path / "responses.sqlite3"), 10)
    for store in (memory, shared):
        store.put("resp_1", entry)
        assert store.nbytes == entry.nbytes
        got = store.get("resp_1")
        assert got is not None
        assert got.response()["text"] == schema
        assert got.history() is not got.history()  # decoded on each read
    db = sqlite3.connect(tmp_path / "responses.sqlite3")
    held = db.execute(
        "SELECT SUM(length(response) + length(history)), SUM(nbytes) FROM responses"
    ).fetchone()
    db.close()
    assert held == (entry.nbytes, entry.nbytes)
    shared.close()
