"""``serve --api-server-count N``: the supervisor's side. It owns the listening socket, the run
directory (control socket, shared load table, the frontends' config), and N frontend child
processes in its nursery, restarted when they die or stall, and drained on shutdown."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import attrs
import trio

from smg_trio.gateway.http.app import listen_backlog
from smg_trio.gateway.http.tenants import create_ledger_file, load_tenants
from smg_trio.gateway.openai.responses_shared import create_shared_store
from smg_trio.logfmt import root_log_format
from smg_trio.protocol.addresses import client_data_plane
from smg_trio.serve.config import GatewayConfig
from smg_trio.serve.control import FRONTEND_BEATS, FRONTEND_READY, RESPONSES_STORE, TENANTS
from smg_trio.transport.sockdir import ensure_ipc_socket_dir
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager
from smg_trio.worker.shared_load import MAX_WORKER_SLOTS, SharedLoad, create_shared_load

__all__ = [
    "FRONTEND_RESTART_MAX_DELAY_S",
    "FRONTEND_STOP_GRACE_S",
    "FrontendGroup",
    "listening_socket",
    "run_directory",
    "watch_beats",
]

log = logging.getLogger(__name__)

#: A dying frontend is restarted after 1 s, doubling per quick death, at most this.
FRONTEND_RESTART_MAX_DELAY_S = 30.0
#: A frontend that lived this long resets the backoff.
_STABLE_S = 60.0
#: After a frontend's drain (its grace plus the flush), how long it may take to exit before
#: SIGKILL.
FRONTEND_STOP_GRACE_S = 10.0


@contextmanager
def run_directory(socket_dir: str) -> Iterator[str]:
    """A private (0700) directory under ``socket_dir`` for one supervisor's control socket,
    load table and frontend sockets; removed on exit. ``socket_dir`` must pass the ipc socket
    directory checks first (``SocketDirError``): the run directory holds the frontends' config
    (API keys) and the control socket they trust."""
    ensure_ipc_socket_dir(socket_dir)
    path = tempfile.mkdtemp(prefix="smg-trio-run-", dir=socket_dir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def listening_socket(host: str, port: int) -> socket.socket:
    """The one listening socket every frontend inherits (no ``SO_REUSEPORT``: no other process
    can bind the port beside it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=listen_backlog())
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.set_inheritable(True)
    return sock


class _Slots:
    """Worker id -> load-table slot, reused once a worker leaves the registry."""

    def __init__(self, manager: WorkerManager) -> None:
        self._manager = manager
        self._slots: dict[str, int] = {}

    def __call__(self, worker_id: str) -> int:
        slot = self._slots.get(worker_id)
        if slot is not None:
            return slot
        live = {w.worker_id for w in self._manager.workers}
        for gone in [k for k in self._slots if k not in live]:
            del self._slots[gone]
        used = set(self._slots.values())
        slot = next((s for s in range(MAX_WORKER_SLOTS) if s not in used), -1)
        if slot >= 0:
            self._slots[worker_id] = slot
        return slot


@attrs.define
class _Frontend:
    index: int
    process: trio.Process | None = None
    restarts: int = 0
    ready: trio.Event = attrs.field(factory=trio.Event)


class FrontendGroup:
    """The N frontend processes of one supervisor (clients 1..N of every engine)."""

    def __init__(
        self,
        config: GatewayConfig,
        count: int,
        run_dir: str,
        listen: socket.socket,
        confinement: WorkerConfinement | None = None,
    ):
        self.config = config
        self.count = count
        self.run_dir = run_dir
        self._listen = listen
        self._stopping = False
        self.frontends = [_Frontend(i) for i in range(1, count + 1)]
        #: The supervisor's manager (its workers' frontend sockets are unlinked at exit).
        self.manager: WorkerManager | None = None
        create_shared_load(os.path.join(run_dir, "load"), count)
        create_shared_store(os.path.join(run_dir, RESPONSES_STORE))
        tenants = load_tenants(config.api_keys_file, config.tenant_api_keys)
        if tenants is not None:
            create_ledger_file(os.path.join(run_dir, TENANTS), len(tenants.tenants), count)
        #: The frontends' in-flight counts (read-only): a worker removal drains them.
        self.load = SharedLoad(os.path.join(run_dir, "load"), count, None)
        doc = {
            "config": attrs.asdict(config, recurse=True),
            "count": count,
            "listen_fd": listen.fileno(),
            # the supervisor's allow-lists (its launched engines' model and socket dirs among
            # them): the frontends load what its table names, which it already confined
            "confinement": attrs.asdict(confinement) if confinement is not None else None,
        }
        fd = os.open(
            os.path.join(run_dir, "config.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        )
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)

    def _stopped(self) -> bool:
        return self._stopping

    @property
    def pids(self) -> list[int]:
        """The live frontends' process ids, by index."""
        return [f.process.pid for f in self.frontends if f.process is not None]

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every frontend (restarting those that die) until cancelled; reports started
        once each printed its ready line."""
        try:
            async with trio.open_nursery() as nursery:
                for frontend in self.frontends:
                    nursery.start_soon(self._keep, frontend)
                for frontend in self.frontends:
                    await frontend.ready.wait()
                task_status.started()
        finally:
            if self.manager is not None:
                self.manager.remote_inflight = None
            self._unlink_data_planes()

    def _unlink_data_planes(self) -> None:
        """The frontends' ipc sockets (a killed frontend leaves its pair behind)."""
        if self.manager is None:
            return
        for worker in self.manager.workers:
            for i in range(1, self.count + 1):
                for url in client_data_plane(worker.addresses.path, i):
                    path = url.removeprefix("ipc://")
                    with contextlib.suppress(OSError):
                        if stat.S_ISSOCK(os.lstat(path).st_mode):
                            os.unlink(path)

    async def _keep(self, frontend: _Frontend) -> None:
        delay = 1.0
        while not self._stopping:
            started = trio.current_time()
            code = await self._run_once(frontend)
            if self._stopped():
                return
            if trio.current_time() - started > _STABLE_S:
                delay = 1.0
            frontend.restarts += 1
            log.error(
                "frontend %d exited (code %s); restarting it in %.0f s (its engine requests "
                "are aborted when it is back)",
                frontend.index,
                code,
                delay,
            )
            await trio.sleep(delay)
            delay = min(delay * 2, FRONTEND_RESTART_MAX_DELAY_S)

    async def _run_once(self, frontend: _Frontend) -> int:
        # The frontend exits when this pipe reaches end of file: only we hold the write end.
        lifeline_r, lifeline_w = os.pipe()
        argv = [sys.executable, "-m", "smg_trio.serve.frontend", self.run_dir, str(frontend.index)]
        pass_fds = [self._listen.fileno()]
        # ... and its event loop writes a byte to this one every so often (watch_beats).
        stall = self.config.frontend_stall_timeout_s
        beats_r, beats_w = os.pipe() if 0 < stall < math.inf else (-1, -1)
        if beats_w >= 0:
            argv.append(str(beats_w))
            pass_fds.append(beats_w)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        env = {
            **os.environ,
            "SMG_TRIO_FRONTEND_LOG_LEVEL": level,
            "SMG_TRIO_FRONTEND_LOG_FORMAT": root_log_format(),
        }
        try:
            async with trio.open_nursery() as nursery:
                try:
                    proc: trio.Process = await nursery.start(
                        partial(
                            trio.run_process,
                            argv,
                            stdin=lifeline_r,
                            stdout=subprocess.PIPE,
                            env=env,
                            pass_fds=pass_fds,
                            check=False,
                            deliver_cancel=_stop_frontend,
                        )
                    )
                finally:
                    os.close(lifeline_r)
                    if beats_w >= 0:
                        os.close(beats_w)
                frontend.process = proc
                assert proc.stdout is not None
                nursery.start_soon(self._read_stdout, proc.stdout, frontend)
                if beats_r >= 0:
                    watch = partial(
                        watch_beats, beats_r, frontend.index, proc, stall, self._stopped
                    )
                    nursery.start_soon(watch)
                    beats_r = -1  # the watcher closes it
                code = await proc.wait()
                nursery.cancel_scope.cancel()
        finally:
            os.close(lifeline_w)
            if beats_r >= 0:
                os.close(beats_r)
            frontend.process = None
        return code

    async def _read_stdout(self, stdout: trio.abc.ReceiveStream, frontend: _Frontend) -> None:
        buf = b""
        async for chunk in stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").rstrip()
                if line.startswith(FRONTEND_READY):
                    log.info("frontend %d ready: %s", frontend.index, line)
                    frontend.ready.set()
                else:
                    log.info("[frontend-%d] %s", frontend.index, line)

    async def drain(self) -> None:
        """SIGTERM every frontend (each drains its own requests) and wait for them to exit;
        none is restarted after this."""
        self._stopping = True
        for frontend in self.frontends:
            if frontend.process is not None:
                frontend.process.send_signal(signal.SIGTERM)
        from smg_trio.serve import DRAIN_FLUSH_S

        limit = self.config.shutdown_grace_period_s + DRAIN_FLUSH_S + FRONTEND_STOP_GRACE_S
        with trio.move_on_after(limit):
            for frontend in self.frontends:
                proc = frontend.process
                if proc is not None:
                    await proc.wait()


async def _stop_frontend(proc: trio.Process) -> None:
    """``deliver_cancel``: SIGTERM (the frontend drains), SIGKILL after the grace."""
    proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(FRONTEND_STOP_GRACE_S):
        await proc.wait()
    proc.kill()


async def watch_beats(
    fd: int, index: int, proc: trio.Process, stall: float, stopped: Callable[[], bool]
) -> None:
    """SIGKILL frontend ``index`` (``proc``) once its event loop has not run for ``stall``
    seconds (a CPU-bound or blocking call that never returns, a deadlock in native code,
    SIGSTOP): it still holds its connections and engine requests but serves nothing, and only
    its death lets :meth:`FrontendGroup._keep` restart it (its engine requests are then
    ABORTed). ``fd``: the heartbeat pipe's read end, closed on return. The clock starts at
    the first beat, so the imports before the loop runs are not timed; once ``stopped()``
    (the group drains), a silence ends the watch instead."""
    os.set_blocking(fd, False)
    try:
        first = True
        # the last beat may have come up to one interval before the loop stopped
        silence = stall * (1 + 1 / FRONTEND_BEATS)
        while True:
            with trio.move_on_after(math.inf if first else silence):
                await trio.lowlevel.wait_readable(fd)
            # read even when the wait timed out: if this loop was the late one, the
            # beats are there (not the frontend's stall)
            try:
                beat = os.read(fd, 4096)
            except BlockingIOError:
                beat = None
            if beat == b"":
                return  # it exited: _run_once sees to it
            first = False
            if beat is not None:
                continue
            if stopped():
                return  # drain's own deadline decides now
            log.error(
                "frontend %d (pid %d) stalled: its event loop has not run for at least "
                "%g s (--frontend-stall-timeout-secs); killing it",
                index,
                proc.pid,
                stall,
            )
            proc.kill()
            return
    finally:
        os.close(fd)
