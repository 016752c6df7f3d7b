"""``python -m smg_trio serve --backend vllm`` launches a REAL headless vLLM engine itself.

The whole user path of issue 6 on a CPU machine: serve builds the ``vllm serve --headless``
command (with the peers venv's interpreter via ``--engine-python``), forwards the engine's log,
registers the worker after the handshake, serves chat through the official ``openai`` client
(plain and streaming), then SIGTERM stops everything: serve exits 0 and no process it started
(the vLLM launcher and its EngineCore child) outlives it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from peers.tools import peer_paths, vllm_engine_env, vllm_missing_reason
from tests.helpers.e2e import ENGINE_STARTUP_S, log_tail, require_e2e, wait_http
from tests.helpers.ports import free_port
from tests.helpers.procs import alive, descendants

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny-vllm"
#: serve's own drain grace plus vLLM's SIGTERM teardown (ENGINE_STOP_GRACE_S is 10 s).
SHUTDOWN_S = 60.0


def _wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


def _start_serve(tiny_model: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``serve --backend vllm`` on a free port, logging to ``log_path``; returns it and its
    port."""
    port = free_port()
    sock_dir = tempfile.mkdtemp(prefix="smg-")
    env = vllm_engine_env()  # the engine inherits serve's environment
    env["SMG_ZMQ_SOCKET_DIR"] = sock_dir
    argv = [
        sys.executable, "-m", "smg_trio", "serve",
        "--backend", "vllm", "--model", str(tiny_model),
        "--engine-python", str(peer_paths().vllm_python),
        "--served-model-name", MODEL, "--port", str(port),
        "--worker-base-port", str(random.randint(40000, 60000)),
        "--worker-startup-timeout-secs", str(int(ENGINE_STARTUP_S)),
        "--", "--dtype", "float32", "--max-model-len", "1024",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, port


def test_serve_backend_vllm_launches_engine_and_serves_chat(
    tiny_model: Path, tmp_path: Path
) -> None:
    require_e2e(vllm_missing_reason())
    log_path = tmp_path / "serve.log"
    proc, port = _start_serve(tiny_model, log_path)
    children: set[int] = set()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(
            f"{base}/readiness",
            proc,
            log_path,
            timeout=ENGINE_STARTUP_S,
            what="serve --backend vllm",
        )
        children = descendants(proc.pid)
        assert children, "serve launched no engine process"
        text = log_tail(log_path, 200_000)
        assert "launched engine-" in text, text[-2000:]
        assert "[engine-" in text, "the engine's log is not forwarded with its worker prefix"

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        try:
            assert [m.id for m in client.models.list()] == [MODEL]
            reply = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hello there"}],
                max_tokens=8,
                temperature=0,
                seed=7,
            )
            choice = reply.choices[0]
            assert choice.finish_reason in ("stop", "length")
            assert reply.usage is not None
            assert reply.usage.completion_tokens >= 1
            pieces = []
            finishes = []
            for chunk in client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hello there"}],
                max_tokens=8,
                temperature=0,
                seed=7,
                stream=True,
            ):
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                    if chunk.choices[0].finish_reason:
                        finishes.append(chunk.choices[0].finish_reason)
            # greedy on the same engine: the stream is the same text
            assert "".join(pieces) == (choice.message.content or "")
            assert finishes == [choice.finish_reason]
        finally:
            client.close()

        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(SHUTDOWN_S)
        assert code == 0, log_tail(log_path)
        assert _wait_gone(children, 10.0) == set(), "engine processes outlived serve"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children | descendants(proc.pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_serve_sigkill_stops_the_real_engine(tiny_model: Path, tmp_path: Path) -> None:
    """``serve`` SIGKILLed (no cleanup of its own runs): the engine's guard stops the real
    vLLM engine's process group (the launcher and its EngineCore child)."""
    require_e2e(vllm_missing_reason())
    log_path = tmp_path / "serve.log"
    proc, port = _start_serve(tiny_model, log_path)
    children: set[int] = set()
    try:
        wait_http(
            f"http://127.0.0.1:{port}/readiness",
            proc,
            log_path,
            timeout=ENGINE_STARTUP_S,
            what="serve --backend vllm",
        )
        children = descendants(proc.pid)
        assert len(children) >= 2, children  # guard, vLLM launcher (and its EngineCore)
        proc.kill()
        proc.wait(10)
        assert _wait_gone(children, SHUTDOWN_S) == set(), "engine processes outlived serve"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
