"""Reported prefix-cache hits: the engine's cached prompt tokens in ``usage`` on chat and
completions (whole and streamed, with ``--enable-prompt-tokens-details`` as in vLLM), the
Responses API's ``input_tokens_details`` and the Messages API's ``cache_read_input_tokens``."""

from __future__ import annotations

from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from smg_trio.gateway.config import GatewayHttpConfig
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory

BS = 16
DETAILS = GatewayHttpConfig(enable_prompt_tokens_details=True)
SYSTEM = "You are a helpful assistant. " * 12
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]


def _cacheable(prompt_tokens: int) -> int:
    """What a repeat of a prompt finds cached: its full blocks short of the last token."""
    return (prompt_tokens - 1) // BS * BS


async def _chat(h: Harness, **body: Any) -> dict[str, Any]:
    res = await h.chat(messages=MESSAGES, max_tokens=3, **body)
    assert res.status_code == 200, res.text
    out: dict[str, Any] = res.json()
    return out


async def test_chat_reports_cached_tokens_whole_and_streamed(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=DETAILS, block_size=BS) as h:
            first = (await _chat(h))["usage"]
            assert first["prompt_tokens_details"] == {"cached_tokens": 0}
            second = (await _chat(h))["usage"]
            cached = _cacheable(second["prompt_tokens"])
            assert cached >= 2 * BS
            assert second["prompt_tokens_details"] == {"cached_tokens": cached}
            body = {"model": "M", "messages": MESSAGES, "max_tokens": 3}
            opts = {"include_usage": True, "continuous_usage_stats": True}
            _, events = await h.stream("/v1/chat/completions", {**body, "stream_options": opts})
            usages = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
            assert usages[-1]["prompt_tokens_details"] == {"cached_tokens": cached}
            assert usages[-1]["prompt_tokens"] == second["prompt_tokens"]
            # Every chunk after the role chunk (sent before the engine answered) has them.
            assert all(u["prompt_tokens_details"]["cached_tokens"] == cached for u in usages[1:])


async def test_without_the_flag_usage_has_no_details(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(block_size=BS) as h:
            await _chat(h)
            usage = (await _chat(h))["usage"]
            assert "prompt_tokens_details" not in usage
            assert h.engine.cache.total.hits > 0  # the engine did find them


async def test_completions_count_each_prompt_once(harness: HarnessFactory) -> None:
    prompts = ["alpha beta gamma delta " * 10, "one two three four five " * 10]
    with trio.fail_after(DEADLINE_S):
        async with harness(config=DETAILS, block_size=BS) as h:
            res = await h.complete(prompt=prompts, max_tokens=2)
            assert res.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            res = await h.complete(prompt=prompts, max_tokens=2, n=2)
            usage = res.json()["usage"]
            lengths = [len(h.ids(p)) for p in prompts]
            assert usage["prompt_tokens"] == sum(lengths)
            expected = sum(_cacheable(n) for n in lengths)
            assert usage["prompt_tokens_details"] == {"cached_tokens": expected}


async def test_responses_report_input_tokens_details(harness: HarnessFactory) -> None:
    body = {"model": "M", "input": SYSTEM + " Hello", "max_output_tokens": 3, "store": False}
    with trio.fail_after(DEADLINE_S):
        async with harness(block_size=BS) as h:
            first = (await h.post("/v1/responses", body)).json()["usage"]
            assert first["input_tokens_details"] == {"cached_tokens": 0}
            second = (await h.post("/v1/responses", body)).json()["usage"]
            cached = _cacheable(second["input_tokens"])
            assert cached > 0
            assert second["input_tokens_details"] == {"cached_tokens": cached}


async def test_messages_report_cache_reads(harness: HarnessFactory) -> None:
    body = {
        "model": "M",
        "max_tokens": 3,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    headers = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
    with trio.fail_after(DEADLINE_S):
        async with harness(config=DETAILS, block_size=BS) as h:
            res = await h.post("/v1/messages", body, headers=headers)
            assert res.status_code == 200, res.text
            first = res.json()["usage"]
            assert first["cache_read_input_tokens"] == 0
            prompt_tokens = first["input_tokens"]
            second = (await h.post("/v1/messages", body, headers=headers)).json()["usage"]
            cached = _cacheable(prompt_tokens)
            assert second["cache_read_input_tokens"] == cached > 0
            assert second["input_tokens"] == prompt_tokens - cached
            _, events = await h.stream("/v1/messages", body, headers=headers)
            (delta,) = [
                e for e in events if isinstance(e, dict) and e.get("type") == "message_delta"
            ]
            assert delta["usage"]["cache_read_input_tokens"] == cached
            assert delta["usage"]["input_tokens"] == prompt_tokens - cached
        async with harness(block_size=BS) as h:
            usage = (await h.post("/v1/messages", body, headers=headers)).json()["usage"]
            assert "cache_read_input_tokens" not in usage


async def test_metrics_count_the_engines_prefix_cache_queries_and_hits(
    harness: HarnessFactory,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(block_size=BS) as h:
            await _chat(h)
            usage = (await _chat(h))["usage"]
            res = await h.http.get("/metrics")
            assert res.status_code == 200
            fams = {f.name: f for f in text_string_to_metric_families(res.text)}
    samples = {
        name: [s.value for s in fams[name].samples if s.name == name + "_total"]
        for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
    }
    prompt = usage["prompt_tokens"]
    assert samples["vllm:prefix_cache_queries"] == [2 * prompt]
    assert samples["vllm:prefix_cache_hits"] == [_cacheable(prompt)]
    assert fams["vllm:prefix_cache_hits"].samples[0].labels == {"model_name": "M"}
