"""Prometheus metrics of one app (its own ``CollectorRegistry``), served at ``GET /metrics``.

Two families (docs/metrics.md lists every series): smg's own (``smg_router_*``,
``smg_worker_*``, ``smg_engine_*``) and vLLM 0.32's engine-level ``vllm:*`` series, per served
model (label ``model_name``), which fleet routers and the usual dashboards read. Units are
seconds and tokens. Gauges are read from the live engine clients at scrape time; per request
there are a handful of observations at its end, plus one cheap histogram bucket increment per
engine batch (``vllm:inter_token_latency_seconds``); nothing is recorded per token.
"""

from __future__ import annotations

import bisect
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from smg_trio.connector.client import EngineClient

if TYPE_CHECKING:
    from smg_trio.backend import GatewayBackend
    from smg_trio.gateway.http.admission import AdmissionGate

__all__ = ["VLLM_FINISH_REASONS", "GatewayMetrics", "ModelStats"]

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


# vLLM 0.32's bucket boundaries (vllm/v1/metrics/buckets.py), so that recording rules and
# dashboards written for vLLM read these histograms unchanged.
_VLLM_TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_VLLM_ITL_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_VLLM_REQUEST_LATENCY_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: vLLM's ``FinishReason`` strings, the values of ``finished_reason``.
VLLM_FINISH_REASONS: Final = ("stop", "length", "abort", "error", "repetition")


class FastHistogram:
    """A histogram for the trio thread only: one C ``bisect`` and two adds per observation
    (``prometheus_client``'s ``Histogram`` takes a lock and walks its buckets in Python), so it
    can be observed per engine batch. Rendered by :class:`_VllmCollector`."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose upper bound is ``>= value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return out


class ModelStats:
    """One served model's ``vllm:*`` counters and histograms (see :class:`GatewayMetrics`)."""

    __slots__ = (
        "e2e",
        "generation_tokens",
        "itl",
        "prompt_tokens",
        "success",
        "tpot",
        "ttft",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(VLLM_FINISH_REASONS, 0)
        self.ttft = FastHistogram(_VLLM_TTFT_BUCKETS)
        self.itl = FastHistogram(_VLLM_ITL_BUCKETS)
        self.tpot = FastHistogram(_VLLM_ITL_BUCKETS)
        self.e2e = FastHistogram(_VLLM_REQUEST_LATENCY_BUCKETS)

    def finish(
        self,
        *,
        e2e_s: float,
        ttft_s: float | None,
        decode_s: float | None,
        prompt_tokens: int,
        finish_reasons: Sequence[str | None],
        generation_tokens: int,
        unfinished: str,
    ) -> None:
        """Record one request that reached an engine: ``finish_reasons`` per engine request
        (``None`` for one that did not finish, counted as ``unfinished``), the prompt counted
        once per engine request that produced output, as vLLM's engines count it."""
        self.e2e.observe(e2e_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            self.prompt_tokens += prompt_tokens * len(finish_reasons)
        self.generation_tokens += generation_tokens
        if decode_s is not None and generation_tokens > 1 and len(finish_reasons) == 1:
            self.tpot.observe(decode_s / (generation_tokens - 1))
        success = self.success
        for reason in finish_reasons:
            key = unfinished if reason is None else reason
            success[key if key in success else "stop"] += 1


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["model_name"])


def _histogram(name: str, doc: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=["model_name"])


class _VllmCollector(Collector):
    """vLLM's engine-level series per served model: the gauges summed (the KV ratio
    averaged) over the model's live engines at scrape time, and the request-path stats."""

    def __init__(self, stats: dict[str, ModelStats]) -> None:
        self._stats = stats
        self.backend: GatewayBackend | None = None
        #: Prefix cache counters per model: the engines' own, carried over engine clients
        #: that come and go (a removed worker's counts stay), so each series only grows.
        self._prefix_cache: dict[str, list[int]] = {}
        self._prefix_seen: dict[int, tuple[EngineClient, int, int]] = {}

    def _prefix_cache_counts(self) -> dict[str, list[int]]:
        """``model_id -> [queries, hits]``: what each live client counted since the last
        scrape, added to the totals."""
        backend = self.backend
        if backend is None:
            return self._prefix_cache
        seen: dict[int, tuple[EngineClient, int, int]] = {}
        for model_id, client in backend.engine_clients():
            _, queries, hits = self._prefix_seen.get(id(client), (client, 0, 0))
            total = self._prefix_cache.setdefault(model_id, [0, 0])
            total[0] += client.prefix_cache_queries - queries
            total[1] += client.prefix_cache_hits - hits
            seen[id(client)] = (client, client.prefix_cache_queries, client.prefix_cache_hits)
        self._prefix_seen = seen  # holding the clients keeps their ids unique
        return self._prefix_cache

    def _loads(self) -> dict[str, tuple[int, int, list[float]]]:
        """``model_id -> (running, waiting, per-rank KV usage)`` over the live engines; every
        served model is present (zeros without a live engine)."""
        out: dict[str, tuple[int, int, list[float]]] = {}
        backend = self.backend
        if backend is None:
            return out
        for served in backend.list_models():
            out[served.model_id] = (0, 0, [])
        for model_id, client in backend.engine_clients():
            running, waiting, kv = out.get(model_id, (0, 0, []))
            for load in client.load():
                running += load.num_running
                waiting += load.num_waiting
                kv.append(load.kv_cache_usage)
            out[model_id] = (running, waiting, kv)
        return out

    def _lora_info(self) -> Iterator[Metric]:
        """``vllm:lora_requests_info`` with vLLM 0.32's labels and value (the time now): the
        adapters with requests running and waiting here, and the engines' ``max_loras``;
        only when an engine serves LoRA or an adapter is registered."""
        backend = self.backend
        if backend is None:
            return
        limits = [
            e.ready.max_loras
            for _, client in backend.engine_clients()
            for e in client.engines
            if e.ready.supports_lora
        ]
        loras = backend.loras
        if not limits and not len(loras):
            return
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        family.add_metric(
            [str(max(limits, default=0)), ",".join(loras.waiting()), ",".join(loras.running())],
            time.time(),
        )
        yield family

    def collect(self) -> Iterator[Metric]:
        running = _gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        waiting = _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        kv = _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        loads = self._loads()
        for model_id, (n_running, n_waiting, usage) in sorted(loads.items()):
            running.add_metric([model_id], n_running)
            waiting.add_metric([model_id], n_waiting)
            kv.add_metric([model_id], sum(usage) / len(usage) if usage else 0.0)
        yield from (running, waiting, kv)
        yield from self._lora_info()

        prompt = CounterMetricFamily(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels=["model_name"]
        )
        generation = CounterMetricFamily(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            labels=["model_name"],
        )  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.",
            labels=["model_name", "finished_reason"],
        )  # fmt: skip
        hists = {
            "ttft": _histogram(
                "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."
            ),
            "itl": _histogram(
                "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."
            ),
            "tpot": _histogram(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
            ),
            "e2e": _histogram(
                "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."
            ),
        }
        for model_id in sorted({*loads, *self._stats}):
            st = self._stats.get(model_id) or ModelStats()
            prompt.add_metric([model_id], st.prompt_tokens)
            generation.add_metric([model_id], st.generation_tokens)
            for reason, count in st.success.items():
                success.add_metric([model_id, reason], count)
            for key, family in hists.items():
                hist: FastHistogram = getattr(st, key)
                family.add_metric([model_id], hist.buckets(), hist.sum)
        yield from (prompt, generation, success, *hists.values())

        queries = CounterMetricFamily(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels=["model_name"],
        )
        hits = CounterMetricFamily(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels=["model_name"],
        )
        counts = self._prefix_cache_counts()
        for model_id in sorted({*loads, *counts}):
            n_queries, n_hits = counts.get(model_id, (0, 0))
            queries.add_metric([model_id], n_queries)
            hits.add_metric([model_id], n_hits)
        yield from (queries, hits)


class _RoutingCollector(Collector):
    """``cache_aware``'s KV block index and event feed, read at scrape time from the backend
    (``routing_snapshot()``, where it has one). Labels: ``worker`` and ``rank`` of the
    registered engines only (a removed worker's series go with it), ``reason`` from fixed
    sets."""

    def __init__(self, backend: GatewayBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        snapshot_of = getattr(self.backend, "routing_snapshot", None)
        snap = snapshot_of() if snapshot_of is not None else None
        if snap is None:
            return
        labels = ["worker", "rank"]
        blocks = GaugeMetricFamily(
            "smg_kv_index_blocks", "KV blocks indexed per engine", labels=labels
        )
        source = GaugeMetricFamily(
            "smg_kv_index_from_events",
            "1 when the engine is indexed by its KV events, 0 by the prompts routed to it",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "smg_kv_events_lag_seconds",
            "Age of the engine's last KV event batch when it arrived",
            labels=labels,
        )
        counters = {
            "events_received": CounterMetricFamily(
                "smg_kv_events_received", "KV events received", labels=labels
            ),
            "batches": CounterMetricFamily(
                "smg_kv_event_batches", "KV event batches applied", labels=labels
            ),
            "gaps": CounterMetricFamily(
                "smg_kv_event_gaps", "Sequence gaps (the start included)", labels=labels
            ),
            "duplicates": CounterMetricFamily(
                "smg_kv_event_duplicates", "Batches dropped as already seen", labels=labels
            ),
            "resets": CounterMetricFamily(
                "smg_kv_index_resets",
                "Times the engine's index was reset (gap, AllBlocksCleared)",
                labels=labels,
            ),
            "replays": CounterMetricFamily(
                "smg_kv_event_replays", "Replays asked of the engine", labels=labels
            ),
            "malformed": CounterMetricFamily(
                "smg_kv_events_malformed", "Malformed KV event messages dropped", labels=labels
            ),
        }
        for e in snap.engines:
            key = [e.worker, str(e.rank)]
            blocks.add_metric(key, e.blocks)
            source.add_metric(key, 1.0 if e.events else 0.0)
            if e.events:
                lag.add_metric(key, e.lag_s)
                for name, family in counters.items():
                    family.add_metric(key, getattr(e, name))
        yield from (blocks, source, lag, *counters.values())
        dropped = CounterMetricFamily(
            "smg_kv_index_dropped",
            "Blocks or events the index dropped or forgot, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(snap.dropped.items()):
            dropped.add_metric([reason], n)
        decisions = CounterMetricFamily(
            "smg_router_cache_aware_decisions",
            "cache_aware choices by reason (cache, placement, session, balance)",
            labels=["reason"],
        )
        for reason, n in sorted(snap.decisions.items()):
            decisions.add_metric([reason], n)
        yield from (dropped, decisions)


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


class _EndpointSeries:
    """One endpoint's children of the per-request series of :class:`GatewayMetrics`."""

    __slots__ = ("completion_tokens", "e2e", "prompt_tokens", "tpot", "ttft")

    def __init__(self, metrics: GatewayMetrics, endpoint: str) -> None:
        self.e2e = metrics.e2e.labels(endpoint)
        self.ttft = metrics.ttft.labels(endpoint)
        self.tpot = metrics.tpot.labels(endpoint)
        self.prompt_tokens = metrics.prompt_tokens.labels(endpoint)
        self.completion_tokens = metrics.completion_tokens.labels(endpoint)


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
      ``smg_engine_kv_cache_usage``;
    - per served model (``model_name``), vLLM 0.32's names and buckets:
      ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
      ``vllm:kv_cache_usage_perc`` (once :meth:`watch_backend` was called),
      ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
      ``vllm:request_success_total{finished_reason}``, ``vllm:time_to_first_token_seconds``,
      ``vllm:inter_token_latency_seconds``, ``vllm:request_time_per_output_token_seconds``,
      ``vllm:e2e_request_latency_seconds``;
    - with ``--policy cache_aware`` (per registered engine, ``worker`` and ``rank``):
      ``smg_kv_index_blocks``, ``smg_kv_index_from_events``, ``smg_kv_events_lag_seconds``,
      ``smg_kv_events_received_total``, ``smg_kv_event_batches_total``,
      ``smg_kv_event_gaps_total``, ``smg_kv_event_duplicates_total``,
      ``smg_kv_index_resets_total``, ``smg_kv_event_replays_total``,
      ``smg_kv_events_malformed_total``; ``smg_kv_index_dropped_total{reason}``,
      ``smg_router_cache_aware_decisions_total{reason}``.
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
        # The labelled children of each request's observation, looked up once per label set
        # (``labels()`` builds its key and takes a lock on every call).
        self._finished: dict[tuple[str, int], Any] = {}
        self._series: dict[str, _EndpointSeries] = {}
        self._workers = _WorkerCollector()
        r.register(self._workers)
        self._admission: _AdmissionCollector | None = None
        self._models: dict[str, ModelStats] = {}
        self._vllm = _VllmCollector(self._models)
        r.register(self._vllm)
        self._routing: _RoutingCollector | None = None

    def watch_backend(self, backend: GatewayBackend) -> None:
        """Read the ``vllm:*`` gauges from ``backend``'s live engines, and ``cache_aware``'s
        index series from it, at scrape time."""
        self._vllm.backend = backend
        if self._routing is None:
            self._routing = _RoutingCollector(backend)
            self.registry.register(self._routing)
        else:
            self._routing.backend = backend

    def model(self, model_id: str) -> ModelStats:
        """The ``vllm:*`` request stats of ``model_id`` (created on first use)."""
        stats = self._models.get(model_id)
        if stats is None:
            stats = self._models[model_id] = ModelStats()
        return stats

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
        key = (endpoint, status)
        finished = self._finished.get(key)
        if finished is None:
            finished = self._finished[key] = self.requests.labels(endpoint, str(status))
        finished.inc()
        if error_code is not None:
            self.errors.labels(endpoint, error_code).inc()
        series = self._series.get(endpoint)
        if series is None:
            series = self._series[endpoint] = _EndpointSeries(self, endpoint)
        series.e2e.observe(e2e_s)
        if ttft_s is not None:
            series.ttft.observe(ttft_s)
            if completion_tokens > 1:
                series.tpot.observe((e2e_s - ttft_s) / (completion_tokens - 1))
        if prompt_tokens:
            series.prompt_tokens.inc(prompt_tokens)
        if completion_tokens:
            series.completion_tokens.inc(completion_tokens)

    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the text exposition format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
