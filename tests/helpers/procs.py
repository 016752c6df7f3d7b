"""Processes in tests: /proc scans (a process's descendants across process groups, liveness),
waiting for processes to be gone, and killing what a test left behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

__all__ = [
    "alive",
    "descendants",
    "engine_pids",
    "kill_leftovers",
    "read_until_ready",
    "spawned",
    "wait_all_gone",
]


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


def _runs_guard_or_frontend(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (len(argv) > 1 and argv[1].endswith(b"guard.py")) or b"smg_trio.serve.frontend" in argv


def engine_pids(root: int) -> set[int]:
    """:func:`descendants` of ``root`` without the engine guards (``serve/guard.py``) and the
    frontend processes (``--api-server-count``): the engine processes themselves and their
    children."""
    return {pid for pid in descendants(root) if not _runs_guard_or_frontend(pid)}


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
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone since


async def read_until_ready(stream: trio.abc.ReceiveStream, what: str = "serve") -> str:
    """The ``smg_trio ready on ...`` line of a gateway's stdout (``what`` names it if it
    exits first)."""
    buf = b""
    async for chunk in stream:
        buf += chunk
        for line in buf.decode(errors="replace").splitlines():
            if line.startswith("smg_trio ready on "):
                return line
    raise AssertionError(f"{what} exited before it was ready; stdout: {buf!r}")


@asynccontextmanager
async def spawned(
    argv: Sequence[str], *, stderr_path: Path, env: Mapping[str, str]
) -> AsyncIterator[trio.Process]:
    """``argv`` running for the block, its stdout piped (for :func:`read_until_ready`) and its
    stderr in ``stderr_path``; afterwards it and every process below it killed."""
    with stderr_path.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    try:
        yield proc
    finally:
        await kill_leftovers(proc, descendants(proc.pid))
