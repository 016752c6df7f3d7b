"""Issue 16, item 1: ``/metrics`` serves vLLM's engine-level series per served model (the
fleet routers' "model server protocol"), parsed with ``prometheus_client``'s own parser."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from smg_trio.backend import ServedModel
from smg_trio.gateway.http.metrics import VLLM_FINISH_REASONS, GatewayMetrics
from smg_trio.lora import LoraRegistry
from smg_trio.protocol.types import EngineLoad
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory, steps_of

#: (name as the parser reports it, type); counters lose ``_total`` in the family name.
VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}
#: vLLM 0.32's boundaries (vllm/v1/metrics/buckets.py).
TTFT_LE = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_LE = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
]  # fmt: skip
E2E_LE = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip


async def scrape(h: Harness) -> dict[str, Any]:
    r = await h.http.get("/metrics")
    assert r.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def one(samples: list[Sample], name: str, **labels: str) -> float:
    (value,) = [s.value for s in samples if s.name == name and s.labels == labels]
    return value


def les(samples: list[Sample], name: str) -> list[float]:
    bounds = [s.labels["le"] for s in samples if s.name == name + "_bucket"]
    assert bounds[-1] == "+Inf"
    return [float(b) for b in bounds[:-1]]


async def test_vllm_series_names_types_labels_and_counts(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a", "b", "c", "d")) as h:
            before = await scrape(h)
            for name in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
                # present from the start, as the endpoint pickers need them
                assert one(before[name].samples, name, model_name="M") == 0.0
            chat = await h.chat(max_tokens=2)  # length
            _, events = await h.stream(
                "/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 10}
            )  # stop: the plan ends
            fan = await h.chat(n=2, max_tokens=3)  # two engine requests
            assert (await h.chat(model="nope")).status_code == 404  # never reaches an engine
            fams = await scrape(h)

    assert chat.status_code == fan.status_code == 200
    assert events[-1] == "[DONE]"
    for name, kind in VLLM_FAMILIES.items():
        assert fams[name].type == kind, name
        for s in fams[name].samples:
            assert s.labels["model_name"] == "M", s
            assert "engine" not in s.labels  # aggregated per model
    # the smg series stay
    assert fams["smg_router_requests"].type == "counter"
    assert fams["smg_engine_kv_cache_usage"].type == "gauge"

    success = fams["vllm:request_success"].samples
    counts = {
        s.labels["finished_reason"]: s.value
        for s in success
        if s.name == "vllm:request_success_total"
    }
    assert set(counts) == set(VLLM_FINISH_REASONS)
    assert counts["length"] == 1 + 2  # the chat and both fan-out choices
    assert counts["stop"] == 1
    assert counts["abort"] == counts["error"] == 0

    generated = (
        chat.json()["usage"]["completion_tokens"] + fan.json()["usage"]["completion_tokens"] + 4
    )
    assert one(fams["vllm:generation_tokens"].samples, "vllm:generation_tokens_total", model_name="M") == generated  # fmt: skip
    prompt = one(fams["vllm:prompt_tokens"].samples, "vllm:prompt_tokens_total", model_name="M")
    # counted per engine request, as vLLM does: the fan-out's prompt twice
    assert prompt == chat.json()["usage"]["prompt_tokens"] * 3 + len(h.ids("x"))

    ttft = fams["vllm:time_to_first_token_seconds"].samples
    assert les(ttft, "vllm:time_to_first_token_seconds") == TTFT_LE
    assert one(ttft, "vllm:time_to_first_token_seconds_count", model_name="M") == 3
    e2e = fams["vllm:e2e_request_latency_seconds"].samples
    assert les(e2e, "vllm:e2e_request_latency_seconds") == E2E_LE
    assert one(e2e, "vllm:e2e_request_latency_seconds_count", model_name="M") == 3
    itl = fams["vllm:inter_token_latency_seconds"].samples
    assert les(itl, "vllm:inter_token_latency_seconds") == ITL_LE
    # one observation per batch after the first, single-choice requests only: 1 + 4
    assert one(itl, "vllm:inter_token_latency_seconds_count", model_name="M") == 1 + 4
    tpot = fams["vllm:request_time_per_output_token_seconds"].samples
    assert les(tpot, "vllm:request_time_per_output_token_seconds") == ITL_LE
    assert one(tpot, "vllm:request_time_per_output_token_seconds_count", model_name="M") == 2


async def test_gauges_read_the_engines_reported_load(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, *["a"] * 2000)) as h:
            url = httpx.URL(h.base_url)
            body = json.dumps({"model": "M", "prompt": "x", "max_tokens": 2000, "stream": True})
            async with await trio.open_tcp_stream(url.host, url.port) as stream:
                await stream.send_all(
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    f"{body}".encode()
                )
                seen = b""
                while b"data: {" not in seen:  # the engine has reported a running step
                    seen += await stream.receive_some(65536)
                h.engine.stall()
                fams = await scrape(h)
                h.engine.resume()
            # the client went away: the engine got its ABORT
            while not h.engine.aborts:
                await h.engine.abort_event.wait()
            after = await scrape(h)
    assert one(fams["vllm:num_requests_running"].samples, "vllm:num_requests_running", model_name="M") == 1  # fmt: skip
    assert one(fams["vllm:num_requests_waiting"].samples, "vllm:num_requests_waiting", model_name="M") == 0  # fmt: skip
    # the mock reports running/128 as its KV usage: only the engine knows it
    kv = one(fams["vllm:kv_cache_usage_perc"].samples, "vllm:kv_cache_usage_perc", model_name="M")
    assert kv == pytest.approx(1 / 128)
    counts = {
        s.labels["finished_reason"]: s.value
        for s in after["vllm:request_success"].samples
        if s.name == "vllm:request_success_total"
    }
    assert counts["abort"] == 1


class _FakeClient:
    engines: tuple[Any, ...] = ()  # no registrations: no engine serves LoRA
    prefix_cache_queries = 0
    prefix_cache_hits = 0

    def __init__(self, *loads: EngineLoad) -> None:
        self._loads = list(loads)

    def load(self) -> list[EngineLoad]:
        return self._loads


class _FakeBackend:
    """Two models: one with a 2-rank worker and a 1-rank worker, one with no live engine."""

    def __init__(self, tok: Any) -> None:
        self.clients = [
            ("A", _FakeClient(EngineLoad(3, 1, 0.5), EngineLoad(1, 0, 0.25))),
            ("A", _FakeClient(EngineLoad(0, 4, 0.75))),
        ]
        self.models = [ServedModel("A", tok, None, 4096), ServedModel("B", tok, None, 4096)]  # type: ignore[arg-type]
        self.loras = LoraRegistry()

    def list_models(self) -> list[ServedModel]:
        return self.models

    def engine_clients(self) -> list[tuple[str, Any]]:
        return self.clients


def test_gauges_aggregate_per_model_over_every_engine(tok: Any) -> None:
    metrics = GatewayMetrics()
    metrics.watch_backend(_FakeBackend(tok))  # type: ignore[arg-type]
    text = metrics.render()[0].decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    def gauge(name: str, model: str) -> float:
        return one(fams[name].samples, name, model_name=model)

    assert gauge("vllm:num_requests_running", "A") == 4
    assert gauge("vllm:num_requests_waiting", "A") == 5
    # the mean over the ranks: the share of the model's (equal-sized) KV pools in use
    assert gauge("vllm:kv_cache_usage_perc", "A") == pytest.approx(0.5)
    assert gauge("vllm:num_requests_running", "B") == 0
    assert gauge("vllm:kv_cache_usage_perc", "B") == 0
    # vLLM exports this only with --enable-lora (tests/gateway_admin/test_lora.py has it)
    assert "vllm:lora_requests_info" not in fams
