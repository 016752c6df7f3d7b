"""Engine child processes in the serve nursery: log forwarding, exit detection, group kill."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from functools import partial

import trio

from smg_trio.errors import SmgError
from smg_trio.serve import guard
from smg_trio.serve.commands import EngineLaunch
from smg_trio.serve.enginelog import EngineLogLevels

__all__ = ["ENGINE_STOP_GRACE_S", "EngineExited", "exit_cause", "run_engine_process"]

log = logging.getLogger(__name__)

#: SIGTERM to SIGKILL: long enough for vLLM to tear down its EngineCore child cleanly.
ENGINE_STOP_GRACE_S = 10.0
#: After an engine exits, how long its last log lines may take to drain for the error message.
#: The group is SIGKILLed first, so the pipe closes at once unless a process left the group.
LOG_DRAIN_S = 1.0
_TAIL_LINES = 40
#: The guard runs as a script by path: no package imports, so it starts in milliseconds.
GUARD_PATH = guard.__file__


def exit_cause(returncode: int) -> str:
    """How a process ended, from its exit status: ``exited with code 3``, or ``exited with
    code -9 (killed by SIGKILL)`` (with the OOM killer named as its usual sender)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = ", often the kernel's out-of-memory killer" if -returncode == signal.SIGKILL else ""
    return f"exited with code {returncode} (killed by {name}{hint})"


class EngineExited(SmgError):
    """An engine process exited on its own. ``returncode`` and the ``tail`` of its log; the
    message says how (code or signal) and quotes its last lines, or says it wrote none."""

    def __init__(self, name: str, returncode: int, tail: list[str]) -> None:
        if tail:
            text = "\n".join(f"  {line}" for line in tail[-15:])
            said = f"last log lines:\n{text}"
        else:
            said = "no log lines"
        super().__init__(f"engine {name} {exit_cause(returncode)}; {said}")
        self.name = name
        self.returncode = returncode
        self.tail = tail


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _stop_group(proc: trio.Process, force: trio.Event | None = None) -> None:
    """``deliver_cancel`` for ``run_process``: SIGTERM the process group, then SIGKILL it
    after ``ENGINE_STOP_GRACE_S``, or as soon as ``force`` is set. SIGCONT follows SIGTERM so
    that a stopped (SIGSTOPped, stalled) engine acts on it."""
    _killpg(proc.pid, signal.SIGTERM)
    _killpg(proc.pid, signal.SIGCONT)
    with trio.move_on_after(ENGINE_STOP_GRACE_S):
        if force is None:
            await proc.wait()
        else:
            async with trio.open_nursery() as nursery:

                async def forced() -> None:
                    await force.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(forced)
                await proc.wait()
                nursery.cancel_scope.cancel()
    _killpg(proc.pid, signal.SIGKILL)


async def _forward(
    stream: trio.abc.ReceiveStream, name: str, tail: deque[str], min_level: int = logging.INFO
) -> None:
    """Log the engine's lines as ``[name] line`` at the engine's own level (those below
    ``min_level`` are dropped); every line goes to ``tail`` for :class:`EngineExited`."""
    buf = b""
    levels = EngineLogLevels()

    def emit(line: str) -> None:
        tail.append(line)
        level = levels.level(line)
        if level < min_level:
            return
        if log.isEnabledFor(level):
            log.log(level, "[%s] %s", name, line)
        else:  # --engine-log-level below the gateway's own level: the engine's lines still show
            log.handle(log.makeRecord(log.name, level, __file__, 0, "[%s] %s", (name, line), None))

    async for chunk in stream:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            emit(raw.decode(errors="replace").rstrip())
    if buf:
        emit(buf.decode(errors="replace"))


async def run_engine_process(
    launch: EngineLaunch,
    *,
    name: str,
    on_exit: Callable[[EngineExited], None] | None = None,
    force_stop: trio.Event | None = None,
    task_status: trio.TaskStatus[trio.Process] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one engine in its own process group until cancelled.

    Cancellation stops the whole group (SIGTERM, then SIGKILL after ``ENGINE_STOP_GRACE_S``,
    or at once when ``force_stop`` is set), so no orphan survives. The engine runs under a guard (:mod:`smg_trio.serve.guard`) that
    stops the group if this process dies without cleaning up (SIGKILL, OOM kill). If the engine
    exits by itself, ``on_exit`` is called as soon as the process is reaped (the caller fails
    the worker's in-flight requests), the rest of the group is killed, and
    :class:`EngineExited` is raised with the last log lines. ``task_status.started`` gets the
    guard's process (its pid is the group's id; its exit status is the engine's).
    """
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    env = {**os.environ, **launch.env}
    # The guard sees end of file on this pipe when this process is gone: only we hold the
    # write end (os.pipe fds are not inherited by other children).
    lifeline_r, lifeline_w = os.pipe()
    try:
        async with trio.open_nursery() as nursery:
            try:
                proc: trio.Process = await nursery.start(
                    partial(
                        trio.run_process,
                        [sys.executable, GUARD_PATH, *launch.argv],
                        env=env,
                        start_new_session=True,
                        stdin=lifeline_r,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        check=False,
                        deliver_cancel=partial(_stop_group, force=force_stop),
                    )
                )
            finally:
                os.close(lifeline_r)
            log.info(
                "launched %s (guard pid %d, its child is the engine): %s",
                name,
                proc.pid,
                " ".join(launch.argv),
            )
            task_status.started(proc)
            assert proc.stdout is not None
            forwarded = trio.Event()

            async def forward(stdout: trio.abc.ReceiveStream) -> None:
                await _forward(stdout, name, tail, launch.log_level)
                forwarded.set()

            nursery.start_soon(forward, proc.stdout)
            # Exit is detected from the process itself (a pidfd on Linux), not from the log
            # pipe: vLLM's EngineCore child inherits stdout and can hold it open after its
            # parent died.
            code = await proc.wait()
            _killpg(proc.pid, signal.SIGKILL)  # the group's leftovers; closes the pipe too
            if on_exit is not None:
                on_exit(EngineExited(name, code, list(tail)))
            with trio.move_on_after(LOG_DRAIN_S):
                await forwarded.wait()
            nursery.cancel_scope.cancel()
    finally:
        os.close(lifeline_w)
    # raised outside the nursery so callers can catch it bare, not inside an ExceptionGroup
    raise EngineExited(name, code, list(tail))
