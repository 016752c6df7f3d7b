"""A REAL headless vLLM 0.32.0 engine over tcp: ``launch --worker-urls tcp://127.0.0.1:PORT``
and ``vllm serve --headless --data-parallel-address 127.0.0.1 --data-parallel-rpc-port PORT``
(the engine says ``local: false``; INIT gives it tcp input and output addresses). A chat, a
stream, an abort, then the engine killed: every request in flight ends with an error.

The tests run in file order (the last one kills the module's engine).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from peers.tools import vllm_engine_command, vllm_missing_reason
from tests.helpers.e2e import (
    launch_command,
    require_e2e,
    smg_trio_with_vllm,
)
from tests.helpers.ports import free_port
from tests.helpers.sse import sse_chunks

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny"
#: A dead engine is seen from its closed tcp connection, then the disconnect grace (0.5 s);
#: the heartbeat timeout is the bound for a peer that vanishes without closing. Generous
#: here (a loaded machine): the test asserts that every request ends with an error.
DEATH_BOUND_S = 30.0


class TcpGateway:
    def __init__(
        self,
        base: str,
        gateway: subprocess.Popen[bytes],
        engine: subprocess.Popen[bytes],
        logs: Path,
    ) -> None:
        self.base, self.gateway, self.engine, self.logs = base, gateway, engine, logs

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60.0)


@pytest.fixture(scope="module")
def tcp_gateway(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcpGateway]:
    require_e2e(vllm_missing_reason())
    logs = tmp_path_factory.mktemp("tcp-gateway")
    port, rpc_port = free_port(), free_port()
    gateway_cmd = launch_command(
        f"tcp://127.0.0.1:{rpc_port}", tiny_model, MODEL, port=port, log_level="info"
    )
    engine_cmd = vllm_engine_command(tiny_model, rpc_port)
    with smg_trio_with_vllm(gateway_cmd, engine_cmd, port=port, logs=logs) as (base, gw, eng):
        yield TcpGateway(base, gw, eng, logs)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], **extra}


def test_the_engine_registered_over_tcp(tcp_gateway: TcpGateway) -> None:
    with tcp_gateway.client() as c:
        workers = c.get("/workers").json()
    (worker,) = workers["workers"] if isinstance(workers, dict) else workers
    assert worker["url"].startswith("tcp://127.0.0.1:")
    assert worker["healthy"]
    log = (tcp_gateway.logs / "smg_trio.log").read_text(errors="replace")
    assert "registered on the input socket" in log


def test_chat(tcp_gateway: TcpGateway) -> None:
    with tcp_gateway.client() as c:
        r = c.post("/v1/chat/completions", json=chat_body(max_tokens=8, temperature=0))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"]
    assert 1 <= body["usage"]["completion_tokens"] <= 8


def test_stream(tcp_gateway: TcpGateway) -> None:
    with (
        tcp_gateway.client() as c,
        c.stream("POST", "/v1/chat/completions", json=chat_body(max_tokens=8, stream=True)) as r,
    ):
        assert r.status_code == 200
        raw = r.read()
    chunks = sse_chunks(raw)
    assert chunks
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert any(ch["choices"][0]["delta"].get("content") for ch in chunks if ch.get("choices"))


def _inflight(c: httpx.Client) -> int:
    workers = c.get("/workers").json()
    rows = workers["workers"] if isinstance(workers, dict) else workers
    return sum(int(w["inflight"]) for w in rows)


def test_abort(tcp_gateway: TcpGateway) -> None:
    body = chat_body(max_tokens=900, stream=True, ignore_eos=True)
    with tcp_gateway.client() as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            next(r.iter_bytes())  # the stream is running; now the client goes away
        deadline = time.monotonic() + DEATH_BOUND_S
        while _inflight(c) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _inflight(c) == 0
        # the engine dropped it and serves the next request
        r2 = c.post("/v1/chat/completions", json=chat_body(max_tokens=4))
        assert r2.status_code == 200, r2.text


#: Each request of the engine-kill test: n=3 choices of 900 tokens (the tiny model's context
#: is 1024).
_LONG = {"max_tokens": 900, "ignore_eos": True, "n": 3}
#: How long the engine stays frozen before the kill: well under the tcp heartbeat timeout
#: (5 s), so that the kill, not the heartbeats, is what the gateway sees.
FREEZE_BOUND_S = 3.0


def _stream_outcome(base: str) -> str:
    body = chat_body(stream=True, **_LONG)
    with (
        httpx.Client(base_url=base, timeout=120.0) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        if r.status_code != 200:  # the engine died before the stream's first output
            return f"stream {r.status_code}"
        raw = r.read()
    chunks = sse_chunks(raw)
    errors = [ch for ch in chunks if "error" in ch]
    finishes = [ch["choices"][0].get("finish_reason") for ch in chunks if ch.get("choices")]
    done = raw.rstrip().endswith(b"data: [DONE]")
    return f"stream error={bool(errors)} done={done}" + ("" if errors else f" {finishes[-1:]}")


def _whole_outcome(base: str) -> str:
    with httpx.Client(base_url=base, timeout=120.0) as c:
        r = c.post("/v1/chat/completions", json=chat_body(**_LONG))
    return f"whole {r.status_code} {json.dumps(r.json().get('error', {}).get('type'))}"


def test_engine_killed_ends_every_request_with_an_error(tcp_gateway: TcpGateway) -> None:
    """Three long requests (two streams, one whole) reach an engine that was frozen (SIGSTOP)
    before they were sent, so none can finish; the engine is then SIGKILLed. Every request
    ends with an error (an SSE error event then ``[DONE]``, or a 503), none hangs, and none
    stays in flight. (The tiny model finishes 900 tokens in about a second, so a running
    engine can finish a request before a busy test sees it in flight: freezing it first takes
    the race away. The freeze stays under the heartbeat timeout.)"""
    pgid = tcp_gateway.engine.pid
    os.killpg(pgid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_stream_outcome, tcp_gateway.base) for _ in range(2)]
            futures.append(pool.submit(_whole_outcome, tcp_gateway.base))
            with tcp_gateway.client() as c:
                deadline = time.monotonic() + FREEZE_BOUND_S
                while (inflight := _inflight(c)) < 3 and time.monotonic() < deadline:
                    time.sleep(0.005)
                os.killpg(pgid, signal.SIGKILL)
                killed = time.monotonic()
            outcomes = [f.result(timeout=DEATH_BOUND_S) for f in futures]
            ended = time.monotonic() - killed
    finally:
        with contextlib.suppress(ProcessLookupError):  # never leave the engine stopped
            os.killpg(pgid, signal.SIGKILL)
    print(f"every request ended {ended:.3f} s after SIGKILL ({inflight} in flight): {outcomes}")
    assert inflight >= 1, (inflight, outcomes)  # the kill met requests in flight
    errored = [
        o
        for o in outcomes
        if o in ("stream error=True done=True", "stream 503") or o.startswith("whole 503")
    ]
    assert len(errored) == 3, outcomes  # a frozen engine finishes nothing: each ends in error
    with tcp_gateway.client() as c:
        assert _inflight(c) == 0
    log = (tcp_gateway.logs / "smg_trio.log").read_text(errors="replace")
    assert "disconnected from the input socket" in log
