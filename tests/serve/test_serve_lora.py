"""LoRA adapters under ``serve --backend mock --api-server-count 2``: a ``--lora-modules``
adapter is listed and served by every frontend; one loaded at run time through one frontend
(forwarded to the supervisor) is listed and served by the other as soon as the worker table
it mirrors changes, and unloading it through the other makes it the unknown-model 404 in both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from smg_trio.mock.tiny_lora import build_tiny_lora
from tests.helpers.frontends import single_frontend
from tests.serve.test_serve_multi_frontend import Served, serve_two

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]


async def _chat(served: Served, index: int, model: str) -> httpx.Response:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    async with served.frontend(index) as c:
        return await c.post("/v1/chat/completions", json=body)


async def _models(served: Served, index: int) -> dict[str, Any]:
    async with served.frontend(index) as c:
        return {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}


async def _wait_status(served: Served, index: int, model: str, status: int) -> httpx.Response:
    while True:
        resp = await _chat(served, index, model)
        if resp.status_code == status:
            return resp
        await trio.sleep(0.02)  # polling another process


async def test_static_and_dynamic_adapters_in_every_frontend(sock_dir: str, tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    static = build_tiny_lora(root / "static", base_model="mock-tiny", seed=1)
    dynamic = build_tiny_lora(root / "dyn", base_model="mock-tiny", seed=2)
    extra = ("--lora-modules", f"static={static}", "--max-loras", "2")
    async with serve_two(sock_dir, tmp_path, *extra, "--allowed-model-dirs", str(root)) as served:
        for index in (1, 2):
            cards = await _models(served, index)
            assert cards["static"]["parent"] == "mock-tiny"
            resp = await _chat(served, index, "static")
            assert resp.status_code == 200, resp.text
            assert resp.json()["model"] == "static"
        async with served.frontend(1) as c:
            body = {"lora_name": "dyn", "lora_path": str(dynamic)}
            resp = await c.post("/v1/load_lora_adapter", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.text == "Success: LoRA adapter 'dyn' added successfully."
            resp = await c.post("/v1/load_lora_adapter", json=body)
            assert resp.status_code == 400, resp.text
        with trio.fail_after(10):
            for index in (1, 2):
                await _wait_status(served, index, "dyn", 200)
        assert (await _models(served, 2))["dyn"]["parent"] == "mock-tiny"
        async with served.frontend(2) as c:
            resp = await c.post("/v1/unload_lora_adapter", json={"lora_name": "dyn"})
            assert resp.status_code == 200, resp.text
        with trio.fail_after(10):
            for index in (1, 2):
                resp = await _wait_status(served, index, "dyn", 404)
                assert resp.json()["error"]["code"] == "model_not_found"
        assert "dyn" not in await _models(served, 1)
