"""``python -m smg_trio launch`` with no ``--worker-urls`` as a subprocess (issue 15 item 3): it
starts empty, answers its probes, and takes a worker from its discovery file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from tests.helpers.frontends import serve_args
from tests.helpers.ipc import free_handshake_address
from tests.helpers.ports import free_port
from tests.helpers.procs import read_until_ready

pytestmark = pytest.mark.slow


async def test_launch_starts_empty_then_discovers_a_worker(sock_dir: str, tmp_path: Path) -> None:
    port = free_port()
    discovery = tmp_path / "workers.json"
    discovery.write_text("[]")
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "launch", *serve_args(), "--port", str(port),
        "--model-path", str(default_tiny_model_dir()), "--served-model-name", "m",
        "--discovery-provider", "file", "--discovery-file", str(discovery),
    ]  # fmt: skip
    stderr_path = tmp_path / "launch.stderr"
    with stderr_path.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    try:
        assert proc.stdout is not None
        with trio.fail_after(60):
            await read_until_ready(proc.stdout, "launch")
            async with (
                trio.open_nursery() as nursery,
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
            ):
                assert (await http.get("/health")).status_code == 200
                ready = await http.get("/readiness")
                assert ready.status_code == 503
                assert ready.json()["reason"] == "no workers"
                assert (await http.get("/v1/models")).json()["data"] == []

                handshake = free_handshake_address()
                entry = {"url": f"ipc://{sock_dir}/engine-a", "zmq_handshake_address": handshake}
                discovery.write_text(json.dumps([entry]))
                nursery.start_soon(MockEngine(handshake, MockEngineConfig()).run)
                while (await http.get("/readiness")).status_code != 200:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # polling another process
                models = (await http.get("/v1/models")).json()["data"]
                assert [m["id"] for m in models] == ["m"]
                resp = await http.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert resp.status_code == 200, resp.text
                nursery.cancel_scope.cancel()
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await proc.wait()
        assert code == 0, stderr_path.read_text(errors="replace")[-4000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
