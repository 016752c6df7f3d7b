"""A local user cannot claim a tcp worker's engine (issue 28, item 2): a process of another
uid that dials the gateway's tcp input socket with the engine's identity receives no prompt,
and the real engine's requests complete; an engine whose connection drops still reconnects.

The claimant runs as uid 65534 (``nobody``; the tests run as root); its connection comes from
127.0.0.1, which the allow-list admits, so only its uid tells it apart."""

from __future__ import annotations

import os

import pytest
import trio

from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.connector import state as state_mod
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses
from smg_trio.transport.monitor import ConnectionEvent
from smg_trio.transport.tcp import TcpOptions, shut_down_connection
from tests.helpers.claimant import claimant
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import make_protocol, request, serving, wait_until
from tests.helpers.ports import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running a claimant as uid 65534")

NOBODY = 65534


@pytest.fixture
def tcp_worker() -> WorkerAddresses:
    return worker_addresses(f"tcp://127.0.0.1:{free_port()}")


async def _complete(client: EngineClient, rid: str) -> None:
    async with client.generate(request(rid, max_tokens=2)) as stream:
        assert [o async for o in stream][-1].finish_reason == "length"


async def test_another_uid_claiming_the_engines_identity_receives_no_prompt(
    tcp_worker: WorkerAddresses,
) -> None:
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig(step_s=0.001))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run)
        with trio.fail_after(IO_DEADLINE_S * 2):
            async with open_engine_client(
                make_protocol("vllm"), tcp_worker, ready_timeout_s=IO_DEADLINE_S, tcp=TcpOptions()
            ) as client:
                await _complete(client, "before")
                identity = client.engines[0].identity
                address = client._sockets.input_address
                async with claimant(address, identity, NOBODY) as claim:
                    assert await claim.next() == f"uid {NOBODY}"
                    # its connection got as far as it can: a ZMTP handshake that succeeded
                    # (the identity taken over: ROUTER_HANDOVER) or failed
                    attempt = await claim.next()
                    assert attempt.startswith("attempt ")
                    with trio.move_on_after(IO_DEADLINE_S) as hung:
                        for i in range(5):
                            await _complete(client, f"after-{i}")
                    assert await claim.stop() == "received 0"
                    assert not hung.cancelled_caught, "the engine's requests hung"
                    assert attempt != "attempt handshake-succeeded"
        nursery.cancel_scope.cancel()


async def test_another_uid_that_handshakes_first_as_the_engine_receives_no_prompt(
    tcp_worker: WorkerAddresses,
) -> None:
    # Before the engine starts, the claimant says HELLO and READY as engine 0, gets INIT,
    # and registers on the input socket as the engine does: its registration never arrives
    # (its connection is refused), so the real engine, starting next, is the worker's engine.
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig(step_s=0.001))
    identity = (0).to_bytes(2, "little")
    async with trio.open_nursery() as nursery:
        with trio.fail_after(IO_DEADLINE_S * 2):
            client_ready: trio.MemorySendChannel[EngineClient]
            client_ready, got_client = trio.open_memory_channel(1)
            done = trio.Event()

            async def serve() -> None:
                async with open_engine_client(
                    make_protocol("vllm"), tcp_worker, ready_timeout_s=IO_DEADLINE_S
                ) as client:
                    await client_ready.send(client)
                    await done.wait()

            nursery.start_soon(serve)
            async with claimant(
                tcp_worker.handshake, identity, NOBODY, engine.registration()
            ) as claim:
                assert await claim.next() == f"uid {NOBODY}"
                assert await claim.next() == "introduced"
                attempt = await claim.next()
                nursery.start_soon(engine.run)
                client = await got_client.receive()
                with trio.move_on_after(IO_DEADLINE_S) as hung:
                    for i in range(3):
                        await _complete(client, f"after-{i}")
                assert await claim.stop() == "received 0"
                assert not hung.cancelled_caught, "the engine's requests hung"
                assert attempt != "attempt handshake-succeeded"
            done.set()
        nursery.cancel_scope.cancel()


async def test_an_engine_whose_connection_drops_reconnects(tcp_worker: WorkerAddresses) -> None:
    # The engine's input connection is cut (as by a network blip): its DEALER dials again
    # with the same identity, passes the peer check, and the rank serves again.
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig(step_s=0.001))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run)
        with trio.fail_after(IO_DEADLINE_S):
            async with open_engine_client(
                make_protocol("vllm"),
                tcp_worker,
                ready_timeout_s=IO_DEADLINE_S,
                disconnect_grace_s=IO_DEADLINE_S,
                tcp=TcpOptions(),
            ) as client:
                await _complete(client, "before")
                fd = client.engines[0].connection_fd
                assert fd is not None
                shut_down_connection(fd)
                await wait_until(lambda: client._router.down[0])  # the monitor saw it go
                await wait_until(lambda: not client._router.down[0])  # and come back
                await _complete(client, "after")
        nursery.cancel_scope.cancel()


async def test_a_connection_closed_before_its_accept_is_read_claims_no_rank(
    tcp_worker: WorkerAddresses,
) -> None:
    # While rank 0 is suspect, a refused peer's connection (closed by the time the monitor's
    # ACCEPTED is read) must not be taken for the rank coming back: it would claim the rank,
    # the engine's own reconnect would find it claimed, and the stranger's DISCONNECTED would
    # then make the rank suspect again for good.
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig(step_s=0.001))
    closed_fd = 65000
    with pytest.raises(OSError):
        os.fstat(closed_fd)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run)
        with trio.fail_after(IO_DEADLINE_S):
            async with open_engine_client(
                make_protocol("vllm"),
                tcp_worker,
                ready_timeout_s=IO_DEADLINE_S,
                disconnect_grace_s=IO_DEADLINE_S,
            ) as client:
                await _complete(client, "before")
                fd = client.engines[0].connection_fd
                assert fd is not None
                shut_down_connection(fd)
                await wait_until(lambda: client._router.down[0])
                # the engine redials in RECONNECT_IVL (100 ms): the stranger's events first
                client._on_connection_event(ConnectionEvent("accepted", closed_fd))
                await wait_until(lambda: not client._router.down[0])
                client._on_connection_event(ConnectionEvent("closed", closed_fd))
                assert not client._router.down[0]
                await _complete(client, "after")
        nursery.cancel_scope.cancel()


async def test_a_restarted_rank_is_readmitted_and_a_claimant_in_its_absence_gets_nothing(
    tcp_worker: WorkerAddresses, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DP=2, independent ranks over tcp: rank 0's engine dies; while it is gone a process of
    # another uid dials the input socket with rank 0's identity (nobody holds it then); the
    # restarted engine is re-admitted (a new connection, a new handshake, through the guard)
    # and serves rank 0's requests; the claimant received none of them.
    monkeypatch.setattr(state_mod, "ENGINE_DISCONNECT_GRACE_S", 0.05)
    configs = [MockEngineConfig(engine_index=i, step_s=0.005) for i in range(2)]
    with trio.fail_after(IO_DEADLINE_S * 2):
        async with (
            serving(tcp_worker, *configs, silence_timeout_s=300.0) as (client, engines),
            trio.open_nursery() as nursery,
        ):
            slot = client.ranks.index(0)
            identity = client.engines[slot].identity
            engines[0].die_silently()
            await wait_until(lambda: slot in client._lost)
            async with claimant(client._sockets.input_address, identity, NOBODY) as claim:
                assert await claim.next() == f"uid {NOBODY}"
                attempt = await claim.next()
                restarted = MockEngine(tcp_worker.handshake, configs[0])
                nursery.start_soon(restarted.run)
                await wait_until(lambda: slot not in client._lost)
                with trio.move_on_after(IO_DEADLINE_S) as hung:
                    for i in range(3):
                        async with client.generate(request(f"r0-{i}", max_tokens=2, rank=0)) as st:
                            assert [o async for o in st][-1].finish_reason == "length"
                assert await claim.stop() == "received 0"
                assert not hung.cancelled_caught, "rank 0's requests hung"
                assert attempt != "attempt handshake-succeeded"
            assert client.alive
            nursery.cancel_scope.cancel()
