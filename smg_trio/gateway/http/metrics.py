"""Prometheus metrics of one app (its own ``CollectorRegistry``), served at ``GET /metrics``.

Names follow smg's (``smg_router_*``, ``smg_worker_*``, ``smg_engine_*``); units are seconds
and tokens. Per-request work is a handful of observations at the end of the request; nothing
is recorded per token.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from smg_trio.connector.client import EngineClient

if TYPE_CHECKING:
    from smg_trio.gateway.http.admission import AdmissionGate

__all__ = ["GatewayMetrics"]

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class _WorkerCollector(Collector):
    """Per-worker load read at scrape time from the clients the gateway has leased."""

    def __init__(self) -> None:
        self.workers: weakref.WeakValueDictionary[str, EngineClient] = weakref.WeakValueDictionary()

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "smg_worker_requests_active", "Requests in flight on the worker", labels=["worker"]
        )
        health = GaugeMetricFamily(
            "smg_worker_health", "1 while the worker's engine client is alive", labels=["worker"]
        )
        running = GaugeMetricFamily(
            "smg_engine_running_requests", "Running requests per engine rank",
            labels=["worker", "rank"],
        )  # fmt: skip
        waiting = GaugeMetricFamily(
            "smg_engine_waiting_requests", "Waiting requests per engine rank",
            labels=["worker", "rank"],
        )  # fmt: skip
        kv = GaugeMetricFamily(
            "smg_engine_kv_cache_usage", "KV cache usage ratio per engine rank",
            labels=["worker", "rank"],
        )  # fmt: skip
        for worker, client in sorted(self.workers.items()):
            active.add_metric([worker], client.inflight_count)
            health.add_metric([worker], 1.0 if client.alive else 0.0)
            for rank, load in enumerate(client.load()):
                labels = [worker, str(rank)]
                running.add_metric(labels, load.num_running)
                waiting.add_metric(labels, load.num_waiting)
                kv.add_metric(labels, load.kv_cache_usage)
        yield from (active, health, running, waiting, kv)


class _AdmissionCollector(Collector):
    """The admission gate's queue and refusals, read at scrape time."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        gate = self._gate
        yield GaugeMetricFamily(
            "smg_router_queue_depth", "Requests waiting for a concurrency slot", gate.waiting
        )
        yield GaugeMetricFamily(
            "smg_router_concurrent_requests", "Requests holding a concurrency slot", gate.active
        )
        yield CounterMetricFamily(
            "smg_router_requests_rejected",
            "Requests refused with 429 at the concurrency limit",
            gate.rejected,
        )


class GatewayMetrics:
    """The app's metrics. ``endpoint`` labels are ``chat`` and ``completions``.

    - ``smg_router_requests_total{endpoint,status}``: finished requests by HTTP status (499:
      client went away);
    - ``smg_router_request_errors_total{endpoint,code}``: failures by error code;
    - ``smg_router_ttft_seconds``, ``smg_router_tpot_seconds`` (mean inter-token latency of
      a request), ``smg_router_e2e_latency_seconds``;
    - ``smg_router_prompt_tokens_total``, ``smg_router_completion_tokens_total``;
    - ``smg_router_requests_in_flight``;
    - ``smg_router_queue_depth``, ``smg_router_concurrent_requests``,
      ``smg_router_requests_rejected_total`` (429 at ``--max-concurrent-requests``);
    - per leased worker: ``smg_worker_requests_active``, ``smg_worker_health``,
      ``smg_engine_running_requests``, ``smg_engine_waiting_requests``,
      ``smg_engine_kv_cache_usage``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "smg_router_requests", "Finished requests", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "smg_router_request_errors", "Failed requests", ["endpoint", "code"], registry=r
        )
        self.ttft = Histogram(
            "smg_router_ttft_seconds", "Time to first token", ["endpoint"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "smg_router_tpot_seconds", "Mean inter-token latency of a request", ["endpoint"],
            buckets=_ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "smg_router_e2e_latency_seconds", "Request latency, arrival to last byte",
            ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "smg_router_prompt_tokens", "Prompt tokens", ["endpoint"], registry=r
        )
        self.completion_tokens = Counter(
            "smg_router_completion_tokens", "Completion tokens", ["endpoint"], registry=r
        )
        self.in_flight = Gauge("smg_router_requests_in_flight", "Requests in flight", registry=r)
        self._workers = _WorkerCollector()
        r.register(self._workers)
        self._admission: _AdmissionCollector | None = None

    def watch_admission(self, gate: AdmissionGate) -> None:
        """Export ``gate``'s queue depth, slots held and refusals (once per registry)."""
        if self._admission is None:
            self._admission = _AdmissionCollector(gate)
            self.registry.register(self._admission)

    def track_worker(self, worker_id: str, client: EngineClient) -> None:
        """Report this worker's load from now on (held weakly)."""
        if self._workers.workers.get(worker_id) is not client:
            self._workers.workers[worker_id] = client

    def observe(
        self,
        endpoint: str,
        status: int,
        *,
        e2e_s: float,
        ttft_s: float | None,
        prompt_tokens: int,
        completion_tokens: int,
        error_code: str | None = None,
    ) -> None:
        """Record one finished request."""
        self.requests.labels(endpoint, str(status)).inc()
        if error_code is not None:
            self.errors.labels(endpoint, error_code).inc()
        self.e2e.labels(endpoint).observe(e2e_s)
        if ttft_s is not None:
            self.ttft.labels(endpoint).observe(ttft_s)
            if completion_tokens > 1:
                self.tpot.labels(endpoint).observe((e2e_s - ttft_s) / (completion_tokens - 1))
        if prompt_tokens:
            self.prompt_tokens.labels(endpoint).inc(prompt_tokens)
        if completion_tokens:
            self.completion_tokens.labels(endpoint).inc(completion_tokens)

    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the text exposition format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
