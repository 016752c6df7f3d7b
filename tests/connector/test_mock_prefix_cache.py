"""The mock engine's prefix cache: vLLM's chained full-block keys, its LRU bound and eviction
order, its events, and the cached tokens the mock reports on both wires."""

from __future__ import annotations

import pytest
import trio

from smg_trio.connector import EngineClient
from smg_trio.mock.engine import MockEngineConfig
from smg_trio.mock.prefix_cache import PrefixCache, block_hashes
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from smg_trio.protocol.types import EngineOutput
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import PROTOCOLS, ProtocolName, request, serving

BS = 16


def _prompt(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def test_lookup_finds_full_blocks_of_a_stored_prefix_short_of_the_last_token() -> None:
    cache = PrefixCache(BS, 100, seed=1)
    prompt = _prompt(1, 40)
    assert cache.lookup(prompt) == 0
    cache.store(prompt)  # two full blocks; the 8-token tail is not cached
    assert len(cache) == 2
    assert cache.lookup(prompt) == 32
    assert cache.lookup(prompt[:33]) == 32
    # 32 tokens: the last one is recomputed, so only the first block counts.
    assert cache.lookup(prompt[:32]) == 16
    assert cache.lookup(prompt[:20] + [7] * 20) == 16


def test_a_block_matches_only_after_the_same_prefix() -> None:
    cache = PrefixCache(BS, 100, seed=1)
    a, b = _prompt(1, 16), _prompt(2, 16)
    cache.store(a + b)
    assert cache.lookup(b + a + [0]) == 0  # the same blocks in another order
    assert cache.lookup(a + b + [0]) == 32
    assert block_hashes(1, a + b, BS)[1] != block_hashes(1, b, BS)[0]
    assert block_hashes(1, a, BS) != block_hashes(2, a, BS)  # the seed keys the chain


def test_store_publishes_new_blocks_chained_to_their_parent() -> None:
    cache = PrefixCache(BS, 100, seed=5)
    prompt = _prompt(1, 50)
    cache.store(prompt[:32])
    cache.store(prompt)  # one more full block after the two cached ones
    cache.store(prompt)  # nothing new: no event
    first, second = cache.take_events()
    hashes = block_hashes(5, prompt, BS)
    assert isinstance(first, BlockStored)
    assert isinstance(second, BlockStored)
    assert first.block_hashes == hashes[:2]
    assert first.parent_block_hash is None
    assert first.token_ids == prompt[:32]
    assert second.block_hashes == hashes[2:3]
    assert second.parent_block_hash == hashes[1]
    assert second.token_ids == prompt[32:48]
    assert (second.block_size, second.medium) == (BS, "GPU")
    assert cache.take_events() == []


def test_lru_evicts_the_least_recent_request_tail_first() -> None:
    cache = PrefixCache(BS, 4, seed=1)
    a, b = _prompt(1, 48), _prompt(2, 48)
    cache.store(a)
    cache.store(b)
    events = cache.take_events()
    ha = block_hashes(1, a, BS)
    assert [type(e) for e in events] == [BlockStored, BlockRemoved, BlockStored]
    removed = events[1]
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == [ha[2], ha[1]]  # a's tail first; its head survives
    assert len(cache) == 4
    assert cache.lookup(a) == 16
    assert cache.evicted == 2
    # a's head was just used: storing c evicts b's blocks, not it.
    cache.store(_prompt(3, 32))
    assert cache.lookup(a) == 16
    assert len(cache) == 4


def test_the_bound_holds_under_churn_and_a_prompt_larger_than_the_cache() -> None:
    cache = PrefixCache(BS, 8, seed=1)
    for tag in range(50):
        cache.store(_prompt(tag, 16 * (tag % 12 + 1)))
        assert len(cache) <= 8
    big = _prompt(99, 16 * 20)
    cache.store(big)
    assert len(cache) == 8
    assert cache.lookup(big) == 8 * 16  # the head of the chain fits, its tail does not


def test_stats_count_queries_and_hits_per_step_and_reset_clears_all() -> None:
    cache = PrefixCache(BS, 100, seed=1)
    prompt = _prompt(1, 40)
    cache.lookup(prompt)
    cache.store(prompt)
    cache.lookup(prompt)
    stats = cache.take_stats()
    assert (stats.requests, stats.queries, stats.hits, stats.reset) == (2, 80, 32, False)
    assert cache.take_stats().queries == 0
    cache.take_events()
    cache.reset()
    assert len(cache) == 0
    assert cache.take_events() == [AllBlocksCleared()]
    assert cache.take_stats().reset
    assert (cache.total.queries, cache.total.hits) == (80, 32)


def test_no_capacity_or_no_events() -> None:
    off = PrefixCache(BS, 0, seed=1)
    off.store(_prompt(1, 64))
    assert len(off) == 0
    assert off.take_events() == []
    quiet = PrefixCache(BS, 10, seed=1, events=False)
    quiet.store(_prompt(1, 64))
    assert len(quiet) == 4
    assert quiet.take_events() == []


async def _first_output(
    client: EngineClient, rid: str, prompt: list[int], max_tokens: int = 2
) -> EngineOutput:
    async with client.generate(request(rid, max_tokens=max_tokens, prompt=prompt)) as stream:
        outputs = [o async for o in stream]
    first: EngineOutput = outputs[0]
    return first


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_the_mock_reports_cached_prompt_tokens(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    config = MockEngineConfig(protocol=proto, block_size=BS, num_gpu_blocks=64)
    prompt = _prompt(1, 40)
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, config) as (client, (engine,)):
            first = await _first_output(client, "a", prompt, max_tokens=10)
            assert not first.cached_tokens  # vLLM says 0; TokenSpeed sends 0, read as None
            second = await _first_output(client, "b", prompt)
            assert second.cached_tokens == 32
            # The first request's answer is cached too (its prompt and output but the last
            # token, 49 tokens): a prompt that continues it finds 3 blocks.
            generated = engine.requests[0].generated
            third = await _first_output(client, "c", prompt + generated + _prompt(2, 30))
            assert third.cached_tokens == 48
            assert engine.cache.total.hits == 80


async def test_prefill_stats_and_scheduler_stats_carry_the_hits(
    addresses: WorkerAddresses,
) -> None:
    config = MockEngineConfig(block_size=BS, num_gpu_blocks=64)
    prompt = _prompt(1, 40)
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, config) as (client, (engine,)):
            sent: list[dict[str, int]] = []
            real_stats = engine._stats

            def spy() -> dict[str, object] | None:
                stats = real_stats()
                assert stats is not None
                pc = stats["prefix_cache_stats"]
                assert isinstance(pc, dict)
                sent.append(pc)
                return stats

            engine._stats = spy  # type: ignore[method-assign]
            await _first_output(client, "a", prompt)
            await _first_output(client, "b", prompt)
            assert sum(s["queries"] for s in sent) == 80
            assert sum(s["hits"] for s in sent) == 32
            assert sum(s["requests"] for s in sent) == 2
            ready = client.ready_responses[0]
            assert (ready.block_size, ready.num_gpu_blocks) == (BS, 64)
            assert ready.kv_cache_size_tokens == 64 * BS
            assert ready.kv_events_config is None
