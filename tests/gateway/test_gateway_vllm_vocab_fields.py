"""vLLM 0.32's ``allowed_token_ids``, ``bad_words`` and ``cache_salt`` (issue 29): sent to the
engine as vLLM's frontend sends them (``SamplingParams.allowed_token_ids``, ``bad_words`` with
``_bad_words_token_ids`` from ``update_from_tokenizer``; ``EngineCoreRequest.cache_salt``),
checked with vLLM's messages, and a 400 naming the field on TokenSpeed, never dropped."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from smg_trio.gateway.http.call import RequestCall
from smg_trio.gateway.openai.vocab_filters import bad_words_token_ids
from smg_trio.protocol.vllm import EngineCoreRequest
from smg_trio.routing.cache_aware import RouteRequest
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of


async def test_allowed_token_ids_reach_the_engine(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.chat(max_tokens=2, allowed_token_ids=[5, 7, 5])
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].raw.sampling_params["allowed_token_ids"] == [5, 7]
            res = await h.complete(max_tokens=2, allowed_token_ids=[9])
            assert h.engine.requests[-1].raw.sampling_params["allowed_token_ids"] == [9]
            plain = await h.chat(max_tokens=2)
            assert plain.status_code == 200
            assert "allowed_token_ids" not in h.engine.requests[-1].raw.sampling_params
            sent = len(h.engine.requests)
            for bad in ([], [5, tok.vocab_size]):
                res = await h.chat(max_tokens=2, allowed_token_ids=bad)
                assert res.status_code == 400, res.text
                assert res.json()["error"]["param"] == "allowed_token_ids"
            assert len(h.engine.requests) == sent


async def test_bad_words_are_tokenized_for_the_engine(harness: HarnessFactory, tok: Any) -> None:
    words = ["hello", "hello", " world"]
    unique, ids = bad_words_token_ids(words, tok) or ([], [])
    assert unique == ["hello", " world"]
    assert ids[0] == tok.encode("hello")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.chat(max_tokens=2, bad_words=words)
            assert res.status_code == 200, res.text
            sp = h.engine.requests[-1].raw.sampling_params
            assert sp["bad_words"] == unique
            assert sp["_bad_words_token_ids"] == ids
            sent = len(h.engine.requests)
            res = await h.complete(max_tokens=2, bad_words=["ok", ""])
            assert res.status_code == 400, res.text
            assert res.json()["error"]["param"] == "bad_words"
            assert "empty string" in res.json()["error"]["message"]
            assert len(h.engine.requests) == sent


async def test_cache_salt_reaches_the_engine_and_is_checked(
    harness: HarnessFactory, tok: Any
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.chat(max_tokens=2, cache_salt="tenant-a", n=2)
            assert res.status_code == 200, res.text
            assert [r.raw.cache_salt for r in h.engine.requests] == ["tenant-a"] * 2
            await h.complete(max_tokens=2)
            assert h.engine.requests[-1].raw.cache_salt is None
            sent = len(h.engine.requests)
            for bad in ("", "a/b", "x" * 129):
                res = await h.complete(max_tokens=2, cache_salt=bad)
                assert res.status_code == 400, res.text
                assert res.json()["error"]["param"] == "cache_salt"
            assert len(h.engine.requests) == sent


def test_cache_salt_sits_in_vllm_s_eighth_wire_slot() -> None:
    """vLLM 0.32's ``EngineCoreRequest``: request_id, prompt_token_ids, mm_features,
    sampling_params, pooling_params, arrival_time, lora_request, cache_salt, ..."""
    assert EngineCoreRequest.__struct_fields__[7] == "cache_salt"


async def test_cache_salt_keys_the_routing_hint(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cache_aware`` keys the prompt's blocks by the salt, as the engine does."""
    seen: list[RouteRequest | None] = []
    real = RequestCall.route_of

    def spy(self: RequestCall, body: object) -> RouteRequest | None:
        route = real(self, body)
        seen.append(route)
        return route

    monkeypatch.setattr(RequestCall, "route_of", spy)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            assert (await h.complete(max_tokens=2, cache_salt="s")).status_code == 200
            assert (await h.complete(max_tokens=2)).status_code == 200
    assert [r.cache_salt if r else "none" for r in seen] == ["s", None]


@pytest.mark.parametrize(
    ("field", "value"),
    [("allowed_token_ids", [5]), ("bad_words", ["no"]), ("cache_salt", "s")],
)
async def test_tokenspeed_refuses_vllm_only_fields(
    harness: HarnessFactory, field: str, value: Any
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(protocol="tokenspeed") as h:
            res = await h.chat(max_tokens=2, **{field: value})
            assert res.status_code == 400, res.text
            assert res.json()["error"]["param"] == field
            assert h.engine.requests == []


async def test_cache_salt_on_responses_and_messages(harness: HarnessFactory, tok: Any) -> None:
    """vLLM 0.32's Responses and Anthropic requests take ``cache_salt`` too."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.http.post(
                "/v1/responses", json={"model": "M", "input": "hi", "cache_salt": "r"}
            )
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].raw.cache_salt == "r"
            msg = {"role": "user", "content": "hi"}
            body = {"model": "M", "max_tokens": 2, "messages": [msg], "cache_salt": "m"}
            res = await h.http.post("/v1/messages", json=body)
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].raw.cache_salt == "m"
            bad = await h.http.post("/v1/messages", json={**body, "cache_salt": ""})
            assert bad.status_code == 400
