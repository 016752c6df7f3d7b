"""Tool calling at the request level: bad tools/tool_choice/messages are 400s naming the
field with nothing sent to the engine; required/named reach the engine as a JSON schema
(or a 400 naming tool_choice where the wire has no JSON constraints); stop strings apply to
the content only; the detokenizer keeps special tokens for a format that needs them (but
hides EOS); agent-loop messages (tool_calls with null content, tool results, developer)
render through the tiny model's template."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.protocol.types import Capabilities
from smg_trio.protocol.vllm import VllmProtocol
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of
from tests.helpers.sse import sse_chunks

HERMES = GatewayHttpConfig(tool_call_parser="hermes", enable_auto_tool_choice=True)


def fn(name: str, **props: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in props.items()},
            },
        },
    }


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("non-function tool", {"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    (
        "tool named twice",
        {"tools": [fn("f"), fn("g"), fn("f")]},
        "tools[2].function.name",
    ),
    (
        "tool_choice names a missing tool",
        {"tools": [fn("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice.function.name",
    ),
    (
        "tool_choice named without a name",
        {"tools": [fn("f")], "tool_choice": {"type": "function", "function": {}}},
        "tool_choice.function.name",
    ),
    ("tool_choice bogus", {"tools": [fn("f")], "tool_choice": "always"}, "tool_choice"),
    ("required without tools", {"tool_choice": "required"}, "tool_choice"),
    (
        "tool_call_id on a user message",
        {"messages": [{"role": "user", "content": "hi", "tool_call_id": "call_1"}]},
        "messages[0].tool_call_id",
    ),
    (
        "required and response_format",
        {
            "tools": [fn("f")],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        "response_format",
    ),
]


@pytest.mark.parametrize(("what", "body", "param"), BAD, ids=[b[0] for b in BAD])
async def test_bad_tool_input_is_a_400_naming_the_field(
    harness: HarnessFactory, what: str, body: dict[str, Any], param: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=HERMES) as h:
            for stream in (False, True):
                resp = await h.chat(max_tokens=4, stream=stream, **body)
                assert resp.status_code == 400, resp.text
                assert resp.json()["error"]["param"] == param, resp.json()
            assert h.engine.requests == []


def _structured(raw: Any) -> Any:
    sp = raw.sampling_params if hasattr(raw, "sampling_params") else raw["sampling_params"]
    so = getattr(sp, "structured_outputs", None)
    return so if so is not None else sp.get("structured_outputs")


async def test_required_and_named_constrain_the_engine_with_a_json_schema(
    harness: HarnessFactory, tok: Any
) -> None:
    tools = [fn("get_weather", city="string"), fn("search", query="string")]
    reply = '{"city": "Paris"}'
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, reply)) as h:  # no parser flags
            named = {"type": "function", "function": {"name": "get_weather"}}
            resp = await h.chat(max_tokens=20, tools=tools, tool_choice=named)
            assert resp.status_code == 200, resp.text
            msg = resp.json()["choices"][0]["message"]
            assert msg["content"] is None
            assert [
                (c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]
            ] == [("get_weather", reply)]
            schema = json.loads(json.dumps(_structured(h.engine.requests[0].raw)["json"]))
            assert schema == tools[0]["function"]["parameters"]
            resp = await h.chat(
                max_tokens=20, tools=tools, tool_choice="required", parallel_tool_calls=False
            )
            assert resp.status_code == 200, resp.text
            schema = _structured(h.engine.requests[1].raw)["json"]
            assert schema["type"] == "array"
            assert schema["maxItems"] == 1
            branches = schema["items"]["anyOf"]
            assert [b["properties"]["name"]["enum"] for b in branches] == [
                ["get_weather"],
                ["search"],
            ]


class _NoJsonProtocol(VllmProtocol):
    capabilities: ClassVar[Capabilities] = Capabilities(
        **{
            **{
                f: getattr(VllmProtocol.capabilities, f)
                for f in VllmProtocol.capabilities.__struct_fields__
            },
            "structured_outputs": frozenset({"regex"}),
        }
    )


async def test_a_wire_without_json_constraints_refuses_required_naming_tool_choice(
    harness: HarnessFactory,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            h.served.protocol = _NoJsonProtocol()
            for choice in ("required", {"type": "function", "function": {"name": "f"}}):
                resp = await h.chat(max_tokens=4, tools=[fn("f")], tool_choice=choice)
                assert resp.status_code == 400, resp.text
                err = resp.json()["error"]
                assert err["param"] == "tool_choice"
                assert err["code"] == "unsupported_field"
            assert h.engine.requests == []


async def test_a_stop_string_inside_the_reasoning_does_not_end_the_answer(
    harness: HarnessFactory, tok: Any
) -> None:
    steps = ["<think>", "we could STOP", " here</think>", "Answer", " then STOP", " more"]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *steps), reasoning_parser="qwen3") as h:
            for stream in (False, True):
                resp = await h.chat(max_tokens=30, stop=["STOP"], stream=stream)
                assert resp.status_code == 200, resp.text
                if stream:
                    chunks = sse_chunks(resp.content)
                    deltas = [c["choices"][0] for c in chunks if c["choices"]]
                    content = "".join(d["delta"].get("content") or "" for d in deltas)
                    reasoning = "".join(d["delta"].get("reasoning") or "" for d in deltas)
                    finish = [d["finish_reason"] for d in deltas if d["finish_reason"]]
                    stop_reason = deltas[-1].get("stop_reason")
                else:
                    choice = resp.json()["choices"][0]
                    content = choice["message"]["content"]
                    reasoning = choice["message"]["reasoning"]
                    finish = [choice["finish_reason"]]
                    stop_reason = choice["stop_reason"]
                assert reasoning == "we could STOP here"
                assert content == "Answer then "
                assert finish == ["stop"]
                assert stop_reason == "STOP"


async def test_hermes_keeps_special_tokens_but_hides_eos(harness: HarnessFactory, tok: Any) -> None:
    """hermes asks for special tokens (they are its markers in Hermes 2 Pro's vocabulary):
    <|im_start|> in the text stays, the EOS that ends the reply does not."""
    eos = tok.encode("<|im_end|>")
    with trio.fail_after(DEADLINE_S):
        async with harness(
            plan=lambda r: [*steps_of(tok, "a <|im_start|> b"), eos], config=HERMES
        ) as h:
            tools = [fn("f")]
            resp = await h.chat(max_tokens=30, tools=tools)
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"] == "a <|im_start|> b"
            resp = await h.chat(max_tokens=30)  # no tools: no parser, special tokens skipped
            assert resp.json()["choices"][0]["message"]["content"] == "a  b"


async def test_an_agent_turn_renders_through_a_string_template(
    harness: HarnessFactory, tok: Any
) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Sunny.")) as h:
            resp = await h.chat(
                max_tokens=8,
                messages=messages,
                tools=[fn("get_weather", city="string")],
                tool_choice="none",
                chat_template_kwargs={"enable_thinking": False},
            )
            assert resp.status_code == 200, resp.text
            prompt = tok.decode(h.engine.requests[0].prompt_token_ids, skip_special_tokens=False)
            assert "Be brief." in prompt
            assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
            assert "<tool_response>\nsunny\n</tool_response>" in prompt
            assert prompt.endswith("<think>\n\n</think>\n\n")


async def test_logprobs_stay_with_their_tokens_through_reasoning_and_tool_calls(
    harness: HarnessFactory, tok: Any
) -> None:
    """Each delta carries the logprobs of the tokens it covers, whichever part they fell in
    (reasoning, content, a held-back call): streamed they add up to the whole response's."""
    steps = [
        "<think>",
        "hmm",
        "</think>",
        "ok ",
        "<tool_call>",
        '{"name": "f", "arguments": {"a": 1}}',
        "</tool_call>",
    ]
    with trio.fail_after(DEADLINE_S):
        async with harness(
            plan=lambda r: steps_of(tok, *steps), config=HERMES, reasoning_parser="qwen3"
        ) as h:
            body: dict[str, Any] = {"max_tokens": 60, "tools": [fn("f")], "logprobs": True}
            whole = (await h.chat(**body)).json()
            choice = whole["choices"][0]
            assert choice["message"]["reasoning"] == "hmm"
            assert choice["message"]["content"] == "ok "
            assert choice["finish_reason"] == "tool_calls"
            tokens = [e["token"] for e in choice["logprobs"]["content"]]
            assert len(tokens) == whole["usage"]["completion_tokens"]
            resp = await h.chat(stream=True, **body)
            streamed: list[str] = []
            for chunk in sse_chunks(resp.content):
                for c in chunk["choices"]:
                    if c.get("logprobs"):
                        streamed += [e["token"] for e in c["logprobs"]["content"]]
            assert streamed == tokens
