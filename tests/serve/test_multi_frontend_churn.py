"""``serve --backend mock --api-server-count 2`` under faults around the frontends: a frontend
that restarts while one worker's engine is stalled comes back and serves the other one; a
stalled frontend is killed and restarted."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import httpx
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


async def test_a_stalled_frontend_is_killed_restarted_and_its_requests_aborted(
    sock_dir: str, tmp_path: Path
) -> None:
    """A frontend whose event loop stops running (SIGSTOP here; a call that never returns is
    the same to the supervisor) is alive, holds its connections and engine requests, and
    serves nothing. The supervisor hears no heartbeat for --frontend-stall-timeout-secs,
    kills it and restarts it; the engine request it held is ABORTed once the new one is
    back; the frontend that kept running is left alone."""
    async with serve_two(sock_dir, tmp_path, "--frontend-stall-timeout-secs", "2") as served:
        pids = served.frontend_pids()
        streaming = trio.Event()

        async def stream_on_frontend_1() -> None:
            body = {**CHAT, "max_tokens": 3000, "ignore_eos": True, "stream": True}
            async with served.frontend(1) as client:
                with contextlib.suppress(httpx.HTTPError):  # its frontend is killed under it
                    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                        assert resp.status_code == 200
                        async for _ in resp.aiter_lines():
                            streaming.set()

        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream_on_frontend_1)
                await streaming.wait()
                rid = (await _wait_log(served, r"mock: add (\S+) \(client 1\)"))[1]
                os.kill(pids[1], signal.SIGSTOP)
                stalled = await _wait_log(served, r"frontend 1 \(pid (\d+)\) stalled")
                assert int(stalled[1]) == pids[1]
                await _wait_log(served, r"(?s)frontend 1 \(pid \d+\) stalled.*frontend 1 ready")
                await _wait_log(served, rf"mock: abort {re.escape(rid)}")
                nursery.cancel_scope.cancel()
            async with served.frontend(1) as client:
                resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
            assert resp.status_code == 200, resp.text
        now = served.frontend_pids()
        assert now[1] != pids[1]
        assert now[2] == pids[2]  # its heartbeat kept coming
        assert len(re.findall(r"frontend \d exited", served.log())) == 1
