"""DP rank selection: pinned ranks, least-loaded scoring with reservations, rotating ties and
stale-load shedding (``RankRouter`` directly, then through a client with two engines)."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack

import pytest
import trio

from smg_trio.connector.routing import RankRouter
from smg_trio.errors import InvalidDataParallelRank
from smg_trio.mock.engine import MockEngineConfig, MockRequest
from smg_trio.protocol import vllm
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.types import EngineLoad
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import RawEngine, raw_serving, request, serving, vllm_output, wait_until

LONG = 100_000  # max_tokens of a request that outlives the test

# -- RankRouter ------------------------------------------------------------------------------


def test_pinned_rank_is_authoritative() -> None:
    router = RankRouter([3, 7])
    router.loads[1] = EngineLoad(num_running=50)
    assert router.reserve("a", 7) == 1  # despite the load
    assert router.inflight[1] == {"a"}
    with pytest.raises(InvalidDataParallelRank, match="out of range for 2 engine"):
        router.reserve("b", 0)
    assert router.inflight == [set(), {"a"}]


def test_a_rank_hint_is_taken_unless_pinned_or_down() -> None:
    """The routing policy's rank (cache_aware: where the prefix is) beats the load; a pinned
    rank beats the hint; a hint of a down or unknown rank falls back to the least loaded."""
    router = RankRouter([3, 7])
    router.loads[1] = EngineLoad(num_running=50)
    assert router.reserve("a", None, hint=7) == 1
    assert router.reserve("b", 3, hint=7) == 0
    router.down[1] = True
    assert router.reserve("c", None, hint=7) == 0
    assert router.reserve("d", None, hint=5) == 0
    assert router.scores() == [(3, 3.0)]


def test_a_cold_burst_spreads_across_engines() -> None:
    router = RankRouter([0, 1, 2])
    slots = [router.reserve(f"r{i}", None) for i in range(9)]
    assert Counter(slots) == {0: 3, 1: 3, 2: 3}


def test_ties_rotate() -> None:
    router = RankRouter([0, 1, 2])
    picks = []
    for i in range(6):
        slot = router.reserve(f"r{i}", None)
        picks.append(slot)
        router.release(slot, f"r{i}")
    assert picks == [0, 1, 2, 0, 1, 2]


def test_least_loaded_uses_the_reported_load() -> None:
    router = RankRouter([0, 1])
    router.loads[0] = EngineLoad(num_running=4)
    # Rank 1 wins until its own reservations catch up with rank 0's report.
    assert [router.reserve(f"r{i}", None) for i in range(4)] == [1, 1, 1, 1]
    assert router.score(0) == router.score(1) == 4.0
    assert {router.reserve("r4", None), router.reserve("r5", None)} == {0, 1}


def test_own_reservations_floor_a_stale_report() -> None:
    router = RankRouter([0, 1])
    router.loads[0] = EngineLoad(num_running=0)
    for i in range(3):
        router.inflight[0].add(f"mine{i}")
    assert router.score(0) == 3.0
    assert router.reserve("x", None) == 1


def test_kv_pressure_penalises_waiting_requests() -> None:
    router = RankRouter([0, 1])
    router.loads[0] = EngineLoad(num_running=1, num_waiting=2, kv_cache_usage=0.9)
    router.loads[1] = EngineLoad(num_running=6, num_waiting=0, kv_cache_usage=0.99)
    assert router.score(0) == pytest.approx(3 + 2 * 6.0 * 0.4)
    assert router.score(1) == 6.0  # nothing waiting: no penalty however full
    assert router.reserve("x", None) == 1
    # Below the knee waiting requests cost only their count.
    router.loads[0] = EngineLoad(num_running=1, num_waiting=2, kv_cache_usage=0.5)
    assert router.score(0) == 3.0


def test_release_is_idempotent_and_frees_only_its_own_slot() -> None:
    router = RankRouter([0, 1])
    a = router.reserve("a", 0)
    router.reserve("b", 0)
    router.release(a, "a")
    router.release(a, "a")
    router.release(1, "b")  # wrong slot: no effect
    assert router.inflight == [{"b"}, set()]


def test_an_emptied_rank_sheds_its_stale_queue_counts() -> None:
    router = RankRouter([0, 1])
    router.reserve("a", 0)
    router.reserve("b", 0)
    router.loads[0] = EngineLoad(num_running=3, num_waiting=2, kv_cache_usage=0.4)
    router.release(0, "a")
    assert router.loads[0] == EngineLoad(3, 2, 0.4)  # still busy: the report stands
    router.release(0, "b")
    assert router.loads[0] == EngineLoad(0, 0, 0.4)  # the KV usage is kept
    assert router.score(0) == 0.0


# -- through the client ----------------------------------------------------------------------

TWO_RANKS = (MockEngineConfig(engine_index=0), MockEngineConfig(engine_index=1))


def _foreign(request_id: str) -> MockRequest:
    """Work on an engine that this client did not submit (another frontend's)."""
    return MockRequest(
        request_id=request_id,
        prompt_token_ids=[1],
        max_tokens=LONG,
        min_tokens=0,
        stop_token_ids=set(),
        eos_token_id=None,
        ignore_eos=True,
        seed=1,
        temperature=1.0,
        logprobs=None,
        n=1,
        raw=None,
    )


async def test_a_pinned_rank_goes_to_that_engine(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, *TWO_RANKS) as (client, engines):
            assert sorted(e.index for e in client.engines) == [0, 1]
            for rank in (1, 0, 1):
                async with client.generate(request(f"p{rank}", rank=rank, max_tokens=2)) as s:
                    assert s.rank == rank
                    [o async for o in s]
            assert [r.request_id for r in engines[0].requests] == ["p0"]
            assert [r.request_id for r in engines[1].requests] == ["p1", "p1"]

            with pytest.raises(InvalidDataParallelRank):
                async with client.generate(request("nowhere", rank=2)):
                    pytest.fail("an out-of-range rank was admitted")
            assert client.inflight_count == 0
            assert all(not s for s in client._router.inflight)
            # Nothing was sent for it: the next ADD on each rank is the next request.
            for rank in (0, 1):
                async with client.generate(request(f"q{rank}", rank=rank, max_tokens=1)) as s:
                    [o async for o in s]
            assert [r.request_id for r in engines[0].requests] == ["p0", "q0"]
            assert [r.request_id for r in engines[1].requests] == ["p1", "p1", "q1"]


async def test_an_unpinned_cold_burst_spreads_across_both_engines(
    addresses: WorkerAddresses,
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, *TWO_RANKS) as (client, engines), AsyncExitStack() as held:
            streams = [
                await held.enter_async_context(client.generate(request(f"c{i}", max_tokens=LONG)))
                for i in range(6)
            ]
            assert Counter(s.rank for s in streams) == {0: 3, 1: 3}
            await wait_until(lambda: all(len(e.requests) == 3 for e in engines))
            for engine in engines:
                mine = {s.request_id for s in streams if s.rank == engine.config.engine_index}
                assert {r.request_id for r in engine.requests} == mine


async def test_unpinned_requests_prefer_the_least_loaded_engine(
    addresses: WorkerAddresses,
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, *TWO_RANKS) as (client, engines), AsyncExitStack() as held:
            for i in range(5):
                engines[0].active[f"foreign-{i}"] = _foreign(f"foreign-{i}")
            pinned = await held.enter_async_context(
                client.generate(request("pinned", rank=0, max_tokens=LONG))
            )
            # The batch carrying this output also reported rank 0's load (6 running); the
            # foreign requests' outputs in it were dropped as unknown ids.
            await pinned.__anext__()
            slot0 = [e.index for e in client.engines].index(0)
            assert client.load()[slot0].num_running == 6
            streams = [
                await held.enter_async_context(client.generate(request(f"u{i}", max_tokens=LONG)))
                for i in range(4)
            ]
            assert [s.rank for s in streams] == [1, 1, 1, 1]
            assert client.inflight_count == 5


async def test_load_reports_and_stale_counts_through_the_client(
    addresses: WorkerAddresses,
) -> None:
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            assert client.load() == [EngineLoad()]
            async with client.generate(request("r")) as stream:
                await engine.recv_kind(b"\x00")
                busy = vllm.SchedulerStats(
                    num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.7
                )
                await engine.push_vllm(vllm_output("r", [1]), scheduler_stats=busy)
                await stream.__anext__()
                assert client.load() == [EngineLoad(3, 2, 0.7)]
                # The final batch still carries the pre-finish snapshot.
                await engine.push_vllm(vllm_output("r", [2], finish=1), scheduler_stats=busy)
                [o async for o in stream]
            # This client's last request on the rank is done: the stale counts are shed.
            assert client.load() == [EngineLoad(0, 0, 0.7)]
