"""One ``/metrics`` for every frontend process: each frontend's text exposition, merged sample
by sample (counters, histograms and per-process gauges summed; gauges that are each process's
view of the same engines take the largest)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["SAME_VIEW_GAUGES", "merge_expositions"]

#: Gauges every frontend reads from the same engines (their reported load, liveness): the
#: merge keeps the largest value instead of the sum.
SAME_VIEW_GAUGES = frozenset(
    {
        "smg_worker_health",
        "smg_engine_running_requests",
        "smg_engine_waiting_requests",
        "smg_engine_kv_cache_usage",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        # its value is the scrape's time, not a count
        "vllm:lora_requests_info",
        # every frontend indexes the same engines' KV events
        "smg_kv_index_blocks",
        "smg_kv_index_from_events",
        "smg_kv_events_lag_seconds",
    }
)


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_expositions(texts: Iterable[str]) -> bytes:
    """The text exposition of the merged families of ``texts``."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                values[family.name] = {}
            keep_max = family.type == "gauge" and family.name in SAME_VIEW_GAUGES
            acc = values[family.name]
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    acc[key] = min(acc.get(key, sample.value), sample.value)
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in acc:
                    acc[key] = sample.value
                elif keep_max:
                    acc[key] = max(acc[key], sample.value)
                else:
                    acc[key] += sample.value
    for name, merged in families.items():
        for (sample_name, labels), value in values[name].items():
            merged.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)
