"""Model-emitted tool calls through the Messages and Responses APIs, over the real gateway and
real ZMQ with the scriptable mock (``--tool-call-parser ... --enable-auto-tool-choice``):

- every case of tests/tools/cases/ (plain-text markers) at 1, 2 and 7 tokens per step, whole
  and streamed: Messages ``tool_use`` blocks (streamed: ``content_block_start`` tool_use and
  ``input_json_delta``) and ``stop_reason``, Responses ``function_call`` items (streamed:
  ``response.function_call_arguments.delta``/``.done``) and ``status``; the stream rebuilt
  from its deltas equals the whole answer, and both equal the case;
- the official SDKs: ``anthropic`` ``messages.create``/``messages.stream`` with a
  ``tool_use`` -> ``tool_result`` round trip, ``openai`` ``responses.create``/
  ``responses.stream`` with a function tool round trip, and reasoning with a call in each."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import trio

from smg_trio.gateway.openai.calls import call_input
from tests.helpers.sse import sse_events
from tests.tools.test_tool_calls_e2e import GROUPS, MODEL, STEPS, _script, _tag, tool_gateway
from tests.tools.toolcase import ToolCase

#: The groups whose markers are plain text (the tiny model serves them).
TEXT_GROUPS = [g for g in GROUPS if g[2] and not any(c.special_tokens for c in GROUPS[g])]

_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def _anthropic_tools(case: ToolCase) -> list[dict[str, Any]]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters") or {"type": "object"},
        }
        for t in case.tools
    ]


def _anthropic_choice(case: ToolCase) -> dict[str, Any]:
    choice = case.tool_choice
    if isinstance(choice, dict):
        out: dict[str, Any] = {"type": "tool", "name": choice["function"]["name"]}
    else:
        out = {"type": {"required": "any"}.get(choice, choice)}
    if not case.parallel_tool_calls:
        out["disable_parallel_tool_use"] = True
    return out


def _responses_tools(case: ToolCase) -> list[dict[str, Any]]:
    return [{"type": "function", **t["function"]} for t in case.tools]


def _responses_choice(case: ToolCase) -> Any:
    choice = case.tool_choice
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice


# -- Messages ---------------------------------------------------------------------------------

Blocks = list[tuple[str, Any]]


def _message_blocks(content: list[dict[str, Any]]) -> Blocks:
    """``(type, value)`` per block: thinking and text their text, tool_use ``(name, input)``."""
    out: Blocks = []
    for b in content:
        if b["type"] == "tool_use":
            assert isinstance(b["id"], str), b  # toolu_..., or the model's own id
            assert b["id"], b
            out.append(("tool_use", (b["name"], b["input"])))
        else:
            out.append((b["type"], b[b["type"]]))
    return out


def _streamed_blocks(events: list[dict[str, Any]]) -> tuple[Blocks, str | None]:
    """The blocks rebuilt from the event stream (each ``input_json_delta`` buffer parsed, as
    the SDKs do), and the ``message_delta`` stop reason; checks the event order."""
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"], kinds
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    open_index = None
    for e in events[2:-2]:
        if e["type"] == "content_block_start":
            assert open_index is None, "a block started inside another"
            assert e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
            open_index = e["index"]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_index
            d, block = e["delta"], blocks[e["index"]]
            if d["type"] == "input_json_delta":
                partial[e["index"]] = partial.get(e["index"], "") + d["partial_json"]
                block["input"] = json.loads(partial[e["index"]])  # parses at every step
            elif d["type"] == "text_delta":
                block["text"] += d["text"]
            elif d["type"] == "signature_delta":  # vLLM 0.32: a thinking block's last delta
                assert block["type"] == "thinking", block
                block["signature"] = d["signature"]
            else:
                assert d["type"] == "thinking_delta", d
                assert "signature" not in block, "thinking after the signature"
                block["thinking"] += d["thinking"]
        else:
            assert e["type"] == "content_block_stop", e
            assert e["index"] == open_index
            if blocks[e["index"]]["type"] == "thinking":  # signed before it stops
                assert len(blocks[e["index"]].get("signature", "")) == 32, blocks[e["index"]]
            open_index = None
    assert open_index is None
    return _message_blocks(blocks), events[-2]["delta"]["stop_reason"]


def _want_blocks(case: ToolCase) -> Blocks:
    out: Blocks = []
    if case.reasoning_content:
        out.append(("thinking", case.reasoning_content))
    if case.content or not case.calls:
        out.append(("text", case.content or ""))
    out += [("tool_use", (name, call_input(args))) for name, args in case.calls]
    return out


async def _messages_case(client: httpx.AsyncClient, case: ToolCase, tps: int) -> list[str]:
    body = {
        "model": MODEL,
        "max_tokens": 512,
        "messages": [{"role": "user", "content": _tag(case, tps)}],
        "tools": _anthropic_tools(case),
        "tool_choice": _anthropic_choice(case),
    }
    how = f"{case.id}/{tps} messages"
    resp = await client.post("/v1/messages", json=body)
    if resp.status_code != 200:
        return [f"{how}: HTTP {resp.status_code} {resp.text}"]
    out = resp.json()
    whole = (_message_blocks(out["content"]), out["stop_reason"])
    resp = await client.post("/v1/messages", json={**body, "stream": True})
    if resp.status_code != 200:
        return [f"{how} stream: HTTP {resp.status_code} {resp.text}"]
    streamed = _streamed_blocks(sse_events(resp.text))
    want = (_want_blocks(case), _STOP[case.finish_reason])
    problems = []
    if whole != want:
        problems.append(f"{how}: got {whole!r}, want {want!r}")
    if streamed != whole:
        problems.append(f"{how}: streamed {streamed!r} != whole {whole!r}")
    return problems


# -- Responses --------------------------------------------------------------------------------

Items = list[tuple[str, Any]]


def _items(output: list[dict[str, Any]]) -> Items:
    """``(type, value)`` per output item: reasoning and message their text, function_call
    ``(name, arguments)``."""
    out: Items = []
    for item in output:
        assert item["status"] == "completed", item
        if item["type"] == "function_call":
            assert isinstance(item["call_id"], str), item
            assert item["call_id"], item
            out.append(("function_call", (item["name"], item["arguments"])))
        else:
            out.append((item["type"], "".join(p["text"] for p in item["content"])))
    return out


def _streamed_items(events: list[dict[str, Any]]) -> tuple[Items, str, Items]:
    """The items rebuilt from the deltas, the final status, and the items of the final
    ``response`` event; checks the sequence numbers and the ``.done`` events."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    by_id: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for e in events:
        kind = e["type"]
        if kind == "response.output_item.added":
            item = e["item"]
            assert e["output_index"] == len(order)
            by_id[item["id"]] = {"type": item["type"], "name": item.get("name"), "text": ""}
            order.append(item["id"])
        elif kind in (
            "response.output_text.delta",
            "response.reasoning_text.delta",
            "response.function_call_arguments.delta",
        ):
            by_id[e["item_id"]]["text"] += e["delta"]
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == by_id[e["item_id"]]["text"]
        elif kind == "response.output_item.done":
            assert e["item"]["status"] == "completed"
    items: Items = []
    for item_id in order:
        i = by_id[item_id]
        value = (i["name"], i["text"]) if i["type"] == "function_call" else i["text"]
        items.append((i["type"], value))
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete"), final["type"]
    return items, final["response"]["status"], _items(final["response"]["output"])


def _want_items(case: ToolCase) -> Items:
    out: Items = []
    if case.reasoning_content:
        out.append(("reasoning", case.reasoning_content))
    if case.content or not case.calls:
        out.append(("message", case.content or ""))
    out += [("function_call", call) for call in case.calls]
    return out


async def _responses_case(client: httpx.AsyncClient, case: ToolCase, tps: int) -> list[str]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_output_tokens": 512,
        "input": _tag(case, tps),
        "tools": _responses_tools(case),
        "tool_choice": _responses_choice(case),
        "store": False,
    }
    if not case.parallel_tool_calls:
        body["parallel_tool_calls"] = False
    how = f"{case.id}/{tps} responses"
    resp = await client.post("/v1/responses", json=body)
    if resp.status_code != 200:
        return [f"{how}: HTTP {resp.status_code} {resp.text}"]
    out = resp.json()
    whole = (_items(out["output"]), out["status"])
    resp = await client.post("/v1/responses", json={**body, "stream": True})
    if resp.status_code != 200:
        return [f"{how} stream: HTTP {resp.status_code} {resp.text}"]
    rebuilt, status, final = _streamed_items(sse_events(resp.text))
    status_want = "incomplete" if case.finish_reason == "length" else "completed"
    want = (_want_items(case), status_want)
    problems = []
    if whole != want:
        problems.append(f"{how}: got {whole!r}, want {want!r}")
    if (rebuilt, status) != whole or final != whole[0]:
        problems.append(f"{how}: streamed {(rebuilt, status, final)!r} != whole {whole!r}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize(
    "group", TEXT_GROUPS, ids=[f"{p}-{r or 'noreasoning'}" for p, r, _ in TEXT_GROUPS]
)
async def test_every_case_through_messages_and_responses(
    group: tuple[str, str | None, str], tmp_path: Path, sock_dir: str
) -> None:
    parser, reasoning, model_dir = group
    cases = GROUPS[group]
    script = _script(cases, tmp_path / "script.json")
    problems: list[str] = []
    with trio.fail_after(240):
        async with (
            tool_gateway(parser, reasoning, model_dir, script, sock_dir) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=60) as client,
        ):
            for case in cases:
                for tps in STEPS:
                    problems += await _messages_case(client, case, tps)
                    problems += await _responses_case(client, case, tps)
    assert not problems, "\n".join(problems)


# -- the official SDKs ------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = "It is sunny in Paris, 21 °C."
THOUGHT = "The user wants the weather in Paris."


def _sdk_script(path: Path) -> Path:
    rules = [
        {"name": "answer", "contains": "<tool_response>", "text": FINAL, "tokens_per_step": 3},
        {"name": "think", "contains": "[think]", "text": f"<think>{THOUGHT}</think>{CALL}"},
        {
            "name": "call",
            "contains": "[call]",
            "text": "Let me check. " + CALL,
            "tokens_per_step": 2,
        },
    ]
    path.write_text(json.dumps({"rules": rules}))
    return path


WEATHER_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
ANTHROPIC_TOOLS: Any = [
    {"name": "get_weather", "description": "The weather", "input_schema": WEATHER_INPUT_SCHEMA}
]
RESPONSES_TOOLS: Any = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather",
        "parameters": WEATHER_INPUT_SCHEMA,
    }
]


@pytest.fixture
async def sdk_gateway(tmp_path: Path, sock_dir: str) -> Any:
    """hermes with the qwen3 reasoning parser, over the SDK script; yields the base URL."""
    from smg_trio.mock.tiny_model import default_tiny_model_dir

    script = _sdk_script(tmp_path / "script.json")
    async with tool_gateway(
        "hermes", "qwen3", str(default_tiny_model_dir()), script, sock_dir
    ) as base_url:
        yield base_url


# The SDKs stop reading their SSE generators without closing them; trio's async-generator
# finalizer then warns when they are collected. That is the clients' issue.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
async def test_anthropic_sdk_tool_use_round_trip(sdk_gateway: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=sdk_gateway, api_key="x", max_retries=0)
    ask: Any = [{"role": "user", "content": "[call] weather in Paris?"}]
    try:
        with trio.fail_after(90):
            msg = await client.messages.create(
                model=MODEL, max_tokens=200, messages=ask, tools=ANTHROPIC_TOOLS
            )
            assert msg.stop_reason == "tool_use"
            assert [b.type for b in msg.content] == ["text", "tool_use"]
            assert msg.content[0].text == "Let me check. "  # type: ignore[union-attr]
            use = msg.content[1]
            assert use.type == "tool_use"
            assert use.name == "get_weather"
            assert use.input == {"city": "Paris"}
            assert use.id.startswith("toolu_")

            async with client.messages.stream(
                model=MODEL, max_tokens=200, messages=ask, tools=ANTHROPIC_TOOLS
            ) as stream:
                json_parts = [e.partial_json async for e in stream if e.type == "input_json"]
                streamed = await stream.get_final_message()
            assert json.loads("".join(json_parts)) == {"city": "Paris"}
            assert streamed.stop_reason == "tool_use"
            assert [b.type for b in streamed.content] == ["text", "tool_use"]
            s_use = streamed.content[1]
            assert s_use.type == "tool_use"
            assert (s_use.name, s_use.input) == ("get_weather", {"city": "Paris"})

            # the client runs the tool and sends its result back: the final answer arrives
            turn: Any = [
                *ask,
                {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 °C"}
                    ],
                },
            ]
            final = await client.messages.create(
                model=MODEL, max_tokens=200, messages=turn, tools=ANTHROPIC_TOOLS
            )
            assert final.stop_reason == "end_turn"
            assert [b.type for b in final.content] == ["text"]
            assert final.content[0].text == FINAL  # type: ignore[union-attr]
            async with client.messages.stream(
                model=MODEL, max_tokens=200, messages=turn, tools=ANTHROPIC_TOOLS
            ) as stream:
                text = "".join([t async for t in stream.text_stream])
            assert text == FINAL

            # reasoning and a call in one reply: a thinking block, then the tool_use
            think: Any = [{"role": "user", "content": "[think] weather?"}]
            for streaming in (False, True):
                if streaming:
                    async with client.messages.stream(
                        model=MODEL, max_tokens=200, messages=think, tools=ANTHROPIC_TOOLS
                    ) as stream:
                        got = await stream.get_final_message()
                else:
                    got = await client.messages.create(
                        model=MODEL, max_tokens=200, messages=think, tools=ANTHROPIC_TOOLS
                    )
                assert [b.type for b in got.content] == ["thinking", "tool_use"]
                assert got.content[0].thinking == THOUGHT  # type: ignore[union-attr]
                assert got.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
                assert got.stop_reason == "tool_use"
    finally:
        await client.close()
        gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
async def test_openai_sdk_responses_function_call_round_trip(sdk_gateway: str) -> None:
    client = openai.AsyncOpenAI(base_url=sdk_gateway + "/v1", api_key="x", max_retries=0)
    try:
        with trio.fail_after(90):
            first = await client.responses.create(
                model=MODEL, input="[call] weather in Paris?", tools=RESPONSES_TOOLS
            )
            assert [i.type for i in first.output] == ["message", "function_call"]
            assert first.output_text == "Let me check. "
            call = first.output[1]
            assert call.type == "function_call"
            assert call.name == "get_weather"
            assert json.loads(call.arguments) == {"city": "Paris"}
            assert call.call_id.startswith("call_")

            async with client.responses.stream(
                model=MODEL, input="[call] weather in Paris?", tools=RESPONSES_TOOLS
            ) as stream:
                deltas, done = [], []
                async for event in stream:
                    if event.type == "response.function_call_arguments.delta":
                        deltas.append(event.delta)
                    elif event.type == "response.function_call_arguments.done":
                        done.append(event.arguments)
                streamed = await stream.get_final_response()
            assert done == ["".join(deltas)] == [call.arguments]
            s_call = streamed.output[1]
            assert s_call.type == "function_call"
            assert (s_call.name, s_call.arguments) == ("get_weather", call.arguments)

            # the client runs the tool and sends function_call_output: the final answer
            output: Any = {"type": "function_call_output", "call_id": call.call_id}
            chained = await client.responses.create(
                model=MODEL,
                previous_response_id=first.id,
                input=[{**output, "output": "sunny, 21 °C"}],
                tools=RESPONSES_TOOLS,
            )
            assert chained.output_text == FINAL
            assert chained.status == "completed"
            # the same turn resent as items (store off), streamed
            items: Any = [
                {"role": "user", "content": "[call] weather in Paris?"},
                *[i.model_dump(exclude_none=True) for i in first.output],
                {**output, "output": "sunny, 21 °C"},
            ]
            async with client.responses.stream(
                model=MODEL, input=items, tools=RESPONSES_TOOLS, store=False
            ) as stream:
                text = [e.delta async for e in stream if e.type == "response.output_text.delta"]
                final = await stream.get_final_response()
            assert "".join(text) == final.output_text == FINAL

            # reasoning and a call in one reply: a reasoning item, then the function_call
            for streaming in (False, True):
                if streaming:
                    async with client.responses.stream(
                        model=MODEL, input="[think] weather?", tools=RESPONSES_TOOLS
                    ) as stream:
                        got = await stream.get_final_response()
                else:
                    got = await client.responses.create(
                        model=MODEL, input="[think] weather?", tools=RESPONSES_TOOLS
                    )
                assert [i.type for i in got.output] == ["reasoning", "function_call"]
                rs = got.output[0]
                assert rs.type == "reasoning"
                assert rs.content is not None
                assert rs.content[0].text == THOUGHT
                fc = got.output[1]
                assert fc.type == "function_call"
                assert json.loads(fc.arguments) == {"city": "Paris"}
                assert got.usage is not None
                assert got.usage.output_tokens_details.reasoning_tokens > 0
    finally:
        await client.close()
        gc.collect()
