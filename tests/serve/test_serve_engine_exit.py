"""An engine that dies at runtime is detected from its process exit, within a second, and
serve relaunches it.

serve launches the mock engine as a child process; the test SIGKILLs it while a streaming
request is in flight. A SIGKILLed engine sends no ``ENGINE_CORE_DEAD`` sentinel and its PULL
peer raises nothing, and the silence watchdog is set far beyond the test, so the only signal
that can end the stream in time is the launcher reaping the process (issue 6).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import attrs
import pytest
import trio
import trio.testing

from tests.helpers.ports import random_worker_base_port
from tests.helpers.procs import engine_pids, wait_all_gone
from tests.helpers.sse import sse_payloads

httpx = pytest.importorskip("httpx")

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.serve import (  # noqa: E402
    ENGINE_RESTART_LIMIT,
    EngineLaunchConfig,
    GatewayConfig,
    ServeHandle,
    _supervise_engine,
    serve,
)
from smg_trio.serve.commands import EngineLaunch  # noqa: E402
from smg_trio.serve.launcher import EngineExited  # noqa: E402
from tests.helpers.frontends import with_api_server_count  # noqa: E402

pytestmark = pytest.mark.slow

#: The detection bound issue 6 names: process exit, not a silence window.
EXIT_DETECTION_S = 1.0
#: Far beyond the test, so the silence watchdog cannot be what ends the stream.
SILENCE_S = 600.0
#: The silence window for the stall test: short, so the watchdog trips quickly.
STALL_SILENCE_S = 1.0
#: The first restart waits 1 s; the relaunched mock handshakes in well under a second more.
RESTART_S = 20.0


def _config(sock_dir: str) -> GatewayConfig:
    return GatewayConfig(
        port=0,
        served_model_name="mock-tiny",
        engine_silence_timeout_s=SILENCE_S,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
            # 20 ms per step: a 1000-token request is still streaming when the engine is killed
            engine_args=("--step-ms", "20"),
        ),
    )


async def test_engine_sigkill_fails_inflight_stream_from_process_exit(sock_dir: str) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handle: ServeHandle = await nursery.start(
                serve, with_api_server_count(_config(sock_dir))
            )
            engines = engine_pids(os.getpid())
            assert len(engines) == 1, engines
            (engine_pid,) = engines
            body = {
                "model": "mock-tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1000,
                "ignore_eos": True,
                "stream": True,
            }
            events: list[str] = []
            async with (
                httpx.AsyncClient(base_url=handle.base_url, timeout=30) as client,
                client.stream("POST", "/v1/chat/completions", json=body) as resp,
            ):
                assert resp.status_code == 200, (await resp.aread()).decode()
                killed_at: float | None = None
                async for data in sse_payloads(resp):
                    events.append(data)
                    if killed_at is None and '"content"' in data:
                        os.kill(engine_pid, signal.SIGKILL)
                        killed_at = trio.current_time()
                ended_at = trio.current_time()
            assert killed_at is not None, events[:3]
            errors = [json.loads(e)["error"] for e in events if e.startswith('{"error"')]
            assert errors, f"the stream ended without an error event: {events[-3:]}"
            assert "exited with code -9" in errors[0]["message"], errors[0]
            assert events[-1] == "[DONE]" or events[-1].startswith('{"error"'), events[-2:]
            assert ended_at - killed_at < EXIT_DETECTION_S, ended_at - killed_at
            # the in-flight registry returns to zero
            with trio.fail_after(5):
                await handle.manager.wait_idle()
            # serve lives on and relaunches the engine; its worker re-handshakes and serves
            async with httpx.AsyncClient(base_url=handle.base_url, timeout=10) as client:
                assert (await client.get("/liveness")).status_code == 200
                with trio.fail_after(RESTART_S):
                    # polled over HTTP, as an orchestrator's readiness probe would
                    while (await client.get("/readiness")).status_code != 200:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                restarted = engine_pids(os.getpid())
                assert restarted, "no engine was relaunched"
                assert engine_pid not in restarted
                reply = await client.post(
                    "/v1/chat/completions",
                    json={**body, "stream": False, "max_tokens": 4},
                )
                assert reply.status_code == 200, reply.text
            nursery.cancel_scope.cancel()
        assert await wait_all_gone({engine_pid, *restarted}) == set()


async def test_engine_restarts_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    """An engine that keeps dying is relaunched ENGINE_RESTART_LIMIT times, then serve fails
    (so a process supervisor sees it) instead of staying up with nothing to serve."""
    url = "ipc:///tmp/smg-restart-test/engine-1"
    launch = EngineLaunch(url, [sys.executable, "-c", "raise SystemExit(3)"], 1, {})
    exits: list[EngineExited] = []
    with pytest.raises(EngineExited) as info:
        await _supervise_engine(launch, url, exits.append, {url})
    assert info.value.returncode == 3
    assert len(exits) == ENGINE_RESTART_LIMIT + 1


async def test_engine_exit_before_registration_fails_at_once() -> None:
    url = "ipc:///tmp/smg-restart-test/engine-2"
    launch = EngineLaunch(url, [sys.executable, "-c", "raise SystemExit(4)"], 1, {})
    exits: list[EngineExited] = []
    with trio.fail_after(30), pytest.raises(EngineExited):
        await _supervise_engine(launch, url, exits.append, set())
    assert len(exits) == 1


async def test_stalled_engine_is_stopped_and_relaunched(sock_dir: str) -> None:
    """An engine that is alive but silent (SIGSTOP) trips the silence watchdog; serve then
    stops its process group (SIGTERM + SIGCONT) and relaunches it, and the worker serves
    again, instead of waiting forever for a handshake a stalled engine never sends. With
    frontend processes, the frontend that times the silence tells the supervisor (whose own
    client is idle), and the supervisor stops and relaunches the engine the same way."""
    config = attrs.evolve(_config(sock_dir), engine_silence_timeout_s=STALL_SILENCE_S)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handle: ServeHandle = await nursery.start(serve, with_api_server_count(config))
            (engine_pid,) = engine_pids(os.getpid())
            body = {
                "model": "mock-tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1000,
                "ignore_eos": True,
            }
            async with httpx.AsyncClient(base_url=handle.base_url, timeout=30) as client:
                os.kill(engine_pid, signal.SIGSTOP)  # alive, but it never answers
                reply = await client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 503, reply.text
                assert "no engine output" in reply.json()["error"]["message"]
                with trio.fail_after(RESTART_S):
                    # polled over HTTP, as an orchestrator's readiness probe would
                    while (await client.get("/readiness")).status_code != 200:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                relaunched = engine_pids(os.getpid())
                assert relaunched
                assert engine_pid not in relaunched
                ok = await client.post("/v1/chat/completions", json={**body, "max_tokens": 4})
                assert ok.status_code == 200, ok.text
            nursery.cancel_scope.cancel()
        assert await wait_all_gone({engine_pid, *relaunched}) == set()
