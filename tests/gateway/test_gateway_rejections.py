"""Loud rejections: bad input is a 4xx OpenAI envelope and never reaches the engine
(B15 b/c, B16, B18, B19, B20, capability rejections, n/seed/context limits)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from smg_trio.gateway.config import DEFAULT_MAX_N
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory

HI = [{"role": "user", "content": "hi"}]


def assert_envelope(resp: httpx.Response, status: int, param: str | None = "?") -> dict[str, Any]:
    """``resp`` is a JSON OpenAI error with ``status``; returns the ``error`` object."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str)
    assert err["message"]
    assert err["code"] is None or isinstance(err["code"], str)
    if status < 500:
        assert err["type"] in ("invalid_request_error", "authentication_error")
    if param != "?":
        assert err["param"] == param, err
    return dict(err)


async def assert_untouched(h: Harness) -> None:
    """Nothing reached the engine and the server still serves."""
    assert h.engine.requests == []
    assert (await h.http.get("/health")).status_code == 200


CHAT_CASES: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("B18a empty messages", {"messages": []}, 400, "messages"),
    ("B18e role robot", {"messages": [{"role": "robot"}]}, 400, "messages[0].content"),
    ("role not a string", {"messages": [{"role": 5, "content": "x"}]}, 400, "messages[0].role"),
    ("B18f no content", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ("messages not a list", {"messages": "hi"}, 400, "messages"),
    (
        "content part image",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0].type",
    ),
    ("B18h n=0", {"n": 0}, 400, "n"),
    ("n over max", {"n": DEFAULT_MAX_N + 1}, 400, "n"),
    ("B18h temperature -1", {"temperature": -1}, 400, "temperature"),
    ("B18h top_p 1.5", {"top_p": 1.5}, 400, "top_p"),
    ("top_p 0", {"top_p": 0}, 400, "top_p"),
    ("top_k -2", {"top_k": -2}, 400, "top_k"),
    ("min_p 2", {"min_p": 2}, 400, "min_p"),
    ("presence_penalty 3", {"presence_penalty": 3}, 400, "presence_penalty"),
    ("repetition_penalty 0", {"repetition_penalty": 0}, 400, "repetition_penalty"),
    ("B16b max_tokens 0", {"max_tokens": 0}, 400, "max_tokens"),
    ("B16c max_tokens -5", {"max_tokens": -5}, 400, "max_tokens"),
    ("B16e max_tokens '10'", {"max_tokens": "10"}, 400, "max_tokens"),
    ("max_completion_tokens 0", {"max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("min_tokens > max_tokens", {"min_tokens": 5, "max_tokens": 2}, 400, "min_tokens"),
    ("B15b top_logprobs without logprobs", {"top_logprobs": 3}, 400, "top_logprobs"),
    ("B15c top_logprobs 21", {"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("B06c seed below int64", {"seed": -(2**63) - 1}, 400, "seed"),
    ("seed 2**63", {"seed": 2**63}, 400, "seed"),
    ("stream not bool", {"stream": "yes"}, 400, "stream"),
    ("stop wrong type", {"stop": 5}, 400, "stop"),
    ("stop string too long", {"stop": "a" * 40_000}, 400, "stop"),
    ("stop list item too long", {"stop": ["ok", "a" * 1025]}, 400, "stop[1]"),
    ("too many stop strings", {"stop": [f"s{i}" for i in range(65)]}, 400, "stop"),
    ("stop_token_ids out of vocab", {"stop_token_ids": [5000]}, 400, "stop_token_ids[0]"),
    ("logit_bias non-id key", {"logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit_bias out of vocab", {"logit_bias": {"99999": 1}}, 400, "logit_bias"),
    ("best_of", {"best_of": 2}, 400, "best_of"),
    ("beam search", {"use_beam_search": True}, 400, "use_beam_search"),
    ("priority 2**63", {"priority": 2**63}, 400, "priority"),
    ("priority below -2**63", {"priority": -(2**63) - 1}, 400, "priority"),
    ("priority not an integer", {"priority": "high"}, 400, "priority"),
    (
        "truncate_prompt_tokens over the context",
        {"truncate_prompt_tokens": 5000},
        400,
        "truncate_prompt_tokens",
    ),
    ("truncation_side middle", {"truncation_side": "middle"}, 400, "truncation_side"),
    ("tool_choice required", {"tool_choice": "required"}, 400, "tool_choice"),
    (
        "response_format bad type",
        {"response_format": {"type": "yaml"}},
        400,
        "response_format.type",
    ),
    (
        "json_schema without schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "json_schema schema not an object",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "s"}}},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "stream_options without stream",
        {"stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ("tool type bogus", {"tools": [{"type": "bogus"}]}, 400, "tools[0].type"),
    ("tool without function", {"tools": [{"type": "function"}]}, 400, "tools[0].function"),
    (
        "tool name not a string",
        {"tools": [{"type": "function", "function": {"name": 5}}]},
        400,
        "tools[0].function.name",
    ),
    (
        "tool parameters not an object",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
        400,
        "tools[0].function.parameters",
    ),
    ("two constraints", {"guided_regex": "a+", "guided_choice": ["a", "b"]}, 400, "guided_choice"),
    ("guided_json not JSON", {"guided_json": "{nope"}, 400, "guided_json"),
    ("stream prompt_logprobs", {"stream": True, "prompt_logprobs": 1}, 400, "prompt_logprobs"),
    ("data_parallel_rank out of range", {"data_parallel_rank": 1}, 400, "data_parallel_rank"),
    ("data_parallel_rank negative", {"data_parallel_rank": -1}, 400, "data_parallel_rank"),
    ("best_of below n", {"best_of": 1, "n": 3}, 400, "best_of"),
    ("guided_json not a schema", {"guided_json": 5}, 400, "guided_json"),
    ("B20 unknown model", {"model": "does-not-exist"}, 404, "model"),
    ("B20 unknown model streaming", {"model": "does-not-exist", "stream": True}, 404, "model"),
    ("B20 model with spaces", {"model": " M "}, 404, "model"),
    ("B20 model wrong case", {"model": "m"}, 404, "model"),
    ("context overflow", {"max_tokens": 5000}, 400, "max_tokens"),
]


@pytest.mark.parametrize(
    ("case", "patch", "status", "param"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES]
)
async def test_chat_rejections(
    harness: HarnessFactory, case: str, patch: dict[str, Any], status: int, param: str | None
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            body = {"model": "M", "messages": HI, **patch}
            err = assert_envelope(await h.post("/v1/chat/completions", body), status, param)
            if status == 404:
                assert err["code"] == "model_not_found"
            await assert_untouched(h)


COMPLETION_CASES: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("missing prompt", {"prompt": None}, 400, "prompt"),
    ("B18g empty prompt", {"prompt": ""}, 400, "prompt[0]"),
    ("empty list", {"prompt": []}, 400, "prompt"),
    ("B18d negative id", {"prompt": [[-1]]}, 400, "prompt[0]"),
    ("B18d id >= vocab", {"prompt": [5, 1024]}, 400, "prompt"),
    ("B18d nested id >= vocab", {"prompt": [[5], [99999]]}, 400, "prompt[1]"),
    ("prompt of dicts", {"prompt": [{"a": 1}]}, 400, "prompt[0]"),
    ("bool in ids", {"prompt": [1, True]}, 400, "prompt[0]"),
    ("max_tokens 0 without echo", {"max_tokens": 0}, 400, "max_tokens"),
    ("suffix", {"suffix": "tail"}, 400, "suffix"),
    ("logprobs 21", {"logprobs": 21}, 400, "logprobs"),
    ("B16e max_tokens string", {"max_tokens": "10"}, 400, "max_tokens"),
    ("n over max", {"n": DEFAULT_MAX_N + 1}, 400, "n"),
    ("unknown model", {"model": "nope"}, 404, "model"),
    ("too many prompts", {"prompt": ["a"] * 129}, 400, "prompt"),
]


@pytest.mark.parametrize(
    ("case", "patch", "status", "param"), COMPLETION_CASES, ids=[c[0] for c in COMPLETION_CASES]
)
async def test_completion_rejections(
    harness: HarnessFactory, case: str, patch: dict[str, Any], status: int, param: str | None
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            body = {"model": "M", "prompt": "hello", **patch}
            if body["prompt"] is None:
                del body["prompt"]
            assert_envelope(await h.post("/v1/completions", body), status, param)
            await assert_untouched(h)


DEEP = b'{"x":' * 5000 + b"1" + b"}" * 5000


def _deep_tools(depth: int) -> bytes:
    return (
        b'{"model":"M","messages":[{"role":"user","content":"hi"}],"tool_choice":"none",'
        b'"tools":[{"type":"function",'
        b'"function":{"name":"f","parameters":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}}]}"
    )


DEEP_IN_TOOLS = _deep_tools(3000)


@pytest.mark.parametrize("depth", [900, 990])
async def test_deep_tool_schema_is_a_400_or_served_never_a_500(
    harness: HarnessFactory, depth: int
) -> None:
    """Nesting the decoder accepts can still be too deep for the template's JSON rendering."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.http.post(
                "/v1/chat/completions",
                content=_deep_tools(depth),
                headers={"content-type": "application/json"},
            )
            assert resp.status_code in (200, 400), resp.text
            if resp.status_code == 400:
                assert_envelope(resp, 400, None)


@pytest.mark.parametrize(
    "raw",
    [b"[]", b"null", b"123", b'"x"', b'{"model":"M",x}', b"", b"{", DEEP, DEEP_IN_TOOLS],
    ids=["list", "null", "int", "str", "bad-key", "empty", "open", "deep", "deep-in-tools"],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_b18_malformed_bodies(harness: HarnessFactory, raw: bytes, path: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.http.post(
                path, content=raw, headers={"content-type": "application/json"}
            )
            err = assert_envelope(resp, 400)
            if raw in (b'{"model":"M",x}', b"", b"{"):
                assert err["code"] == "json_parse_error"
            await assert_untouched(h)


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"max_tokens": -1}, "max_tokens", "invalid_value"),  # the right type, out of bounds
        ({"top_p": 1.5}, "top_p", "invalid_value"),
        ({"messages": [{"role": "", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"logit_bias": {"5": "high"}}, "logit_bias", "invalid_type"),  # in a map's value
        ({"max_tokens": "ten"}, "max_tokens", "invalid_type"),
        ({"messages": "hi"}, "messages", "invalid_type"),
    ],
    ids=["below-min", "above-max", "not-a-choice", "map-value", "str-for-int", "str-for-list"],
)
async def test_a_bad_value_and_a_bad_type_have_their_own_codes(
    harness: HarnessFactory, extra: dict[str, Any], param: str, code: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post("/v1/chat/completions", {"model": "M", "messages": HI, **extra})
            assert assert_envelope(resp, 400, param)["code"] == code
            await assert_untouched(h)


async def test_b18_missing_required_field_names_it(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post("/v1/chat/completions", {"model": "M"})
            err = assert_envelope(resp, 400, "messages")
            assert err["code"] == "missing_required_parameter"
            await assert_untouched(h)


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 415),
        ("application/x-www-form-urlencoded", 415),
        ("text/plain", 415),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
    ],
)
async def test_b19_content_type(
    harness: HarnessFactory, content_type: str | None, status: int
) -> None:
    body = b'{"model":"M","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            headers = {} if content_type is None else {"content-type": content_type}
            req = h.http.build_request(
                "POST", "/v1/chat/completions", content=body, headers=headers
            )
            assert content_type is not None or "content-type" not in req.headers
            resp = await h.http.send(req)
            if status == 415:
                err = assert_envelope(resp, 415)
                assert "application/json" in err["message"]
                await assert_untouched(h)
            else:
                assert resp.status_code == 200, resp.text
                assert resp.headers["content-type"] == "application/json"


async def test_b20_missing_model_defaults_to_the_only_model(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post("/v1/chat/completions", {"messages": HI, "max_tokens": 2})
            assert resp.status_code == 200, resp.text
            assert resp.json()["model"] == "M"


async def test_prompt_longer_than_context(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(max_model_len=16) as h:
            long = [{"role": "user", "content": "word " * 40}]
            err = assert_envelope(
                await h.post("/v1/chat/completions", {"model": "M", "messages": long}),
                400,
                "messages",
            )
            assert err["code"] == "context_length_exceeded"
            err = assert_envelope(await h.complete(prompt=list(range(3, 30))), 400, "prompt")
            assert err["code"] == "context_length_exceeded"
            await assert_untouched(h)


TOKENSPEED_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "chat top_logprobs",
        "/v1/chat/completions",
        {"logprobs": True, "top_logprobs": 2},
        "top_logprobs",
    ),
    ("completions logprobs", "/v1/completions", {"logprobs": 1}, "logprobs"),
    ("echo with logprobs", "/v1/completions", {"echo": True, "logprobs": 0}, "echo"),
    ("prompt_logprobs", "/v1/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("guided_choice", "/v1/chat/completions", {"guided_choice": ["a", "b"]}, "guided_choice"),
    (
        "structured choice",
        "/v1/chat/completions",
        {"structured_outputs": {"choice": ["a"]}},
        "structured_outputs.choice",
    ),
    ("top_k over kernel limit", "/v1/chat/completions", {"top_k": 500}, "top_k"),
]


@pytest.mark.parametrize(
    ("case", "path", "patch", "param"), TOKENSPEED_CASES, ids=[c[0] for c in TOKENSPEED_CASES]
)
async def test_tokenspeed_capability_rejections(
    harness: HarnessFactory, case: str, path: str, patch: dict[str, Any], param: str
) -> None:
    """Fields TokenSpeed's wire cannot carry are a 400 naming the field, never dropped."""
    with trio.fail_after(DEADLINE_S):
        async with harness(protocol="tokenspeed") as h:
            body = {"model": "M", "messages": HI, "prompt": "hello", **patch}
            err = assert_envelope(await h.post(path, body), 400, param)
            assert "TokenSpeed" in err["message"] or "tokenspeed" in err["message"]
            await assert_untouched(h)
