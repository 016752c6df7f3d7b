"""An engine client's connections: the guarded send, rank loss and return, re-admission."""

from __future__ import annotations

import errno
import math

import trio

from smg_trio.connector.state import ClientState, log
from smg_trio.errors import EngineDeadError, HandshakeError, TransportError
from smg_trio.transport.handshake import EngineRegistration, readmit_engine
from smg_trio.transport.monitor import ConnectionEvent, ConnectionMonitor
from smg_trio.transport.peer_guard import judge_connection
from smg_trio.transport.tcp import endpoint_port, shut_down_connection

__all__ = ["ENGINE_SEND_TIMEOUT_S", "ClientConnections"]

#: A send on the input socket that cannot complete in this time means the engine stopped
#: reading; the socket may be mid-message, so it is fatal (smg ``ENGINE_SEND_TIMEOUT``).
ENGINE_SEND_TIMEOUT_S = 10.0


class ClientConnections(ClientState):
    """Sends to the engines, and each engine's connection watched for its death or return."""

    # -- the send path (engine death from a send) --------------------------------------------

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
