"""Streams that take several engine steps at once (they fell behind the engine) merge them
into one delta per choice: whatever the API (chat, completions, Responses, Anthropic
messages) and whatever rides on the deltas (logprobs, token ids, usage, stop strings, tool
calls, reasoning, failures), the merged stream adds up to the stream that kept up."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio

from smg_trio.codec.msgpack import encoder
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.protocol import vllm
from tests.helpers.gateway import (
    DEADLINE_S,
    Harness,
    HarnessFactory,
    steps_of,
    steps_per_message,
)
from tests.helpers.raw_sse import RawSSE
from tests.helpers.sse import sse_chunks, sse_events

HERMES = GatewayHttpConfig(tool_call_parser="hermes", enable_auto_tool_choice=True)


def stream_choices(raw: bytes) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every choice of a stream's chunks in order, and the final usage chunk's ``usage``."""
    choices: list[dict[str, Any]] = []
    usage = None
    for chunk in sse_chunks(raw):
        if chunk.get("usage") and not chunk["choices"]:
            usage = chunk["usage"]
        choices += chunk["choices"]
    return choices, usage


def chat_summary(raw: bytes) -> dict[str, Any]:
    """What a chat stream adds up to, per choice."""
    choices, usage = stream_choices(raw)
    out: dict[int, dict[str, Any]] = {}
    for c in choices:
        s = out.setdefault(
            c["index"],
            {"content": "", "reasoning": "", "calls": {}, "lp": [], "ids": [], "finish": None},
        )
        d = c.get("delta", {})
        s["content"] += d.get("content") or ""
        s["reasoning"] += d.get("reasoning") or ""
        for tc in d.get("tool_calls") or []:
            call = s["calls"].setdefault(tc["index"], {"id": None, "name": None, "args": ""})
            if tc.get("id"):
                assert call["id"] is None, "a call's id sent twice"
                call["id"] = "x"
            fn = tc.get("function") or {}
            if fn.get("name"):
                call["name"] = fn["name"]
            call["args"] += fn.get("arguments") or ""
        if c.get("logprobs"):
            s["lp"] += c["logprobs"]["content"]
        s["ids"] += c.get("token_ids") or []
        if c.get("finish_reason"):
            assert s["finish"] is None
            s["finish"] = (c["finish_reason"], c.get("stop_reason"))
    return {"choices": out, "usage": usage}


def completion_summary(raw: bytes) -> dict[str, Any]:
    choices, usage = stream_choices(raw)
    out: dict[int, dict[str, Any]] = {}
    for c in choices:
        s = out.setdefault(
            c["index"], {"text": "", "tokens": [], "lps": [], "top": [], "off": [], "fin": None}
        )
        s["text"] += c["text"]
        lp = c.get("logprobs")
        if lp:
            s["tokens"] += lp["tokens"]
            s["lps"] += lp["token_logprobs"]
            s["top"] += lp["top_logprobs"] or []
            s["off"] += lp["text_offset"]
        if c.get("finish_reason"):
            s["fin"] = (c["finish_reason"], c.get("stop_reason"))
    return {"choices": out, "usage": usage}


async def both(
    harness: HarnessFactory,
    monkeypatch: pytest.MonkeyPatch,
    steps: Sequence[str],
    tok: Any,
    call: Callable[[Harness], Any],
    ks: Sequence[int | None] = (1, 2, 3, None),
    **kw: Any,
) -> list[Any]:
    """``call`` answered with ``k`` steps per engine message for each of ``ks``."""
    answers = []
    for k in ks:
        with trio.fail_after(DEADLINE_S):
            async with harness(plan=lambda r: steps_of(tok, *steps), **kw) as h:
                steps_per_message(h.engine, monkeypatch, k)
                answers.append(await call(h))
                assert h.client.inflight_count == 0
    return answers


async def _chat_raw(h: Harness, body: dict[str, Any]) -> bytes:
    resp = await h.chat(stream=True, **body)
    assert resp.status_code == 200, resp.text
    return resp.content


STEPS = ["one ", "two ", "thr", "ee ", "four ", "five ", "six"]


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": True, "top_logprobs": 2},
        {"return_token_ids": True},
        {"n": 2, "logprobs": True, "top_logprobs": 1, "return_token_ids": True},
        {"stop": ["two three"]},
        {"stop": ["o thr"], "include_stop_str_in_output": True},
        {"stop": ["one"], "min_tokens": 2},
        {"stop": ["ee four"], "logprobs": True, "return_token_ids": True},
        {"max_tokens": 3, "logprobs": True},
    ],
)
async def test_chat_merged_adds_up_to_kept_up(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    body: dict[str, Any] = {"max_tokens": 40, **extra}
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}

    async def call(h: Harness) -> Any:
        return chat_summary(await _chat_raw(h, body))

    answers = await both(harness, monkeypatch, STEPS, tok, call)
    for a in answers[1:]:
        assert a == answers[0]


TOOL_STEPS = [
    "<think>",
    "hm",
    "m</think>",
    "ok ",
    "<tool_call>",
    '{"name": "f", ',
    '"arguments": {"a": 1}}',
    "</tool_call>",
    "<tool_call>",
    '{"name": "g", "arguments": {"b": [1, 2]}}',
    "</tool_call>",
]


def fn(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"parallel_tool_calls": False},
        {"n": 2},
        {"tool_choice": {"type": "function", "function": {"name": "g"}}},
        {"tool_choice": "required"},
    ],
)
@pytest.mark.parametrize("fast", [True, False])
async def test_chat_tool_calls_and_reasoning_merged(
    harness: HarnessFactory,
    tok: Any,
    monkeypatch: pytest.MonkeyPatch,
    extra: dict[str, Any],
    fast: bool,
) -> None:
    """Two calls, reasoning before them, content between: their deltas in one event (the
    two calls in one ``tool_calls`` list) add up to the deltas of the steps one by one."""
    body: dict[str, Any] = {
        "max_tokens": 80,
        "tools": [fn("f"), fn("g")],
        "logprobs": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **extra,
    }

    async def call(h: Harness) -> Any:
        return chat_summary(await _chat_raw(h, body))

    answers = await both(
        harness,
        monkeypatch,
        TOOL_STEPS,
        tok,
        call,
        config=HERMES,
        reasoning_parser="qwen3",
        fast_http1=fast,
    )
    first = answers[0]["choices"][0]
    if not extra:
        assert first["reasoning"] == "hmm"
        assert [c["name"] for c in first["calls"].values()] == ["f", "g"]
    for a in answers[1:]:
        assert a == answers[0]


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": 2},
        {"logprobs": 1, "echo": True},
        {"logprobs": 0, "stop": ["two three"]},
        {"n": 2, "logprobs": 1},
        {"echo": True, "return_token_ids": True},
    ],
)
async def test_completions_merged_adds_up_to_kept_up(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    body: dict[str, Any] = {"model": "M", "prompt": "hello", "max_tokens": 40, **extra}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}

    async def call(h: Harness) -> Any:
        resp = await h.post("/v1/completions", body)
        assert resp.status_code == 200, resp.text
        return completion_summary(resp.content)

    answers = await both(harness, monkeypatch, STEPS, tok, call)
    for a in answers[1:]:
        assert a == answers[0]


def _responses_summary(raw: bytes) -> Any:
    events = sse_events(raw)
    deltas: dict[str, str] = {}
    done = None
    kinds = []
    for e in events:
        t = e["type"]
        kinds.append(t) if not t.endswith(".delta") else None
        if t.endswith(".delta"):
            deltas[t] = deltas.get(t, "") + e["delta"]
        if t == "response.completed":
            done = e["response"]
            for item in done["output"]:
                item.pop("id", None)
                item.pop("call_id", None)
            done.pop("id")
            done.pop("created_at")
    return deltas, kinds, done


async def test_responses_merged(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {
        "model": "M",
        "input": "hi",
        "max_output_tokens": 80,
        "stream": True,
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"type": "function", "name": "g", "parameters": {"type": "object"}},
        ],
    }

    async def call(h: Harness) -> Any:
        resp = await h.post("/v1/responses", body)
        assert resp.status_code == 200, resp.text
        return _responses_summary(resp.content)

    answers = await both(
        harness, monkeypatch, TOOL_STEPS, tok, call, config=HERMES, reasoning_parser="qwen3"
    )
    for a in answers[1:]:
        assert a[0] == answers[0][0]
        assert a[1] == answers[0][1]
        assert a[2]["output"] == answers[0][2]["output"]
        assert a[2]["usage"] == answers[0][2]["usage"]


@pytest.mark.parametrize(
    "extra", [{}, {"stop_sequences": ["ok <tool"]}, {"stop_sequences": ["m</"]}]
)
async def test_messages_merged(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    body = {
        "model": "M",
        "max_tokens": 80,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}},
            {"name": "g", "input_schema": {"type": "object"}},
        ],
        **extra,
    }

    def summary(raw: bytes) -> Any:
        blocks: list[Any] = []
        kinds = []
        for e in sse_events(raw):
            kinds.append(e["type"]) if e["type"] != "content_block_delta" else None
            if e["type"] == "content_block_start":
                block = dict(e["content_block"])
                block.pop("id", None)
                block.pop("signature", None)
                blocks.append([block, ""])
            elif e["type"] == "content_block_delta":
                d = e["delta"]
                blocks[e["index"]][1] += (
                    d.get("text") or d.get("thinking") or d.get("partial_json") or ""
                )
            elif e["type"] == "message_delta":
                blocks.append(e)
        return kinds, blocks

    async def call(h: Harness) -> Any:
        resp = await h.post("/v1/messages", body)
        assert resp.status_code == 200, resp.text
        return summary(resp.content)

    answers = await both(
        harness, monkeypatch, TOOL_STEPS, tok, call, config=HERMES, reasoning_parser="qwen3"
    )
    for a in answers[1:]:
        assert a == answers[0]


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
)
async def test_error_after_text_in_one_message(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Text steps and an engine error in the same message: the text goes out, then the
    error event; nothing leaks."""
    body: dict[str, Any] = {"model": "M", "max_tokens": 40, "stream": True}
    if path == "/v1/completions":
        body["prompt"] = "hi"
    elif path == "/v1/responses":
        body["input"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]

    async def call(h: Harness) -> Any:
        resp = await h.post(path, body)
        assert resp.status_code == 200, resp.text
        return resp.content

    answers = await both(
        harness,
        monkeypatch,
        STEPS,
        tok,
        call,
        error_finish=lambda r: len(r.generated) >= 4,
    )
    for a in answers:
        text = a.decode()
        assert "error" in text, text
        assert "one" in text, text


def _body(path: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "M", "max_tokens": 40, "stream": True, **extra}
    if path == "/v1/completions":
        body["prompt"] = "hi"
    elif path == "/v1/responses":
        body["input"] = "hi"
        body["max_output_tokens"] = body.pop("max_tokens")
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    return body


async def _pushed(
    h: Harness, path: str, body: dict[str, Any], outs: Callable[[str], list[Any]]
) -> tuple[bytes, str]:
    """Stall the engine, send ``body`` and answer it with one message of ``outs(rid)``."""

    h.engine.stall()
    arrived = h.engine.request_event
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def post() -> None:
            resp = await h.post(path, body)
            got.append(resp.content)

        nursery.start_soon(post)
        await arrived.wait()
        rid = h.engine.requests[-1].request_id
        env = vllm.EngineCoreOutputs(engine_index=0, outputs=outs(rid))
        await h.engine._push([encoder.encode(env)])
    return got[0], rid


PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("code", [2, 3])  # abort, error
async def test_text_and_a_failure_in_one_message(
    harness: HarnessFactory, tok: Any, path: str, code: int
) -> None:
    """Two steps of text and the engine's abort or error finish in one message: the text goes
    out in one event, then the error event; nothing leaks."""

    one, two = tok.encode("one "), tok.encode("two ")

    def outs(rid: str) -> list[Any]:
        return [
            vllm.EngineCoreOutput(request_id=rid, new_token_ids=one),
            vllm.EngineCoreOutput(request_id=rid, new_token_ids=two),
            vllm.EngineCoreOutput(request_id=rid, new_token_ids=[], finish_reason=code),
        ]

    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw, _ = await _pushed(h, path, _body(path), outs)
            assert h.client.inflight_count == 0
    text = raw.decode()
    assert "one two " in text, text
    assert "error" in text
    assert text.index("one two ") < text.rindex("error")


@pytest.mark.parametrize("path", PATHS)
async def test_text_and_the_finish_in_one_message(
    harness: HarnessFactory, tok: Any, path: str
) -> None:

    one, two = tok.encode("one "), tok.encode("two ")

    def outs(rid: str) -> list[Any]:
        return [
            vllm.EngineCoreOutput(request_id=rid, new_token_ids=one),
            vllm.EngineCoreOutput(request_id=rid, new_token_ids=two, finish_reason=1),
        ]

    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw, _ = await _pushed(h, path, _body(path), outs)
            assert h.client.inflight_count == 0
    text = raw.decode()
    assert "one two " in text, text
    assert "event: error" not in text
    assert "response.failed" not in text
    assert "engine_aborted" not in text
    if path in PATHS[:2]:
        assert text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("path", "n"), [*((p, 1) for p in PATHS), ("/v1/chat/completions", 3), ("/v1/completions", 3)]
)
async def test_disconnect_while_steps_come_together_aborts(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch, path: str, n: int
) -> None:
    """The client goes away while its stream takes four steps per message: every sub is
    ABORTed and the registry empties."""

    body = _body(path, max_tokens=3000)
    if n > 1:
        body["n"] = n
    with trio.fail_after(DEADLINE_S):
        async with harness(step_s=0.002) as h:
            steps_per_message(h.engine, monkeypatch, 4)
            sse = await RawSSE.post(h.base_url, path, body)
            await sse.until(lambda evs: len(evs) >= 6)
            await sse.aclose()
            ids = [r.request_id for r in h.engine.requests]
            assert len(ids) == n
            await h.wait_aborted(ids)
            while h.engine.active:
                await h.engine.abort_event.wait()
            assert h.client.inflight_count == 0
            assert (await h.chat(max_tokens=2)).status_code == 200


@pytest.mark.parametrize("path", PATHS)
async def test_text_then_the_engine_dead_sentinel_right_behind_it(
    harness: HarnessFactory, tok: Any, path: str
) -> None:
    """Two steps of text and, right behind them on the socket, ``ENGINE_CORE_DEAD``: the
    text goes out, then the error event; nothing leaks."""
    body = _body(path)
    one, two = tok.encode("one "), tok.encode("two ")
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            h.engine.stall()
            arrived = h.engine.request_event
            got: list[bytes] = []
            async with trio.open_nursery() as nursery:

                async def post() -> None:
                    got.append((await h.post(path, body)).content)

                nursery.start_soon(post)
                await arrived.wait()
                rid = h.engine.requests[-1].request_id
                outs = [
                    vllm.EngineCoreOutput(request_id=rid, new_token_ids=one),
                    vllm.EngineCoreOutput(request_id=rid, new_token_ids=two),
                ]
                env = vllm.EngineCoreOutputs(engine_index=0, outputs=outs)
                await h.engine._push([encoder.encode(env)])
                await h.engine.die_with_sentinel()
            assert h.client.inflight_count == 0
    text = got[0].decode()
    assert "one two " in text, text
    assert text.index("one two ") < text.rindex("error")


@pytest.mark.parametrize("include", [False, True])
async def test_chat_stop_token_id_and_eos_merged(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, include: bool
) -> None:
    """The engine stops on a stop token id (its text hidden unless
    ``include_stop_str_in_output``) in a message with the steps before it."""
    stop_id = tok.encode("four ")[0]
    body: dict[str, Any] = {
        "max_tokens": 40,
        "logprobs": True,
        "return_token_ids": True,
        "stop_token_ids": [stop_id],
        "include_stop_str_in_output": include,
        "stream_options": {"include_usage": True},
    }

    async def call(h: Harness) -> Any:
        return chat_summary(await _chat_raw(h, body))

    answers = await both(harness, monkeypatch, STEPS, tok, call)
    assert answers[0]["choices"][0]["finish"] == ("stop", stop_id)
    for a in answers[1:]:
        assert a == answers[0]


def ts_steps_per_message(engine: Any, monkeypatch: pytest.MonkeyPatch, k: int | None) -> None:
    """:func:`steps_per_message` for the TokenSpeed protocol: ``k`` steps' rows in one
    batch (a request's rows repeated, as a gateway that drained several batches sees them)."""
    if k == 1:
        return
    send = engine._send_ts
    held: list[Any] = []

    async def send_ts(results: Any) -> None:
        if not results:
            await send(results)
            return
        held.append(results)
        if len(held) == k or any(reason for _, _, reason in results):
            rows = [row for step in held for row in step]
            held.clear()
            await send(rows)

    monkeypatch.setattr(engine, "_send_ts", send_ts)


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": True, "top_logprobs": 0},
        {"stop": ["two three"]},
        {"n": 2, "logprobs": True},
        {"tools": [fn("f"), fn("g")]},
    ],
)
async def test_tokenspeed_merged_adds_up_to_kept_up(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    body: dict[str, Any] = {"max_tokens": 40, "stream_options": {"include_usage": True}, **extra}
    steps = TOOL_STEPS if "tools" in extra else STEPS
    answers = []
    events = []
    for k in (1, 3, None):
        with trio.fail_after(DEADLINE_S):
            async with harness(
                plan=lambda r: steps_of(tok, *steps),
                protocol="tokenspeed",
                config=HERMES,
                reasoning_parser="qwen3",
            ) as h:
                ts_steps_per_message(h.engine, monkeypatch, k)
                raw = await _chat_raw(h, body)
                assert h.client.inflight_count == 0
        answers.append(chat_summary(raw))
        events.append(raw.count(b"data: "))
    assert events[2] < events[0]  # the steps were taken together
    for a in answers[1:]:
        assert a == answers[0]


@pytest.mark.parametrize("path", [p for p in PATHS if p != "/v1/responses"])  # (no stop)
async def test_a_stop_string_inside_steps_taken_together_aborts_the_engine(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A stop string matched inside a message of several steps (more follow) ends the
    answer there and ABORTs the engine request."""
    words = [f"w{i} " for i in range(200)]
    stop = {"stop_sequences": ["w4 w5"]} if path == "/v1/messages" else {"stop": ["w4 w5"]}
    body = _body(path, max_tokens=400, **stop)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *words)) as h:
            steps_per_message(h.engine, monkeypatch, 3)
            resp = await h.post(path, body)
            assert resp.status_code == 200
            rid = h.engine.requests[-1].request_id
            await h.wait_aborted([rid])
            assert h.client.inflight_count == 0
    text = resp.text.replace('"w4 w5"', "")  # the stop named as stop_reason/stop_sequence
    assert "w3 " in text
    assert "w4" not in text  # held back, then dropped with the stop
    assert "w5" not in text
    assert "w6" not in text
