"""n>1 fan-out, cancellation and failures over real HTTP and real ZMQ: interleaved indices
(B04), seeds (B06), ABORT on a real client disconnect (streaming and not, B22), one request
failing among others (B24c), engine errors and engine death mid-stream."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio

from smg_trio.mock.engine import MockRequest
from tests.gateway.test_gateway_chat import assert_stream_shape, chat_body
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory, content_indices, steps_of
from tests.helpers.raw_sse import RawSSE

#: The issue's bound: every sub-request is aborted within one second of a disconnect.
ABORT_WITHIN_S = 1.0


async def test_b04_streamed_choices_interleave_with_their_own_index(
    harness: HarnessFactory, tok: Any
) -> None:
    def plan(req: MockRequest) -> list[list[int]]:
        if req.request_id.endswith("-0"):
            return [[], *steps_of(tok, "A"), [], *steps_of(tok, "B", "C")]  # child 1 leads
        return steps_of(tok, "x", "y", "z")

    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            _, events = await h.stream("/v1/chat/completions", chat_body(n=2, max_tokens=3))
            assert assert_stream_shape(events, 2) == {0: "ABC", 1: "xyz"}
            order = [
                c["index"] for ev in events[:-1] for c in ev["choices"] if c["delta"].get("content")
            ]
            assert order != sorted(order)  # really interleaved
            res = (await h.chat(n=2, max_tokens=3)).json()
            assert [(c["index"], c["message"]["content"]) for c in res["choices"]] == [
                (0, "ABC"),
                (1, "xyz"),
            ]


async def test_b06_seeds_are_derived_deterministic_and_in_range(
    harness: HarnessFactory, tok: Any
) -> None:
    with trio.fail_after(DEADLINE_S):
        for protocol in ("vllm", "tokenspeed"):
            async with harness(plan=lambda r: steps_of(tok, "a"), protocol=protocol) as h:
                for seed, expect in [
                    (1234, [1234, 1235, 1236]),
                    (1234, [1234, 1235, 1236]),  # the same request again: the same seeds
                    (2**31 - 1, [2**31 - 1, 2**31, 2**31 + 1]),  # no i32 wrap
                    (2**63 - 1, [2**63 - 1, 0, 1]),  # wraps within [0, 2**63)
                ]:
                    before = len(h.engine.requests)
                    res = await h.complete(n=3, seed=seed, temperature=1.0, max_tokens=2)
                    assert res.status_code == 200, res.text
                    got = sorted(h.engine.requests[before:], key=lambda r: r.request_id)
                    assert [r.seed for r in got] == expect, protocol
                before = len(h.engine.requests)
                assert (await h.complete(n=3, temperature=1.0, max_tokens=2)).status_code == 200
                assert [r.seed for r in h.engine.requests[before:]] == [None] * 3


@pytest.mark.parametrize("n", [1, 3])
async def test_client_disconnect_mid_stream_aborts_every_sub(
    harness: HarnessFactory, n: int
) -> None:
    """A real disconnect (the HTTP connection is closed mid-stream) ABORTs every sub."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:  # random tokens until max_tokens: runs for seconds
            body = chat_body(n=n, max_tokens=3000, stream=True)
            sse = await RawSSE.post(
                h.base_url, "/v1/chat/completions", body, {"x-request-id": "dc"}
            )
            await sse.until(lambda evs: content_indices(evs) == set(range(n)))
            assert sse.status == 200
            await sse.aclose()  # the client goes away mid-stream
            ids = [r.request_id for r in h.engine.requests]
            assert len(ids) == n
            assert all(i.startswith("chatcmpl-dc-") for i in ids)
            if n > 1:
                assert sorted(i.rsplit("-", 1)[1] for i in ids) == [str(i) for i in range(n)]
            with trio.fail_after(ABORT_WITHIN_S):
                await h.wait_aborted(ids)
                while h.engine.active:
                    await h.engine.abort_event.wait()
            assert set(h.engine.aborts) == set(ids)
            assert h.client.inflight_count == 0
            while "smg_router_requests_in_flight 0.0" not in (
                text := (await h.http.get("/metrics")).text
            ):
                pass  # each GET is a checkpoint; the stream's exit records the 499
            assert 'smg_router_requests_total{endpoint="chat",status="499"} 1.0' in text
            assert (await h.chat(max_tokens=2)).status_code == 200  # still serving


@pytest.mark.parametrize("n", [1, 3])
async def test_b22_non_streaming_disconnect_aborts(harness: HarnessFactory, n: int) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(h.chat, n=n, max_tokens=3000))
                while len(h.engine.active) < n:  # every sub is generating
                    await h.engine.request_event.wait()
                nursery.cancel_scope.cancel()  # the client gives up and closes the socket
            ids = {r.request_id for r in h.engine.requests}
            with trio.fail_after(ABORT_WITHIN_S):
                await h.wait_aborted(sorted(ids))
                while h.engine.active:
                    await h.engine.abort_event.wait()
            assert set(h.engine.aborts) == ids
            assert len(ids) == n


async def _concurrently(h: Harness, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    results: list[httpx.Response | None] = [None] * len(bodies)

    async def one(i: int) -> None:
        results[i] = await h.post("/v1/chat/completions", bodies[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(bodies)):
            nursery.start_soon(one, i)
    return [r for r in results if r is not None]


def _bad(req: MockRequest, tok: Any) -> bool:
    return tok.encode("bad")[0] in req.prompt_token_ids


@pytest.mark.parametrize(
    ("protocol", "code"), [("vllm", "engine_error"), ("tokenspeed", "engine_aborted")]
)
async def test_b24c_one_request_fails_others_finish(
    harness: HarnessFactory, tok: Any, protocol: str, code: str
) -> None:
    """The engine fails one request (vLLM: error finish; TokenSpeed: abort finish). Only
    that request fails, with a structured error; the others complete normally."""
    hook = {"error_finish" if protocol == "vllm" else "reject": lambda r: _bad(r, tok)}
    bad = [{"role": "user", "content": "bad"}]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok"), protocol=protocol, **hook) as h:
            bodies = [
                chat_body(max_tokens=4),
                chat_body(messages=bad, max_tokens=4),
                chat_body(max_tokens=4),
            ]
            good1, failed, good2 = await _concurrently(h, bodies)
            for r in (good1, good2):
                assert r.status_code == 200
                assert r.json()["choices"][0]["message"]["content"] == "ok"
            assert failed.status_code == 500
            err = failed.json()["error"]
            assert (err["code"], err["type"]) == (code, "server_error")
            resp, events = await h.stream(
                "/v1/chat/completions", chat_body(messages=bad, max_tokens=4)
            )
            assert resp.status_code == 200
            assert events[-1] == "[DONE]"
            assert events.count("[DONE]") == 1
            assert events[-2]["error"]["code"] == code
            assert (await h.chat(max_tokens=2)).status_code == 200


async def test_one_failing_sub_fails_the_stream_and_aborts_the_others(
    harness: HarnessFactory, tok: Any
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(
            error_finish=lambda r: r.request_id.endswith("-1") and len(r.generated) >= 0
        ) as h:
            resp, events = await h.stream(
                "/v1/chat/completions",
                chat_body(n=3, max_tokens=3000),
                headers={"x-request-id": "e"},
            )
            assert resp.status_code == 200
            assert events[-1] == "[DONE]"
            assert events[-2]["error"]["code"] == "engine_error"
            sub = {r.request_id[-1]: r.request_id for r in h.engine.requests}
            assert all(i.startswith("chatcmpl-e-") for i in sub.values())
            with trio.fail_after(ABORT_WITHIN_S):
                await h.wait_aborted([sub["0"], sub["2"]])
            assert sub["1"] not in h.engine.aborts  # it finished (with an error) itself
            res = await h.chat(n=3, max_tokens=3000)
            assert res.status_code == 500
            assert res.json()["error"]["code"] == "engine_error"


async def test_engine_death_mid_stream_and_after(harness: HarnessFactory) -> None:
    """A dead engine ends the open stream with an SSE error then [DONE], fails the
    in-flight non-streaming request with 503, flips /health, and new requests get 503."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            statuses: list[int] = []

            async def non_streaming() -> None:
                statuses.append((await h.chat(max_tokens=3000)).status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(non_streaming)
                sse = await RawSSE.post(
                    h.base_url, "/v1/chat/completions", chat_body(max_tokens=3000, stream=True)
                )
                await sse.until(lambda evs: content_indices(evs) == {0})
                while len(h.engine.active) < 2:
                    await h.engine.request_event.wait()
                await h.engine.die_with_sentinel()
                events = await sse.rest()
                await sse.aclose()
            assert events[-1] == "[DONE]"
            assert events.count("[DONE]") == 1
            assert events[-2]["error"]["type"] == "service_unavailable_error"
            assert statuses == [503]
            assert (await h.http.get("/health")).status_code == 503
            assert (await h.http.get("/readiness")).status_code == 503
            assert (await h.http.get("/liveness")).status_code == 200
            r = await h.chat(max_tokens=2)
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "service_unavailable_error"
            r = await h.post("/v1/chat/completions", chat_body(max_tokens=2, stream=True))
            assert r.status_code == 503
