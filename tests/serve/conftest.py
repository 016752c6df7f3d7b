"""Fixtures for the serve tests: free ports, a private socket dir, and a /proc process scan."""

from __future__ import annotations

import os
import random
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_worker_base_port() -> int:
    """A worker base port outside the 20000..29999 handshake band, random per test."""
    return random.randint(40000, 60000)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, pgid)`` of ``pid`` from ``/proc/<pid>/stat``, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (by PPID), plus every member of their process groups
    (an engine runs in its own group; its children may be reparented)."""
    table = {pid: st for pid in _all_pids() if (st := _stat(pid)) is not None}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        kids = {pid for pid, (_, ppid, _) in table.items() if ppid in frontier} - found
        found |= kids
        frontier = kids
    groups = {table[pid][2] for pid in found if pid in table} - {os.getpgid(0)}
    found |= {pid for pid, (_, _, pgid) in table.items() if pgid in groups}
    found.discard(root)
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


async def wait_all_gone(pids: set[int], timeout_s: float = 5.0) -> set[int]:
    """Poll until every pid is gone; returns the survivors after ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        while any(alive(p) for p in pids):  # noqa: ASYNC110 (polling /proc)
            await trio.sleep(0.05)
    return {p for p in pids if alive(p)}


@pytest.fixture
def sock_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, short ``SMG_ZMQ_SOCKET_DIR`` (AF_UNIX paths are limited to 107 bytes)."""
    directory = tempfile.mkdtemp(prefix="smg-")
    monkeypatch.setenv("SMG_ZMQ_SOCKET_DIR", directory)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
