"""The conformance runner's HTTP cases against ``serve --backend mock`` as a subprocess (with
``SMG_TRIO_TEST_API_SERVER_COUNT=2``: ``--api-server-count 2``, each case's fresh connections
landing on either frontend): every case passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from conformance.case import Result
from conformance.client import Context
from conformance.runner import http_cases, run_cases
from tests.helpers.frontends import serve_args
from tests.helpers.ports import free_port, random_worker_base_port
from tests.helpers.procs import descendants, kill_leftovers, read_until_ready, wait_all_gone

pytestmark = pytest.mark.slow


async def test_every_conformance_case_passes_against_serve(sock_dir: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--backend", "mock", *serve_args(),
        "--port", str(port), "--worker-base-port", str(random_worker_base_port()),
    ]  # fmt: skip
    log_path = tmp_path / "serve.stderr"
    with log_path.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        with trio.fail_after(90):
            await read_until_ready(proc.stdout)
        children = descendants(proc.pid)
        ctx = Context(f"http://127.0.0.1:{port}", "mock-tiny", timeout_s=30.0)
        with trio.fail_after(180):
            results = await trio.to_thread.run_sync(
                partial(run_cases, ctx, http_cases()), abandon_on_cancel=True
            )
        bad = {r.name: (r.result.name, r.message) for r in results if r.result is not Result.PASS}
        assert bad == {}, log_path.read_text(errors="replace")[-3000:]
        assert len(results) == len(http_cases())
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            assert await proc.wait() == 0, log_path.read_text(errors="replace")[-3000:]
        assert await wait_all_gone(children, timeout_s=15) == set()
    finally:
        await kill_leftovers(proc, children)
