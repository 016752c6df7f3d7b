"""Engine death: the sentinel, the silence watchdog, persistent garbage, a stuck send and a
vanished peer each fail in-flight requests with ``EngineDeadError`` and latch the client."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack
from functools import partial

import pytest
import trio
import trio.lowlevel
import zmq

from smg_trio.connector import connections as connections_mod
from smg_trio.connector import run_engine_client
from smg_trio.connector.client import MAX_CONSECUTIVE_DECODE_ERRORS, EngineClient
from smg_trio.errors import EngineDeadError
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.transport import engine_side, topology
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import (
    PROTOCOLS,
    READY_TIMEOUT_S,
    ProtocolName,
    RawEngine,
    raw_serving,
    request,
    serving,
)

#: The silence window the watchdog tests give the client (seconds).
SILENCE_S = 0.3


async def _assert_latched_dead(client: EngineClient, match: str) -> None:
    assert client.dead_event.is_set()
    assert not client.alive
    assert client.dead_reason is not None
    assert match in str(client.dead_reason)
    assert client.inflight_count == 0
    assert all(not s for s in client._router.inflight)
    with pytest.raises(EngineDeadError, match=match):
        async with client.generate(request("after-death")):
            pytest.fail("a dead client admitted a request")


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_sentinel_fails_inflight_requests(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol=proto)) as (client, (engine,)):
            async with client.generate(request("r", max_tokens=100_000)) as stream:
                await stream.__anext__()
                await engine.die_with_sentinel()
                with pytest.raises(EngineDeadError, match="ENGINE_CORE_DEAD"):
                    async for _ in stream:
                        pass
            await _assert_latched_dead(client, "ENGINE_CORE_DEAD")
            # A dead engine gets no abort.
            assert engine.aborts == []


async def test_run_engine_client_returns_when_the_engine_dies(
    addresses: WorkerAddresses,
) -> None:
    engine = MockEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.run)
            client: EngineClient = await nursery.start(
                partial(
                    run_engine_client, VllmProtocol(), addresses, ready_timeout_s=READY_TIMEOUT_S
                )
            )
            async with client.generate(request("r", max_tokens=3)) as stream:
                [o async for o in stream]
            await engine.die_with_sentinel()
            # run_engine_client returns on its own; the nursery then only waits for the mock,
            # which died too.
    assert client.dead_event.is_set()


@pytest.mark.parametrize("fault", ["die_silently", "stall"])
async def test_silence_with_requests_in_flight_is_death(
    addresses: WorkerAddresses, fault: str
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, silence_timeout_s=SILENCE_S) as (client, (engine,)):
            async with client.generate(request("r", max_tokens=100_000)) as stream:
                await stream.__anext__()
                if fault == "stall":
                    engine.stall()
                else:
                    engine.die_silently()
                start = trio.current_time()
                with pytest.raises(EngineDeadError, match="no engine output"):
                    async for _ in stream:
                        pass
                elapsed = trio.current_time() - start
            # The last output came at most one engine step before the fault.
            assert SILENCE_S - 0.05 <= elapsed < SILENCE_S + 2.0
            await _assert_latched_dead(client, "no engine output")
            if fault == "stall":
                # a stalled (not dead) engine is still asked to drop what the client gave up on
                while "r" not in engine.aborts:
                    await engine.abort_event.wait()
                assert "r" not in engine.active
            engine.resume()


async def test_idle_silence_and_slow_progress_are_fine(addresses: WorkerAddresses) -> None:
    # 2 ms steps: 250 tokens take about 0.5 s, longer than the window, but every output
    # re-arms the watchdog.
    cfg = MockEngineConfig(step_s=0.002)
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, cfg, silence_timeout_s=SILENCE_S) as (client, _):
            start = trio.current_time()
            async with client.generate(request("long", max_tokens=250)) as stream:
                outputs = [o async for o in stream]
            assert trio.current_time() - start > SILENCE_S
            assert outputs[-1].finish_reason == "length"
            # Nothing in flight: the window must pass for real, and nothing happens.
            await trio.sleep(2 * SILENCE_S)
            assert client.alive
            async with client.generate(request("again", max_tokens=2)) as stream:
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "length"
            assert client.alive


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_consecutive_garbage_is_death(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol=proto)) as (client, (engine,)):
            async with client.generate(request("r", max_tokens=100_000)) as stream:
                await stream.__anext__()
                engine.send_garbage(MAX_CONSECUTIVE_DECODE_ERRORS)
                with pytest.raises(EngineDeadError, match="consecutive undecodable"):
                    async for _ in stream:
                        pass
            await _assert_latched_dead(client, "consecutive undecodable")


@pytest.mark.parametrize("count", range(1, MAX_CONSECUTIVE_DECODE_ERRORS))
async def test_sporadic_garbage_is_dropped(
    addresses: WorkerAddresses, count: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="smg_trio.connector.client")
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            async with client.generate(request("r", max_tokens=10)) as stream:
                outputs = [await stream.__anext__()]
                engine.send_garbage(count)
                outputs += [o async for o in stream]
            assert [t for o in outputs for t in o.new_token_ids] == engine.requests[0].generated
            assert len(engine.requests[0].generated) == 10
            assert outputs[-1].finish_reason == "length"
            # A good batch resets the count: another burst of the same size is survivable too.
            async with client.generate(request("r2", max_tokens=4)) as stream:
                await stream.__anext__()
                engine.send_garbage(count)
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "length"
            assert client.alive
    drops = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(drops) == 2 * count


@pytest.fixture
def tiny_pipes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make a send on the input ROUTER able to block: one-message HWMs and small kernel buffers
    on both ends (production runs the ROUTER with an unbounded HWM), and a 0.2 s send timeout."""
    monkeypatch.setattr(connections_mod, "ENGINE_SEND_TIMEOUT_S", 0.2)
    configure = topology._configure_input_router

    def bounded_router(sock: zmq.Socket[bytes]) -> None:
        configure(sock)
        sock.setsockopt(zmq.SNDHWM, 1)
        sock.setsockopt(zmq.SNDBUF, 4096)

    monkeypatch.setattr(topology, "_configure_input_router", bounded_router)
    engine_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    engine_ctx.setsockopt(zmq.RCVHWM, 1)
    engine_ctx.setsockopt(zmq.RCVBUF, 4096)
    monkeypatch.setattr(engine_side, "zmq_context", lambda: engine_ctx)
    monkeypatch.setattr(engine_side, "ENGINE_LINGER_MS", 0)
    yield
    engine_ctx.destroy(linger=0)


@pytest.mark.usefixtures("tiny_pipes")
async def test_a_stuck_send_is_death(addresses: WorkerAddresses) -> None:
    engine = RawEngine(addresses.handshake)  # never reads its input
    big_prompt = [1000] * 20_000  # ~60 kB per ADD
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client, AsyncExitStack() as held:
            streams = []
            with pytest.raises(EngineDeadError, match="send stuck") as info:  # noqa: PT012
                for i in range(1000):
                    start = trio.current_time()
                    stream = await held.enter_async_context(
                        client.generate(request(f"big-{i}", prompt=big_prompt))
                    )
                    streams.append(stream)
            assert trio.current_time() - start >= 0.2
            assert streams, "the first send already blocked"
            assert info.value is client.dead_reason
            for stream in streams:
                with pytest.raises(EngineDeadError, match="send stuck"):
                    await stream.receive_some()
            await _assert_latched_dead(client, "send stuck")


async def test_a_vanished_engine_is_death(addresses: WorkerAddresses) -> None:
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            async with client.generate(request("v", max_tokens=100_000)) as stream:
                await engine.recv_kind(b"\x00")
                # A hard exit, no sentinel: the input socket's monitor sees the connection
                # close, and after the reconnect grace the request fails (no 300 s silence).
                engine.close()
                with pytest.raises(EngineDeadError, match="disconnected from the input socket"):
                    await stream.receive_some()
            await _assert_latched_dead(client, "disconnected from the input socket")
