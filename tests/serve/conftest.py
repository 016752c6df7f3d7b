"""Fixtures for the serve tests: free ports, a private socket dir, and a /proc process scan."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator

import pytest
import trio

from tests.helpers.procs import alive, descendants, engine_pids

__all__ = [
    "alive",
    "descendants",
    "engine_pids",
    "free_port",
    "kill_leftovers",
    "random_worker_base_port",
    "wait_all_gone",
]


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_worker_base_port() -> int:
    """A worker base port outside the 20000..29999 handshake band, random per test."""
    return random.randint(40000, 60000)


async def wait_all_gone(pids: set[int], timeout_s: float = 5.0) -> set[int]:
    """Poll until every pid is gone; returns the survivors after ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        while any(alive(p) for p in pids):  # noqa: ASYNC110 (polling /proc)
            await trio.sleep(0.05)
    return {p for p in pids if alive(p)}


async def kill_leftovers(proc: trio.Process, pids: set[int]) -> None:
    """Test cleanup: kill ``proc`` if it still runs, and every pid of ``pids`` still alive."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def sock_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, short ``SMG_ZMQ_SOCKET_DIR`` (AF_UNIX paths are limited to 107 bytes)."""
    directory = tempfile.mkdtemp(prefix="smg-")
    monkeypatch.setenv("SMG_ZMQ_SOCKET_DIR", directory)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
