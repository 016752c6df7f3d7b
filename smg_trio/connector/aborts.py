"""The abort paths (per request, eager, per ``AbortGroup``) and the aborted ids' memory."""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterable

import trio

from smg_trio.connector.connections import ClientConnections
from smg_trio.connector.state import log
from smg_trio.connector.stream import _Entry
from smg_trio.errors import EngineDeadError, TransportError

__all__ = [
    "ABORTED_TTL_S",
    "ABORT_GROUP",
    "ABORT_SEND_TIMEOUT_S",
    "REABORT_INTERVAL_S",
    "AbortGroup",
    "ClientAborts",
]

#: Bound on the shielded ABORT sent when a request's block exits early: cleanup must not hang
#: a cancelled caller, and a dead engine needs no abort.
ABORT_SEND_TIMEOUT_S = 1.0
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
        self._members: dict[tuple[int, str], ClientAborts] = {}

    def abort_now(self) -> None:
        """Retire every member and queue its ABORT without waiting (:meth:`ClientAborts.abort_nowait`)."""
        by_client: dict[int, tuple[ClientAborts, list[str]]] = {}
        for (key, rid), client in self._members.items():
            by_client.setdefault(key, (client, []))[1].append(rid)
        self._members.clear()
        for client, rids in by_client.values():
            client.abort_nowait(rids)


#: The :class:`AbortGroup` of the current client request, if the HTTP front set one.
ABORT_GROUP: contextvars.ContextVar[AbortGroup | None] = contextvars.ContextVar(
    "smg_trio_abort_group", default=None
)


class ClientAborts(ClientConnections):
    """Retiring requests and telling their engines ABORT, and the aborted ids remembered."""

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
