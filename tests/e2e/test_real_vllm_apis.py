"""Smoke cases of the Messages, Responses and tokenize APIs in front of a REAL vLLM 0.32.0
engine: one engine (module fixture) behind ``python -m smg_trio launch --tool-call-parser
hermes --enable-auto-tool-choice``, driven by the official ``anthropic`` and ``openai`` SDKs.
The tiny random model writes no tool calls of its own; a named tool (Messages ``tool``,
Responses' named function) goes through the engine's structured-output constraint, so the
call's arguments are JSON the engine itself produced."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from peers.tools import vllm_engine_command, vllm_missing_reason
from tests.helpers.e2e import (
    assert_alive,
    handshake_port,
    ipc_worker,
    require_e2e,
    smg_trio_with_vllm,
)
from tests.helpers.ports import free_port

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny"
ASK = "Tell me a story about a dragon."
GREEDY = {"temperature": 0}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def base_url(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real engine behind the gateway for every case of this module."""
    require_e2e(vllm_missing_reason())
    logs = tmp_path_factory.mktemp("apis-gateway")
    port = free_port()
    with ipc_worker() as addresses:
        engine_cmd = vllm_engine_command(tiny_model, handshake_port(addresses))
        gateway_cmd = [
            sys.executable, "-m", "smg_trio", "launch",
            "--worker-urls", addresses.url, "--backend", "vllm",
            "--model-path", str(tiny_model), "--served-model-name", MODEL,
            "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
        with smg_trio_with_vllm(gateway_cmd, engine_cmd, port=port, logs=logs) as (base, gw, _eng):
            yield base
            assert_alive(gw, logs / "smg_trio.log", "smg_trio gateway")


def test_messages_create_stream_and_count_tokens(base_url: str) -> None:
    client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120)
    try:
        kw: Any = {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": ASK}],
            "extra_body": GREEDY,  # the anthropic SDK 2.x has no temperature argument
        }
        msg = client.messages.create(**kw)
        assert msg.type == "message"
        assert msg.stop_reason in ("end_turn", "max_tokens")
        assert 1 <= msg.usage.output_tokens <= 8
        text = "".join(b.text for b in msg.content if b.type == "text")
        with client.messages.stream(**kw) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        assert "".join(pieces) == text  # greedy on one engine: the same text
        assert final.stop_reason == msg.stop_reason
        assert final.usage.output_tokens == msg.usage.output_tokens
        counted = client.messages.count_tokens(model=MODEL, messages=kw["messages"])
        assert counted.input_tokens == msg.usage.input_tokens
    finally:
        client.close()


def test_responses_create_and_stream(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        kw: Any = {"model": MODEL, "input": ASK, "max_output_tokens": 8, "temperature": 0}
        res = client.responses.create(**kw)
        assert res.status in ("completed", "incomplete")
        assert res.usage is not None
        assert 1 <= res.usage.output_tokens <= 8
        with client.responses.stream(**kw) as stream:
            events = list(stream)
        # the SDK's get_final_response() wants response.completed; a reply cut by
        # max_output_tokens ends with response.incomplete, which carries the response too
        seqs = [event.sequence_number for event in events]
        assert seqs == list(range(len(seqs)))
        assert events[-1].type == f"response.{res.status}"
        final = events[-1].response  # type: ignore[union-attr]
        assert final.output_text == res.output_text
        assert final.status == res.status
        got = client.responses.retrieve(res.id)
        assert got.output_text == res.output_text
    finally:
        client.close()


def test_named_tools_are_constrained_by_the_engine(base_url: str) -> None:
    """Messages ``tool_choice: tool`` and Responses' named function: the engine writes JSON
    that the call's schema allows, returned as a ``tool_use`` / ``function_call``."""
    a_client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120)
    o_client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        msg = a_client.messages.create(
            model=MODEL,
            max_tokens=48,
            extra_body=GREEDY,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[{"name": "get_weather", "input_schema": SCHEMA}],
            tool_choice={"type": "tool", "name": "get_weather"},
        )
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert [u.name for u in uses] == ["get_weather"], msg.content
        if msg.stop_reason == "tool_use":  # the JSON object was finished within max_tokens
            assert set(uses[0].input) == {"city"}  # type: ignore[arg-type]
        res = o_client.responses.create(
            model=MODEL,
            max_output_tokens=48,
            temperature=0,
            input="Weather in Paris?",
            tools=[{"type": "function", "name": "get_weather", "parameters": SCHEMA}],
            tool_choice={"type": "function", "name": "get_weather"},
        )
        calls = [i for i in res.output if i.type == "function_call"]
        assert [c.name for c in calls] == ["get_weather"], res.output
        if res.status == "completed":
            assert set(json.loads(calls[0].arguments)) == {"city"}
    finally:
        a_client.close()
        o_client.close()


def test_tokenize_detokenize(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=60) as http:
        tok = http.post("/tokenize", json={"model": MODEL, "prompt": ASK}).json()
        assert tok["count"] == len(tok["tokens"]) > 0
        back = http.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]}).json()
        assert ASK in back["prompt"]
        chat = http.post(
            "/v1/tokenize",
            json={"model": MODEL, "messages": [{"role": "user", "content": ASK}]},
        ).json()
        count = http.post(
            "/v1/messages/count_tokens",
            json={"model": MODEL, "messages": [{"role": "user", "content": ASK}]},
        ).json()
        assert count["input_tokens"] == chat["count"]
        bad = http.post("/detokenize", json={"model": MODEL, "tokens": [10**9]})
        assert bad.status_code == 400
        assert "tokens[0]" in json.dumps(bad.json()["error"])
