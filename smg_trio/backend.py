"""The seam between the HTTP front and the worker layer: served models, leases, readiness."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import attrs

from smg_trio.connector.client import EngineClient
from smg_trio.errors import SmgError
from smg_trio.lora import LoraAdapter, LoraRegistry
from smg_trio.protocol.types import EngineProtocol
from smg_trio.routing.cache_aware import RouteRequest
from smg_trio.tokenizer.core import Tokenizer
from smg_trio.tokenizer.pooling_info import PoolingInfo

__all__ = [
    "EngineIndexStats",
    "GatewayBackend",
    "NoWorkerAvailable",
    "Readiness",
    "RoutingSnapshot",
    "ServedModel",
    "StaticBackend",
    "WorkerLease",
]


class NoWorkerAvailable(SmgError):
    """The model exists but no healthy worker can take the request now (HTTP 503 with
    ``Retry-After``)."""


@attrs.define
class ServedModel:
    """A model the gateway serves: its tokenizer and EOS ids, the engine dialect, and the
    context length in tokens (from the engine registration)."""

    model_id: str
    tokenizer: Tokenizer
    protocol: EngineProtocol
    max_model_len: int
    eos_token_id: int | None = None
    extra_eos_token_ids: list[int] = attrs.field(factory=list)
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    #: The model directory its tokenizer came from (the frontends load the same one).
    model_path: str | None = None
    #: Classifier labels and Matryoshka dimensions from ``config.json`` (pooling models).
    pooling: PoolingInfo = attrs.field(factory=PoolingInfo)
    #: ``generation_config.json``'s sampling fields, the defaults of requests that leave
    #: them unset (vLLM's ``--generation-config auto``)
    sampling_defaults: dict[str, float] = attrs.field(factory=dict)
    created: int = attrs.field(factory=lambda: int(time.time()))
    owned_by: str = "smg_trio"
    #: Set on the copy that serves a LoRA adapter: ``model_id`` is then the adapter's name
    #: (responses, usage and logs name it) and :attr:`engine_model_id` the base model.
    lora: LoraAdapter | None = None

    @property
    def engine_model_id(self) -> str:
        """The model whose workers serve this one (the base model of an adapter)."""
        return self.model_id if self.lora is None else self.lora.base_model


@attrs.define
class WorkerLease:
    """One request's use of one worker's engine client; ``rank_hint`` is the DP rank the
    policy chose (``cache_aware``), for the request's ``GenerateRequest.rank_hint``."""

    worker_id: str
    client: EngineClient
    rank_hint: int | None = None


@attrs.frozen
class EngineIndexStats:
    """One engine's part of ``cache_aware``'s index and its KV event feed (``/metrics``)."""

    worker: str
    rank: int
    blocks: int
    #: Whether the engine is indexed by its KV events (else by the prompts routed to it).
    events: bool
    events_received: int = 0
    batches: int = 0
    gaps: int = 0
    duplicates: int = 0
    resets: int = 0
    replays: int = 0
    malformed: int = 0
    lag_s: float = 0.0


@attrs.frozen
class RoutingSnapshot:
    """``cache_aware``'s state for ``/metrics``: per engine, what the index dropped by
    reason, and the decisions taken by reason."""

    engines: Sequence[EngineIndexStats]
    dropped: dict[str, int]
    decisions: dict[str, int]


@attrs.frozen
class Readiness:
    """``/readiness`` verdict: ``reason`` is empty when ready."""

    ready: bool
    reason: str
    healthy_workers: int
    total_workers: int

    @classmethod
    def evaluate(cls, *, draining: bool, healthy: int, total: int) -> Readiness:
        """Not ready while draining, with no worker registered (``no workers``: a gateway
        started empty) or with no healthy one."""
        if draining:
            return cls(False, "draining", healthy, total)
        if total == 0:
            return cls(False, "no workers", healthy, total)
        if healthy == 0:
            return cls(False, "insufficient healthy workers", healthy, total)
        return cls(True, "", healthy, total)


class GatewayBackend(Protocol):
    """What the HTTP front needs. Implemented by the worker manager and by
    :class:`StaticBackend` (fixed clients, for tests and embedding)."""

    #: The LoRA adapters requests may name as their ``model`` (``/v1/models`` lists them).
    loras: LoraRegistry

    @property
    def draining(self) -> bool:
        """True once shutdown began: readiness fails and new requests get 503."""

    def list_models(self) -> Sequence[ServedModel]:
        """Models with at least one ready worker (``/v1/models``)."""

    def known_models(self) -> Sequence[str]:
        """Ids of the models requests may name: a worker of theirs is registered, ready or not
        (or left a moment ago). Others are a 404."""

    def get_model(self, model_id: str) -> ServedModel | None:
        """Exact-match lookup (model ids are case- and space-sensitive) among the known models
        whose tokenizer has loaded."""

    async def wait_for_worker(self, model_id: str, *, exclude: Collection[str] = ()) -> None:
        """Return once :meth:`lease` can pick a worker (no checkpoint when it can at once);
        a known model without one waits a bounded time, then raises
        :class:`NoWorkerAvailable`."""

    def lease(
        self, model_id: str, exclude: Collection[str] = (), route: RouteRequest | None = None
    ) -> AbstractContextManager[WorkerLease]:
        """``with backend.lease(model) as lease:`` picks a worker by the load-balancing policy
        (never one whose id is in ``exclude``; ``route``: the prompt and session key, which
        ``cache_aware`` routes by) and holds an in-flight slot; an ``EngineError``
        escaping the block counts against the worker's circuit breaker, anything else (client
        4xx included) does not. ``adapter``: the request's LoRA adapter (the workers holding
        it are preferred). Raises :class:`NoWorkerAvailable` at once (see
        :meth:`wait_for_worker`)."""

    def readiness(self) -> Readiness:
        """Ready when a worker and its tokenizer are ready and the gateway is not draining."""

    def engine_clients(self) -> Sequence[tuple[str, EngineClient]]:
        """``(model_id, client)`` for every worker whose engine client is alive: the engines
        whose load ``/metrics`` reports per model."""


class StaticBackend:
    """A fixed set of (model, clients); round-robin among a model's live clients."""

    def __init__(self, entries: Sequence[tuple[ServedModel, Sequence[EngineClient]]]) -> None:
        self._models = {m.model_id: m for m, _ in entries}
        self._clients = {m.model_id: list(c) for m, c in entries}
        self._next = dict.fromkeys(self._models, 0)
        self._draining = False
        self.loras = LoraRegistry()

    @property
    def draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        """Flip readiness to 503 and refuse new requests."""
        self._draining = True

    def list_models(self) -> Sequence[ServedModel]:
        return list(self._models.values())

    def known_models(self) -> Sequence[str]:
        return list(self._models)

    def get_model(self, model_id: str) -> ServedModel | None:
        return self._models.get(model_id)

    async def wait_for_worker(self, model_id: str, *, exclude: Collection[str] = ()) -> None:
        """Fixed clients never come back: no wait (the lease raises when none is alive)."""

    @contextmanager
    def lease(
        self, model_id: str, exclude: Collection[str] = (), route: RouteRequest | None = None
    ) -> Iterator[WorkerLease]:
        clients = [
            (f"{model_id}-{i}", c)
            for i, c in enumerate(self._clients.get(model_id, []))
            if c.alive and f"{model_id}-{i}" not in exclude
        ]
        if not clients:
            raise NoWorkerAvailable(f"no healthy worker for model {model_id!r}")
        i = self._next[model_id] = (self._next[model_id] + 1) % len(clients)
        worker_id, client = clients[i]
        yield WorkerLease(worker_id=worker_id, client=client)

    def engine_clients(self) -> Sequence[tuple[str, EngineClient]]:
        return [(m, c) for m, cs in self._clients.items() for c in cs if c.alive]

    def readiness(self) -> Readiness:
        total = sum(len(c) for c in self._clients.values())
        healthy = sum(1 for cs in self._clients.values() for c in cs if c.alive)
        return Readiness.evaluate(draining=self._draining, healthy=healthy, total=total)
