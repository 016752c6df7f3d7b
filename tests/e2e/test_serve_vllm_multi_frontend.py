"""``serve --backend vllm --api-server-count 2`` driving a REAL vLLM 0.32 CPU engine (one
engine for the module, one test): chat through each frontend (its own unix socket), a stream,
a client that disconnects mid-stream (its request ends at the engine: no request is left for
vLLM's shutdown to abort), then SIGTERM drains a running stream to ``[DONE]``, serve exits 0
and no process it started outlives it."""

from __future__ import annotations

import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from peers.tools import peer_paths, vllm_engine_env, vllm_missing_reason
from tests.helpers.e2e import ENGINE_STARTUP_S, log_tail, require_e2e
from tests.helpers.frontends import hold_chat_stream
from tests.helpers.procs import descendants, kill_leftovers, read_until_ready, wait_all_gone

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny-vllm"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}]}


def _frontend(run_dir: str, index: int) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=os.path.join(run_dir, f"frontend-{index}.sock"))
    return httpx.AsyncClient(transport=transport, base_url="http://frontend", timeout=120)


async def _first_chunk_then_hold(
    sock: str, body: dict[str, object], task_status: trio.TaskStatus[str]
) -> None:
    stream = await trio.open_unix_socket(sock)
    await hold_chat_stream(stream, body, task_status=task_status)


async def _in_flight(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(r"^smg_router_requests_in_flight (\S+)", text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_two_frontends_on_a_real_vllm_engine(tiny_model: Path, tmp_path: Path) -> None:
    require_e2e(vllm_missing_reason())
    sock_dir = tempfile.mkdtemp(prefix="smg-")
    env = vllm_engine_env()
    env.update(SMG_ZMQ_SOCKET_DIR=sock_dir, PYTHONUNBUFFERED="1")
    port = random.randint(20000, 39000)
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--api-server-count", "2",
        "--backend", "vllm", "--model", str(tiny_model),
        "--engine-python", str(peer_paths().vllm_python),
        "--served-model-name", MODEL, "--port", str(port),
        "--worker-base-port", str(random.randint(40000, 60000)),
        "--worker-startup-timeout-secs", str(int(ENGINE_STARTUP_S)),
        "--shutdown-grace-period-secs", "120",
        "--", "--dtype", "float32", "--max-model-len", "1024",
    ]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env
        )
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        with trio.fail_after(ENGINE_STARTUP_S + 60):
            await read_until_ready(proc.stdout)
        children = descendants(proc.pid)
        (run_dir,) = glob.glob(os.path.join(sock_dir, "smg-trio-run-*"))
        with trio.fail_after(240):
            # each frontend answers, greedy: the same text from either, and as a stream
            texts = []
            for index in (1, 2):
                async with _frontend(run_dir, index) as c:
                    body = {**CHAT, "max_tokens": 8, "temperature": 0}
                    resp = await c.post("/v1/chat/completions", json=body)
                    assert resp.status_code == 200, resp.text
                    texts.append(resp.json()["choices"][0]["message"]["content"])
            assert texts[0] == texts[1]
            async with _frontend(run_dir, 2) as c:
                body = {**CHAT, "max_tokens": 8, "temperature": 0, "stream": True}
                async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                    lines = [line async for line in resp.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            pieces = [
                json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                for line in lines[:-1]
                if json.loads(line[6:])["choices"]
            ]
            assert "".join(pieces) == texts[0]

            # a client that goes away mid-stream: the frontend's request ends (its ABORT
            # reaches the engine: nothing is left in vLLM for shutdown to abort, below)
            long = {**CHAT, "max_tokens": 900, "ignore_eos": True, "stream": True}
            sock = os.path.join(run_dir, "frontend-1.sock")
            async with trio.open_nursery() as nursery:
                await nursery.start(_first_chunk_then_hold, sock, long)
                nursery.cancel_scope.cancel()
            async with _frontend(run_dir, 1) as c:
                while await _in_flight(c):  # noqa: ASYNC110 (polling another process)
                    await trio.sleep(0.05)

            # SIGTERM drains: a stream running on frontend 2 finishes with [DONE]
            results: list[str] = []
            started = trio.Event()

            async def finish() -> None:
                body = {**CHAT, "max_tokens": 64, "ignore_eos": True, "stream": True}
                async with (
                    _frontend(run_dir, 2) as c,
                    c.stream("POST", "/v1/chat/completions", json=body) as resp,
                ):
                    async for line in resp.aiter_lines():
                        if line:
                            started.set()
                            results.append(line)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish)
                await started.wait()
                proc.send_signal(signal.SIGTERM)
            assert results[-1] == "data: [DONE]"
            assert not any('"error"' in line for line in results), results[-3:]
            code = await proc.wait()
        text = log_tail(log_path, 400_000)
        assert code == 0, text[-4000:]
        assert "in-flight requests count" not in text, text[-4000:]  # nothing left running
        assert await wait_all_gone(children, timeout_s=30) == set()
    finally:
        await kill_leftovers(proc, children)
