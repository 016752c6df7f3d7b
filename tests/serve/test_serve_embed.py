"""Embedding: ``await nursery.start(serve, config)`` and ``async with open_gateway(config)``
with the mock engine launched by serve; cancellation leaves no process and no socket file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from tests.helpers.ports import random_worker_base_port
from tests.helpers.procs import descendants, wait_all_gone

pytest.importorskip("smg_trio.gateway.http.app", reason="the HTTP app has not landed yet")
httpx = pytest.importorskip("httpx")

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, ServeHandle, open_gateway, serve  # noqa: E402
from tests.helpers.frontends import with_api_server_count  # noqa: E402

pytestmark = pytest.mark.slow


def _config(sock_dir: str) -> GatewayConfig:
    model = str(default_tiny_model_dir())
    return GatewayConfig(
        port=0,
        served_model_name="mock-tiny",
        engines=EngineLaunchConfig(
            backend="mock",
            model=model,
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
        ),
    )


async def _chat(handle: ServeHandle) -> str:
    async with httpx.AsyncClient(base_url=handle.base_url, timeout=20) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={
                "model": "mock-tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
        )
    assert resp.status_code == 200, resp.text
    content = resp.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


def _sockets(directory: str) -> list[str]:
    return [p.name for p in Path(directory).iterdir() if p.is_socket()]


async def test_nursery_start_serve(sock_dir: str) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handle: ServeHandle = await nursery.start(
                serve, with_api_server_count(_config(sock_dir))
            )
            assert handle.port > 0
            assert handle.base_url == f"http://127.0.0.1:{handle.port}"
            assert len(handle.workers) == 1
            assert handle.workers[0].url.startswith(f"ipc://{sock_dir}/engine-")
            engines = descendants(os.getpid())
            assert engines, "serve launched no engine process"
            assert _sockets(sock_dir), "no ipc sockets were bound"
            await _chat(handle)
            nursery.cancel_scope.cancel()
        assert await wait_all_gone(engines) == set()
        assert _sockets(sock_dir) == []


async def test_open_gateway(sock_dir: str) -> None:
    with trio.fail_after(60):
        async with open_gateway(with_api_server_count(_config(sock_dir))) as handle:
            engines = descendants(os.getpid())
            assert engines
            await _chat(handle)
            assert [m.model_id for m in handle.manager.list_models()] == ["mock-tiny"]
        assert await wait_all_gone(engines) == set()
        assert _sockets(sock_dir) == []
