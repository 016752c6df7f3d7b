"""The HTTP surface: models, probes, metrics, request ids, auth, draining, route errors."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import serve_http
from smg_trio.gateway.openai.capabilities import render_capabilities
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.vllm import VllmProtocol
from tests.gateway.test_gateway_rejections import assert_envelope
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of


async def test_models(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            res = await h.http.get("/v1/models")
            assert res.status_code == 200
            assert res.headers["content-type"] == "application/json"
            (card,) = res.json()["data"]
            assert res.json()["object"] == "list"
            assert (card["id"], card["object"], card["max_model_len"]) == ("M", "model", 4096)
            assert (await h.http.get("/v1/models/M")).json()["id"] == "M"
            err = assert_envelope(await h.http.get("/v1/models/nope"), 404, "model")
            assert err["code"] == "model_not_found"


async def test_probes_and_draining(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            assert (await h.http.get("/liveness")).status_code == 200
            assert (await h.http.get("/health")).status_code == 200
            r = await h.http.get("/readiness")
            assert r.status_code == 200
            assert r.json() == {"status": "ready", "healthy_workers": 1, "total_workers": 1}
            h.backend.start_draining()
            r = await h.http.get("/readiness")
            assert r.status_code == 503
            assert r.json()["reason"] == "draining"
            assert (await h.http.get("/health")).status_code == 200  # alive while draining
            err = assert_envelope(await h.chat(max_tokens=2), 503)
            assert err["code"] == "draining"
            assert h.engine.requests == []


async def test_request_id_is_honoured_and_echoed(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            r = await h.post(
                "/v1/chat/completions",
                {"model": "M", "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-request-id": "abc-123"},
            )
            assert r.headers["x-request-id"] == "abc-123"
            assert r.json()["id"] == "chatcmpl-abc-123"
            # the engine id is the response id plus a gateway-unique suffix (vLLM's rule)
            assert h.engine.requests[-1].request_id.startswith("chatcmpl-abc-123-")
            r = await h.complete(max_tokens=2)
            generated = r.headers["x-request-id"]
            assert len(generated) == 32
            assert r.json()["id"] == f"cmpl-{generated}"
            r = await h.post(
                "/v1/completions",
                {"model": "M", "prompt": "x"},
                headers={"x-correlation-id": "corr"},
            )
            assert r.headers["x-request-id"] == "corr"
            # errors and streams echo it too
            r = await h.post(
                "/v1/chat/completions",
                {"model": "nope", "messages": []},
                headers={"x-request-id": "e1"},
            )
            assert r.status_code == 404
            assert r.headers["x-request-id"] == "e1"
            r = await h.post(
                "/v1/chat/completions",
                {"model": "M", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                headers={"x-request-id": "s1"},
            )
            assert r.headers["x-request-id"] == "s1"
            assert r.headers["content-type"].startswith("text/event-stream")


async def test_same_request_id_twice_concurrently(harness: HarnessFactory, tok: Any) -> None:
    """A reused x-request-id never collides on the engine (ids in flight stay unique)."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *"abcdefgh")) as h:
            statuses: list[int] = []

            async def one() -> None:
                r = await h.post(
                    "/v1/chat/completions",
                    {"model": "M", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"x-request-id": "dup"},
                )
                statuses.append(r.status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                nursery.start_soon(one)
            assert statuses == [200, 200]
            ids = [r.request_id for r in h.engine.requests]
            assert len(set(ids)) == 2
            assert all(i.startswith("chatcmpl-dup") for i in ids)


async def test_metrics(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a", "b", "c")) as h:
            assert (await h.chat(max_tokens=3)).status_code == 200
            assert (
                await h.stream("/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 3})
            )[0].status_code == 200
            assert (await h.chat(model="nope")).status_code == 404
            r = await h.http.get("/metrics")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain")
            text = r.text
            for line in [
                'smg_router_requests_total{endpoint="chat",status="200"} 1.0',
                'smg_router_requests_total{endpoint="completions",status="200"} 1.0',
                'smg_router_requests_total{endpoint="chat",status="404"} 1.0',
                'smg_router_request_errors_total{code="model_not_found",endpoint="chat"} 1.0',
                'smg_router_completion_tokens_total{endpoint="chat"} 3.0',
                'smg_router_ttft_seconds_count{endpoint="chat"} 1.0',
                'smg_router_tpot_seconds_count{endpoint="completions"} 1.0',
                'smg_router_e2e_latency_seconds_count{endpoint="chat"} 2.0',
                "smg_router_requests_in_flight 0.0",
                'smg_worker_requests_active{worker="M-0"} 0.0',
                'smg_worker_health{worker="M-0"} 1.0',
                'smg_engine_running_requests{rank="0",worker="M-0"}',
            ]:
                assert line in text, line
            assert 'smg_router_prompt_tokens_total{endpoint="chat"}' in text


async def test_api_key(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key="sekret")) as h:
            err = assert_envelope(await h.chat(max_tokens=2), 401)
            assert (err["type"], err["code"]) == ("authentication_error", "invalid_api_key")
            bad = {"authorization": "Bearer nope"}
            assert (
                await h.post("/v1/completions", {"model": "M", "prompt": "x"}, headers=bad)
            ).status_code == 401
            assert (await h.http.get("/v1/models")).status_code == 401
            good = {"authorization": "Bearer sekret"}
            assert (await h.http.get("/v1/models", headers=good)).status_code == 200
            r = await h.post(
                "/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 2}, headers=good
            )
            assert r.status_code == 200
            for probe in ("/health", "/liveness", "/readiness", "/metrics"):
                assert (await h.http.get(probe)).status_code == 200
            assert len(h.engine.requests) == 1


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/nope", 404), ("GET", "/v1/chat/completions", 405), ("DELETE", "/v1/models", 405)],
)
async def test_route_errors_use_the_envelope(
    harness: HarnessFactory, method: str, path: str, status: int
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            assert_envelope(await h.http.request(method, path), status)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="max_n"):
        GatewayHttpConfig(max_n=0)
    with pytest.raises(ValueError, match="max_top_logprobs"):
        GatewayHttpConfig(max_top_logprobs=-1)
    assert GatewayHttpConfig(request_id_headers=("X-Foo",)).request_id_headers == ("x-foo",)


async def test_max_n_is_configurable(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(
            plan=lambda r: steps_of(tok, "a"), config=GatewayHttpConfig(max_n=2)
        ) as h:
            assert (await h.chat(n=2, max_tokens=1)).status_code == 200
            assert_envelope(await h.chat(n=3, max_tokens=1), 400, "n")


def test_capabilities_doc_is_current() -> None:
    """docs/capabilities.md is the rendering of the protocols' capability tables."""
    expected = render_capabilities([VllmProtocol.capabilities, TokenSpeedProtocol.capabilities])
    doc = Path(__file__).resolve().parents[2] / "docs" / "capabilities.md"
    assert doc.read_text(encoding="utf-8") == expected, "regenerate docs/capabilities.md"


async def test_body_too_large(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(max_body_bytes=200)) as h:
            big = [{"role": "user", "content": "x" * 500}]
            err = assert_envelope(
                await h.post("/v1/chat/completions", {"model": "M", "messages": big}), 413
            )
            assert err["code"] == "request_too_large"
            assert "limit of 200 bytes" in err["message"]
            assert h.engine.requests == []


async def test_serve_http_binds_port_zero_and_stops_on_trigger(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(
                    partial(serve_http, h.app, "127.0.0.1", 0, shutdown_trigger=stop.wait)
                )
                assert len(binds) == 1
                assert binds[0].startswith("http://127.0.0.1:")
                assert not binds[0].endswith(":0")
                async with httpx.AsyncClient(base_url=binds[0], verify=False) as http:
                    assert (await http.get("/liveness")).status_code == 200
                stop.set()  # serve_http returns: the nursery closes without a cancel
