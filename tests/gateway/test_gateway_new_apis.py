"""What holds for chat holds for Messages and Responses: a client disconnect ABORTs the engine
request (streamed or not), the reasoning split, the metrics endpoint label, drain, engine
errors in each API's own shape, and the capability rejections of the engine's wire."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio

from smg_trio.protocol.vllm import RequestError
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of
from tests.helpers.raw_sse import RawSSE

ABORT_WITHIN_S = 1.0
HI = [{"role": "user", "content": "hi"}]
APIS = {
    "messages": ("/v1/messages", {"model": "M", "messages": HI, "max_tokens": 3000}),
    "responses": ("/v1/responses", {"model": "M", "input": "hi", "max_output_tokens": 3000}),
}


@pytest.mark.parametrize("api", sorted(APIS))
async def test_disconnect_mid_stream_aborts(harness: HarnessFactory, api: str) -> None:
    path, body = APIS[api]
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:  # random tokens until max_tokens: runs for seconds
            sse = await RawSSE.post(h.base_url, path, {**body, "stream": True}, {})
            await sse.until(lambda evs: len(evs) >= 4)  # some deltas arrived
            assert sse.status == 200
            await sse.aclose()
            ids = [r.request_id for r in h.engine.requests]
            assert len(ids) == 1
            with trio.fail_after(ABORT_WITHIN_S):
                await h.wait_aborted(ids)
            assert h.client.inflight_count == 0
            while "smg_router_requests_in_flight 0.0" not in (
                text := (await h.http.get("/metrics")).text
            ):
                pass
            assert f'smg_router_requests_total{{endpoint="{api}",status="499"}} 1.0' in text


@pytest.mark.parametrize("api", sorted(APIS))
async def test_non_streaming_disconnect_aborts(harness: HarnessFactory, api: str) -> None:
    path, body = APIS[api]
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(h.post, path, body))
                while not h.engine.active:
                    await h.engine.request_event.wait()
                nursery.cancel_scope.cancel()
            ids = [r.request_id for r in h.engine.requests]
            with trio.fail_after(ABORT_WITHIN_S):
                await h.wait_aborted(ids)
            assert h.client.inflight_count == 0


async def test_reasoning_split(harness: HarnessFactory, tok: Any) -> None:
    steps = ["<think>", "abc", "</think>", "Answer"]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *steps), reasoning_parser="qwen3") as h:
            msg = (await h.post("/v1/messages", {**APIS["messages"][1], "max_tokens": 20})).json()
            assert [b["type"] for b in msg["content"]] == ["thinking", "text"]
            assert msg["content"][0]["thinking"] == "abc"
            assert msg["content"][1]["text"] == "Answer"
            resp = await h.post("/v1/responses", {**APIS["responses"][1], "max_output_tokens": 20})
            out = resp.json()
            assert [i["type"] for i in out["output"]] == ["reasoning", "message"]
            assert out["output"][0]["content"][0]["text"] == "abc"
            assert out["output"][1]["content"][0]["text"] == "Answer"
            assert out["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
            _, events = await h.stream("/v1/messages", {**APIS["messages"][1], "max_tokens": 20})
            thinking = "".join(
                e["delta"].get("thinking", "")
                for e in events
                if isinstance(e, dict) and e.get("type") == "content_block_delta"
            )
            assert thinking == "abc"


async def test_metrics_endpoint_labels(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            for path, body in APIS.values():
                short = {**body, "max_tokens": 2, "max_output_tokens": 2}
                assert (await h.post(path, short)).status_code == 200
            assert (await h.post("/v1/tokenize", {"prompt": "x"})).status_code == 200
            text = (await h.http.get("/metrics")).text
            for label in ("messages", "responses", "tokenize"):
                assert f'smg_router_requests_total{{endpoint="{label}",status="200"}} 1.0' in text


async def test_draining_refuses_in_each_envelope(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            h.backend.start_draining()
            msg = await h.post(*APIS["messages"])
            assert msg.status_code == 503
            assert msg.json()["error"]["type"] == "overloaded_error"
            resp = await h.post(*APIS["responses"])
            assert resp.status_code == 503
            assert resp.json()["error"]["code"] == "draining"
            assert not h.engine.requests


async def test_engine_error_mid_stream_in_each_apis_shape(harness: HarnessFactory) -> None:
    bad = RequestError("engine_error", "the engine broke")
    with trio.fail_after(DEADLINE_S):
        async with harness(error_finish=lambda r: bad) as h:
            _, events = await h.stream(*APIS["messages"])
            assert events[-1]["type"] == "error"
            assert events[-1]["error"]["type"] == "api_error"
            _, events = await h.stream(*APIS["responses"])
            assert events[-1]["type"] == "response.failed"
            assert events[-1]["response"]["status"] == "failed"
            assert "[DONE]" not in events
            assert h.client.inflight_count == 0


@pytest.mark.parametrize("protocol", ["vllm", "tokenspeed"])
async def test_both_wires_serve_both_apis(harness: HarnessFactory, protocol: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(protocol=protocol) as h:
            for path, body in APIS.values():
                short = {**body, "max_tokens": 2, "max_output_tokens": 2}
                assert (await h.post(path, short)).status_code == 200
                _, events = await h.stream(path, short)
                assert events[-1]["type"] in ("message_stop", "response.incomplete")
