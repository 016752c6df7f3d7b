"""``EngineClient``: request submission (``generate``, utility calls); open, attach or run one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from smg_trio.connector.aborts import ABORT_GROUP, ABORT_SEND_TIMEOUT_S, AbortGroup
from smg_trio.connector.connections import ENGINE_SEND_TIMEOUT_S
from smg_trio.connector.output import (
    ENGINE_CORE_DEAD,
    MAX_CONSECUTIVE_DECODE_ERRORS,
    ClientOutput,
)
from smg_trio.connector.routing import SharedRankLoad
from smg_trio.connector.state import ENGINE_DISCONNECT_GRACE_S, ENGINE_SILENCE_DEATH_TIMEOUT_S
from smg_trio.connector.stream import RequestStream, _Entry
from smg_trio.errors import (
    DuplicateRequestId,
    EngineDeadError,
    InvalidDataParallelRank,
    UtilityUnsupported,
)
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.types import EngineProtocol, GenerateRequest
from smg_trio.transport.handshake import READY_TIMEOUT_S, EngineRegistration, run_handshake
from smg_trio.transport.tcp import TcpOptions
from smg_trio.transport.topology import HandshakeSocket, bind_worker_sockets

# The constants are re-exported: a test that patches one patches the module that reads it.
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


class EngineClient(ClientOutput):
    """A live connection to one worker: ``len(engines)`` engines (DP ranks) on one socket set.

    Create it with :func:`open_engine_client` or :func:`run_engine_client`. All methods must be
    called from the trio thread that owns it.

    Its parts live in sibling modules, each class built on the one before: ``state`` (the
    shared state, introspection, the dead latch), ``connections`` (sends, the connection
    watch, re-admission), ``aborts`` (the abort paths, the aborted ids) and ``output`` (the
    output loop); this module adds request submission.
    """

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
