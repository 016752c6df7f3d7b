"""The engine side of the handshake (DEALER/PUSH dial-in), for the mock engine and tests."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import attrs
import zmq

from smg_trio.errors import UnexpectedHandshakeMessage
from smg_trio.protocol.handshake import EngineHandshakeMetadata, decode_init, encode_status
from smg_trio.transport.zsocket import ZmqSocket, zmq_context

__all__ = ["ENGINE_LINGER_MS", "EngineSockets", "dial_frontend"]

logger = logging.getLogger(__name__)

#: How long, in milliseconds, an engine-side socket keeps delivering queued messages after it is
#: closed (in the background; closing never blocks). vLLM lingers 4-5 s; a mock needs less. It
#: lets a mock that pushes its last outputs and exits still deliver them.
ENGINE_LINGER_MS: Final = 1000


@attrs.frozen
class EngineSockets:
    """An engine's connected data-plane sockets after a completed handshake.

    ``input`` is the DEALER (identity = the engine's) that receives requests as
    ``[type_byte, payload, *aux]``; ``output`` is the PUSH that sends ``[payload, *aux]`` or the
    ``ENGINE_CORE_DEAD`` sentinel. ``init`` is the INIT message the frontend sent. ``inputs``
    and ``outputs`` hold one socket per frontend client INIT named (``input``/``output`` are
    client 0's), as vLLM's ``process_input_sockets``/``process_output_sockets`` open them.
    """

    identity: bytes
    engine_index: int
    init: EngineHandshakeMetadata
    inputs: list[ZmqSocket]
    outputs: list[ZmqSocket]

    @property
    def input(self) -> ZmqSocket:
        """Client 0's input DEALER."""
        return self.inputs[0]

    @property
    def output(self) -> ZmqSocket:
        """Client 0's output PUSH."""
        return self.outputs[0]


def _dial(
    stack: contextlib.ExitStack, socket_type: int, address: str, identity: bytes | None = None
) -> ZmqSocket:
    """Create a socket, connect it and register its close on ``stack``."""
    sock = zmq_context().socket(socket_type)
    stack.callback(sock.close, 0)  # a no-op after wrapped.close(); covers a failing wrap
    wrapped = ZmqSocket(sock)
    stack.callback(wrapped.close, linger_ms=ENGINE_LINGER_MS)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return wrapped


@asynccontextmanager
async def dial_frontend(
    handshake_address: str,
    *,
    engine_index: int,
    registration: bytes,
    hello_local: bool = True,
    with_hash_key: bool = True,
    register_before_ready: bool = False,
    multi_client: bool = True,
) -> AsyncIterator[EngineSockets]:
    """Do what a vLLM/TokenSpeed engine does at startup and yield its data-plane sockets.

    A DEALER with identity ``engine_index.to_bytes(2, "little")`` connects to
    ``handshake_address``, sends HELLO, receives one frame of INIT, then sends READY; the input
    DEALER (same identity) connects to ``inputs[0]`` and sends ``registration`` as its first
    message; a PUSH connects to ``outputs[0]``. With ``register_before_ready`` the registration
    goes out before READY, which is how real vLLM orders it. ``hello_local=False`` and
    ``with_hash_key=False`` give vLLM 0.32's three-key HELLO/READY. With ``multi_client``
    (vLLM) every input and output address in INIT gets its socket, and the registration goes
    to every input; without it (TokenSpeed) only the first pair is used.

    The engine may dial before the frontend has bound: ZMQ's connect retries in the background
    and HELLO waits in the DEALER's queue. This call sets no deadline of its own; wrap it in a
    cancel scope. Everything is closed on exit (lingering :data:`ENGINE_LINGER_MS`).

    Raises:
        ValueError: ``engine_index`` does not fit in 2 bytes (0..65535).
        DecodeError: INIT is malformed or lacks an input or output address.
        UnexpectedHandshakeMessage: the INIT reply is not a single frame.
    """
    if not 0 <= engine_index <= 0xFFFF:
        raise ValueError(f"engine_index must be in 0..65535, got {engine_index}")
    identity = engine_index.to_bytes(2, "little")
    status_kwargs = {"local": hello_local, "headless": True, "with_hash_key": with_hash_key}

    with contextlib.ExitStack() as stack:
        handshake = _dial(stack, zmq.DEALER, handshake_address, identity)
        await handshake.send_multipart([encode_status("HELLO", **status_kwargs)])
        logger.debug("engine %d: HELLO queued for %s", engine_index, handshake_address)
        frames = await handshake.recv_multipart()
        if len(frames) != 1:
            raise UnexpectedHandshakeMessage(f"expected a 1-frame INIT, got {len(frames)} frames")
        init = decode_init(frames[0])
        logger.debug("engine %d: INIT received: %s", engine_index, init.addresses)

        ready = [encode_status("READY", **status_kwargs)]
        if not register_before_ready:
            await handshake.send_multipart(ready)
        count = len(init.addresses.inputs) if multi_client else 1
        inputs = [_dial(stack, zmq.DEALER, a, identity) for a in init.addresses.inputs[:count]]
        for inp in inputs:
            await inp.send_multipart([registration])
        if register_before_ready:
            await handshake.send_multipart(ready)
        # Done with it, as vLLM is: its READY is delivered while the socket lingers, often
        # after the connection is gone from the frontend's point of view.
        handshake.close(linger_ms=ENGINE_LINGER_MS)
        outs = init.addresses.outputs[: len(init.addresses.outputs) if multi_client else 1]
        outputs = [_dial(stack, zmq.PUSH, a) for a in outs]
        logger.debug("engine %d: READY and registration sent", engine_index)
        yield EngineSockets(
            identity=identity, engine_index=engine_index, init=init, inputs=inputs, outputs=outputs
        )
