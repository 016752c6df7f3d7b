"""Engine guard: the parent of one engine that stops the engine's process group when serve dies.

``serve`` starts each engine as ``python guard.py ENGINE_ARGV...`` in a new process group, with
the guard's stdin the read end of a pipe whose write end only ``serve`` holds. The guard starts
the engine in the same group and waits for either:

- the engine to exit: the guard exits the same way (same code, or the same signal), so serve
  sees the engine's own exit status;
- end of file on stdin: serve is gone, even by SIGKILL or the OOM killer, which no signal
  handler in serve could catch. The guard sends SIGTERM (and SIGCONT) to the group, waits up to
  ``STOP_GRACE_S`` for the engine, then SIGKILLs the group, itself included.

The guard ignores SIGTERM and SIGINT: serve stops an engine by signalling its whole group, and
the guard stays to report the engine's exit. It is run as a script by path and imports only the
standard library, so it starts in milliseconds and holds a few MiB.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from typing import NoReturn

#: SIGTERM to SIGKILL after serve vanished (serve's own ENGINE_STOP_GRACE_S).
STOP_GRACE_S = 10.0
#: Without pidfds (not Linux), how often the engine's exit is polled, in seconds.
_POLL_S = 0.5


def _exit_like(code: int) -> NoReturn:
    """Exit with the engine's status: its code, or death by the same signal."""
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


def _wait(child: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    try:
        return child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _stop_group(child: subprocess.Popen[bytes]) -> NoReturn:
    os.killpg(0, signal.SIGTERM)
    os.killpg(0, signal.SIGCONT)
    code = _wait(child, STOP_GRACE_S)
    if code is None:
        os.killpg(0, signal.SIGKILL)  # the guard too
    _exit_like(code if code is not None else -signal.SIGKILL)


def main(argv: list[str]) -> NoReturn:
    """Run ``argv`` and guard it as described in the module docstring."""
    if not argv:
        sys.exit("usage: guard.py ENGINE_ARGV...")
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after the spawn: the engine keeps defaults
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    poller = select.poll()
    poller.register(0, select.POLLIN | select.POLLHUP)
    pidfd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else None
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while True:
        events = poller.poll(None if pidfd is not None else _POLL_S * 1000)
        code = child.poll()
        if code is not None:
            _exit_like(code)
        for fd, _ in events:
            if fd == 0 and not os.read(0, 4096):
                _stop_group(child)


if __name__ == "__main__":
    main(sys.argv[1:])
