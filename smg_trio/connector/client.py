"""The engine client: one nursery per engine connection running the output loop, with
abort-on-exit for every request (the trio replacement for Rust's ``Drop``)."""

from __future__ import annotations

import contextvars
import errno
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from smg_trio.connector.routing import RankRouter, SharedRankLoad, WaveClock
from smg_trio.connector.stream import RequestStream, _Entry
from smg_trio.connector.tasks import EngineTasks
from smg_trio.connector.utility import UtilityCalls
from smg_trio.errors import (
    ClientClosed,
    DecodeError,
    DuplicateRequestId,
    EngineDeadError,
    HandshakeError,
    InvalidDataParallelRank,
    TransportError,
    UtilityUnsupported,
)
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.handshake import EngineCoreReadyResponse
from smg_trio.protocol.types import EngineBatch, EngineLoad, EngineProtocol, GenerateRequest
from smg_trio.transport.handshake import (
    READY_TIMEOUT_S,
    EngineRegistration,
    readmit_engine,
    run_handshake,
)
from smg_trio.transport.monitor import ConnectionEvent, ConnectionMonitor
from smg_trio.transport.peer_guard import judge_connection
from smg_trio.transport.tcp import TcpOptions, endpoint_port, shut_down_connection
from smg_trio.transport.topology import BoundSockets, HandshakeSocket, bind_worker_sockets

__all__ = [
    "ABORT_GROUP",
    "ABORT_SEND_TIMEOUT_S",
    "AbortGroup",
    "ENGINE_CORE_DEAD",
    "ENGINE_DISCONNECT_GRACE_S",
    "ENGINE_SEND_TIMEOUT_S",
    "ENGINE_SILENCE_DEATH_TIMEOUT_S",
    "MAX_CONSECUTIVE_DECODE_ERRORS",
    "EngineClient",
    "attach_engine_client",
    "open_engine_client",
    "run_engine_client",
]

log = logging.getLogger(__name__)

#: The single output frame a dying engine sends (vLLM ``EngineCoreProc``, TokenSpeed on close).
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
#: A send on the input socket that cannot complete in this time means the engine stopped
#: reading; the socket may be mid-message, so it is fatal (smg ``ENGINE_SEND_TIMEOUT``).
ENGINE_SEND_TIMEOUT_S = 10.0
#: Bound on the shielded ABORT sent when a request's block exits early: cleanup must not hang
#: a cancelled caller, and a dead engine needs no abort.
ABORT_SEND_TIMEOUT_S = 1.0
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
#: One undecodable message is dropped; this many in a row means the stream is garbage.
MAX_CONSECUTIVE_DECODE_ERRORS = 3
#: The output loop handles up to this many waiting messages before it lets other tasks run.
_OUTPUT_BURST = 16
#: Ids retired by an abort are remembered so that an engine that registered the request late
#: (its ABORT raced ahead of registration) is told again when its output shows up.
_ABORTED_MEMORY = 4096
#: ... and forgotten this long after their retirement: outputs that raced an ABORT arrive
#: within an engine step or two, and an output that still comes later is ABORTed anyway as
#: an id this client does not know. Kept longer, every disconnect storm's ids stayed alive
#: until 4096 newer ones pushed them out, pinning allocator arenas (RSS grew each storm).
ABORTED_TTL_S = 5.0
#: An aborted id's outputs that keep arriving are ABORTed again at most this often: a
#: restarted frontend finds many output batches of each orphan queued for it, and told again
#: for every one, the engine got a burst of ABORTs for one request.
REABORT_INTERVAL_S = 0.25


class AbortGroup:
    """The engine requests one client request has in flight, so that all of them are ABORTed
    the moment its client is known to be gone, before the cancellation of its handler has
    unwound (under a disconnect storm that unwinding takes tens of milliseconds per batch).

    The HTTP front sets :data:`ABORT_GROUP` for the handler's task; ``generate`` blocks opened
    in it (or in tasks it starts) join it while they run."""

    __slots__ = ("_members",)

    def __init__(self) -> None:
        self._members: dict[tuple[int, str], EngineClient] = {}

    def abort_now(self) -> None:
        """Retire every member and queue its ABORT without waiting (:meth:`EngineClient.abort_nowait`)."""
        by_client: dict[int, tuple[EngineClient, list[str]]] = {}
        for (key, rid), client in self._members.items():
            by_client.setdefault(key, (client, []))[1].append(rid)
        self._members.clear()
        for client, rids in by_client.values():
            client.abort_nowait(rids)


#: The :class:`AbortGroup` of the current client request, if the HTTP front set one.
ABORT_GROUP: contextvars.ContextVar[AbortGroup | None] = contextvars.ContextVar(
    "smg_trio_abort_group", default=None
)


class EngineClient:
    """A live connection to one worker: ``len(engines)`` engines (DP ranks) on one socket set.

    Create it with :func:`open_engine_client` or :func:`run_engine_client`. All methods must be
    called from the trio thread that owns it.
    """

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

    # -- utility calls ---------------------------------------------------------------------

    async def call_utility(self, method: str, *args: Any, rank: int | None = None) -> Any:
        """Call engine ``method(*args)`` on the engine of DP rank ``rank`` (the first engine
        when ``None``) and return its result, as vLLM's ``call_utility_async`` does.

        Unbounded: the caller bounds the wait with a cancel scope; cancelled, the call leaves
        no pending entry (a late answer is dropped). Raises ``UtilityUnsupported`` (an engine
        wire with no utility calls), ``InvalidDataParallelRank``, ``UtilityCallFailed`` (the
        engine answered with a failure), ``EngineDeadError``/``ClientClosed`` (the client,
        or that rank, is gone or goes while waiting)."""
        self._check_open()
        slot = 0 if rank is None else self._router.slot_for_index(rank)
        if slot is None:
            raise InvalidDataParallelRank(rank if rank is not None else 0, len(self.engines))
        index = self._router.indices[slot]
        if slot in self._lost or self._router.down[slot]:
            raise EngineDeadError(f"engine {index} is not connected")
        call = self._utility.open(method, slot, index)
        try:
            frames = self.protocol.encode_utility(call.call_id, method, args)
            if frames is None:
                raise UtilityUnsupported(self.protocol.name, method)
            await self._send(self._identities[slot], frames)
            await call.done.wait()
            return call.outcome()
        finally:
            self._utility.discard(call)

    # -- requests ------------------------------------------------------------------------

    @asynccontextmanager
    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestStream]:
        """Submit ``request`` and yield its :class:`RequestStream`.

        Leaving the block before the terminal output, for any reason including cancellation,
        retires the request at once (later outputs for its id are dropped) and sends ABORT in a
        shielded scope bounded by ``ABORT_SEND_TIMEOUT_S``.

        Raises ``DuplicateRequestId`` (nothing sent), ``InvalidDataParallelRank``,
        ``UnsupportedField``/``ValidationError`` (from the protocol), ``EncodeError``, and
        ``EngineDeadError``/``ClientClosed`` when the client cannot take requests (or the
        rank it would go to is not connected). The stream raises ``EngineDeadError`` when its
        rank dies; the other ranks' requests carry on.
        """
        self._check_open()
        self.protocol.validate(request)
        rid = request.request_id
        if rid in self._registry:
            raise DuplicateRequestId(rid)
        frames = self.protocol.encode_add(request)
        slot = self._router.reserve(rid, request.data_parallel_rank, request.rank_hint)
        entry = _Entry(rid, slot, self._identities[slot], self._router.indices[slot])
        self._registry[rid] = entry
        self._aborted.pop(rid, None)
        if len(self._registry) == 1:
            self._last_output = trio.current_time()
        group = ABORT_GROUP.get()
        member = (id(self), rid)
        if group is not None:
            group._members[member] = self
        try:
            await self._send(entry.identity, frames)
            entry.sent = True
            # This frame lives as long as the request: do not pin the encoded prompt with it.
            del frames
            if self._waves is not None:
                await self._wake_group(self._waves.next_wake())
            yield RequestStream(entry)
        finally:
            if group is not None:
                group._members.pop(member, None)
            if not entry.finished and not entry.aborted:
                self._retire(entry)
                entry.close()
                if entry.sent and self.alive and not self._router.down[entry.rank]:
                    with trio.CancelScope(shield=True), trio.move_on_after(ABORT_SEND_TIMEOUT_S):
                        await self._send_abort(entry.identity, rid)

    async def abort(self, request_id: str) -> None:
        """Retire ``request_id`` (its stream ends with ``RequestStreamClosed``) and send ABORT.
        Unknown ids are ignored."""
        entry = self._registry.get(request_id)
        if entry is None:
            return
        self._retire(entry)
        entry.close()
        if self.alive:
            await self._send_abort(entry.identity, request_id)

    def abort_nowait(self, request_ids: Iterable[str]) -> None:
        """Retire ``request_ids`` now (their streams end with ``RequestStreamClosed``; their
        ``generate`` blocks then send nothing more) and queue one ABORT per engine without
        waiting; not a checkpoint. Called where a client is first known to be gone (a failed
        direct write, ``http.disconnect``). From inside the output loop's dispatch the ABORTs
        go out at the end of the batch, coalesced. Unknown ids are ignored."""
        pending = self._pending_aborts
        for rid in request_ids:
            entry = self._registry.get(rid)
            if entry is None or entry.finished:
                continue
            self._retire(entry)
            entry.aborted = True
            entry.close()
            if entry.sent and self.alive and not self._router.down[entry.rank]:
                pending.setdefault(entry.identity, []).append(rid)
        if not self._dispatching:
            self._flush_aborts()

    def _flush_aborts(self) -> None:
        """Send the queued eager ABORTs: at once when the socket takes them, else from a task
        in the client's nursery (bounded like any abort)."""
        pending, self._pending_aborts = self._pending_aborts, {}
        for identity, rids in pending.items():
            frames = [identity, *self.protocol.encode_abort(rids)]
            try:
                if not self._send_lock.locked() and self._sockets.input.send_multipart_nowait(
                    frames
                ):
                    continue
            except (TransportError, trio.ClosedResourceError) as exc:
                log.debug("eager abort of %d request(s) not sent: %s", len(rids), exc)
                continue
            if self._nursery is not None:
                self._nursery.start_soon(self._send_aborts_bounded, identity, rids)

    async def _send_aborts_bounded(self, identity: bytes, request_ids: list[str]) -> None:
        with trio.move_on_after(ABORT_SEND_TIMEOUT_S):
            await self._send_aborts(identity, request_ids)

    def fail_inflight(self, error: BaseException) -> int:
        """End every in-flight request's stream with ``error`` now, leaving the client alive:
        each ``generate`` block then exits and sends its ABORT as usual. Used when the gateway
        must stop waiting (its shutdown grace period ran out). Returns how many were failed."""
        entries = list(self._registry.values())  # finished entries leave the registry
        for entry in entries:
            entry.close(error)
        return len(entries)

    def kill(self, reason: str) -> None:
        """Latch the client dead now (e.g. its engine process exited): every in-flight request
        fails with ``EngineDeadError`` and ``dead_event`` is set."""
        self._die(EngineDeadError(reason))

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"engine is dead: {self._dead}")
        if self._closed:
            raise ClientClosed("client is shutting down")

    def _retire(self, entry: _Entry) -> None:
        if self._registry.get(entry.request_id) is entry:
            del self._registry[entry.request_id]
        self._router.release(entry.rank, entry.request_id)
        if not entry.finished and entry.sent and entry.rank not in self._lost:
            self._remember_aborted(entry.request_id, entry.identity)

    def _may_reabort(self, request_id: str, identity: bytes) -> bool:
        """Whether to tell the engine ABORT again for an aborted id whose output arrived: not
        within :data:`REABORT_INTERVAL_S` of the last time."""
        now = trio.current_time()
        _, last, retired = self._aborted[request_id]
        if now - last < REABORT_INTERVAL_S:
            return False
        self._aborted[request_id] = (identity, now, retired)
        return True

    def _remember_aborted(self, request_id: str, identity: bytes) -> None:
        aborted = self._aborted
        now = trio.current_time()
        aborted.pop(request_id, None)  # re-remembered: to the end, the order stays by age
        aborted[request_id] = (identity, -math.inf, now)
        if len(aborted) > _ABORTED_MEMORY:
            aborted.popitem(last=False)
        self._expire_aborted(now)

    def _expire_aborted(self, now: float) -> None:
        """Forget the aborted ids retired more than :data:`ABORTED_TTL_S` before ``now``."""
        aborted = self._aborted
        horizon = now - ABORTED_TTL_S
        while aborted and next(iter(aborted.values()))[2] < horizon:
            aborted.popitem(last=False)

    @property
    def aborted_remembered(self) -> int:
        """How many aborted ids this client still remembers (bounded in size and age)."""
        return len(self._aborted)

    async def _send(self, identity: bytes, frames: list[bytes]) -> None:
        msg = [identity, *frames]
        sock = self._sockets.input
        try:
            if not self._send_lock.locked() and sock.send_multipart_nowait(msg):
                return
            async with self._send_lock:
                with trio.move_on_after(ENGINE_SEND_TIMEOUT_S) as cs:
                    await sock.send_multipart(msg)
        except TransportError as exc:
            if exc.errno == errno.EHOSTUNREACH and identity in self._identities:
                # ROUTER_MANDATORY: that engine's connection is gone. The socket monitor
                # decides whether it comes back (a blip) or the rank is dead; only this
                # message fails here.
                slot = self._identities.index(identity)
                if self.owns_liveness:
                    self._suspect(slot)
                raise EngineDeadError(
                    f"engine {self._router.indices[slot]} is not connected"
                ) from exc
            err = EngineDeadError(f"engine input socket failed: {exc}")
            self._die(err)
            raise err from exc
        except trio.ClosedResourceError as exc:
            err = EngineDeadError(f"engine input socket failed: {exc}")
            self._die(err)
            raise err from exc
        if cs.cancelled_caught:
            err = EngineDeadError(f"engine send stuck for over {ENGINE_SEND_TIMEOUT_S:g} s")
            self._die(err)
            raise err

    def _abort_all_nowait(self) -> None:
        """Queue one ABORT per engine identity for every in-flight request, without waiting."""
        by_identity: dict[bytes, list[str]] = {}
        for entry in self._registry.values():
            if entry.sent:
                by_identity.setdefault(entry.identity, []).append(entry.request_id)
        for identity, ids in by_identity.items():
            msg = [identity, *self.protocol.encode_abort(ids)]
            try:
                queued = self._sockets.input.send_multipart_nowait(msg)
            except (TransportError, trio.ClosedResourceError):
                queued = False
            if not queued:
                log.warning("could not queue ABORT for %d stalled request(s)", len(ids))

    async def _send_abort(self, identity: bytes, request_id: str) -> None:
        await self._send_aborts(identity, [request_id])

    async def _send_aborts(self, identity: bytes, request_ids: list[str]) -> None:
        """One ABORT message for ``request_ids`` (vLLM and TokenSpeed take a list)."""
        try:
            await self._send(identity, self.protocol.encode_abort(request_ids))
        except EngineDeadError:
            log.debug("abort of %d request(s) not sent: engine is dead", len(request_ids))

    async def _wake_group(self, wave: int) -> None:
        frames = self.protocol.encode_start_wave(wave)
        if frames is None:
            return
        for identity in self._identities:
            await self._send(identity, frames)

    async def _wake_group_background(self, wave: int) -> None:
        """A wake the output loop asked for (``start_wave``). Runs in the client's nursery, so
        a failed send must not escape: ``_send`` has already latched the client dead."""
        try:
            await self._wake_group(wave)
        except EngineDeadError:
            log.debug("wake of wave %d not sent: engine is dead", wave)

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

    # -- connection watch (engine death from the socket itself) ----------------------------

    async def _watch_connections(self) -> None:
        """The input socket monitor's one reader: an engine's input connection that closes
        makes its rank suspect; one that is accepted while a rank is suspect is that rank
        coming back (the oldest suspect first: a new connection carries no identity the
        monitor reports), routable again once its ZMTP handshake is done; a rank still suspect after the grace is dead (:meth:`_rank_lost`).

        This is what sees an engine die whatever started it (``launch``, ``serve``, the
        admin API): the kernel closes a killed process's sockets, and libzmq reports it here
        within milliseconds. The silence watchdog stays as the last line of defence (a
        wedged engine keeps its sockets open)."""
        if not self.owns_liveness:
            return
        sock = self._sockets.input_monitor
        grace = self._grace_s
        try:
            while self._dead is None and not self._closed:
                due = min(self._suspects.values(), default=math.inf) + grace
                event = None
                with trio.move_on_at(due):
                    event = await sock.receive()
                if event is not None:
                    self._on_connection_event(event)
                now = trio.current_time()
                for slot, since in list(self._suspects.items()):
                    if since + grace <= now:
                        del self._suspects[slot]
                        self._rank_lost(
                            slot,
                            EngineDeadError(
                                f"engine {self._router.indices[slot]} disconnected from the"
                                f" input socket and did not reconnect within {grace:g} s"
                            ),
                        )
        except (TransportError, trio.ClosedResourceError) as exc:
            if not self._closed and self._dead is None:
                log.warning("input socket monitor failed (%s); relying on the watchdog", exc)

    def _on_connection_event(self, event: ConnectionEvent) -> None:
        fd = event.fd
        log.debug("input monitor: %s fd %d", event.kind, fd)
        if event.kind == "closed":
            self._reconnecting.pop(fd, None)
            slot = self._slot_of_fd.pop(fd, None)
            if slot is not None:
                self._suspect(slot)
        elif event.kind == "accepted":
            if self._refuse_stranger(fd, "input") or self._gone(fd):
                return
            # A suspect rank dialing back in (the oldest suspect not already claimed by an
            # earlier connection): it stays suspect until that connection's ZMTP handshake is
            # done, since the ROUTER cannot route to it before.
            claimed = set(self._reconnecting.values())
            slot = next((s for s in self._suspects if s not in claimed), None)
            if fd not in self._slot_of_fd and slot is not None:
                self._reconnecting[fd] = slot
        elif self._reconnecting:  # a handshake done: the oldest accepted connection's
            fd = next(iter(self._reconnecting))
            slot = self._reconnecting.pop(fd)
            if slot not in self._suspects:
                return
            # The new pipe and routing id are queued for the ROUTER; apply them now, or the
            # next send could go into the closed connection's pipe and be lost.
            try:
                self._sockets.input.process_commands()
            except trio.ClosedResourceError:
                return
            del self._suspects[slot]
            self._slot_of_fd[fd] = slot
            self._router.down[slot] = False
            log.info(
                "engine %d reconnected to the input socket; its requests carry on",
                self._router.indices[slot],
            )

    def _gone(self, fd: int) -> bool:
        """A tcp worker's input connection ``fd`` that is no longer open (its DISCONNECTED
        follows): it cannot be a rank coming back, and must not claim one (a refused peer's
        connection is often closed before its ACCEPTED is read)."""
        sockets = self._sockets
        port = endpoint_port(sockets.input_address)
        if sockets.tcp is None or port is None:
            return False
        return judge_connection(fd, port, sockets.tcp) is None

    def _refuse_stranger(self, fd: int, which: str) -> bool:
        """A tcp worker's connection from a peer that may not be an engine (a host not on the
        allow-list, or on this host a uid not allowed) is shut down. The peer guard already
        keeps it from completing its handshake; ending it here also keeps it out of the
        reconnect bookkeeping (:meth:`_on_connection_event`)."""
        sockets = self._sockets
        if sockets.tcp is None:
            return False
        bound = sockets.input_address if which == "input" else sockets.output_address
        port = endpoint_port(bound)
        # None: not (or no longer) that connection
        verdict = judge_connection(fd, port, sockets.tcp) if port is not None else None
        if verdict is None or verdict.allowed:
            return False
        log.warning(
            "refused a connection to the %s socket from %s: %s", which, verdict.peer, verdict.why
        )
        shut_down_connection(fd)
        return True

    async def _guard_output_peers(self, monitor: ConnectionMonitor) -> None:
        """A tcp worker's output PULL: shut down connections from peers not on the allow-list
        (the monitor's one reader)."""
        try:
            while True:
                event = await monitor.receive()
                if event is not None and event.accepted:
                    self._refuse_stranger(event.fd, "output")
        except (TransportError, trio.ClosedResourceError):
            return

    def _suspect(self, slot: int) -> None:
        """``slot``'s input connection closed: no new requests go to it; its in-flight ones
        wait out the grace period."""
        if slot in self._lost or slot in self._suspects:
            return
        for fd, s in list(self._slot_of_fd.items()):
            if s == slot:
                del self._slot_of_fd[fd]  # a send found it gone before the monitor did
        log.warning(
            "engine %d disconnected from the input socket; dead in %g s unless it reconnects",
            self._router.indices[slot],
            self._grace_s,
        )
        self._suspects[slot] = trio.current_time()
        self._router.down[slot] = True

    def _rank_lost(self, slot: int, error: EngineDeadError) -> None:
        """Fail ``slot``'s in-flight requests with ``error``; the client dies with it when no
        rank is left, or when the ranks run in lockstep (a DP wave cannot go on without one).
        The other ranks keep serving; the dead rank takes no requests (no ABORT is sent to
        it: nobody would read it)."""
        self._lost.add(slot)
        self._router.down[slot] = True
        if self._waves is not None or len(self._lost) == len(self.engines):
            self._die(error)
            return
        log.error("%s; %d other rank(s) still serving", error, len(self.engines) - len(self._lost))
        self._utility.fail(error, slot)
        registry = self._registry
        for rid, entry in list(registry.items()):
            if entry.rank == slot:
                del registry[rid]
                self._router.release(slot, rid)
                entry.close(error)
        if self._readmit_scope is None and self._nursery is not None:
            self._readmit_scope = trio.CancelScope()
            self._nursery.start_soon(self._readmit_lost, self._readmit_scope)

    # -- re-admission (a restarted rank while the others keep serving) ---------------------

    async def _readmit_lost(self, scope: trio.CancelScope) -> None:
        """While ranks are lost and the others serve, take a restarted engine of a lost rank
        back: the handshake as at startup (HELLO, INIT with this client's addresses, READY,
        the registration on the input socket), answering only the lost ranks' identities.
        A re-admitted rank is routable again at once."""
        with scope:
            while self._lost and self.alive:
                lost = {self._identities[slot] for slot in self._lost}
                try:
                    engine = await readmit_engine(
                        self._sockets, lost.__contains__, ready_timeout_s=self._ready_timeout_s
                    )
                except (HandshakeError, TransportError) as exc:
                    log.warning("re-admission of a restarted engine failed: %s", exc)
                    await trio.sleep(1.0)
                    continue
                self._readmitted(engine)
        self._readmit_scope = None

    def _readmitted(self, engine: EngineRegistration) -> None:
        slot = self._identities.index(engine.identity)
        self.engines[slot] = engine
        self._lost.discard(slot)
        self._suspects.pop(slot, None)
        for fd, s in list(self._slot_of_fd.items()):
            if s == slot:
                del self._slot_of_fd[fd]
        if engine.connection_fd is not None:
            self._slot_of_fd[engine.connection_fd] = slot
        self._router.loads[slot] = None
        self._router.down[slot] = False
        log.info(
            "engine %d restarted and re-admitted; %d rank(s) serving",
            self._router.indices[slot],
            len(self.engines) - len(self._lost),
        )

    def _dispatch(self, batch: EngineBatch) -> None:
        self._dispatching = True
        try:
            self._dispatch_batch(batch)
        finally:
            self._dispatching = False
            if self._pending_aborts:
                self._flush_aborts()

    def _wake_queued(self) -> None:
        """Wake every request that the messages drained in this wake-up gave outputs (or
        ended), once each. A consumer that fell behind the engine (several steps waiting on
        the socket) then takes them all at once: a stream writes them in one socket write
        rather than one per step, which is how a saturated gateway catches up. When it keeps
        up, a drain holds one step and nothing waits longer than the decode of that step."""
        to_wake = self._to_wake
        if not to_wake:
            return
        self._to_wake = {}
        self._dispatching = True
        try:
            for entry in to_wake:
                entry.wake()
        finally:
            self._dispatching = False
            if self._pending_aborts:
                self._flush_aborts()

    def _dispatch_batch(self, batch: EngineBatch) -> None:
        router = self._router
        slot = router.slot_for_index(batch.engine_index)
        if batch.utility is not None:
            self._utility.resolve(batch.utility)
        if batch.load is not None and slot is not None:
            load = batch.load
            if batch.outputs and not router.inflight[slot]:
                # Outputs only of requests this client does not own (a previous life's, or
                # ones it retired): the counts include requests being ABORTed, and no later
                # stats need reach this client to correct them (vLLM sends them with a
                # client's own outputs). Shed them, as an emptied rank does on release.
                load = EngineLoad(0, 0, load.kv_cache_usage)
            router.loads[slot] = load
        if batch.prefix_cache_queries:
            self.prefix_cache_queries += batch.prefix_cache_queries
            self.prefix_cache_hits += batch.prefix_cache_hits
        registry = self._registry
        to_wake = self._to_wake
        # Ids to tell ABORT again, per engine: one message each (not one task and message per
        # output: under a disconnect storm every retired request's in-flight outputs did that,
        # hundreds of sends competing with the ABORTs that mattered).
        reabort: dict[bytes, dict[str, None]] | None = None
        if self._aborted:
            self._expire_aborted(trio.current_time())
        for out in batch.outputs:
            entry = registry.get(out.request_id)
            if entry is None:
                known = self._aborted.get(out.request_id)
                identity = known[0] if known is not None else None
                if identity is None and out.finish_reason is None and slot is not None:
                    # An id this client never sent, still running: a previous life's request
                    # (this frontend restarted, and the engine kept its outputs for this
                    # socket). Nobody waits for it: ABORT it, once (remembered below).
                    identity = self._identities[slot]
                    self._remember_aborted(out.request_id, identity)
                    log.info(
                        "aborting %s: an engine request this client does not know", out.request_id
                    )
                if identity is not None:
                    if out.finish_reason is None:
                        if self._may_reabort(out.request_id, identity):
                            reabort = reabort or {}
                            reabort.setdefault(identity, {})[out.request_id] = None
                    else:
                        self._aborted.pop(out.request_id, None)
                continue
            entry.put(out)
            to_wake[entry] = None
            if out.finish_reason is not None:
                del registry[out.request_id]
                router.release(entry.rank, out.request_id)
        for rid in batch.finished_request_ids:
            entry = registry.pop(rid, None)
            if entry is not None:
                router.release(entry.rank, rid)
                if entry.end():
                    to_wake[entry] = None
        if self._waves is not None:
            if batch.wave_complete is not None:
                self._waves.wave_complete(batch.wave_complete)
            if batch.start_wave is not None and self._nursery is not None:
                self._nursery.start_soon(
                    self._wake_group_background, self._waves.start_wave(batch.start_wave)
                )
        if reabort and self._nursery is not None:
            for identity, rids in reabort.items():
                self._nursery.start_soon(self._send_aborts, identity, list(rids))

    async def _silence_watchdog(self) -> None:
        """Fail the in-flight requests when the engine has sent nothing for the silence window
        while requests are pending; idle silence is fine. One timer per window, not a deadline
        update per message: the output loop only records the time of each output."""
        timeout = self._silence_timeout_s
        if not math.isfinite(timeout):
            return
        with self._watchdog_scope:
            await self._watch_silence(timeout)

    async def _watch_silence(self, timeout: float) -> None:
        while self._dead is None and not self._closed:
            deadline = self._last_output + timeout
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            if not self._registry:
                self._last_output = trio.current_time()  # idle: restart the window
                continue
            # The engine may be stalled rather than gone: ask it to drop the requests (best
            # effort, never blocking) before they are failed here.
            self._abort_all_nowait()
            self._die(
                EngineDeadError(
                    f"no engine output for {timeout:g} s with "
                    f"{len(self._registry)} request(s) in flight"
                )
            )
            return

    async def _output_loop(self) -> None:
        """Receive, decode and dispatch engine outputs until the client dies or closes."""
        with trio.CancelScope() as scope:
            self._recv_scope = scope  # cancelled by _die
            try:
                await self._receive_outputs()
            finally:
                self._wake_queued()  # nothing queued is left unwoken, however the loop ends
        self._recv_scope = None

    async def _receive_outputs(self) -> None:
        """Every message waiting is handled in one wake-up (a checkpoint every
        ``_OUTPUT_BURST`` messages keeps a flood fair), and the requests it fed are woken
        before the loop waits or yields (:meth:`_wake_queued`)."""
        sock = self._sockets.output
        decode = self.protocol.decode_batch
        errors = 0
        burst = 0
        while self._dead is None:
            try:
                if burst >= _OUTPUT_BURST:
                    burst = 0
                    self._wake_queued()
                    await trio.lowlevel.checkpoint()
                frames = sock.recv_multipart_nowait()
                if frames is None:
                    burst = 0
                    self._wake_queued()
                    await sock.wait_readable()
                    continue
                burst += 1
            except (TransportError, trio.ClosedResourceError) as exc:
                if not self._closed:
                    self._die(EngineDeadError(f"engine output socket failed: {exc}"))
                return
            self._last_output = trio.current_time()
            if len(frames) == 1 and frames[0] == ENGINE_CORE_DEAD:
                self._die(EngineDeadError("engine core dead (ENGINE_CORE_DEAD sentinel)"))
                return
            try:
                batch = decode(frames)
            except DecodeError as exc:
                errors += 1
                log.warning("dropping undecodable engine output (%d in a row): %s", errors, exc)
                if errors >= MAX_CONSECUTIVE_DECODE_ERRORS:
                    self._die(EngineDeadError(f"{errors} consecutive undecodable outputs: {exc}"))
                    return
                continue
            errors = 0
            self._dispatch(batch)

    def _close(self) -> None:
        self._closed = True
        registry, self._registry = self._registry, {}
        for entry in registry.values():
            entry.close(ClientClosed("engine client closed"))
        self._utility.fail(ClientClosed("engine client closed"))
        self._router.clear()


async def run_engine_client(
    protocol: EngineProtocol,
    addresses: WorkerAddresses,
    *,
    engine_count: int = 1,
    ready_timeout_s: float = READY_TIMEOUT_S,
    silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
    task_status: trio.TaskStatus[EngineClient] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind the worker's sockets, run the handshake, then serve until cancelled or dead.

    For ``await nursery.start(run_engine_client, ...)``: ``start`` returns the ready
    :class:`EngineClient`. Returns (without raising) when the engine dies; watch
    ``client.dead_event``. Handshake failures raise ``HandshakeError`` subclasses.
    """
    async with open_engine_client(
        protocol,
        addresses,
        engine_count=engine_count,
        ready_timeout_s=ready_timeout_s,
        silence_timeout_s=silence_timeout_s,
    ) as client:
        task_status.started(client)
        await client.dead_event.wait()


@asynccontextmanager
async def open_engine_client(
    protocol: EngineProtocol,
    addresses: WorkerAddresses,
    *,
    engine_count: int = 1,
    ready_timeout_s: float = READY_TIMEOUT_S,
    silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
    handshake: HandshakeSocket | None = None,
    disconnect_grace_s: float | None = None,
    tcp: TcpOptions | None = None,
) -> AsyncIterator[EngineClient]:
    """Bind, handshake with ``engine_count`` engines, and yield a running :class:`EngineClient`.

    The client's nursery runs the output loop; leaving the block cancels it, fails remaining
    requests with ``ClientClosed`` and closes the sockets. ``ready_timeout_s`` bounds each
    handshake receive; ``silence_timeout_s`` is the in-flight silence watchdog (``math.inf``
    disables it). ``disconnect_grace_s`` is how long a rank whose input connection closed may
    take to reconnect before it is dead (``ENGINE_DISCONNECT_GRACE_S`` by default). ``handshake`` is a handshake ROUTER the caller keeps bound across engine
    lives (see :class:`~smg_trio.transport.topology.HandshakeSocket`); without it one is bound
    here and closed on exit. ``tcp`` sets up a ``tcp://`` worker (advertised host, heartbeats,
    engine peer allow-list; see :class:`~smg_trio.transport.tcp.TcpOptions`).

    With ``addresses.client_count > 1`` this call is client 0 (``addresses.client_index`` must
    be 0): INIT also names the other clients' pairs, which :func:`attach_engine_client` binds.
    """
    if addresses.client_index != 0:
        raise ValueError("only client 0 runs the handshake; the others attach")
    others = (
        list(zip(addresses.inputs[1:], addresses.outputs[1:], strict=True))
        if addresses.client_count > 1
        else []
    )
    async with bind_worker_sockets(addresses, handshake=handshake, tcp=tcp) as sockets:
        engines = await run_handshake(
            sockets,
            engine_count=engine_count,
            ready_timeout_s=ready_timeout_s,
            other_clients=others,
        )
        client = EngineClient(
            protocol,
            sockets,
            engines,
            silence_timeout_s=silence_timeout_s,
            disconnect_grace_s=disconnect_grace_s,
            ready_timeout_s=ready_timeout_s,
        )
        async with _running(client) as running:
            yield running


@asynccontextmanager
async def attach_engine_client(
    protocol: EngineProtocol,
    addresses: WorkerAddresses,
    engines: Sequence[EngineRegistration],
    *,
    silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
    shared_load: SharedRankLoad | None = None,
) -> AsyncIterator[EngineClient]:
    """Yield a running :class:`EngineClient` for frontend client ``addresses.client_index`` of
    engines that client 0 already handshook (``engines``: its registrations, which say which
    identities to route to and what each engine is).

    Only this client's own input ROUTER and output PULL are bound (at the deterministic
    addresses of :func:`~smg_trio.protocol.addresses.client_data_plane`, which INIT named); the
    engines dial them on their own and reconnect when this client is re-bound after a restart.
    The block starts once ``len(engines)`` connections reached the input socket (unbounded:
    wrap it in a cancel scope).
    ``protocol`` must carry the same ``client_index``: the engine sends each request's outputs
    to that client's output socket. The engine's input registration on this socket is not
    awaited (a re-bound socket never gets one): the first send finds an engine that has not
    connected yet as not connected (a 503), and outputs for request ids this client does not
    know (a previous life's) are answered with ABORT. ``shared_load`` makes its DP-rank
    choice count every frontend's requests on each rank (:class:`SharedRankLoad`).
    """
    if addresses.client_index == 0:
        raise ValueError("client 0 runs the handshake (open_engine_client)")
    async with bind_worker_sockets(addresses, with_handshake=False) as sockets:
        # Ready once every engine's connection to this input socket finished its ZMTP
        # handshake, so its identity is routable (a restarted client's re-bound socket gets
        # no registration, only the connection). Callers bound the wait. libzmq names no
        # descriptor in a handshake event (its value is 0): count them, against the
        # connections open now.
        live: set[int] = set()
        handshakes = 0
        while handshakes < len(engines) or len(live) < len(engines):
            event = await sockets.input_monitor.receive()
            if event is None:
                continue
            if event.handshaken:
                handshakes += 1
            elif event.accepted:
                live.add(event.fd)
            else:
                live.discard(event.fd)
                handshakes = min(handshakes, len(live))
        sockets.input.process_commands()  # libzmq attaches the new pipes now, not on a later send
        # Engine death is seen from the sentinel, the silence watchdog, or client 0 (which
        # owns the engines' liveness).
        attached = [attrs.evolve(e, connection_fd=None) for e in engines]
        client = EngineClient(
            protocol,
            sockets,
            attached,
            silence_timeout_s=silence_timeout_s,
            owns_liveness=False,
            shared_load=shared_load,
        )
        async with _running(client) as running:
            yield running


@asynccontextmanager
async def _running(client: EngineClient) -> AsyncIterator[EngineClient]:
    """Run ``client``'s output loop, silence watchdog and connection watch for the block."""
    async with trio.open_nursery() as nursery:
        client._nursery = nursery
        nursery.start_soon(client._output_loop)
        nursery.start_soon(client._silence_watchdog)
        nursery.start_soon(client._watch_connections)
        if client._sockets.output_monitor is not None:
            nursery.start_soon(client._guard_output_peers, client._sockets.output_monitor)
        try:
            yield client
        finally:
            client._close()
            nursery.cancel_scope.cancel()
