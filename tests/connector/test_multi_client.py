"""Several frontend clients on one engine (vLLM's multi-client wire, ``--api-server-count``):
INIT names every client's pair, each request carries its ``client_index`` and its outputs come
back on that client's socket only, and a client re-bound after a crash ABORTs the requests of
its previous life when their outputs reach it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import msgspec
import pytest
import trio
import trio.testing

from smg_trio.connector.client import EngineClient, attach_engine_client, open_engine_client
from smg_trio.errors import WorkerAddressError
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol import vllm
from smg_trio.protocol.addresses import WorkerAddresses, client_data_plane, worker_addresses
from smg_trio.protocol.handshake import decode_init, encode_init
from smg_trio.protocol.vllm import VllmProtocol
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import READY_TIMEOUT_S, request


def test_client_addresses_are_derived_in_one_place() -> None:
    url = "ipc:///tmp/smg-zmq/w0"
    one = worker_addresses(url)
    assert one.inputs == [one.input] == ["ipc:///tmp/smg-zmq/w0-in.sock"]
    three = worker_addresses(url, client_count=3)
    assert three.input == one.input  # client 0 keeps smg's names
    assert three.inputs == [client_data_plane("/tmp/smg-zmq/w0", i)[0] for i in range(3)]
    assert three.outputs[2] == "ipc:///tmp/smg-zmq/w0-out-2.sock"
    second = three.for_client(2)
    assert (second.input, second.output) == (three.inputs[2], three.outputs[2])
    assert second.handshake == three.handshake
    with pytest.raises(WorkerAddressError):
        worker_addresses(url, client_index=3, client_count=3)


def test_init_lists_every_client_in_order() -> None:
    meta = decode_init(encode_init(["ipc:///a0", "ipc:///a1"], ["ipc:///b0", "ipc:///b1"]))
    assert meta.addresses.inputs == ["ipc:///a0", "ipc:///a1"]
    assert meta.addresses.outputs == ["ipc:///b0", "ipc:///b1"]
    with pytest.raises(ValueError):
        encode_init(["ipc:///a0"], ["ipc:///b0", "ipc:///b1"])


def test_the_add_carries_the_client_index() -> None:
    frames = VllmProtocol(client_index=2).encode_add(request("r"))
    assert msgspec.msgpack.decode(frames[1], type=vllm.EngineCoreRequest).client_index == 2
    frames = VllmProtocol().encode_add(request("r"))
    assert msgspec.msgpack.decode(frames[1], type=vllm.EngineCoreRequest).client_index == 0


@asynccontextmanager
async def _clients(
    addresses: WorkerAddresses,
    count: int,
    config: MockEngineConfig | None = None,
    *,
    attached: int | None = None,
) -> AsyncIterator[tuple[MockEngine, list[EngineClient]]]:
    """One mock engine for ``count`` clients; client 0 handshakes with it, clients
    1..``attached`` - 1 attach (all of them by default)."""
    multi = attrs.evolve(addresses, client_count=count)
    engine = MockEngine(multi.handshake, config or MockEngineConfig())
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        nursery.start_soon(engine.run)
        first = await stack.enter_async_context(
            open_engine_client(VllmProtocol(), multi, ready_timeout_s=READY_TIMEOUT_S)
        )
        clients = [first]
        for i in range(1, count if attached is None else attached):
            clients.append(
                await stack.enter_async_context(
                    attach_engine_client(VllmProtocol(i), multi.for_client(i), first.engines)
                )
            )
        yield engine, clients
        nursery.cancel_scope.cancel()


async def _collect(client: EngineClient, rid: str, max_tokens: int = 4) -> list[int]:
    async with client.generate(request(rid, max_tokens=max_tokens)) as stream:
        return [t async for out in stream for t in out.new_token_ids]


async def test_each_clients_outputs_come_back_on_its_own_socket(
    addresses: WorkerAddresses,
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with _clients(addresses, 3) as (engine, clients):
            assert engine.client_count == 3
            results: dict[int, list[int]] = {}

            async def one(i: int) -> None:
                results[i] = await _collect(clients[i], f"r{i}")

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i)
            assert {i: len(toks) for i, toks in results.items()} == {0: 4, 1: 4, 2: 4}
            assert sorted((r.request_id, r.client_index) for r in engine.requests) == [
                ("r0", 0),
                ("r1", 1),
                ("r2", 2),
            ]
            # Nothing was routed to a client that did not send it: every registry is empty and
            # no client saw an id it did not know (it would have ABORTed it).
            assert engine.aborts == []
            assert all(c.inflight_count == 0 for c in clients)


async def test_a_rebound_client_aborts_its_previous_lifes_requests(
    addresses: WorkerAddresses,
) -> None:
    second_addresses = attrs.evolve(addresses, client_count=2).for_client(1)
    with trio.fail_after(IO_DEADLINE_S):
        async with _clients(addresses, 2, MockEngineConfig(step_s=0.005), attached=1) as (
            engine,
            [first],
        ):
            async with (
                attach_engine_client(VllmProtocol(1), second_addresses, first.engines) as second,
                second.generate(request("orphan", max_tokens=100_000)) as stream,
            ):
                await stream.__anext__()
                # The frontend dies: no ABORT leaves it (a dead client sends none).
                second.kill("simulated frontend crash")
            assert "orphan" in engine.active
            assert engine.aborts == []
            # Its replacement binds the same addresses; the engine reconnects and delivers
            # the orphan's outputs there, and the new client ABORTs the id it never sent.
            async with attach_engine_client(
                VllmProtocol(1), second_addresses, first.engines
            ) as again:
                while "orphan" not in engine.aborts:
                    await engine.abort_event.wait()
                assert "orphan" not in engine.active
                assert await _collect(again, "fresh") != []


async def test_a_rebound_client_does_not_keep_its_previous_lifes_load(
    addresses: WorkerAddresses,
) -> None:
    """The outputs a restarted frontend finds queued for it (its previous life's requests) carry
    the engine's stats of then; once those orphans are ABORTed no later stats need reach this
    client (vLLM sends them with a client's own outputs), so they must not stay its load view
    (they did: the merged /metrics showed the dead frontend's streams as running for good)."""
    second_addresses = attrs.evolve(addresses, client_count=2).for_client(1)
    with trio.fail_after(IO_DEADLINE_S):
        async with _clients(addresses, 2, MockEngineConfig(step_s=0.005), attached=1) as (
            engine,
            [first],
        ):
            async with (
                attach_engine_client(VllmProtocol(1), second_addresses, first.engines) as second,
                AsyncExitStack() as streams,
            ):
                for rid in ("orphan-a", "orphan-b"):
                    stream = await streams.enter_async_context(
                        second.generate(request(rid, max_tokens=100_000))
                    )
                    await stream.__anext__()
                second.kill("simulated frontend crash")
            async with attach_engine_client(
                VllmProtocol(1), second_addresses, first.engines
            ) as again:
                while not {"orphan-a", "orphan-b"} <= set(engine.aborts):
                    await engine.abort_event.wait()
                assert [load.num_running for load in again.load()] == [0]
                assert again.inflight_count == 0


async def test_stats_reach_one_client_and_the_others_still_route(
    addresses: WorkerAddresses,
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with _clients(addresses, 2) as (_engine, clients):
            await _collect(clients[1], "a")
            await _collect(clients[0], "b")
            # Client 1 may never get a stats batch (vLLM sends them to one client); its load
            # view falls back to its own in-flight count and it routes all the same.
            for client in clients:
                assert [load.num_running for load in client.load()] == [0]
            assert await _collect(clients[1], "c") != []
