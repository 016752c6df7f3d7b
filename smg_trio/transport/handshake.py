"""The frontend side of the startup handshake: HELLO→INIT, READY, then input registrations."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import trio

from smg_trio.errors import (
    DecodeError,
    HandshakeError,
    HandshakeTimeout,
    InputRegistrationTimeout,
    UnexpectedHandshakeMessage,
)
from smg_trio.protocol.handshake import (
    EngineCoreReadyResponse,
    decode_ready_response,
    decode_status,
    encode_init,
)
from smg_trio.transport.handshake_stage import clear_stage, set_stage, stage_text
from smg_trio.transport.tcp import peer_host
from smg_trio.transport.topology import BoundSockets, init_addresses
from smg_trio.transport.zsocket import ZmqSocketError

__all__ = [
    "READY_TIMEOUT_S",
    "EngineRegistration",
    "engine_index",
    "readmit_engine",
    "run_handshake",
]

logger = logging.getLogger(__name__)

#: Deadline for EACH receive of the handshake, in seconds (smg's ``ZMQ_CONNECT_TIMEOUT``). It is
#: this long because the engine loads the model and profiles the KV cache between INIT and READY;
#: on a big model that takes minutes. It is a per-message deadline, not a total: a handshake that
#: keeps making progress never times out. Tests pass a small value.
READY_TIMEOUT_S: Final = 600.0
#: INIT is sent again this often (seconds) to an identity that said HELLO and has not
#: registered yet: its first INIT may have gone to a stranger that held its identity then.
INIT_RESEND_S: Final = 1.0
#: Identities other than the expected ones (2-byte indices below ``engine_count``) tracked
#: at most; HELLOs from more are dropped, so a flood of identities cannot grow the table.
MAX_UNEXPECTED_PEERS: Final = 32
#: Dropped handshake messages logged per handshake; the rest are only counted.
IGNORED_LOG_LIMIT: Final = 10
#: While a running client re-admits a rank, its input ROUTER (which other tasks send on) is
#: polled this often for the registration: a parked reader could miss its wake-up, because a
#: send from another task consumes the socket's edge-style fd signal.
READMIT_POLL_S: Final = 0.02


def engine_index(identity: bytes) -> int | None:
    """The engine index of a 2-byte little-endian identity, or ``None`` for any other length
    (accepted, but unindexed: it cannot be pinned by ``data_parallel_rank``)."""
    if len(identity) != 2:
        return None
    return int.from_bytes(identity, "little")


@attrs.frozen
class EngineRegistration:
    """One engine that completed the handshake: its ZMQ identity, its index (see
    :func:`engine_index`), the registration it sent on the input socket, and the file
    descriptor of the input connection that registration came in on (``ZMQ_SRCFD``; the
    input socket monitor names connections by it)."""

    identity: bytes
    index: int | None
    ready: EngineCoreReadyResponse
    connection_fd: int | None = None


def _name(identity: bytes) -> str:
    index = engine_index(identity)
    return f"engine {index}" if index is not None else f"engine with identity {identity.hex()!r}"


def _peer(frames: list[bytes]) -> str:
    """Who sent ``frames`` (escaped: identities come from anyone who can reach the port)."""
    return _name(frames[0][:32]) if frames else "an unknown peer"


@attrs.define
class _Peer:
    """One identity that said HELLO: whether READY came for it, its registration once that
    arrived on the input socket, and when INIT is next sent to it."""

    ready: bool = False
    registration: EngineCoreReadyResponse | None = None
    next_init: float = 0.0
    connection_fd: int | None = None

    @property
    def done(self) -> bool:
        return self.ready and self.registration is not None


@attrs.define
class _Ignored:
    """Rate-limited warnings for handshake messages that are dropped."""

    count: int = 0

    def __call__(self, what: str) -> None:
        self.count += 1
        if self.count <= IGNORED_LOG_LIMIT:
            logger.warning("handshake: ignoring %s", what)
            if self.count == IGNORED_LOG_LIMIT:
                logger.warning("handshake: further ignored messages are counted, not logged")


@attrs.define
class _Driver:
    """The state of one :func:`run_handshake` call, shared by its two reader tasks (the
    handshake ROUTER's, which also sends every INIT, and the input ROUTER's)."""

    sockets: BoundSockets
    engine_count: int
    init_payload: bytes
    peers: dict[bytes, _Peer] = attrs.field(factory=dict)  # first-HELLO order
    # registrations read before HELLO, with their input connection's fd
    early: dict[bytes, tuple[bytes, int | None]] = attrs.field(factory=dict)
    ignored: _Ignored = attrs.field(factory=_Ignored)
    deadline: trio.CancelScope | None = None  # pushed back on every step of progress
    timeout_s: float = READY_TIMEOUT_S
    finished: trio.Event = attrs.field(factory=trio.Event)
    fatal: HandshakeError | None = None
    #: Re-admission: only these identities are answered, and the input ROUTER is polled.
    wanted: Callable[[bytes], bool] | None = None

    def _advance(self) -> None:
        self.show_stage()
        if self.deadline is not None:
            self.deadline.deadline = trio.current_time() + self.timeout_s
        if sum(p.done for p in self.peers.values()) >= self.engine_count:
            self.finished.set()

    def show_stage(self) -> None:
        """Publish what this handshake waits for (:mod:`handshake_stage`)."""
        address = self.sockets.handshake_address
        if address is None:
            return
        expected = [p for i, p in self.peers.items() if engine_index(i) is not None]
        set_stage(
            address,
            stage_text(
                self.engine_count,
                min(len(expected), self.engine_count),
                min(sum(p.ready for p in expected), self.engine_count),
                min(sum(p.registration is not None for p in expected), self.engine_count),
            ),
        )

    # -- handshake ROUTER ----------------------------------------------------------------

    def refused(
        self, fd: int | None, what: str, frames: list[bytes], *, strict: bool = True
    ) -> bool:
        """Whether a tcp worker's message came from a peer not on its allow-list (logged).

        A message whose connection is already gone has no address to check: ``strict``
        refuses it (the input registration, which proves an engine; the real one keeps its
        input connection open), else it passes (HELLO and READY on the handshake socket, which
        vLLM closes right after its READY; an INIT goes to whichever connection holds the
        identity then, and READY proves nothing without the registration)."""
        tcp = self.sockets.tcp
        if tcp is None:
            return False
        host = peer_host(fd)
        if host is None and not strict:
            return False
        if host is not None and tcp.peer_allowed(host):
            return False
        self.ignored(
            f"{what} from {_peer(frames)} at {host or 'an unknown address'}: refused, the host"
            " is not loopback or in --allowed-engine-hosts"
        )
        return True

    async def handshake_loop(self) -> None:
        sock = self.sockets.handshake
        assert sock is not None, "run_handshake needs a handshake socket"
        while True:
            due = min(
                (p.next_init for p in self.peers.values() if p.registration is None),
                default=math.inf,
            )
            frames: list[bytes] | None = None
            fd: int | None = None
            with trio.move_on_at(due):
                frames, fd = await sock.recv_multipart_with_source()
            if frames is not None and self.refused(fd, "a handshake message", frames, strict=False):
                frames = None
            if frames is not None:
                try:
                    self._on_handshake(frames)
                except HandshakeError as exc:
                    self._fail(exc)
                    return
            now = trio.current_time()
            for identity, peer in self.peers.items():
                if peer.registration is None and peer.next_init <= now:
                    self._send_init(identity, peer)

    def _on_handshake(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self.ignored(f"a {len(frames)}-frame message from {_peer(frames)}")
            return
        identity, payload = frames
        try:
            status = decode_status(payload).status
        except DecodeError as exc:
            self.ignored(f"an undecodable message from {_name(identity)}: {exc}")
            return
        peer = self.peers.get(identity)
        if status == "HELLO":
            self._on_hello(identity, peer)
        elif status == "READY":
            if peer is None:
                self.ignored(f"READY from {_name(identity)}, which never said HELLO")
            elif peer.ready:
                self.ignored(f"a duplicate READY from {_name(identity)}")
            else:
                peer.ready = True
                logger.info("handshake: READY from %s", _name(identity))
                self._advance()
        else:
            shown = repr(status[:40]) if isinstance(status, str) else repr(status)
            self.ignored(f"unexpected handshake status {shown} from {_name(identity)}")

    def _on_hello(self, identity: bytes, peer: _Peer | None) -> None:
        if self.wanted is not None and not self.wanted(identity):
            self.ignored(f"HELLO from {_name(identity)}, which is not a rank to re-admit")
            return
        if peer is not None and peer.done:
            self.ignored(f"HELLO from {_name(identity)}, which already completed its handshake")
            return
        if peer is None:
            index = engine_index(identity)
            expected = index is not None and index < self.engine_count
            if not expected and len(self.peers) >= self.engine_count + MAX_UNEXPECTED_PEERS:
                self.ignored(f"HELLO from {_name(identity)}: too many identities said HELLO")
                return
            peer = self.peers[identity] = _Peer()
            logger.log(  # a stranger's HELLO (an unexpected identity) only at DEBUG: no log flood
                logging.INFO if expected else logging.DEBUG,
                "handshake: HELLO from %s; sending INIT",
                _name(identity),
            )
            self._advance()
            early = self.early.pop(identity, None)
            if early is not None:
                self._register(identity, peer, *early)
                if peer.registration is not None:
                    return  # registered: it has its INIT
        else:
            # The same identity again: a restarted engine, or a stranger using its identity.
            # Answer again; the one that registers on the input socket (which only local
            # engines can reach) is the engine. READY (which proves nothing: anyone can send
            # it) is kept, so a stranger's late HELLO cannot undo the real engine's READY.
            logger.debug("handshake: HELLO again from %s; sending INIT again", _name(identity))
        self._send_init(identity, peer)

    def _send_init(self, identity: bytes, peer: _Peer) -> None:
        """Send INIT without waiting; resent every ``INIT_RESEND_S`` until the identity
        registers. libzmq routes it to whichever connection holds the identity *now*
        (``ROUTER_HANDOVER``), so an engine whose connection a stranger took over for a while
        still gets its INIT once it is back. A second INIT is harmless: engines read one."""
        peer.next_init = trio.current_time() + INIT_RESEND_S
        sock = self.sockets.handshake
        assert sock is not None
        try:
            sent = sock.send_multipart_nowait([identity, self.init_payload])
        except ZmqSocketError as exc:  # EHOSTUNREACH: that identity is not connected (now)
            logger.debug("handshake: INIT to %s not sent: %s", _name(identity), exc.strerror)
            return
        if not sent:
            logger.debug("handshake: INIT to %s not sent: its queue is full", _name(identity))

    # -- input ROUTER --------------------------------------------------------------------

    async def input_loop(self) -> None:
        sock = self.sockets.input
        while True:
            if self.wanted is None:
                frames, fd = await sock.recv_multipart_with_source()
            else:
                got = sock.recv_multipart_with_source_nowait()
                if got is None:
                    await trio.sleep(READMIT_POLL_S)
                    continue
                frames, fd = got
            if self.refused(fd, "an input registration", frames):
                continue
            try:
                self._on_registration(frames, fd)
            except HandshakeError as exc:
                self._fail(exc)
                return

    def _fail(self, exc: HandshakeError) -> None:
        self.fatal = exc
        self.finished.set()

    def _on_registration(self, frames: list[bytes], fd: int | None = None) -> None:
        if len(frames) != 2:
            self.ignored(f"a {len(frames)}-frame input registration from {_peer(frames)}")
            return
        identity, payload = frames
        peer = self.peers.get(identity)
        if peer is None:
            # Its HELLO may still be unread on the other socket (no cross-socket ordering).
            if (
                identity in self.early
                or len(self.early) >= self.engine_count + MAX_UNEXPECTED_PEERS
            ):
                self.ignored(f"input registration from {_name(identity)}, which did not handshake")
            else:
                self.early[identity] = (payload, fd)
            return
        self._register(identity, peer, payload, fd)

    def _register(
        self, identity: bytes, peer: _Peer, payload: bytes, fd: int | None = None
    ) -> None:
        if peer.registration is not None:
            self.ignored(f"a duplicate input registration from {_name(identity)}")
            return
        # Only a local engine can reach the input socket (an ipc path in a private directory),
        # so what arrives here is the real engine: an incompatible one fails loudly.
        if not payload:
            raise UnexpectedHandshakeMessage(
                f"empty input registration from {_name(identity)}: this engine version is too"
                " old for the ZMQ backend (it must send an EngineCoreReadyResponse)"
            )
        try:
            peer.registration = decode_ready_response(payload)
        except DecodeError as exc:
            raise UnexpectedHandshakeMessage(
                f"undecodable input registration from {_name(identity)}: {exc}"
            ) from exc
        peer.connection_fd = fd
        logger.info("handshake: %s registered on the input socket", _name(identity))
        self._advance()

    # -- the deadline --------------------------------------------------------------------

    def timeout_error(self, timeout_s: float) -> HandshakeError:
        """The error for ``timeout_s`` without progress, naming the stage reached."""
        peers = self.peers
        n = self.engine_count
        if len(peers) < n:
            return HandshakeTimeout(
                f"startup handshake timed out while waiting for HELLO after {timeout_s} s"
                f" ({len(peers)} of {n} engine(s) said HELLO)"
            )
        ready = sum(p.ready for p in peers.values())
        if ready < n:
            return HandshakeTimeout(
                f"startup handshake timed out while waiting for READY after {timeout_s} s"
                f" ({ready} of {n} engine(s) said READY)"
            )
        pending = [_name(i) for i, p in peers.items() if p.ready and p.registration is None]
        return InputRegistrationTimeout(
            f"engine input registration timed out after {timeout_s} s"
            f" (still waiting for {', '.join(pending) or 'a READY engine'})"
        )


async def run_handshake(
    sockets: BoundSockets,
    *,
    engine_count: int,
    ready_timeout_s: float = READY_TIMEOUT_S,
    other_clients: Sequence[tuple[str, str]] = (),
    wanted: Callable[[bytes], bool] | None = None,
) -> list[EngineRegistration]:
    """Run the startup handshake with ``engine_count`` engines (wire spec §1.3).

    Every identity that says HELLO is answered with INIT at once, and again every
    ``INIT_RESEND_S`` until it registers on the input ROUTER. An engine is done once it said
    READY and registered (one ``EngineCoreReadyResponse``; it may arrive before READY, as real
    vLLM sends it); the handshake is done once ``engine_count`` engines are.

    The handshake port is reachable by any local process, so nothing that arrives there can
    abort the handshake: a wrong frame count, an undecodable payload or status, READY from an
    identity that never said HELLO, a duplicate READY, or a HELLO from an identity that already
    finished are logged (rate-limited) and dropped. A HELLO from an identity already in
    progress (a restarted engine, or a stranger using its identity) is answered with INIT
    again: the handshake is not "consumed" by the first HELLO, because only the registration,
    which comes over the private ipc input socket, proves an engine. Identities beyond the expected
    ones (2-byte indices below ``engine_count``) are tracked up to ``MAX_UNEXPECTED_PEERS``.

    ``other_clients`` are the (input, output) addresses of further frontend clients (1, 2,
    ...; this call's own sockets are client 0): INIT lists them after ``sockets``' own, and
    each engine also connects to them (vLLM's multi-client wire). Only client 0's input
    registration is awaited here; each other client reads its own.

    ``ready_timeout_s`` bounds the time without progress (a new identity's HELLO, a READY, a
    registration); dropped messages are not progress. Callers may also wrap the whole call in
    their own cancel scope.

    Returns:
        The registrations in first-HELLO order (the first ``engine_count`` to finish).

    Raises:
        ValueError: ``engine_count < 1``.
        HandshakeTimeout: no progress within the deadline (the message names the stage).
        InputRegistrationTimeout: every engine said READY but one did not register in time.
        UnexpectedHandshakeMessage: an engine that said HELLO sent an empty or undecodable
            registration (an incompatible engine version).
    """
    if engine_count < 1:
        raise ValueError(f"expected engine_count >= 1, got {engine_count}")
    own_input, own_output = init_addresses(sockets)
    init = encode_init(
        [own_input, *(i for i, _ in other_clients)],
        [own_output, *(o for _, o in other_clients)],
    )
    driver = _Driver(sockets, engine_count, init, wanted=wanted)
    driver.show_stage()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.handshake_loop)
            nursery.start_soon(driver.input_loop)
            with trio.move_on_after(ready_timeout_s) as deadline:
                driver.deadline, driver.timeout_s = deadline, ready_timeout_s
                await driver.finished.wait()
            nursery.cancel_scope.cancel()
    finally:
        if sockets.handshake_address is not None:
            clear_stage(sockets.handshake_address)
    if not driver.finished.is_set():
        raise driver.timeout_error(ready_timeout_s)
    if driver.fatal is not None:
        raise driver.fatal
    if driver.ignored.count > IGNORED_LOG_LIMIT:
        logger.warning("handshake: ignored %d message(s) in all", driver.ignored.count)
    done = [(i, p) for i, p in driver.peers.items() if p.done][:engine_count]
    return [
        EngineRegistration(
            identity=i, index=engine_index(i), ready=p.registration, connection_fd=p.connection_fd
        )
        for i, p in done
        if p.registration is not None
    ]


async def readmit_engine(
    sockets: BoundSockets,
    wanted: Callable[[bytes], bool],
    *,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> EngineRegistration:
    """Handshake one restarted engine into a client that keeps serving its other ranks: the
    same HELLO, INIT, READY and input registration as :func:`run_handshake`, answering only
    the identities ``wanted`` accepts (the client's lost ranks). The input ROUTER is polled
    (``READMIT_POLL_S``), since other tasks send on it meanwhile. Raises like
    :func:`run_handshake`; waits for good while no wanted engine says HELLO."""
    while True:
        try:
            (registration,) = await run_handshake(
                sockets, engine_count=1, ready_timeout_s=ready_timeout_s, wanted=wanted
            )
        except HandshakeTimeout:
            continue  # nobody to re-admit yet (or one that stalled): keep listening
        return registration
