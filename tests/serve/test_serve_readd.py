"""A launched worker removed over ``/workers`` and added again at its URL (the rolling update
of a worker that ``serve`` launched): an engine handshakes once per process, so serve
relaunches it for the new registration, which becomes ready and serves. A spec the running
engine cannot serve is refused."""

from __future__ import annotations

import os

import httpx
import pytest
import trio

from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, ServeHandle, serve
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ipc import free_handshake_address
from tests.helpers.ports import random_worker_base_port
from tests.helpers.procs import engine_pids, wait_all_gone

pytestmark = pytest.mark.slow

KEY = "admin-key"
CHAT = {"model": "mock-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _config(sock_dir: str) -> GatewayConfig:
    return GatewayConfig(
        port=0,
        served_model_name="mock-tiny",
        admin_api_key=KEY,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
        ),
    )


async def test_a_launched_worker_removed_and_added_again_is_relaunched_and_serves(
    sock_dir: str,
) -> None:
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            handle: ServeHandle = await nursery.start(
                serve, with_api_server_count(_config(sock_dir))
            )
            (first,) = handle.workers
            (old_engine,) = engine_pids(os.getpid())
            spec = {
                "url": first.spec.url,
                "model_path": first.spec.model_path,
                "model_id": "mock-tiny",
                "runtime_type": first.spec.runtime_type,
            }
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(
                base_url=handle.base_url, headers=headers, timeout=30
            ) as http:
                resp = await http.delete(f"/workers/{first.worker_id}")
                assert resp.status_code in (200, 202), resp.text
                while handle.manager.get_worker(first.worker_id) is not None:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                # what the running engine was not started with is refused: its registration
                # would wait for engines or a handshake that never come
                for field, value in [
                    ("dp_size", 2),
                    ("runtime_type", "tokenspeed"),
                    ("zmq_handshake_address", free_handshake_address()),
                ]:
                    resp = await http.post("/workers", json={**spec, field: value})
                    assert resp.status_code == 400, resp.text
                    error = resp.json()["error"]
                    assert error["param"] == field
                    assert "is an engine that serve launched with" in error["message"]
                resp = await http.post("/workers", json=spec)
                assert resp.status_code == 202, resp.text
                job = handle.manager.jobs[resp.json()["job_id"]]
                await job.done.wait()
                assert job.status == "succeeded", job.error
                reply = await http.post("/v1/chat/completions", json=CHAT)
                assert reply.status_code == 200, reply.text
            engines = engine_pids(os.getpid())
            assert engines, "no engine runs"
            assert old_engine not in engines  # relaunched for the new registration
            nursery.cancel_scope.cancel()
        assert await wait_all_gone({old_engine, *engines}) == set()
