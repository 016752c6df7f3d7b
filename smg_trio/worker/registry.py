"""The registry of workers by id, URL, handshake address and model, and routing among them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, Literal, get_args

import attrs
import trio

from smg_trio.errors import SmgError
from smg_trio.protocol.types import EngineLoad
from smg_trio.worker.circuit import CircuitBreaker
from smg_trio.worker.policies import CacheAwarePolicy, LoadBalancingPolicy, RouteRequest

__all__ = [
    "ROUTABLE_STATUS",
    "Held",
    "Runtime",
    "Worker",
    "WorkerConflictError",
    "WorkerNotFoundError",
    "WorkerRegistry",
    "WorkerStatus",
]

#: The engines a ZMQ worker can run.
Runtime = Literal["vllm", "tokenspeed"]

#: ``pending`` until the handshake lands; ``ready`` serves; ``unhealthy`` lost its engine;
#: ``draining`` finishes in-flight work before removal; ``removed`` is gone from the registry.
WorkerStatus = Literal["pending", "ready", "unhealthy", "draining", "removed"]

#: The only status in which a worker receives new requests.
ROUTABLE_STATUS: Final = "ready"

#: An engine control call holds a ready worker out of routing: put to sleep or paused (the
#: admin routes ``/sleep``, ``/pause``) until woken or resumed.
Held = Literal["sleeping", "paused"]


class WorkerConflictError(SmgError):
    """A worker cannot be registered because it clashes with one already registered: the same
    URL, the same id, or the same ZMQ handshake address (e.g. a derived-port collision).
    The gateway answers 409 (smg ``WORKER_ALREADY_EXISTS``)."""

    def __init__(self, message: str, *, url: str, existing_url: str, existing_id: str) -> None:
        super().__init__(message)
        self.url = url
        self.existing_url = existing_url
        self.existing_id = existing_id


class WorkerNotFoundError(SmgError, LookupError):
    """No registered worker has this id."""


def _status_set(worker: Worker, _attribute: attrs.Attribute[Any], value: str) -> str:
    # runs before the value is stored: wake the waiters once it is, on their next checkpoint
    # (trio runs them only after this synchronous assignment finished)
    worker.changed()
    return value


@attrs.define(eq=False)
class Worker:
    """One registered worker: an engine (or DP group of engines) behind one socket set.

    Mutable; the registry hands out the same object to everyone. ``handshake_address``,
    ``url`` and ``worker_id`` are indexed by the registry and must not change after
    registration.

    Attributes:
        url: ``ipc://…`` or ``tcp://…`` endpoint the engines dial.
        model_id: The served model name requests are routed by.
        runtime: ``"vllm"`` or ``"tokenspeed"``.
        worker_id: A uuid4 string by default.
        status: See :data:`WorkerStatus`.
        dp_size: Engines (data-parallel ranks) behind this worker, ``>= 1``.
        handshake_address: The ZMQ handshake endpoint, unique across workers; ``None`` if not
            yet derived.
        metadata: Discovered facts (``max_model_len``, engine version, …).
        circuit: This worker's breaker; the caller records engine/transport faults only.
        client: The engine client; opaque here.
        inflight: Requests dispatched and not finished (see :meth:`track`).
        loads: The engines' latest load snapshot, one per DP rank.
        on_change: Called after every ``status`` change (the registry that holds the worker
            sets it, to wake :meth:`WorkerRegistry.changed` waiters).
        held: Set while an engine control call holds the worker out of routing (asleep or
            paused); it then takes no requests and does not count as ready.

    Raises:
        ValueError: an unknown ``runtime`` or ``status``, or ``dp_size < 1``.
    """

    url: str
    model_id: str
    runtime: Runtime = attrs.field(
        default="vllm", validator=attrs.validators.in_(get_args(Runtime))
    )
    worker_id: str = attrs.field(factory=lambda: str(uuid.uuid4()))
    status: WorkerStatus = attrs.field(
        default="pending",
        validator=attrs.validators.in_(get_args(WorkerStatus)),
        on_setattr=attrs.setters.pipe(attrs.setters.validate, _status_set),
    )
    dp_size: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    handshake_address: str | None = None
    metadata: dict[str, Any] = attrs.field(factory=dict)
    circuit: CircuitBreaker = attrs.field(factory=CircuitBreaker)
    client: Any | None = None
    inflight: int = 0
    loads: tuple[EngineLoad, ...] = ()
    on_change: Callable[[], None] | None = attrs.field(default=None, repr=False)
    held: Held | None = attrs.field(default=None, on_setattr=_status_set)

    def changed(self) -> None:
        """Tell the registry something routing depends on changed (status, engine client)."""
        if self.on_change is not None:
            self.on_change()

    @property
    def healthy(self) -> bool:
        """Routable: ``ready``, not held (asleep or paused), and the circuit breaker allows a
        request."""
        return self.status == ROUTABLE_STATUS and self.held is None and self.circuit.allow()

    def load_score(self) -> float:
        """``max(inflight, Σ running + waiting)`` over the DP ranks, as smg's ZMQ connector
        scores engines: our own count covers requests the engine has not reported yet, the
        engine's covers load we did not send. Unit: requests."""
        reported = sum(load.num_running + load.num_waiting for load in self.loads)
        return float(max(self.inflight, reported))

    def rank_loads(self) -> list[tuple[int, float]]:
        """``(DP rank, load)`` per engine: the reported running + waiting of each rank
        (the whole worker as rank 0 before any report)."""
        if not self.loads:
            return [(0, self.load_score())]
        return [(i, float(ld.num_running + ld.num_waiting)) for i, ld in enumerate(self.loads)]

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count one request in flight for the duration of the ``with`` block (works across
        ``await``; trio tasks share one thread, so no lock is needed)."""
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1


class WorkerRegistry:
    """Workers by id, with URL and handshake-address indexes that reject collisions.

    Synchronous and lock-free: every method runs to completion without a checkpoint, so
    concurrent trio tasks always see a consistent registry. :attr:`changed` wakes tasks that
    wait for a worker to become routable.
    """

    def __init__(self) -> None:
        self._workers: dict[str, Worker] = {}
        self._by_url: dict[str, str] = {}
        self._by_handshake: dict[str, str] = {}
        self._changed = trio.Event()

    @property
    def changed(self) -> trio.Event:
        """Set at the next change of membership or of a member's status or engine client
        (then replaced by a fresh event): grab it, check the registry, then wait on it."""
        return self._changed

    def touch(self) -> None:
        """Wake :attr:`changed` waiters (a member changed in a way the registry cannot see)."""
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def register(self, worker: Worker) -> Worker:
        """Add ``worker`` and return it.

        Raises:
            WorkerConflictError: its id or URL is already registered, or its handshake address
                is claimed by another worker; the message names both URLs.
        """
        if (other := self._workers.get(worker.worker_id)) is not None:
            raise WorkerConflictError(
                f"worker id {worker.worker_id} of {worker.url} is already used by {other.url}",
                url=worker.url,
                existing_url=other.url,
                existing_id=other.worker_id,
            )
        if (other_id := self._by_url.get(worker.url)) is not None:
            raise WorkerConflictError(
                f"worker {worker.url} is already registered (worker {other_id})",
                url=worker.url,
                existing_url=self._workers[other_id].url,
                existing_id=other_id,
            )
        address = worker.handshake_address
        if address is not None and (other_id := self._by_handshake.get(address)) is not None:
            other = self._workers[other_id]
            raise WorkerConflictError(
                f"handshake address {address} of worker {worker.url} is already claimed by "
                f"worker {other.url} ({other_id}); set zmq_handshake_address explicitly",
                url=worker.url,
                existing_url=other.url,
                existing_id=other_id,
            )
        self._workers[worker.worker_id] = worker
        self._by_url[worker.url] = worker.worker_id
        if address is not None:
            self._by_handshake[address] = worker.worker_id
        worker.on_change = self.touch
        self.touch()
        return worker

    #: Alias of :meth:`register`.
    add = register

    def remove(self, worker_id: str) -> Worker:
        """Forget a worker, free its URL and handshake address, mark it ``removed``, return it.

        Raises:
            WorkerNotFoundError: no worker has this id.
        """
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            raise WorkerNotFoundError(f"no worker with id {worker_id!r}")
        del self._by_url[worker.url]
        if worker.handshake_address is not None:
            self._by_handshake.pop(worker.handshake_address, None)
        worker.status = "removed"
        worker.on_change = None
        self.touch()
        return worker

    def get(self, worker_id: str) -> Worker | None:
        """The worker with this id, or ``None``."""
        return self._workers.get(worker_id)

    def get_by_url(self, url: str) -> Worker | None:
        """The worker registered at ``url``, or ``None``."""
        worker_id = self._by_url.get(url)
        return None if worker_id is None else self._workers[worker_id]

    def list(self, model: str | None = None) -> tuple[Worker, ...]:
        """Every registered worker (of ``model``, if given), in registration order."""
        return tuple(w for w in self._workers.values() if model is None or w.model_id == model)

    def models(self) -> tuple[str, ...]:
        """Model ids with at least one registered worker (any status), sorted."""
        return tuple(sorted({w.model_id for w in self._workers.values()}))

    def workers_for(self, model: str, exclude: Collection[str] = ()) -> tuple[Worker, ...]:
        """The workers of ``model`` that may take a request now: ``ready`` with a circuit that
        allows it, and an id not in ``exclude``."""
        return tuple(
            w
            for w in self._workers.values()
            if w.model_id == model and w.worker_id not in exclude and w.healthy
        )

    def select(
        self, model: str, policy: LoadBalancingPolicy, exclude: Collection[str] = ()
    ) -> Worker | None:
        """The worker ``policy`` picks among :meth:`workers_for` ``model`` (skipping the ids in
        ``exclude``), or ``None`` if no worker is routable. The caller should count the request
        with :meth:`Worker.track`."""
        candidates: Sequence[Worker] = self.workers_for(model, exclude)
        return policy.select(candidates) if candidates else None

    def select_engine(
        self,
        model: str,
        policy: LoadBalancingPolicy,
        exclude: Collection[str] = (),
        request: RouteRequest | None = None,
        narrow: Callable[[Sequence[Worker]], Sequence[Worker]] | None = None,
    ) -> tuple[Worker, int | None] | None:
        """:meth:`select` with the request (``cache_aware`` routes by its prompt) and the DP
        rank the policy chose (``None``: the connector chooses by load). ``narrow`` may keep a
        preferred non-empty subset of the candidates first (the LoRA affinity does)."""
        candidates: Sequence[Worker] = self.workers_for(model, exclude)
        if not candidates:
            return None
        if narrow is not None:
            candidates = narrow(candidates) or candidates
        if isinstance(policy, CacheAwarePolicy):
            return policy.select_engine(candidates, request)
        worker = policy.select(candidates, request)
        return None if worker is None else (worker, None)

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._workers

    def __iter__(self) -> Iterator[Worker]:
        return iter(tuple(self._workers.values()))
