"""``serve --backend mock --api-server-count 2`` under faults around the frontends: a frontend
that restarts while one worker's engine is stalled comes back and serves the other one."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import trio

from tests.helpers.frontends import single_frontend
from tests.helpers.procs import engine_pids
from tests.serve.test_serve_multi_frontend import CHAT, _wait_log, serve_two

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]


async def test_restarted_frontend_serves_beside_a_stalled_engine(
    sock_dir: str, tmp_path: Path
) -> None:
    """A frontend's startup waited (up to --worker-startup-timeout-secs, 600 s, then crashed
    with TooSlowError) for every ready worker to attach, and a stalled engine (SIGSTOP, no
    traffic, so nobody timed its silence) never connects to the restarted frontend's fresh
    sockets: the frontend stayed out of service for the healthy worker too."""
    async with serve_two(sock_dir, tmp_path) as served:
        pids = served.frontend_pids()
        engines = sorted(engine_pids(served.proc.pid))
        assert len(engines) == 2, engines
        stalled = engines[0]
        os.kill(stalled, signal.SIGSTOP)
        try:
            with trio.fail_after(90):  # far below the 600 s it took before
                os.kill(pids[1], signal.SIGKILL)
                await _wait_log(served, r"frontend 1 exited")
                await _wait_log(served, r"(?s)frontend 1 exited.*frontend 1 ready")
                async with served.frontend(1) as client:
                    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
            assert resp.status_code == 200, resp.text
            assert re.search(r"have not connected to frontend 1", served.log())
            assert len(re.findall(r"frontend \d exited", served.log())) == 1
        finally:
            os.kill(stalled, signal.SIGCONT)
