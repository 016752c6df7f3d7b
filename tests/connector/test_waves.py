"""DP waves of lockstep vLLM groups (ready response ``data_parallel_size > 1``): every submit
wakes every rank with ``START_DP_WAVE``, ``wave_complete`` and ``start_wave`` move the clock,
and independent ranks are never woken."""

from __future__ import annotations

from typing import Any

import trio

from smg_trio.connector.routing import WaveClock
from smg_trio.mock.engine import MockEngineConfig
from smg_trio.protocol.addresses import WorkerAddresses
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import RawEngine, raw_serving, request, serving, vllm_output, wait_until

ADD = b"\x00"
START_DP_WAVE = b"\x02"


def test_wave_clock() -> None:
    clock = WaveClock()
    assert clock.next_wake() == 1
    clock.wave_complete(5)
    assert clock.wave == 6
    assert clock.next_wake() == 7
    clock.wave_complete(3)  # behind: no effect
    assert clock.next_wake() == 8
    assert clock.start_wave(20) == 21
    assert clock.start_wave(2) == 22


async def test_first_submit_wakes_the_whole_lockstep_group(addresses: WorkerAddresses) -> None:
    cfgs = [MockEngineConfig(engine_index=i, data_parallel_size=2) for i in (0, 1)]
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, *cfgs) as (client, engines):
            assert client.wave == 0
            async with client.generate(request("w1", rank=0, max_tokens=3)) as stream:
                # After the ADD, both ranks (including the one holding it) get wave 1.
                await wait_until(lambda: all(e.waves for e in engines))
                assert [e.waves for e in engines] == [[(1, None)], [(1, None)]]
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "length"
            # Rank 0 drains and reports wave_complete(1): the clock moves past it.
            await wait_until(lambda: (client.wave or 0) >= 2)
            async with client.generate(request("w2", rank=1, max_tokens=1)) as stream:
                await wait_until(lambda: all(len(e.waves) == 2 for e in engines))
                [o async for o in stream]
            for engine in engines:
                assert engine.waves[1][0] > 1


async def _expect_wave(engine: RawEngine) -> int:
    kind, payload = await engine.recv()
    assert kind == START_DP_WAVE, (kind, payload)
    wave, exclude = payload
    assert exclude is None
    assert isinstance(wave, int)
    return wave


async def test_wave_complete_and_start_wave_move_the_clock(addresses: WorkerAddresses) -> None:
    ranks = [RawEngine(addresses.handshake, engine_index=i, data_parallel_size=2) for i in (0, 1)]
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, *ranks) as client:
            # A rank reports completing a wave ahead of the clock: no wake, but the next one
            # names a later wave.
            await ranks[1].push_vllm(wave_complete=7)
            await wait_until(lambda: client.wave == 8)
            async with client.generate(request("a", rank=0)) as stream:
                payload: Any = await ranks[0].recv_kind(ADD)
                assert payload[0] == "a"
                waves = [await _expect_wave(r) for r in ranks]
                assert waves[0] == waves[1] > 7
                await ranks[0].push_vllm(vllm_output("a", [1], finish=1))
                [o async for o in stream]

            # A rank asks for wave 20 to start: every rank is woken with a wave >= 20 at once.
            await ranks[0].push_vllm(start_wave=20)
            waves = [await _expect_wave(r) for r in ranks]
            assert waves[0] == waves[1] >= 20
            assert client.alive


async def test_independent_ranks_are_never_woken(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(
            addresses, MockEngineConfig(engine_index=0), MockEngineConfig(engine_index=1)
        ) as (client, engines):
            assert client.wave is None
            for i in range(4):
                async with client.generate(request(f"i{i}", max_tokens=2)) as stream:
                    [o async for o in stream]
            assert all(e.requests for e in engines)
            assert [e.waves for e in engines] == [[], []]


async def test_wave_notifications_from_independent_ranks_are_ignored(
    addresses: WorkerAddresses,
) -> None:
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            await engine.push_vllm(wave_complete=3)
            await engine.push_vllm(start_wave=9)
            async with client.generate(request("x")) as stream:
                # The very next input is the ADD: no START_DP_WAVE was sent.
                kind, payload = await engine.recv()
                assert (kind, payload[0]) == (ADD, "x")
                await engine.push_vllm(vllm_output("x", [1], finish=1))
                [o async for o in stream]
            assert client.wave is None
            assert client.alive


async def test_a_failed_background_wake_latches_dead_cleanly(
    addresses: WorkerAddresses,
) -> None:
    ranks = [RawEngine(addresses.handshake, engine_index=i, data_parallel_size=2) for i in (0, 1)]
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, *ranks) as client:
            ranks[1].close()
            await ranks[1].closed.wait()
            # Once the ROUTER has seen rank 1 go, the wake a start_wave triggers cannot be
            # routed. That happens in the client's own nursery: it must not crash the nursery.
            while client.alive:
                await ranks[0].push_vllm(start_wave=1)
                async with trio.open_nursery() as race:

                    async def woken() -> None:
                        await ranks[0].recv_kind(START_DP_WAVE)
                        race.cancel_scope.cancel()

                    async def died() -> None:
                        await client.dead_event.wait()
                        race.cancel_scope.cancel()

                    race.start_soon(woken)
                    race.start_soon(died)
            assert client.dead_event.is_set()
            # The unroutable wake fails alone; the rank's closed connection is what latches
            # the lockstep group dead (after the reconnect grace).
            assert "disconnected from the input socket" in str(client.dead_reason)
