"""The frontend side of the startup handshake: HELLO→INIT, READY, then input registrations."""

from __future__ import annotations

import logging
from typing import Final

import attrs
import trio
import zmq

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
from smg_trio.transport.topology import BoundSockets
from smg_trio.transport.zsocket import ZmqSocket

__all__ = ["READY_TIMEOUT_S", "EngineRegistration", "engine_index", "run_handshake"]

logger = logging.getLogger(__name__)

#: Deadline for EACH receive of the handshake, in seconds (smg's ``ZMQ_CONNECT_TIMEOUT``). It is
#: this long because the engine loads the model and profiles the KV cache between INIT and READY;
#: on a big model that takes minutes. It is a per-message deadline, not a total: a handshake that
#: keeps making progress never times out. Tests pass a small value.
READY_TIMEOUT_S: Final = 600.0


def engine_index(identity: bytes) -> int | None:
    """The engine index of a 2-byte little-endian identity, or ``None`` for any other length
    (accepted, but unindexed: it cannot be pinned by ``data_parallel_rank``)."""
    if len(identity) != 2:
        return None
    return int.from_bytes(identity, "little")


@attrs.frozen
class EngineRegistration:
    """One engine that completed the handshake: its ZMQ identity, its index (see
    :func:`engine_index`) and the registration it sent on the input socket."""

    identity: bytes
    index: int | None
    ready: EngineCoreReadyResponse


def _name(identity: bytes) -> str:
    index = engine_index(identity)
    return f"engine {index}" if index is not None else f"engine with identity {identity.hex()!r}"


async def _recv_pair(sock: ZmqSocket, timeout_s: float, on_timeout: HandshakeError) -> list[bytes]:
    """One receive under its own deadline; the message must be ``[identity, payload]``."""
    # Safe to time out: recv_multipart is cancel-atomic, so no message is lost.
    with trio.move_on_after(timeout_s):
        frames = await sock.recv_multipart()
        if len(frames) != 2:
            raise UnexpectedHandshakeMessage(
                f"expected a 2-frame [identity, payload] message, got {len(frames)} frames"
                f" from {_name(frames[0])}"
            )
        return frames
    raise on_timeout


def _status(identity: bytes, payload: bytes) -> str | None:
    try:
        return decode_status(payload).status
    except DecodeError as exc:
        raise UnexpectedHandshakeMessage(
            f"undecodable handshake message from {_name(identity)}: {exc}"
        ) from exc


async def run_handshake(
    sockets: BoundSockets,
    *,
    engine_count: int,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> list[EngineRegistration]:
    """Run the startup handshake with ``engine_count`` engines (wire spec §1.3).

    Phase A: until ``engine_count`` distinct identities said HELLO, each is answered with INIT at
    once (an early READY from an identity that already said HELLO is accepted). Phase B: until
    every engine said READY. Phase C: one registration (an ``EngineCoreReadyResponse``) per
    engine on the input ROUTER; it may have arrived before READY (real vLLM sends it first), and
    the ROUTER buffers it. Each receive has its own deadline of ``ready_timeout_s`` seconds;
    callers may also wrap the whole call in their own cancel scope.

    Returns:
        The registrations in HELLO order.

    Raises:
        ValueError: ``engine_count < 1``.
        HandshakeTimeout: no HELLO/READY within the deadline (the message names the stage).
        InputRegistrationTimeout: an engine said READY but did not register in time.
        UnexpectedHandshakeMessage: a duplicate HELLO, an unknown or duplicate READY, a wrong
            status, an undecodable payload, a wrong frame count, an empty registration, or a
            registration from an identity that did not handshake.
        HandshakeError: the INIT reply could not be routed (the engine vanished).
    """
    if engine_count < 1:
        raise ValueError(f"expected engine_count >= 1, got {engine_count}")
    init_payload = encode_init(sockets.input_address, sockets.output_address)
    hello: list[bytes] = []  # HELLO order
    ready: set[bytes] = set()

    # Phase A: HELLO (READY may overlap for an engine that already said HELLO).
    while len(hello) < engine_count:
        identity, payload = await _recv_pair(
            sockets.handshake,
            ready_timeout_s,
            HandshakeTimeout(
                f"startup handshake timed out while waiting for HELLO after {ready_timeout_s} s"
                f" ({len(hello)} of {engine_count} engine(s) said HELLO)"
            ),
        )
        status = _status(identity, payload)
        if status == "HELLO":
            if identity in hello:
                raise UnexpectedHandshakeMessage(
                    f"duplicate HELLO from {_name(identity)} (two engines share an identity?)"
                )
            hello.append(identity)
            logger.info("handshake: HELLO from %s; sending INIT", _name(identity))
            await _send_init(sockets.handshake, identity, init_payload)
        elif status == "READY":
            _mark_ready(identity, hello, ready)
        else:
            raise UnexpectedHandshakeMessage(
                f"unexpected handshake status {status!r} from {_name(identity)}"
            )

    # Phase B: READY from every engine that said HELLO.
    while len(ready) < engine_count:
        identity, payload = await _recv_pair(
            sockets.handshake,
            ready_timeout_s,
            HandshakeTimeout(
                f"startup handshake timed out while waiting for READY after {ready_timeout_s} s"
                f" ({len(ready)} of {engine_count} engine(s) said READY)"
            ),
        )
        status = _status(identity, payload)
        if status != "READY":
            raise UnexpectedHandshakeMessage(
                f"unexpected handshake status {status!r} from {_name(identity)} while waiting"
                " for READY"
            )
        _mark_ready(identity, hello, ready)

    # Phase C: one registration per engine on the input ROUTER.
    registrations: dict[bytes, EngineCoreReadyResponse] = {}
    while len(registrations) < engine_count:
        pending = [_name(i) for i in hello if i not in registrations]
        identity, payload = await _recv_pair(
            sockets.input,
            ready_timeout_s,
            InputRegistrationTimeout(
                f"engine input registration timed out after {ready_timeout_s} s"
                f" (still waiting for {', '.join(pending)})"
            ),
        )
        if identity in registrations:
            raise UnexpectedHandshakeMessage(f"duplicate input registration from {_name(identity)}")
        if identity not in hello:
            raise UnexpectedHandshakeMessage(
                f"input registration from {_name(identity)}, which did not handshake"
            )
        if not payload:
            raise UnexpectedHandshakeMessage(
                f"empty input registration from {_name(identity)}: this engine version is too"
                " old for the ZMQ backend (it must send an EngineCoreReadyResponse)"
            )
        try:
            registrations[identity] = decode_ready_response(payload)
        except DecodeError as exc:
            raise UnexpectedHandshakeMessage(
                f"undecodable input registration from {_name(identity)}: {exc}"
            ) from exc
        logger.info("handshake: %s registered on the input socket", _name(identity))

    return [
        EngineRegistration(identity=i, index=engine_index(i), ready=registrations[i]) for i in hello
    ]


def _mark_ready(identity: bytes, hello: list[bytes], ready: set[bytes]) -> None:
    if identity not in hello:
        raise UnexpectedHandshakeMessage(f"READY from {_name(identity)}, which never said HELLO")
    if identity in ready:
        raise UnexpectedHandshakeMessage(f"duplicate READY from {_name(identity)}")
    ready.add(identity)
    logger.info("handshake: READY from %s", _name(identity))


async def _send_init(sock: ZmqSocket, identity: bytes, payload: bytes) -> None:
    try:
        await sock.send_multipart([identity, payload])
    except zmq.ZMQError as exc:
        raise HandshakeError(f"cannot send INIT to {_name(identity)}: {exc.strerror}") from exc
