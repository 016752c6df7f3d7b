"""LoRA-aware routing: prefer the workers whose engines hold the request's adapter, within
their ``max_loras``, before the load-balancing policy picks among them."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TypeVar

from smg_trio.worker.registry import Worker

__all__ = ["LoraAffinity"]

W = TypeVar("W", bound=Worker)


class LoraAffinity:
    """Per worker, the adapters its engines hold as far as this gateway knows: those it
    preloaded there (``add_lora``) and those it routed requests for, least recently used
    first, at most the worker's ``max_loras`` (as the engine's own LRU cache keeps them).

    :meth:`prefer` narrows a request's candidates to the workers holding its adapter; failing
    that, to those with a free slot (loading it there evicts nothing); failing that, all."""

    def __init__(self) -> None:
        self._held: dict[str, OrderedDict[str, None]] = {}

    @staticmethod
    def _capacity(worker: Worker) -> int:
        client = getattr(worker, "client", None)
        engines = getattr(client, "engines", ()) or ()
        limits = [e.ready.max_loras for e in engines if e.ready.supports_lora]
        return min(limits) if limits else 1

    def holds(self, worker: Worker, adapter: str) -> bool:
        return adapter in self._held.get(worker.worker_id, ())

    def record(self, worker: Worker, adapter: str) -> None:
        """``adapter`` was loaded on, or routed to, ``worker`` (now its most recent)."""
        held = self._held.setdefault(worker.worker_id, OrderedDict())
        held[adapter] = None
        held.move_to_end(adapter)
        while len(held) > self._capacity(worker):
            held.popitem(last=False)

    def forget(self, adapter: str) -> None:
        """``adapter`` was unloaded everywhere."""
        for held in self._held.values():
            held.pop(adapter, None)

    def prefer(self, workers: Sequence[W], adapter: str | None) -> Sequence[W]:
        if adapter is None or len(workers) < 2:
            return workers
        holding = [w for w in workers if self.holds(w, adapter)]
        if holding:
            return holding
        free = [w for w in workers if len(self._held.get(w.worker_id, ())) < self._capacity(w)]
        return free or workers
