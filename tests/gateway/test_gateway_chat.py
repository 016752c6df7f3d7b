"""Chat completions against the mock engine over real ZMQ: content, SSE shape, usage, stops,
EOS forwarding, reasoning, logprobs and the wire fields that reach the engine."""

from __future__ import annotations

import gc
from typing import Any

import openai
import pytest
import trio

from smg_trio.mock.engine import MockRequest
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory, steps_of

HI = [{"role": "user", "content": "hi"}]
EOS = 2  # <|im_end|>: config.json's eos_token_id
EXTRA_EOS = 0  # <|endoftext|>: the extra id from generation_config.json


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "M", "messages": HI, **kw}


def by_choice(events: list[Any]) -> dict[int, list[dict[str, Any]]]:
    """Chunk choices grouped by index (usage chunk and [DONE] excluded)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for ev in events:
        if ev == "[DONE]":
            continue
        for c in ev["choices"]:
            out.setdefault(c["index"], []).append(c)
    return out


def assert_stream_shape(events: list[Any], n: int, usage: bool = False) -> dict[int, str]:
    """Role chunk first per choice, exactly one finish per choice on its last chunk, one
    shared id/created, optional usage chunk, [DONE] exactly once and last. Returns content
    per index."""
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    if usage:
        assert chunks[-1]["choices"] == []
        assert set(chunks[-1]["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
        chunks = chunks[:-1]
    assert all("usage" not in c for c in chunks)
    groups = by_choice(chunks)
    assert sorted(groups) == list(range(n))
    texts = {}
    for i, cs in groups.items():
        assert cs[0]["delta"].get("role") == "assistant"
        assert all("role" not in c["delta"] for c in cs[1:])
        finishes = [c["finish_reason"] for c in cs if c["finish_reason"] is not None]
        assert len(finishes) == 1
        assert cs[-1]["finish_reason"] is not None
        texts[i] = "".join(c["delta"].get("content") or "" for c in cs)
    return texts


async def run_both(h: Harness, **body: Any) -> tuple[dict[str, Any], list[Any]]:
    """The same chat request non-streaming and streaming (with usage)."""
    full = await h.chat(**body)
    assert full.status_code == 200, full.text
    _, events = await h.stream(
        "/v1/chat/completions", chat_body(stream_options={"include_usage": True}, **body)
    )
    return full.json(), events


# The openai client stops reading its SSE generators at [DONE] without closing them; trio's
# async-generator finalizer then warns when they are collected. That is the client's issue.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_openai_client_chat_and_stream(harness: HarnessFactory, tok: Any) -> None:
    """The official client parses both shapes; streamed deltas concatenate to the message."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world", "!")) as h:
            client = openai.AsyncOpenAI(base_url=h.base_url + "/v1", api_key="x", max_retries=0)
            try:
                res = await client.chat.completions.create(model="M", messages=HI, max_tokens=8)
                assert res.choices[0].message.content == "Hello world!"
                assert res.choices[0].finish_reason == "stop"
                assert res.usage is not None
                assert res.usage.completion_tokens == 4
                stream = await client.chat.completions.create(
                    model="M",
                    messages=HI,
                    max_tokens=8,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                parts, finishes, usage = [], [], None
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for c in chunk.choices:
                        parts.append(c.delta.content or "")
                        if c.finish_reason:
                            finishes.append(c.finish_reason)
                assert "".join(parts) == "Hello world!"
                assert finishes == ["stop"]
                assert usage is not None
                assert usage.completion_tokens == 4
                models = await client.models.list()
                assert [m.id for m in models.data] == ["M"]
            finally:
                await client.close()
                gc.collect()  # let the client's leftover generators warn inside this test


@pytest.mark.parametrize(
    ("steps", "max_tokens", "text", "finish", "tokens"),
    [
        (["A"], 1, "A", "length", 1),  # one token and the finish in the same tick
        (["A", "BCD"], 4, "ABCD", "length", 4),  # several tokens in the finishing tick
        (["A", "BCD<|im_end|>"], 20, "ABCD", "stop", 5),  # ... finishing on EOS (hidden)
    ],
)
async def test_b01_last_tokens_arrive_with_the_finish(
    harness: HarnessFactory,
    tok: Any,
    steps: list[str],
    max_tokens: int,
    text: str,
    finish: str,
    tokens: int,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *steps)) as h:
            full, events = await run_both(h, max_tokens=max_tokens)
            assert full["choices"][0]["message"]["content"] == text
            assert full["choices"][0]["finish_reason"] == finish
            assert full["usage"]["completion_tokens"] == tokens
            texts = assert_stream_shape(events, 1, usage=True)
            assert texts[0] == text
            assert by_choice(events[:-2])[0][-1]["finish_reason"] == finish
            assert events[-2]["usage"]["completion_tokens"] == tokens


@pytest.mark.parametrize("steps", [["a", "b", "c", "d", "e"], ["ab", "cd", "e"]])
async def test_b03_completion_tokens_are_counted(
    harness: HarnessFactory, tok: Any, steps: list[str]
) -> None:
    prompt_len = len(tok.encode(tok.apply_chat_template(HI, add_generation_prompt=True)))
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: [tok.encode(s) for s in steps] + [[9] * 5]) as h:
            full, events = await run_both(h, max_tokens=5)
            sent = sum(len(r.generated) for r in h.engine.requests)
            assert sent == 10  # 5 per request, as the mock counted
            for usage in (full["usage"], events[-2]["usage"]):
                assert usage["completion_tokens"] == 5
                assert usage["prompt_tokens"] == prompt_len
                assert usage["total_tokens"] == prompt_len + 5


async def test_b11_eos_ids_and_single_token_stops_reach_the_engine(
    harness: HarnessFactory, tok: Any
) -> None:
    steps = [*steps_of(tok, "a", "b", "c"), [EOS], *steps_of(tok, "x", "y")]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            res = (await h.chat()).json()  # no max_tokens: the engine must stop on EOS
            sp = h.engine.requests[0].raw.sampling_params
            assert sp["_eos_token_id"] == EOS
            assert EXTRA_EOS in sp["stop_token_ids"]
            assert set(sp["_all_stop_token_ids"]) >= {EOS, EXTRA_EOS}
            assert res["choices"][0]["message"]["content"] == "abc"
            assert res["choices"][0]["finish_reason"] == "stop"
            assert res["usage"]["completion_tokens"] == 4
            assert h.engine.requests[0].generated[-1] == EOS

            res = (await h.chat(ignore_eos=True)).json()
            sp = h.engine.requests[1].raw.sampling_params
            assert "_eos_token_id" not in sp
            assert EXTRA_EOS not in sp["stop_token_ids"]
            assert res["choices"][0]["message"]["content"] == "abcxy"  # EOS did not stop it

            dot = tok.encode(".")
            assert len(dot) == 1
            steps[:] = [*steps_of(tok, "a"), dot, *steps_of(tok, "b")]
            res = (await h.chat(stop=["."])).json()
            sp = h.engine.requests[2].raw.sampling_params
            assert dot[0] in sp["stop_token_ids"]
            assert res["choices"][0]["message"]["content"] == "a"
            assert res["choices"][0]["finish_reason"] == "stop"
            assert res["choices"][0]["stop_reason"] == dot[0]
            assert h.engine.aborts == []  # the engine stopped by itself


async def _wait_idle(h: Harness) -> None:
    while h.engine.active:
        await h.engine.abort_event.wait()


@pytest.mark.parametrize("stream", [False, True])
async def test_b10_gateway_stop_aborts_the_engine(
    harness: HarnessFactory, tok: Any, stream: bool
) -> None:
    """A multi-token stop matched in the gateway ends the sub-request at once: ABORT for
    exactly that id, usage counts tokens up to the stop, nothing leaks."""
    steps = steps_of(tok, "a", "\n", "\n") + [tok.encode("z")] * 2000
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps, step_s=0.002) as h:
            body = chat_body(stop=["\n\n"], max_tokens=500)
            if stream:
                body["stream_options"] = {"include_usage": True}
                _, events = await h.stream("/v1/chat/completions", body)
                texts = assert_stream_shape(events, 1, usage=True)
                assert texts[0] == "a"
                usage = events[-2]["usage"]
                last = by_choice(events[:-2])[0][-1]
                finish, stop_reason = last["finish_reason"], last["stop_reason"]
            else:
                res = (await h.post("/v1/chat/completions", body)).json()
                assert res["choices"][0]["message"]["content"] == "a"
                usage = res["usage"]
                finish = res["choices"][0]["finish_reason"]
                stop_reason = res["choices"][0]["stop_reason"]
            assert (finish, stop_reason) == ("stop", "\n\n")
            assert usage["completion_tokens"] == 3
            rid = h.engine.requests[0].request_id
            with trio.fail_after(1.0):
                await h.wait_aborted([rid])
                await _wait_idle(h)
            assert set(h.engine.aborts) == {rid}  # (the connector may repeat an ABORT)
            assert len(h.engine.requests[0].generated) < 100  # aborted, not run to 500


async def test_b10_n2_only_the_stopped_choice_is_aborted(harness: HarnessFactory, tok: Any) -> None:
    def plan(req: MockRequest) -> list[list[int]]:
        if req.request_id.endswith("-1"):
            return steps_of(tok, "a", "\n", "\n") + [tok.encode("z")] * 2000
        return [tok.encode("q")] * 30

    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            resp = await h.post(
                "/v1/chat/completions",
                chat_body(n=2, stop=["\n\n"], max_tokens=30),
                headers={"x-request-id": "b10"},
            )
            res = resp.json()
            c0, c1 = res["choices"]
            assert (c0["index"], c0["message"]["content"], c0["finish_reason"]) == (
                0,
                "q" * 30,
                "length",
            )
            assert (c1["index"], c1["message"]["content"], c1["finish_reason"]) == (1, "a", "stop")
            assert res["usage"]["completion_tokens"] == 33
            (sub1,) = [r.request_id for r in h.engine.requests if r.request_id.endswith("-1")]
            assert sub1.startswith("chatcmpl-b10-")
            assert set(h.engine.aborts) == {sub1}  # choice 0 ran to its end
            assert not h.engine.active


async def test_stop_string_is_held_back_and_trimmed_or_kept(
    harness: HarnessFactory, tok: Any
) -> None:
    """A possible stop prefix never leaks into a chunk; ``include_stop_str_in_output`` keeps
    the stop; a prefix that turns out not to be a stop is released."""
    steps = steps_of(tok, "a", "S", "T", "x", "S", "T", "O", "P", "b")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            full, events = await run_both(h, stop=["STOP"], max_tokens=50)
            assert full["choices"][0]["message"]["content"] == "aSTx"
            deltas = [c["delta"].get("content") for c in by_choice(events[:-2])[0]]
            assert "".join(d or "" for d in deltas) == "aSTx"
            assert not any(d and d.endswith(("S", "ST")) and d != "aSTx" for d in deltas[:-1])
            full, events = await run_both(
                h, stop=["STOP"], max_tokens=50, include_stop_str_in_output=True
            )
            assert full["choices"][0]["message"]["content"] == "aSTxSTOP"
            assert assert_stream_shape(events, 1, usage=True)[0] == "aSTxSTOP"
            steps[:] = steps_of(tok, "a", "S", "T", "x")
            full, events = await run_both(h, stop=["STOP"], max_tokens=50)
            assert full["choices"][0]["message"]["content"] == "aSTx"
            assert assert_stream_shape(events, 1, usage=True)[0] == "aSTx"


async def test_min_tokens_defers_stop_strings(harness: HarnessFactory, tok: Any) -> None:
    steps = steps_of(tok, "x", "y", "a", "x", "y", "b")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            res = (await h.chat(stop=["xy"], min_tokens=3, max_tokens=20)).json()
            assert res["choices"][0]["message"]["content"] == "xya"
            assert h.engine.requests[0].raw.sampling_params["min_tokens"] == 3


@pytest.mark.parametrize(
    ("parser", "kwargs", "steps", "reasoning", "content"),
    [
        ("qwen3", None, ["<think>", "abc", "</think>", "Answer"], "abc", "Answer"),
        ("qwen3", None, ["Answer"], None, "Answer"),
        ("qwen3", {"enable_thinking": False}, ["Answer"], None, "Answer"),
        (  # the prompt closed the block: a block the model still writes is content (vLLM)
            "qwen3",
            {"enable_thinking": False},
            ["<think>", "abc", "</think>", "Answer"],
            None,
            "<think>abc</think>Answer",
        ),
        ("deepseek_r1", None, ["abc", "</think>", "Answer"], "abc", "Answer"),
        (None, None, ["<think>", "abc", "</think>", "Answer"], None, "<think>abc</think>Answer"),
    ],
)
async def test_reasoning(
    harness: HarnessFactory,
    tok: Any,
    parser: str | None,
    kwargs: dict[str, Any] | None,
    steps: list[str],
    reasoning: str | None,
    content: str,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *steps), reasoning_parser=parser) as h:
            full, events = await run_both(h, max_tokens=20, chat_template_kwargs=kwargs)
            msg = full["choices"][0]["message"]
            assert msg["content"] == content
            assert msg.get("reasoning") == reasoning
            assert "reasoning_content" not in msg  # vLLM 0.32 emits only ``reasoning``
            if parser is None:
                assert "reasoning" not in msg
            cs = by_choice(events[:-2])[0]
            assert "".join(c["delta"].get("content") or "" for c in cs) == content
            streamed = "".join(c["delta"].get("reasoning") or "" for c in cs)
            assert streamed == (reasoning or "")
            assert all("reasoning_content" not in c["delta"] for c in cs)


async def test_b15_chat_logprobs(harness: HarnessFactory, tok: Any) -> None:
    steps = steps_of(tok, "Hello", " world")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            # (a) logprobs without top_logprobs: one entry per token, top_logprobs empty
            res = (await h.chat(logprobs=True, max_tokens=10)).json()
            content = res["choices"][0]["logprobs"]["content"]
            assert len(content) == res["usage"]["completion_tokens"] == 3
            for e in content:
                assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
                assert e["top_logprobs"] == []
                assert bytes(e["bytes"]).decode() == e["token"]
            assert "".join(e["token"] for e in content) == "Hello world"
            assert h.engine.requests[0].raw.sampling_params["logprobs"] == 0
            # top_logprobs k: k candidates each, in rank order
            res = (await h.chat(logprobs=True, top_logprobs=3, max_tokens=10)).json()
            for e in res["choices"][0]["logprobs"]["content"]:
                tops = [t["logprob"] for t in e["top_logprobs"]]
                assert len(tops) == 3
                assert tops == sorted(tops, reverse=True)
            assert h.engine.requests[1].raw.sampling_params["logprobs"] == 3
            # no logprobs asked: null
            res = (await h.chat(max_tokens=10)).json()
            assert res["choices"][0]["logprobs"] is None
            assert "logprobs" not in h.engine.requests[2].raw.sampling_params


async def test_b15f_streamed_logprobs_stay_with_their_choice(
    harness: HarnessFactory, tok: Any
) -> None:
    def plan(req: MockRequest) -> list[list[int]]:
        return (
            steps_of(tok, "A", "B")
            if req.request_id.endswith("-0")
            else steps_of(tok, "x", "yz", "q")
        )

    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            _, events = await h.stream(
                "/v1/chat/completions", chat_body(n=2, logprobs=True, top_logprobs=2, max_tokens=10)
            )
            texts = assert_stream_shape(events, 2)
            assert texts == {0: "AB", 1: "xyzq"}
            for i, cs in by_choice(events[:-1]).items():
                entries = [e for c in cs if c["logprobs"] for e in c["logprobs"]["content"]]
                assert "".join(e["token"] for e in entries) == texts[i]
                assert all(len(e["top_logprobs"]) == 2 for e in entries)
                for c in cs:  # each chunk's logprobs cover exactly the chunk's text
                    if c["logprobs"]:
                        covered = "".join(e["token"] for e in c["logprobs"]["content"])
                        assert covered == (c["delta"].get("content") or "")


async def test_max_tokens_defaults_and_precedence(harness: HarnessFactory, tok: Any) -> None:
    prompt_len = len(tok.encode(tok.apply_chat_template(HI, add_generation_prompt=True)))
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            assert (await h.chat()).status_code == 200
            assert (await h.chat(max_tokens=None)).status_code == 200  # B16a: null = unset
            assert (await h.chat(max_completion_tokens=5, max_tokens=7)).status_code == 200
            got = [r.raw.sampling_params["max_tokens"] for r in h.engine.requests]
            assert got == [4096 - prompt_len, 4096 - prompt_len, 5]


async def test_sampling_fields_reach_the_vllm_wire(harness: HarnessFactory, tok: Any) -> None:
    """Never narrow silently: every field the EngineCore wire carries is sent."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            res = await h.chat(
                max_tokens=9,
                temperature=0.5,
                top_p=0.9,
                top_k=7,
                min_p=0.05,
                presence_penalty=0.5,
                frequency_penalty=-0.5,
                repetition_penalty=1.1,
                seed=42,
                min_tokens=1,
                logit_bias={"5": 2.5, "7": -100},
                stop_token_ids=[9],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                },
            )
            assert res.status_code == 200, res.text
            sp = h.engine.requests[0].raw.sampling_params
            expect = {
                "max_tokens": 9,
                "temperature": 0.5,
                "top_p": 0.9,
                "top_k": 7,
                "min_p": 0.05,
                "presence_penalty": 0.5,
                "frequency_penalty": -0.5,
                "repetition_penalty": 1.1,
                "seed": 42,
                "min_tokens": 1,
                "logit_bias": {5: 2.5, 7: -100.0},
            }
            assert {k: sp[k] for k in expect} == expect
            assert 9 in sp["stop_token_ids"]
            assert sp["structured_outputs"]["json"] == {"type": "object"}
            for body, key, value in [
                ({"response_format": {"type": "json_object"}}, "json_object", True),
                ({"guided_regex": "a+"}, "regex", "a+"),
                ({"guided_choice": ["yes", "no"]}, "choice", ["yes", "no"]),
                ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),  # GBNF quotes
                ({"guided_json": '{"type": "string"}'}, "json", {"type": "string"}),
                ({"structured_outputs": {"regex": "b+"}}, "regex", "b+"),
            ]:
                assert (await h.chat(max_tokens=2, **body)).status_code == 200
                assert h.engine.requests[-1].raw.sampling_params["structured_outputs"][key] == value
            assert (await h.chat(max_tokens=2, data_parallel_rank=0)).status_code == 200
            assert h.engine.requests[-1].raw.data_parallel_rank == 0


async def test_generation_config_defaults_fill_the_unset_fields(
    harness: HarnessFactory, tok: Any
) -> None:
    """As vLLM's server (--generation-config auto): the model's generation_config.json
    sampling fields are the defaults of a request that leaves them unset; the request's own
    values win."""
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            h.served.sampling_defaults = dict(defaults)
            assert (await h.chat(max_tokens=2)).status_code == 200
            sp = h.engine.requests[-1].raw.sampling_params
            assert {k: sp[k] for k in defaults} == defaults
            assert (await h.chat(max_tokens=2, temperature=0.0, top_k=5)).status_code == 200
            sp = h.engine.requests[-1].raw.sampling_params
            assert (sp["temperature"], sp["top_k"], sp["top_p"]) == (0.0, 5, 0.95)


async def test_sampling_fields_reach_the_tokenspeed_wire(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a"), protocol="tokenspeed") as h:
            res = await h.chat(
                max_tokens=9,
                temperature=0.5,
                top_k=7,
                min_p=0.05,
                seed=42,
                min_tokens=1,
                logit_bias={"5": 2.5},
                logprobs=True,
                guided_regex="a+",
            )
            assert res.status_code == 200, res.text
            raw = h.engine.requests[0].raw
            p = raw.sampling_params
            assert (p.max_new_tokens, p.temperature, p.top_k, p.min_p, p.seed) == (
                9,
                0.5,
                7,
                0.05,
                42,
            )
            assert (p.min_new_tokens, p.logit_bias, p.regex) == (1, {"5": 2.5}, "a+")
            assert raw.return_logprob is True
            assert res.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


async def test_continuous_usage_stats(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a", "b", "c")) as h:
            _, events = await h.stream(
                "/v1/chat/completions",
                chat_body(
                    max_tokens=5,
                    stream_options={"include_usage": True, "continuous_usage_stats": True},
                ),
            )
            counts = [ev["usage"]["completion_tokens"] for ev in events[:-1]]
            assert counts == sorted(counts)
            assert counts[0] == 0
            assert counts[-1] == 3
            # vLLM 0.32: continuous_usage_stats takes effect only with include_usage
            _, alone = await h.stream(
                "/v1/chat/completions",
                chat_body(max_tokens=5, stream_options={"continuous_usage_stats": True}),
            )
            assert len(alone) > 2
            assert all("usage" not in ev for ev in alone[:-1])


async def test_tools_are_rendered_into_the_prompt(harness: HarnessFactory, tok: Any) -> None:
    """With tool_choice 'none' the tools still reach the template (vLLM's default); 'auto'
    (explicit, or implied by tools) without --enable-auto-tool-choice is vLLM's 400."""
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            assert (await h.chat(max_tokens=2, tools=[tool], tool_choice="none")).status_code == 200
            prompt = tok.decode(h.engine.requests[0].prompt_token_ids, skip_special_tokens=False)
            assert '"name": "get_weather"' in prompt
            for extra in ({"tool_choice": "auto"}, {}):
                resp = await h.chat(max_tokens=2, tools=[tool], **extra)
                assert resp.status_code == 400, resp.text
                err = resp.json()["error"]
                assert err["param"] == "tool_choice"
                assert "--enable-auto-tool-choice" in err["message"]
            assert len(h.engine.requests) == 1


async def test_detokenization_streamed_equals_full(harness: HarnessFactory, tok: Any) -> None:
    """Multi-byte characters split across tokens never yield U+FFFD mid-stream; special
    tokens follow skip_special_tokens; the streamed deltas join to the full text."""
    text = "Café 😀 中文 ok"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # some characters span several tokens
    steps = [[t] for t in ids] + [[1], *steps_of(tok, "!")]  # 1 = <|im_start|> (special)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            for skip, expect in ((True, text + "!"), (False, text + "<|im_start|>!")):
                full, events = await run_both(h, max_tokens=50, skip_special_tokens=skip)
                assert full["choices"][0]["message"]["content"] == expect
                deltas = [c["delta"].get("content") or "" for c in by_choice(events[:-2])[0]]
                assert "".join(deltas) == expect
                assert not any("\ufffd" in d for d in deltas)


async def test_engine_error_mid_stream(harness: HarnessFactory, tok: Any) -> None:
    """Content already sent, then the engine fails the request: an SSE error event, then
    [DONE], nothing else; non-streaming gets a 500 envelope."""
    with trio.fail_after(DEADLINE_S):
        async with harness(error_finish=lambda r: len(r.generated) >= 3) as h:
            _, events = await h.stream("/v1/chat/completions", chat_body(max_tokens=50))
            assert events[-1] == "[DONE]"
            assert events.count("[DONE]") == 1
            err = events[-2]["error"]
            assert (err["code"], err["type"]) == ("engine_error", "server_error")
            content = "".join(c["delta"].get("content") or "" for c in by_choice(events[:-2])[0])
            assert content  # tokens went out before the failure
            assert all(c["finish_reason"] is None for c in by_choice(events[:-2])[0])
            res = await h.chat(max_tokens=50)
            assert res.status_code == 500
            assert res.json()["error"]["code"] == "engine_error"
