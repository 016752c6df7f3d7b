"""Completions against the mock engine over real ZMQ: prompt forms, batches (prompt-major
indices), echo, legacy logprobs, stops inside multi-token steps (B09), and B05."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from smg_trio.mock import engine as mock_engine
from smg_trio.mock.engine import MockRequest
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

EOS = 2


def completion_stream_texts(events: list[Any], n: int, usage: bool = False) -> dict[int, str]:
    """Checks framing ([DONE] once and last, one finish per choice on its last chunk) and
    returns the text per index."""
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    chunks = events[:-1]
    if usage:
        assert chunks[-1]["choices"] == []
        chunks = chunks[:-1]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    groups: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        for ch in c["choices"]:
            groups.setdefault(ch["index"], []).append(ch)
    assert sorted(groups) == list(range(n))
    out = {}
    for i, cs in groups.items():
        assert [c["finish_reason"] is not None for c in cs].count(True) == 1
        assert cs[-1]["finish_reason"] is not None
        out[i] = "".join(c["text"] for c in cs)
    return out


async def test_prompt_forms_and_batch_indices(harness: HarnessFactory, tok: Any) -> None:
    """String, token ids, list of strings and list of token lists; a batch's choices are
    prompt-major and each sub-request sees its own prompt."""
    p0, p1 = tok.encode("hello"), tok.encode("the cat")

    def plan(req: MockRequest) -> list[list[int]]:
        last = req.request_id.rsplit("-", 1)[1]  # the choice index, for more than one choice
        index = last if last.isdigit() else "0"
        return steps_of(tok, "A" if req.prompt_token_ids == p0 else "B", index)

    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            for prompt in ("hello", p0):
                res = (await h.complete(prompt=prompt, max_tokens=5)).json()
                assert [c["text"] for c in res["choices"]] == ["A0"]
            for prompt in (["hello", "the cat"], [p0, p1]):
                resp = await h.complete(prompt=prompt, n=2, max_tokens=5)
                res = resp.json()
                assert [c["index"] for c in res["choices"]] == [0, 1, 2, 3]
                assert [c["text"] for c in res["choices"]] == ["A0", "A1", "B2", "B3"]
                assert res["usage"]["prompt_tokens"] == len(p0) + len(p1)
                assert res["usage"]["completion_tokens"] == 8
                _, events = await h.stream(
                    "/v1/completions", {"model": "M", "prompt": prompt, "n": 2, "max_tokens": 5}
                )
                assert completion_stream_texts(events, 4) == {0: "A0", 1: "A1", 2: "B2", 3: "B3"}
            ids = sorted(r.request_id for r in h.engine.requests[-4:])
            assert [i.rsplit("-", 1)[1] for i in ids] == ["0", "1", "2", "3"]


async def test_echo(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, " world")) as h:
            res = (await h.complete(prompt="hello", echo=True, max_tokens=5)).json()
            assert res["choices"][0]["text"] == "hello world"
            _, events = await h.stream(
                "/v1/completions", {"model": "M", "prompt": "hello", "echo": True, "max_tokens": 5}
            )
            assert completion_stream_texts(events, 1) == {0: "hello world"}
            # B16d: echo with max_tokens 0 returns the prompt and never asks the engine
            before = len(h.engine.requests)
            res = (await h.complete(prompt="P", echo=True, max_tokens=0)).json()
            assert res["choices"][0]["text"] == "P"
            assert res["choices"][0]["finish_reason"] == "length"
            assert res["usage"]["completion_tokens"] == 0
            _, events = await h.stream(
                "/v1/completions",
                {
                    "model": "M",
                    "prompt": "P",
                    "echo": True,
                    "max_tokens": 0,
                    "stream_options": {"include_usage": True},
                },
            )
            assert completion_stream_texts(events, 1, usage=True) == {0: "P"}
            assert events[-2]["usage"]["completion_tokens"] == 0
            assert len(h.engine.requests) == before


async def test_echo_with_logprobs_asks_for_prompt_logprobs(
    harness: HarnessFactory, tok: Any
) -> None:
    """On vLLM, echo+logprobs sends prompt_logprobs; the prompt's entries come first (the
    first with a null logprob) and generated tokens never leak when max_tokens is 0."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, " world")) as h:
            res = (await h.complete(prompt="hello", echo=True, logprobs=1, max_tokens=3)).json()
            assert h.engine.requests[0].raw.sampling_params["prompt_logprobs"] == 1
            lp = res["choices"][0]["logprobs"]
            prompt_tokens = [tok.token_text(t) for t in tok.encode("hello")]
            assert lp["tokens"] == [*prompt_tokens, " world"]
            assert lp["token_logprobs"][0] is None
            assert lp["top_logprobs"][0] is None
            assert lp["text_offset"] == [0, 1, 3, 5]
            res = (await h.complete(prompt="hello", echo=True, logprobs=1, max_tokens=0)).json()
            assert res["choices"][0]["text"] == "hello"
            assert res["usage"]["completion_tokens"] == 0
            assert res["choices"][0]["logprobs"]["tokens"] == prompt_tokens


async def test_b15_completion_logprobs(harness: HarnessFactory, tok: Any) -> None:
    steps = steps_of(tok, "a", "bc", "d")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            # (d) logprobs 0: four tokens, four entries in every list, only the sampled token
            res = (await h.complete(logprobs=0, max_tokens=4)).json()
            lp = res["choices"][0]["logprobs"]
            assert res["choices"][0]["text"] == "abcd"
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert len(lp[key]) == 4, key
            assert all(len(t) == 1 for t in lp["top_logprobs"])
            assert lp["text_offset"] == [0, 1, 2, 3]
            # (e) logprobs 5, streamed: each chunk's logprobs cover exactly its tokens
            _, events = await h.stream(
                "/v1/completions", {"model": "M", "prompt": "hi", "logprobs": 5, "max_tokens": 4}
            )
            assert completion_stream_texts(events, 1) == {0: "abcd"}
            offsets = []
            for ev in events[:-1]:
                ch = ev["choices"][0]
                if ch["logprobs"] is None:
                    assert ch["text"] == ""
                    continue
                assert "".join(ch["logprobs"]["tokens"]) == ch["text"]
                assert all(1 <= len(t) <= 6 for t in ch["logprobs"]["top_logprobs"])
                offsets += ch["logprobs"]["text_offset"]
            assert offsets == [0, 1, 2, 3]
            # logprobs null: no logprobs anywhere
            res = (await h.complete(max_tokens=4)).json()
            assert res["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("stream", [False, True])
async def test_b09_stop_inside_a_multi_token_step(
    harness: HarnessFactory, tok: Any, stream: bool
) -> None:
    """The stop completes inside a step that also crosses max_tokens: finish is 'stop', no
    token after the stop leaks, completion_tokens never passes the stop or max_tokens."""
    singles = steps_of(tok, *"abcdefgh")
    cases = [
        # (steps, request fields, text, finish, completion_tokens)
        (
            [*singles, tok.encode("xyij")],
            {"stop": ["xy"], "max_tokens": 10},
            "abcdefgh",
            "stop",
            10,
        ),
        (
            [*singles, tok.encode("xyij")],
            {"stop": ["xy"], "max_tokens": 20},
            "abcdefgh",
            "stop",
            10,
        ),
        ([*singles, [EOS, *tok.encode("ij")]], {"max_tokens": 10}, "abcdefgh", "stop", 9),
        ([*singles, tok.encode("i"), [EOS]], {"max_tokens": 10}, "abcdefghi", "stop", 10),
    ]
    with trio.fail_after(DEADLINE_S):
        for steps, fields, text, finish, count in cases:
            async with harness(plan=lambda r, s=steps: s) as h:
                body = {"model": "M", "prompt": "P", **fields}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                    _, events = await h.stream("/v1/completions", body)
                    assert completion_stream_texts(events, 1, usage=True) == {0: text}
                    last = [c for ev in events[:-2] for c in ev["choices"]][-1]
                    got = (last["finish_reason"], events[-2]["usage"]["completion_tokens"])
                else:
                    res = (await h.post("/v1/completions", body)).json()
                    assert res["choices"][0]["text"] == text
                    got = (res["choices"][0]["finish_reason"], res["usage"]["completion_tokens"])
                assert got == (finish, count), (fields, got)


@pytest.mark.parametrize("stream", [False, True])
async def test_b05_all_n_choices_arrive(harness: HarnessFactory, tok: Any, stream: bool) -> None:
    """n=4, child 2 stops after one token while the others run to max_tokens, with finish
    order shuffled across runs: always 4 choices, [DONE] only after all four finished."""
    rng = random.Random(5)
    lengths: dict[str, int] = {}

    def plan(req: MockRequest) -> list[list[int]]:
        i = int(req.request_id.rsplit("-", 1)[1])
        if i == 2:
            return [[*tok.encode("s"), EOS]]
        n = lengths[req.request_id] = rng.randint(2, 8)
        return [tok.encode("t")] * n

    with trio.fail_after(DEADLINE_S * 2):
        async with harness(plan=plan) as h:
            for _ in range(10):
                body = {"model": "M", "prompt": "P", "n": 4, "max_tokens": 8}
                if stream:
                    _, events = await h.stream("/v1/completions", body)
                    texts = completion_stream_texts(events, 4)
                    finishes = {
                        c["index"]: c["finish_reason"]
                        for ev in events[:-1]
                        for c in ev["choices"]
                        if c["finish_reason"]
                    }
                else:
                    res = (await h.post("/v1/completions", body)).json()
                    assert [c["index"] for c in res["choices"]] == [0, 1, 2, 3]
                    texts = {c["index"]: c["text"] for c in res["choices"]}
                    finishes = {c["index"]: c["finish_reason"] for c in res["choices"]}
                assert texts[2] == "s"
                assert finishes[2] == "stop"
                for i in (0, 1, 3):
                    rid = next(
                        r.request_id
                        for r in h.engine.requests[-4:]
                        if r.request_id.endswith(f"-{i}")
                    )
                    assert texts[i] == "t" * lengths[rid]
                    assert finishes[i] == ("length" if lengths[rid] == 8 else "stop")


async def test_a_long_running_mock_keeps_only_its_last_requests(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MockEngine.requests`` is for tests: a mock serving for hours (``serve --backend
    mock``, the benchmarks) keeps at least the last ``KEEP_REQUESTS`` and drops older ones in
    batches, so its memory stays flat (it grew by every request before)."""
    monkeypatch.setattr(mock_engine, "KEEP_REQUESTS", 3)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            for i in range(10):
                r = await h.complete(prompt=f"request {i}", max_tokens=1)
                assert r.status_code == 200, r.text
                assert 3 <= len(h.engine.requests) <= 6 or i < 3
            assert len(h.engine.requests) <= 6
            last = h.engine.requests[-1].prompt_token_ids
            assert h.engine.requests[-1].request_id != h.engine.requests[0].request_id
            assert len(last) > 0
