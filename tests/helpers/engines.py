"""Engines for the connector tests: real engine clients over ipc + tcp, served by mock engines
(:func:`serving`) or by engines driven by hand (:class:`RawEngine`, :func:`raw_serving`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import msgspec
import trio
import trio.lowlevel

from smg_trio.codec.msgpack import encoder
from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.connector.client import ENGINE_SILENCE_DEATH_TIMEOUT_S
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol import vllm
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import EngineProtocol, GenerateRequest, SamplingOptions
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.transport.engine_side import EngineSockets, dial_frontend

__all__ = [
    "PROTOCOLS",
    "READY_TIMEOUT_S",
    "ProtocolName",
    "RawEngine",
    "make_protocol",
    "raw_serving",
    "request",
    "serving",
    "vllm_output",
    "wait_until",
]

#: The handshake deadline the tests give the client (a broken dial fails fast).
READY_TIMEOUT_S = 5.0

ProtocolName = Literal["vllm", "tokenspeed"]
PROTOCOLS: tuple[ProtocolName, ...] = ("vllm", "tokenspeed")


def make_protocol(name: ProtocolName) -> EngineProtocol:
    return VllmProtocol() if name == "vllm" else TokenSpeedProtocol()


def request(
    request_id: str,
    *,
    max_tokens: int = 8,
    rank: int | None = None,
    prompt: list[int] | None = None,
    **sampling: Any,
) -> GenerateRequest:
    """A small generate request (prompt ``[1, 2, 3]`` unless given)."""
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=[1, 2, 3] if prompt is None else prompt,
        sampling=SamplingOptions(max_tokens=max_tokens, **sampling),
        data_parallel_rank=rank,
    )


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Yield to the scheduler (and so to socket I/O) until ``predicate()`` holds. Call it under
    the test's ``fail_after``; there is no timeout of its own."""
    while not predicate():
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def serving(
    addresses: WorkerAddresses,
    *configs: MockEngineConfig,
    silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
) -> AsyncIterator[tuple[EngineClient, list[MockEngine]]]:
    """An engine client handshaken with one mock engine per config (all of one protocol).

    The mocks are started before the client binds; their first dial happens after the bind
    (``bind_worker_sockets`` checkpoints only once everything is bound), so no reconnect delay.
    """
    configs = configs or (MockEngineConfig(),)
    engines = [MockEngine(addresses.handshake, cfg) for cfg in configs]
    runs = [engine.run for engine in engines]
    async with _client_of(addresses, configs[0].protocol, runs, silence_timeout_s) as client:
        yield client, engines


@asynccontextmanager
async def _client_of(
    addresses: WorkerAddresses,
    protocol: ProtocolName,
    runs: Sequence[Callable[[], Awaitable[None]]],
    silence_timeout_s: float,
) -> AsyncIterator[EngineClient]:
    """Start one engine task per ``runs`` entry, then the client that handshakes with them;
    on exit, close the client and cancel the engines."""
    async with trio.open_nursery() as nursery:
        for run in runs:
            nursery.start_soon(run)
        async with open_engine_client(
            make_protocol(protocol),
            addresses,
            engine_count=len(runs),
            ready_timeout_s=READY_TIMEOUT_S,
            silence_timeout_s=silence_timeout_s,
        ) as client:
            yield client
        nursery.cancel_scope.cancel()


class RawEngine:
    """An engine rank driven by hand: it handshakes like the mock (same registration), then the
    test reads its input with :meth:`recv` and writes arbitrary output with :meth:`push`."""

    def __init__(
        self,
        handshake_address: str,
        *,
        protocol: ProtocolName = "vllm",
        engine_index: int = 0,
        data_parallel_size: int = 1,
    ) -> None:
        self.handshake_address = handshake_address
        self.protocol = protocol
        self.engine_index = engine_index
        self.registration = MockEngine(
            handshake_address,
            MockEngineConfig(
                protocol=protocol,
                engine_index=engine_index,
                data_parallel_size=data_parallel_size,
            ),
        ).registration()
        self.ready = trio.Event()
        self.closed = trio.Event()
        self._sockets: EngineSockets | None = None
        self._cancel = trio.CancelScope()

    @property
    def sockets(self) -> EngineSockets:
        assert self._sockets is not None, "RawEngine has not finished its handshake"
        return self._sockets

    async def run(self) -> None:
        """Dial and handshake, set :attr:`ready`, then hold the sockets until :meth:`close`."""
        vllm_like = self.protocol == "vllm"
        with self._cancel:
            async with dial_frontend(
                self.handshake_address,
                engine_index=self.engine_index,
                registration=self.registration,
                hello_local=not vllm_like,
                with_hash_key=not vllm_like,
                register_before_ready=vllm_like,
            ) as sockets:
                self._sockets = sockets
                self.ready.set()
                await trio.sleep_forever()
        self.closed.set()

    def close(self) -> None:
        """Close the engine's sockets (a hard exit, no sentinel)."""
        self._cancel.cancel()

    async def recv(self) -> tuple[bytes, Any]:
        """The next input message as ``(type_byte, decoded payload)``."""
        frames = await self.sockets.input.recv_multipart()
        return frames[0], msgspec.msgpack.decode(frames[1])

    async def recv_kind(self, kind: bytes) -> Any:
        """Skip input messages until one of type ``kind``; return its payload."""
        while True:
            got, payload = await self.recv()
            if got == kind:
                return payload

    async def push(self, *frames: bytes) -> None:
        await self.sockets.output.send_multipart(list(frames))

    async def push_vllm(self, *outputs: vllm.EngineCoreOutput, **envelope: Any) -> None:
        """Push one ``EngineCoreOutputs`` of this rank."""
        env = vllm.EngineCoreOutputs(
            engine_index=self.engine_index, outputs=list(outputs), **envelope
        )
        await self.push(encoder.encode(env))


def vllm_output(
    request_id: str, tokens: list[int], finish: int | None = None
) -> vllm.EngineCoreOutput:
    """One vLLM ``EngineCoreOutput`` (finish codes: 0 stop, 1 length, 2 abort, 3 error)."""
    return vllm.EngineCoreOutput(request_id=request_id, new_token_ids=tokens, finish_reason=finish)


@asynccontextmanager
async def raw_serving(
    addresses: WorkerAddresses,
    *engines: RawEngine,
    silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
) -> AsyncIterator[EngineClient]:
    """An engine client handshaken with ``engines``; yields once every engine is ready."""
    runs = [engine.run for engine in engines]
    async with _client_of(addresses, engines[0].protocol, runs, silence_timeout_s) as client:
        for engine in engines:
            await engine.ready.wait()
        yield client
