"""/proc scans for tests: a process's descendants (across process groups) and liveness."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["alive", "descendants", "engine_pids"]


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


def _runs_guard(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and argv[1].endswith(b"guard.py")


def engine_pids(root: int) -> set[int]:
    """:func:`descendants` of ``root`` without the engine guards (``serve/guard.py``): the
    engine processes themselves and their children."""
    return {pid for pid in descendants(root) if not _runs_guard(pid)}
