"""A worker's own ``tool_call_parser`` (``POST /workers``) with ``--api-server-count 2``: every
frontend parses its model's tool calls with it, not with the gateway-wide
``--tool-call-parser`` (the worker table did not carry it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.script import load_script
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, open_gateway
from smg_trio.tokenizer import Tokenizer
from tests.helpers.frontends import find_run_dir, frontend_client, single_frontend
from tests.helpers.ipc import free_handshake_address
from tests.helpers.ports import random_worker_base_port

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


async def _wait_model(http: httpx.AsyncClient, model: str) -> None:
    """Return once ``model`` is served there (its worker is loaded, as it attaches)."""
    while True:
        if model in [m["id"] for m in (await http.get("/v1/models")).json()["data"]]:
            return
        await trio.sleep(0.05)  # polling another process


async def test_every_frontend_parses_with_the_workers_tool_call_parser(
    sock_dir: str, tmp_path: Path
) -> None:
    model_dir = default_tiny_model_dir()
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps({"rules": [{"name": "call", "regex": ".", "text": CALL}]}))
    script = load_script(script_path, Tokenizer.from_dir(model_dir))
    handshake = free_handshake_address()
    config = GatewayConfig(
        port=0,
        served_model_name="mock-tiny",
        tool_call_parser="mistral",  # the gateway-wide default, which cannot parse CALL
        enable_auto_tool_choice=True,
        allow_insecure_admin=True,
        api_server_count=2,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(model_dir),
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
        ),
    )
    worker = {
        "url": f"ipc://{sock_dir}/engine-tools",
        "model_id": "tools",
        "model_path": str(model_dir),
        "zmq_handshake_address": handshake,
        "tool_call_parser": "hermes",
    }
    body: dict[str, Any] = {
        "model": "tools",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "max_tokens": 64,
    }
    with trio.fail_after(90):
        async with (
            open_gateway(config) as handle,
            trio.open_nursery() as nursery,
            httpx.AsyncClient(base_url=handle.base_url, timeout=30) as http,
        ):
            nursery.start_soon(MockEngine(handshake, MockEngineConfig(script=script)).run)
            resp = await http.post("/workers", json=worker)
            assert resp.status_code == 202, resp.text
            run_dir = find_run_dir(sock_dir)
            for index in (1, 2):
                async with frontend_client(run_dir, index) as client:
                    await _wait_model(client, "tools")
                    resp = await client.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                choice = resp.json()["choices"][0]
                assert choice["finish_reason"] == "tool_calls", (index, choice)
                [call] = choice["message"]["tool_calls"]
                assert call["function"]["name"] == "get_weather"
                assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
            nursery.cancel_scope.cancel()
