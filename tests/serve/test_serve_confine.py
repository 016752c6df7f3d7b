"""End to end (issue 18, finding 1): a ``serve`` gateway with the mock backend. Without keys
nobody may join the served model; with ``allow_insecure_admin`` a second process still cannot
join it through an abstract socket or a socket dir of its own, nor read a file through a model
dir's symlinked chat template. Every client request keeps going to the real engine."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.helpers.ipc import free_handshake_address
from tests.helpers.ports import random_worker_base_port

httpx = pytest.importorskip("httpx")

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, open_gateway  # noqa: E402
from tests.helpers.frontends import with_api_server_count  # noqa: E402

pytestmark = pytest.mark.slow
MODEL = "mock-tiny"


def _config(sock_dir: str, **kw: Any) -> GatewayConfig:
    return GatewayConfig(
        port=0,
        served_model_name=MODEL,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
        ),
        **kw,
    )


def _join(url: str, handshake: str, model_path: Path | None = None) -> dict[str, Any]:
    """A worker spec that joins the served model, as the attacker sent it."""
    return {
        "url": url,
        "model_id": MODEL,
        "model_path": str(model_path or default_tiny_model_dir()),
        "runtime_type": "vllm",
        "zmq_handshake_address": handshake,
    }


async def _chats(http: Any, count: int) -> None:
    for i in range(count):
        resp = await http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": f"p{i}"}],
                "max_tokens": 4,
            },
        )
        assert resp.status_code == 200, resp.text


async def test_without_keys_nobody_joins_the_served_model(sock_dir: str) -> None:
    with trio.fail_after(60):
        async with (
            open_gateway(with_api_server_count(_config(sock_dir))) as handle,
            httpx.AsyncClient(base_url=handle.base_url, timeout=20) as http,
        ):
            resp = await http.post("/workers", json=_join("ipc://@x", free_handshake_address()))
            assert resp.status_code == 403, resp.text
            assert "--allow-insecure-admin" in resp.json()["error"]["message"]
            (worker,) = handle.workers
            resp = await http.delete(f"/workers/{worker.worker_id}")
            assert resp.status_code == 403, resp.text
            assert (await http.get("/workers")).json()["total"] == 1
            await _chats(http, 2)


async def test_insecure_admin_still_keeps_a_second_process_out(
    sock_dir: str, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    evil = root / "evil"
    shutil.copytree(default_tiny_model_dir(), evil)
    secret = tmp_path / "root-only.jinja"
    secret.write_text("{{ 'TOP-SECRET-d00d' }}")
    secret.chmod(0o600)
    (evil / "chat_template.jinja").symlink_to(secret)
    other_dir = tempfile.mkdtemp(prefix="smg-other-")  # the second process's own socket dir
    handshake = free_handshake_address()
    port = int(handshake.rpartition(":")[2])
    config = _config(sock_dir, allow_insecure_admin=True, allowed_model_dirs=(str(root),))
    attacker = await trio.lowlevel.open_process(
        [sys.executable, "-m", "smg_trio", "mock-engine", "--handshake", handshake],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(60):
            async with open_gateway(with_api_server_count(config)) as handle:
                async with httpx.AsyncClient(base_url=handle.base_url, timeout=20) as http:
                    for url in ("ipc://@x", f"ipc://{other_dir}/engine", "ipc://engine"):
                        resp = await http.post("/workers", json=_join(url, handshake))
                        assert resp.status_code == 400, (url, resp.text)
                        assert resp.json()["error"]["param"] == "url"
                    resp = await http.post(
                        "/workers", json=_join(f"ipc://{sock_dir}/evil", handshake, evil)
                    )
                    assert resp.status_code == 400, resp.text
                    assert resp.json()["error"]["param"] == "model_path"
                    assert "chat_template.jinja" in resp.text
                    assert "TOP-SECRET" not in resp.text
                    assert (await http.get("/workers")).json()["total"] == 1
                    await _chats(http, 4)
                # Nobody ever bound the second process's handshake port, so it was never
                # given a socket to receive prompts on (it is still dialing).
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
                assert attacker.returncode is None
                assert os.listdir(other_dir) == []
    finally:
        attacker.kill()
        await attacker.wait()
        shutil.rmtree(other_dir, ignore_errors=True)
