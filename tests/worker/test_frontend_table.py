"""The worker table's round trip (``--api-server-count`` > 1): what the supervisor's manager
publishes (``serve.control.worker_table``) and a frontend's ``FrontendManager`` adopts gives
the frontend the model the supervisor serves, with each worker's own settings (its parsers),
not the gateway-wide defaults."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import msgspec
import trio

from smg_trio.backend import ServedModel
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.mock.engine import MockEngineConfig
from smg_trio.mock.script import load_script
from smg_trio.serve.control import worker_table
from smg_trio.tokenizer import Tokenizer
from smg_trio.worker.attached import FrontendManager
from smg_trio.worker.manager import WorkerManager
from tests.helpers.ipc import IpcNamespace
from tests.worker.test_manager import (
    DEADLINE_S,
    make_spec,
    open_manager,
    serve_worker,
    start_engine,
    temp_confinement,
)

#: What a ``ServedModel`` holds that shapes a request's handling, and must match between the
#: supervisor and a frontend (the tokenizer and protocol objects are per process).
_REQUEST_FIELDS = (
    "model_id",
    "model_path",
    "max_model_len",
    "eos_token_id",
    "extra_eos_token_ids",
    "reasoning_parser",
    "tool_call_parser",
    "pooling",
    "sampling_defaults",
)


def _request_fields(model: ServedModel) -> dict[str, Any]:
    values = attrs.asdict(model, recurse=False)
    return {name: values[name] for name in _REQUEST_FIELDS}


def _published(manager: WorkerManager) -> dict[str, Any]:
    """The table as a frontend reads it (through JSON, as the control socket sends it)."""
    table = worker_table(manager, lambda worker_id: 0)
    return msgspec.json.decode(msgspec.json.encode(table))  # type: ignore[no-any-return]


@asynccontextmanager
async def _frontend(table: dict[str, Any]) -> AsyncIterator[FrontendManager]:
    """Frontend client 1 of 2, attached to every ready worker of ``table``; stopped (its
    sockets closed) on exit, as a frontend process that exits."""
    async with trio.open_nursery() as nursery:
        frontend = FrontendManager(
            nursery,
            client_index=1,
            client_count=2,
            confinement=temp_confinement(),
            ready_timeout_s=5.0,
        )
        frontend.apply(table)
        await frontend.wait_attached()
        yield frontend
        nursery.cancel_scope.cancel()


async def test_a_frontend_serves_the_workers_own_parsers(ns: IpcNamespace, model_dir: Path) -> None:
    """A worker's ``tool_call_parser`` (``POST /workers``) was not in the table: the frontends
    served its model with the gateway-wide ``--tool-call-parser`` instead."""
    spec = make_spec(ns, "w0", model_dir, tool_call_parser="hermes", reasoning_parser="qwen3")
    with trio.fail_after(DEADLINE_S):
        async with open_manager(client_count=2) as (supervisor, nursery):
            await serve_worker(supervisor, nursery, spec)
            async with _frontend(_published(supervisor)) as frontend:
                served = frontend.models["m"]
                assert (served.tool_call_parser, served.reasoning_parser) == ("hermes", "qwen3")
                assert _request_fields(served) == _request_fields(supervisor.models["m"])
                assert frontend.workers[0].spec == supervisor.workers[0].spec


async def test_a_frontend_parses_tool_calls_with_the_workers_parser(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    """Through a frontend's HTTP app: the worker's ``hermes`` parses the engine's tool call,
    where the gateway-wide ``--tool-call-parser`` (``mistral``) would leave it as content."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps({"rules": [{"name": "call", "regex": ".", "text": text}]}))
    script = load_script(script_path, Tokenizer.from_dir(model_dir))
    spec = make_spec(ns, "w0", model_dir, tool_call_parser="hermes")
    config = GatewayHttpConfig(tool_call_parser="mistral", enable_auto_tool_choice=True)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
        "max_tokens": 64,
    }
    with trio.fail_after(DEADLINE_S):
        async with open_manager(client_count=2) as (supervisor, nursery):
            await start_engine(nursery, spec, MockEngineConfig(step_s=0.001, script=script))
            await supervisor.register(spec)
            async with _frontend(_published(supervisor)) as frontend:
                app = create_app(frontend, config)
                binds = await nursery.start(partial(serve_http, app, "127.0.0.1", 0))
                async with httpx.AsyncClient(base_url=binds[0], timeout=30.0) as http:
                    resp = await http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


async def test_a_worker_that_joins_a_served_model_attaches_on_a_frontend(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """A worker added with ``model_id`` alone (it joins a served model, with its tokenizer)
    has no ``model_path`` in the table: a frontend that came to it before the model was
    loaded there (both adopted together, or the model's first worker since removed) tried
    to load ``None`` and never attached it."""
    first = make_spec(ns, "w0", model_dir, tool_call_parser="hermes", reasoning_parser="qwen3")
    with trio.fail_after(DEADLINE_S):
        async with open_manager(client_count=2) as (supervisor, nursery):
            await serve_worker(supervisor, nursery, first)
            joining = make_spec(ns, "w1", model_dir)
            joining = attrs.evolve(joining, model_path=None)
            await serve_worker(supervisor, nursery, joining)
            async with _frontend(_published(supervisor)) as both:
                for worker in both.workers:
                    assert worker.engine_client is not None, worker.last_error
                assert _request_fields(both.models["m"]) == _request_fields(supervisor.models["m"])
            assert await supervisor.remove_worker(supervisor.workers[0].worker_id)
            # a frontend (re)started now finds only the joining worker in the table
            async with _frontend(_published(supervisor)) as alone:
                [worker] = alone.workers
                assert worker.engine_client is not None, worker.last_error
                assert _request_fields(alone.models["m"]) == _request_fields(supervisor.models["m"])
