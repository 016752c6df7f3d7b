"""POST /v1/messages (Anthropic Messages) through the official anthropic SDK and raw HTTP: the
message shape, the event stream, stop reasons, tool_use/tool_result turns, count_tokens,
Anthropic's error envelope and x-api-key."""

from __future__ import annotations

import gc
import json
from typing import Any

import anthropic
import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

HI = [{"role": "user", "content": "hi"}]
#: vLLM's rule: tools under tool_choice auto need a parser and --enable-auto-tool-choice.
HERMES = GatewayHttpConfig(tool_call_parser="hermes", enable_auto_tool_choice=True)


def _client(base_url: str, key: str = "x") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_anthropic_sdk_create_stream_and_count_tokens(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world", "!")) as h:
            client = _client(h.base_url)
            try:
                msg = await client.messages.create(model="M", max_tokens=8, messages=HI)
                assert msg.type == "message"
                assert msg.role == "assistant"
                assert msg.id.startswith("msg_")
                assert [b.type for b in msg.content] == ["text"]
                assert msg.content[0].text == "Hello world!"  # type: ignore[union-attr]
                assert msg.stop_reason == "end_turn"
                assert msg.usage.output_tokens == 4
                rendered = tok.apply_chat_template(HI, add_generation_prompt=True)
                assert msg.usage.input_tokens == len(tok.encode(rendered))

                async with client.messages.stream(model="M", max_tokens=8, messages=HI) as s:
                    texts = [t async for t in s.text_stream]
                    final = await s.get_final_message()
                assert "".join(texts) == "Hello world!"
                assert final.content[0].text == "Hello world!"  # type: ignore[union-attr]
                assert final.stop_reason == "end_turn"
                assert final.usage.output_tokens == 4

                counted = await client.messages.count_tokens(model="M", messages=HI)
                assert counted.input_tokens == msg.usage.input_tokens
            finally:
                await client.close()
                gc.collect()


async def test_stream_event_sequence_with_ping(harness: HarnessFactory, tok: Tokenizer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world")) as h:
            resp = await h.http.post(
                "/v1/messages",
                json={"model": "M", "max_tokens": 8, "messages": HI, "stream": True},
            )
            assert resp.status_code == 200
            events = [
                line.removeprefix("event: ")
                for line in resp.text.splitlines()
                if line.startswith("event: ")
            ]
            assert events[:3] == ["message_start", "ping", "content_block_start"]
            assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
            assert set(events[3:-3]) == {"content_block_delta"}
            assert "[DONE]" not in resp.text


@pytest.mark.parametrize(
    ("body", "reason", "sequence", "text"),
    [
        ({"max_tokens": 2}, "max_tokens", None, None),
        ({"max_tokens": 8, "stop_sequences": [" wor"]}, "stop_sequence", " wor", "Hello"),
    ],
)
async def test_stop_reasons(
    harness: HarnessFactory,
    tok: Tokenizer,
    body: dict[str, Any],
    reason: str,
    sequence: str | None,
    text: str | None,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world", "!", "?")) as h:
            resp = await h.post("/v1/messages", {"model": "M", "messages": HI, **body})
            assert resp.status_code == 200, resp.text
            out = resp.json()
            assert out["stop_reason"] == reason
            assert out["stop_sequence"] == sequence
            ids = [t for step in steps_of(tok, "Hello", " world", "!", "?") for t in step]
            assert out["content"][0]["text"] == (text or tok.decode(ids[:2]))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_tool_use_and_tool_result_turns_reach_the_template(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    tools = [
        {
            "name": "get_weather",
            "description": "The weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    messages: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "SUNNY-21C"}],
        },
    ]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "It is sunny."), config=HERMES) as h:
            client = _client(h.base_url)
            try:
                msg = await client.messages.create(
                    model="M", max_tokens=8, messages=messages, tools=tools
                )
            finally:
                await client.close()
                gc.collect()
            assert msg.content[0].text == "It is sunny."  # type: ignore[union-attr]
            prompt = tok.decode(h.engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
            assert "SUNNY-21C" in prompt
            assert "Paris" in prompt
            assert "get_weather" in prompt


async def test_errors_use_anthropics_envelope(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            missing = await h.post("/v1/messages", {"model": "M", "messages": HI})
            assert missing.status_code == 400
            body = missing.json()
            assert body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"
            assert "max_tokens" in body["error"]["message"]
            image = await h.post(
                "/v1/messages",
                {
                    "model": "M",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": [{"type": "image"}]}],
                },
            )
            assert image.status_code == 400
            assert "messages[0].content[0]" in image.json()["error"]["message"]
            unknown = await h.post(
                "/v1/messages", {"model": "nope", "max_tokens": 4, "messages": HI}
            )
            assert unknown.status_code == 404
            assert unknown.json()["error"]["type"] == "not_found_error"


async def test_x_api_key_and_bearer_both_authenticate(harness: HarnessFactory) -> None:
    body = {"model": "M", "max_tokens": 2, "messages": HI}
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key="k")) as h:
            denied = await h.post("/v1/messages", body, headers={"x-api-key": "wrong"})
            assert denied.status_code == 401
            assert denied.json()["error"]["type"] == "authentication_error"
            for headers in ({"x-api-key": "k"}, {"authorization": "Bearer k"}):
                ok = await h.post(
                    "/v1/messages", body, headers={**headers, "anthropic-version": "2023-06-01"}
                )
                assert ok.status_code == 200, ok.text
            count = await h.post(
                "/v1/messages/count_tokens",
                {"model": "M", "messages": HI},
                headers={"x-api-key": "k"},
            )
            assert count.status_code == 200
            # x-api-key is Anthropic's: the OpenAI routes still want the bearer token
            chat = await h.post(
                "/v1/chat/completions", {"model": "M", "messages": HI}, headers={"x-api-key": "k"}
            )
            assert chat.status_code == 401


WEATHER_TOOL = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SEARCH_TOOL = {
    "name": "search",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


async def test_tools_without_the_parser_flags_are_a_clear_400_in_anthropics_envelope(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    body = {"model": "M", "max_tokens": 8, "messages": HI, "tools": [WEATHER_TOOL]}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok")) as h:  # no parser flags
            for extra in ({}, {"tool_choice": {"type": "auto"}}, {"stream": True}):
                resp = await h.post("/v1/messages", {**body, **extra})
                assert resp.status_code == 400, resp.text
                out = resp.json()
                assert out["type"] == "error"
                assert out["error"]["type"] == "invalid_request_error"
                message = out["error"]["message"]
                assert "--enable-auto-tool-choice" in message
                assert "--tool-call-parser" in message
                assert '{"type": "any"}' in message  # what works without them
            assert h.engine.requests == []
            # tool_choice none needs no parser: the tools are rendered, the reply is text
            resp = await h.post("/v1/messages", {**body, "tool_choice": {"type": "none"}})
            assert resp.status_code == 200, resp.text
            assert resp.json()["content"] == [{"type": "text", "text": "ok"}]


def _structured(raw: Any) -> Any:
    sp = raw.sampling_params if hasattr(raw, "sampling_params") else raw["sampling_params"]
    so = getattr(sp, "structured_outputs", None)
    return so if so is not None else sp.get("structured_outputs")


@pytest.mark.parametrize("stream", [False, True])
async def test_any_and_tool_constrain_the_engine_and_answer_tool_use(
    harness: HarnessFactory, tok: Tokenizer, stream: bool
) -> None:
    """``any`` is chat's ``required`` (``disable_parallel_tool_use``: at most one call), ``tool``
    a named function: a JSON schema reaches the engine and the constrained output comes back
    as ``tool_use`` blocks, with no parser flags."""
    replies = {
        "any": '[{"name": "search", "parameters": {"query": "ß"}}]',
        "tool": '{"city": "Lyon"}',
    }
    base = {"model": "M", "max_tokens": 40, "messages": HI, "tools": [WEATHER_TOOL, SEARCH_TOOL]}

    def plan(r: Any) -> list[list[int]]:
        schema = _structured(r.raw)["json"]
        return steps_of(tok, replies["any" if schema.get("type") == "array" else "tool"])

    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            choices = [
                ({"type": "any", "disable_parallel_tool_use": True}, ("search", {"query": "ß"})),
                ({"type": "tool", "name": "get_weather"}, ("get_weather", {"city": "Lyon"})),
            ]
            for choice, (name, args) in choices:
                body = {**base, "tool_choice": choice}
                if stream:
                    _, events = await h.stream("/v1/messages", body)
                    blocks = [
                        e["content_block"] for e in events if e["type"] == "content_block_start"
                    ]
                    partial = "".join(
                        e["delta"]["partial_json"]
                        for e in events
                        if e["type"] == "content_block_delta"
                    )
                    reason = next(e for e in events if e["type"] == "message_delta")["delta"][
                        "stop_reason"
                    ]
                    got = [(b["type"], b["name"], json.loads(partial)) for b in blocks]
                else:
                    resp = await h.post("/v1/messages", body)
                    assert resp.status_code == 200, resp.text
                    out = resp.json()
                    reason = out["stop_reason"]
                    got = [(b["type"], b["name"], b["input"]) for b in out["content"]]
                    assert out["content"][0]["id"].startswith("toolu_")
                assert got == [("tool_use", name, args)]
                assert reason == "tool_use"
            any_schema = _structured(h.engine.requests[0].raw)["json"]
            assert any_schema["type"] == "array"
            assert any_schema["maxItems"] == 1
            named_schema = _structured(h.engine.requests[1].raw)["json"]
            assert named_schema == WEATHER_TOOL["input_schema"]


async def test_unknown_subpaths_and_wrong_methods_use_anthropics_envelope(
    harness: HarnessFactory,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            batches = await h.post("/v1/messages/batches", {"requests": []})
            assert batches.status_code == 404
            body = batches.json()
            assert body["type"] == "error"
            assert body["error"]["type"] == "not_found_error"
            assert "/v1/messages/batches" in body["error"]["message"]
            wrong = await h.http.get("/v1/messages")
            assert wrong.status_code == 405
            body = wrong.json()
            assert body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"
            assert "POST" in wrong.headers["allow"]
            # the OpenAI routes keep OpenAI's envelope
            other = await h.http.get("/v1/chat/completions")
            assert other.status_code == 405
            assert other.json()["error"]["type"] == "invalid_request_error"
            assert "type" not in other.json()


@pytest.mark.parametrize("role", ["user", "assistant"])
async def test_a_text_block_without_string_text_names_the_text_field(
    harness: HarnessFactory, role: str
) -> None:
    messages: list[Any] = [{"role": role, "content": [{"type": "text", "text": 5}]}]
    if role == "assistant":
        messages = [*HI, *messages]
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post(
                "/v1/messages", {"model": "M", "max_tokens": 4, "messages": messages}
            )
            assert resp.status_code == 400, resp.text
            message = resp.json()["error"]["message"]
            where = len(messages) - 1
            assert message.startswith(f"messages[{where}].content[0].text:"), message
            assert h.engine.requests == []


_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (  # no tool_use at all
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}],
            "messages[0].content[0].tool_use_id",
        ),
        (  # the previous turn used another id
            [
                *HI,
                {"role": "assistant", "content": [_USE]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]},
            ],
            "messages[2].content[0].tool_use_id",
        ),
        (
            [*HI, {"role": "assistant", "content": [{**_USE, "input": "Paris"}]}],
            "messages[1].content[0].input",
        ),
        (  # input is required (Anthropic's API refuses a tool_use without it)
            [
                *HI,
                {"role": "assistant", "content": [{k: v for k, v in _USE.items() if k != "input"}]},
            ],
            "messages[1].content[0].input",
        ),
    ],
)
async def test_unmatched_tool_result_and_non_object_tool_input_are_400s(
    harness: HarnessFactory, messages: list[Any], param: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=HERMES) as h:
            for path, extra in (
                ("/v1/messages", {"max_tokens": 4}),
                ("/v1/messages/count_tokens", {}),
            ):
                body = {"model": "M", "messages": messages, "tools": [WEATHER_TOOL], **extra}
                resp = await h.post(path, body)
                assert resp.status_code == 400, resp.text
                err = resp.json()
                assert err["error"]["type"] == "invalid_request_error"
                assert err["error"]["message"].startswith(f"{param}:"), err
            assert h.engine.requests == []


async def test_max_tokens_above_the_context_left_is_clamped(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    """vLLM 0.32 (``get_max_tokens``): the context left clamps ``max_tokens``, as Claude Code
    asks every model for 32000; above the whole context it is a 400 in vLLM's words."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hi"), max_model_len=256) as h:
            body = {"model": "M", "max_tokens": 250, "messages": HI}
            res = await h.http.post("/v1/messages", json=body)
            assert res.status_code == 200, res.text
            prompt = len(h.engine.requests[-1].prompt_token_ids)
            assert h.engine.requests[-1].max_tokens == 256 - prompt
            over = await h.http.post("/v1/messages", json={**body, "max_tokens": 32000})
            assert over.status_code == 400
            err = over.json()["error"]
            assert "cannot be greater than max_model_len=256" in err["message"]


async def test_thinking_blocks_carry_a_signature(harness: HarnessFactory, tok: Tokenizer) -> None:
    """vLLM 0.32: a thinking block has a ``signature`` (a uuid4 hex); streamed, a
    ``signature_delta`` comes right before its ``content_block_stop``."""
    plan = lambda r: steps_of(tok, "<think>", "hmm", "</think>", "Hi")  # noqa: E731
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan, reasoning_parser="qwen3") as h:
            body = {"model": "M", "max_tokens": 20, "messages": HI}
            whole = (await h.http.post("/v1/messages", json=body)).json()
            thinking = whole["content"][0]
            assert (thinking["type"], thinking["thinking"]) == ("thinking", "hmm")
            assert len(thinking["signature"]) == 32
            resp = await h.http.post("/v1/messages", json={**body, "stream": True})
            events = [
                json.loads(line.removeprefix("data: "))
                for line in resp.text.splitlines()
                if line.startswith("data: ")
            ]
            stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop")
            assert events[stop]["index"] == 0
            signed = events[stop - 1]
            assert signed["type"] == "content_block_delta"
            assert signed["delta"]["type"] == "signature_delta"
            assert len(signed["delta"]["signature"]) == 32
