"""The confinement check of .ci/fuzz.sh's keyed admin pass: after the admin mutations were
fuzzed with the admin key, nothing was created, removed or bound outside the server's socket
dir, and nothing listens beyond what listened before the run.

Usage:
  python .ci/fuzz_confine.py snapshot PID OUT BASE_URL KEY
      the TCP listeners of PID and its descendants, and the server's workers, into OUT
  python .ci/fuzz_confine.py check PID SNAPSHOT BASE_URL KEY ALLOWED_DIR [STRACE_LOG]
      fails (exit 1) on a listener that is not loopback, on listeners left beyond the snapshot
      once the workers the fuzzer added are removed, and, given an ``strace -f -y`` log of the
      server, on any successful mkdir/unlink/rename/link/symlink/creating open or unix bind
      outside ALLOWED_DIR (or an abstract one), or a TCP bind that is not loopback.
"""

from __future__ import annotations

import codecs
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

#: Syscalls that create or remove a name: for each path argument in order, the index of its
#: dirfd argument (None: relative to the working directory).
_PATH_CALLS: dict[str, list[int | None]] = {
    "mkdir": [None],
    "mkdirat": [0],
    "rmdir": [None],
    "unlink": [None],
    "unlinkat": [0],
    "rename": [None, None],
    "renameat": [0, 2],
    "renameat2": [0, 2],
    "link": [None, None],
    "linkat": [0, 2],
    "symlink": [None],  # only the link's name (the second string) is checked
    "symlinkat": [1],
    "creat": [None],
    "open": [None],
    "openat": [0],
    "mknod": [None],
    "mknodat": [0],
}
_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)")
_FD = re.compile(r"^(?:AT_FDCWD|\d+)(?:<(.*)>)?$")


def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += children.get(p, [])
    return out


def listeners(pid: int) -> list[str]:
    """``addr:port`` of every listening TCP socket the process tree of ``pid`` holds."""
    pids = _tree(pid)
    text = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            out.append(line.split()[3])
    return sorted(out)


def _workers(base: str, key: str) -> list[str]:
    resp = httpx.get(f"{base}/workers", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    resp.raise_for_status()
    return [w["id"] for w in resp.json()["workers"]]


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _unescape(s: str) -> str:
    raw: bytes = codecs.escape_decode(s.encode("latin-1", "backslashreplace"))[0]
    return raw.decode("utf-8", "surrogateescape")


def _args(text: str) -> list[str]:
    """Top-level comma-separated arguments of a syscall (quotes and braces respected)."""
    out: list[str] = []
    cur: list[str] = []
    depth, quoted, esc = 0, False, False
    for ch in text:
        if quoted:
            cur.append(ch)
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                quoted = False
            continue
        if ch == '"':
            quoted = True
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _calls(log: Path) -> list[tuple[str, list[str], str]]:
    """(name, arguments, result) of each completed syscall in an ``strace -f`` log, with
    ``<unfinished ...>`` / ``<... resumed>`` halves joined."""
    pending: dict[str, str] = {}
    out = []
    for raw in log.read_text(errors="replace").splitlines():
        m = _LINE.match(raw)
        if not m:
            continue
        pid, rest = m.groups()
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        resumed = re.match(r"^<\.\.\. \w+ resumed>\s?(.*)$", rest)
        if resumed:
            rest = pending.pop(pid, "") + resumed.group(1)
        call = _CALL.match(rest)
        if call:
            out.append((call.group(1), _args(call.group(2)), call.group(3)))
    return out


def _resolve(dirfd: str | None, path: str, cwd: str) -> str:
    if path.startswith("/"):
        return os.path.normpath(path)
    base = cwd
    if dirfd is not None:
        m = _FD.match(dirfd)
        if m and m.group(1):
            base = m.group(1)
    return os.path.normpath(os.path.join(base, path))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _bind_problem(addr: str, allowed: str, cwd: str) -> str | None:
    if "AF_UNIX" in addr:
        m = re.search(r'sun_path=(@?)"((?:[^"\\]|\\.)*)"', addr)
        if not m or m.group(1) or not _inside(_resolve(None, _unescape(m.group(2)), cwd), allowed):
            return f"unix bind outside {allowed}: {addr}"
    elif "AF_INET" in addr:
        m = re.search(r'inet_(?:addr|pton)\((?:AF_INET6, )?"([^"]+)"', addr)
        if not m or not _loopback(m.group(1) + ":0"):
            return f"tcp bind not on loopback: {addr}"
    return None


def strace_problems(log: Path, allowed: str, cwd: str) -> list[str]:
    """Everything the traced server created, removed or bound outside ``allowed``."""
    allowed = os.path.realpath(allowed)
    problems = []
    for name, args, result in _calls(log):
        if result == "?" or int(result) < 0:
            continue
        if name == "bind":
            problem = _bind_problem(args[1] if len(args) > 1 else "", allowed, cwd)
            if problem:
                problems.append(problem)
            continue
        if name not in _PATH_CALLS:
            continue
        if name in ("open", "openat"):
            flags = args[2] if name == "openat" else args[1]
            if "O_CREAT" not in flags:
                continue
        dirfds = _PATH_CALLS[name]
        strs = [(i, a) for i, a in enumerate(args) if a.startswith('"')]
        if name == "symlink":
            strs = strs[1:]  # the target may be anything; the link's name is what is created
        for k, (_, a) in enumerate(strs):
            dirfd_index = dirfds[min(k, len(dirfds) - 1)]
            dirfd = args[dirfd_index] if dirfd_index is not None else None
            path = _resolve(dirfd, _unescape(a[1:-1]), cwd)
            if _inside(path, allowed) or "/__pycache__/" in path or path.startswith("/dev/"):
                continue
            problems.append(f"{name} outside {allowed}: {path}")
    return problems


def main() -> int:
    mode, pid = sys.argv[1], int(sys.argv[2])
    if mode == "snapshot":
        out, base, key = sys.argv[3:6]
        snap = {"listeners": listeners(pid), "workers": _workers(base, key)}
        Path(out).write_text(json.dumps(snap))
        return 0
    snapshot, base, key, allowed = sys.argv[3:7]
    strace_log = sys.argv[7] if len(sys.argv) > 7 else None
    before = json.loads(Path(snapshot).read_text())
    problems = []
    now = listeners(pid)
    problems += [f"listening beyond loopback: {a}" for a in now if not _loopback(a)]
    if now != before["listeners"]:
        # The fuzzer may have added loopback workers; removing them must free their ports.
        for worker in _workers(base, key):
            if worker not in before["workers"]:
                headers = {"Authorization": f"Bearer {key}"}
                httpx.delete(f"{base}/workers/{worker}", headers=headers, timeout=10)
        deadline = time.monotonic() + 15
        while now != before["listeners"] and time.monotonic() < deadline:
            time.sleep(0.2)
            now = listeners(pid)
        if now != before["listeners"]:
            problems.append(f"listeners {now} after the run, {before['listeners']} before")
    if strace_log:
        problems += strace_problems(Path(strace_log), allowed, os.getcwd())
    for p in problems:
        print(f"fuzz confine: {p}")
    print(f"fuzz confine: {len(problems)} problem(s); listening {now}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
