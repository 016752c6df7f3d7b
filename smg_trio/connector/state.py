"""An engine client's shared state, its introspection (load, ranks, wave) and its dead latch."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import trio

from smg_trio.connector.routing import RankRouter, SharedRankLoad, WaveClock
from smg_trio.connector.stream import _Entry
from smg_trio.connector.tasks import EngineTasks
from smg_trio.connector.utility import UtilityCalls
from smg_trio.errors import ClientClosed, EngineDeadError
from smg_trio.protocol.handshake import EngineCoreReadyResponse
from smg_trio.protocol.types import EngineLoad, EngineProtocol
from smg_trio.transport.handshake import READY_TIMEOUT_S, EngineRegistration
from smg_trio.transport.topology import BoundSockets

__all__ = ["ENGINE_DISCONNECT_GRACE_S", "ENGINE_SILENCE_DEATH_TIMEOUT_S", "ClientState"]

#: The engine client's logger, shared by the modules its class is split into (``client``,
#: ``output``, ``aborts``, ``connections`` and this one): log configurations name it.
log = logging.getLogger("smg_trio.connector.client")

#: No output for this long while requests are in flight means a hard-killed or wedged engine
#: (a bound PULL never errors when its peer vanishes). Idle silence is fine.
ENGINE_SILENCE_DEATH_TIMEOUT_S = 300.0
#: An engine whose input connection closes (its process died: the kernel closes its ipc
#: sockets; or it closed them) is declared dead this long after, unless a connection comes
#: back first: a socket blip, not a death. During the grace the rank takes no new requests but
#: its in-flight ones keep running (their outputs arrive on the output socket). Half a second
#: keeps death detection well under a second while covering a reconnect, which on ipc takes
#: milliseconds (libzmq's ``RECONNECT_IVL`` is 100 ms).
ENGINE_DISCONNECT_GRACE_S = 0.5


class ClientState:
    """The state every part of :class:`~smg_trio.connector.client.EngineClient` shares (set up
    here, in the constructor), its introspection, and its dead latch and close."""

    def __init__(
        self,
        protocol: EngineProtocol,
        sockets: BoundSockets,
        engines: Sequence[EngineRegistration],
        *,
        silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
        disconnect_grace_s: float | None = None,
        owns_liveness: bool = True,
        ready_timeout_s: float = READY_TIMEOUT_S,
        shared_load: SharedRankLoad | None = None,
    ) -> None:
        self.protocol = protocol
        #: False for a frontend client that attached to engines client 0 handshook: client 0
        #: watches the engines' connections; here a send to an engine not connected (yet)
        #: fails only that request, and the socket monitor is not read after the attach.
        self.owns_liveness = owns_liveness
        self._ready_timeout_s = ready_timeout_s
        self.engines = list(engines)
        self._sockets = sockets
        self._identities = [e.identity for e in self.engines]
        self._router = RankRouter(
            [e.index if e.index is not None else slot for slot, e in enumerate(self.engines)],
            shared_load,
        )
        self._registry: dict[str, _Entry] = {}
        #: Aborted ids, oldest first: their engine's identity, when the engine was last told
        #: ABORT again for a late output (:data:`REABORT_INTERVAL_S`), and when they were
        #: retired (forgotten :data:`ABORTED_TTL_S` later).
        self._aborted: OrderedDict[str, tuple[bytes, float, float]] = OrderedDict()
        self._send_lock = trio.StrictFIFOLock()
        self._silence_timeout_s = silence_timeout_s
        self._grace_s = (
            ENGINE_DISCONNECT_GRACE_S if disconnect_grace_s is None else disconnect_grace_s
        )
        #: Input connection (fd, as the socket monitor names it) -> engine slot.
        self._slot_of_fd = {
            e.connection_fd: slot
            for slot, e in enumerate(self.engines)
            if e.connection_fd is not None
        }
        #: Slots whose connection closed -> when; insertion order is disconnect order.
        self._suspects: dict[int, float] = {}
        self._lost: set[int] = set()  # slots declared dead (the others keep serving)
        #: Connections accepted while a rank was suspect (fd -> that slot), in accept order,
        #: until their ZMTP handshake is done.
        self._reconnecting: dict[int, int] = {}
        self._recv_scope: trio.CancelScope | None = None
        self._watchdog_scope = trio.CancelScope()  # cancelled by _die: a dead client is not timed
        #: The re-admission of lost ranks (reads the handshake ROUTER); cancelled by _die, so
        #: that a restarted engine's HELLO is left for the next client's handshake.
        self._readmit_scope: trio.CancelScope | None = None
        #: When the silence window last restarted: the last engine output, or the submit that
        #: made an idle client busy (idle silence is never timed).
        self._last_output = trio.current_time()
        self._dead: EngineDeadError | None = None
        self._closed = False
        self.dead_event = trio.Event()
        self._waves = WaveClock() if any(e.ready.is_lockstep for e in self.engines) else None
        self._nursery: trio.Nursery | None = None
        #: Eager ABORTs queued while the output loop dispatches (sent once per engine at the
        #: end of the batch), by engine identity.
        self._pending_aborts: dict[bytes, list[str]] = {}
        self._dispatching = False
        #: Requests given outputs (or ended) by the messages drained so far in this wake-up of
        #: the output loop, woken once they are all in (:meth:`_wake_queued`).
        self._to_wake: dict[_Entry, None] = {}
        #: Utility calls waiting for their engine's answer.
        self._utility = UtilityCalls()
        #: The engines' prefix cache counters summed over their scheduler stats so far
        #: (vLLM's ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        #: The engine's supported tasks (``get_supported_tasks``), settled by ``learn_tasks``.
        self.tasks = EngineTasks()

    # -- introspection -------------------------------------------------------------------

    @property
    def ranks(self) -> list[int]:
        """The DP rank of each engine, in slot order (its ``index``, else its slot)."""
        return self._router.indices

    @property
    def ready_responses(self) -> list[EngineCoreReadyResponse]:
        """Each engine's registration, in HELLO order."""
        return [e.ready for e in self.engines]

    @property
    def max_model_len(self) -> int:
        """Context length in tokens (the first engine's registration)."""
        return self.engines[0].ready.max_model_len

    @property
    def alive(self) -> bool:
        """False once latched dead or closed."""
        return self._dead is None and not self._closed

    @property
    def dead_reason(self) -> EngineDeadError | None:
        """Why the client latched dead, if it did."""
        return self._dead

    @property
    def inflight_count(self) -> int:
        """Requests registered and not yet retired."""
        return len(self._registry)

    def load(self) -> list[EngineLoad]:
        """Per-rank load: the engine's last report, with the running count floored at our own
        in-flight reservations on that rank. Indexed like :attr:`engines` (HELLO order, which
        need not be DP-rank order: ``engines[i].index`` is entry ``i``'s rank)."""
        out = []
        for slot, load in enumerate(self._router.loads):
            own = self._router.inflight_count(slot)
            load = load or EngineLoad()
            out.append(
                EngineLoad(max(load.num_running, own), load.num_waiting, load.kv_cache_usage)
            )
        return out

    def rank_scores(self) -> list[tuple[int, float]]:
        """``(DP rank, load score)`` of each connected rank: in-flight requests (every
        frontend's) or running + waiting, whichever is larger, plus a KV-pressure penalty
        on waiting ones (what the connector's own rank choice compares)."""
        return self._router.scores()

    @property
    def wave(self) -> int | None:
        """The lockstep wave clock, or ``None`` for independent ranks."""
        return None if self._waves is None else self._waves.wave

    @property
    def utility_pending(self) -> int:
        """Utility calls waiting for an answer."""
        return len(self._utility)

    # -- liveness (the dead latch, and close) ----------------------------------------------

    def _check_open(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"engine is dead: {self._dead}")
        if self._closed:
            raise ClientClosed("client is shutting down")

    def _die(self, error: EngineDeadError) -> None:
        """Latch dead and fail every in-flight request with ``error``."""
        if self._dead is None:
            self._dead = error
            log.error("engine client for %s is dead: %s", self._sockets.input_address, error)
        registry, self._registry = self._registry, {}
        for entry in registry.values():
            entry.close(error)
        self._utility.fail(error)
        self._router.clear()
        self.dead_event.set()
        if self._recv_scope is not None:
            self._recv_scope.cancel()
        self._watchdog_scope.cancel()
        if self._readmit_scope is not None:
            self._readmit_scope.cancel()

    def _close(self) -> None:
        self._closed = True
        registry, self._registry = self._registry, {}
        for entry in registry.values():
            entry.close(ClientClosed("engine client closed"))
        self._utility.fail(ClientClosed("engine client closed"))
        self._router.clear()
