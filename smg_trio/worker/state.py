"""A registered worker's lifecycle state: its spec, addresses, cancel scopes, live engine
client and the ``/workers`` representation."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from smg_trio.connector.client import EngineClient
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.worker.registry import Worker
from smg_trio.worker.spec import WorkerSpec

__all__ = ["WorkerState"]


def _set_event() -> trio.Event:
    event = trio.Event()
    event.set()
    return event


@attrs.define(eq=False, kw_only=True)
class WorkerState(Worker):
    """A registered worker (:class:`~smg_trio.worker.registry.Worker`) plus its lifecycle:
    the spec it came from, its addresses, and the cancel scopes of its registration and of its
    connection supervisor."""

    spec: WorkerSpec
    addresses: WorkerAddresses
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    registration_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    idle: trio.Event = attrs.field(factory=trio.Event)
    #: Set once the connection supervisor (and with it every socket) is gone; set while none
    #: was started.
    stopped: trio.Event = attrs.field(factory=_set_event)
    #: Set (then replaced by a fresh event) whenever ``client`` is assigned or cleared; grab it
    #: before reading ``client`` to wait for the next change without missing one.
    client_changed: trio.Event = attrs.field(factory=trio.Event)
    last_error: str | None = None
    #: Counts the engine clients this worker had: each handshake (a restarted engine's too)
    #: is a new generation, which frontend processes re-attach to.
    generation: int = 0

    def set_client(self, client: EngineClient | None) -> None:
        """Swap the live engine client (or clear it) and wake ``client_changed`` waiters."""
        self.client = client
        if client is not None:
            self.generation += 1
            self.held = None  # a new engine (a restart) is awake, whatever its last life was
        changed, self.client_changed = self.client_changed, trio.Event()
        changed.set()
        self.changed()

    @property
    def engine_client(self) -> EngineClient | None:
        """The live engine client, if connected."""
        return self.client if isinstance(self.client, EngineClient) else None

    @property
    def healthy(self) -> bool:
        """Routable: ready, circuit closed, and the engine client alive."""
        c = self.engine_client
        return super().healthy and c is not None and c.alive

    def load_score(self) -> float:
        """Own in-flight floor vs the engines' reported running + waiting (requests)."""
        c = self.engine_client
        if c is not None:
            self.loads = tuple(c.load())
        return super().load_score()

    def rank_loads(self) -> list[tuple[int, float]]:
        """``(DP rank, load score)`` of each connected engine (the connector's rank score:
        every frontend's in-flight requests or running + waiting)."""
        c = self.engine_client
        return [] if c is None else c.rank_scores()

    def to_json(self) -> dict[str, Any]:
        """The ``/workers`` representation."""
        c = self.engine_client
        return {
            "id": self.worker_id,
            "url": self.url,
            "model_id": self.model_id,
            "runtime_type": self.runtime,
            "status": self.status,
            "held": self.held,
            "healthy": self.healthy,
            "dp_size": self.dp_size,
            "zmq_handshake_address": self.handshake_address,
            "inflight": self.inflight,
            "circuit": str(self.circuit.state),
            "metadata": self.metadata,
            "last_error": self.last_error,
            "load": [
                {
                    "num_running": ld.num_running,
                    "num_waiting": ld.num_waiting,
                    "kv_cache_usage": ld.kv_cache_usage,
                }
                for ld in (c.load() if c else [])
            ],
        }
