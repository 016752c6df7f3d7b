"""KvIndex: the engines' blocks by content key, fed like vLLM's KV events."""

from __future__ import annotations

import pytest

from smg_trio.routing.blocks import block_keys, extra_key
from smg_trio.routing.index import KvIndex

A = ("w1", 0)
B = ("w2", 0)
BS = 4


def tokens(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def index(*engines: tuple[str, int], gpu_blocks: int | None = None) -> KvIndex:
    idx = KvIndex()
    for e in engines:
        idx.add_engine(e, block_size=BS, num_gpu_blocks=gpu_blocks)
    return idx


def test_stored_blocks_match_the_prompt_chain() -> None:
    idx = index(A, B)
    prompt = tokens(5)
    assert idx.stored(A, [11, 12, 13], None, prompt[:12], BS)
    # continued by a later event whose parent is the engine's earlier block
    assert idx.stored(A, [14], 13, prompt[12:16], BS)
    assert idx.stored(B, [21], None, prompt[:4], BS)
    keys = block_keys(prompt, BS)
    assert idx.match(keys) == {A: 4, B: 1}
    assert idx.match(keys, engines=[B]) == {B: 1}
    assert idx.match(block_keys(tokens(3, start=1000), BS)) == {}


def test_removed_and_cleared() -> None:
    idx = index(A)
    prompt = tokens(3)
    idx.stored(A, [1, 2, 3], None, prompt, BS)
    idx.removed(A, [2])
    assert idx.match(block_keys(prompt, BS)) == {A: 1}
    idx.removed(A, [99])  # unknown: already evicted here, ignored
    idx.cleared(A)
    assert idx.match(block_keys(prompt, BS)) == {}
    assert idx.blocks(A) == 0
    assert idx.counters.resets == 1


def test_unknown_parent_is_dropped_and_counted() -> None:
    idx = index(A)
    assert not idx.stored(A, [5], 4, tokens(1), BS)
    assert idx.counters.unknown_parent == 1
    assert idx.blocks(A) == 0


def test_unknown_engine_is_counted() -> None:
    idx = index(A)
    assert not idx.stored(("nobody", 0), [1], None, tokens(1), BS)
    idx.removed(("nobody", 0), [1])
    idx.cleared(("nobody", 0))
    assert idx.counters.unknown_engine == 3


def test_block_size_mismatch_ignores_the_engine() -> None:
    idx = index(A)
    assert not idx.stored(A, [1], None, list(range(8)), 8)
    assert idx.counters.block_size_mismatch == 1
    assert idx.ignored(A)
    assert not idx.stored(A, [1], None, tokens(1), BS)  # ignored until a reset
    idx.reset(A)
    assert idx.stored(A, [1], None, tokens(1), BS)


def test_block_size_is_taken_from_the_events_when_not_registered() -> None:
    idx = KvIndex()
    idx.add_engine(A, block_size=None)
    assert idx.stored(A, [1, 2], None, list(range(32)), 16)
    assert idx.block_size(A) == 16


def test_other_media_and_groups_are_ignored() -> None:
    idx = index(A)
    assert not idx.stored(A, [1], None, tokens(1), BS, medium="CPU")
    assert not idx.stored(A, [1], None, tokens(1), BS, group_idx=1)
    assert idx.stored(A, [1], None, tokens(1), BS, medium="GPU", group_idx=0)
    assert idx.counters.other_medium == 2


def test_malformed_token_count_is_counted() -> None:
    idx = index(A)
    assert not idx.stored(A, [1, 2], None, tokens(1), BS)
    assert idx.counters.malformed == 1


def test_lora_and_salt_match_the_gateway_keys() -> None:
    idx = index(A)
    prompt = tokens(2)
    # vLLM's events carry the bare LoRA name and the salt as the first block's extra keys
    idx.stored(A, [1, 2], None, prompt, BS, "ad", [("ad", "salt"), ("ad",)])
    assert idx.match(block_keys(prompt, BS, lora_name="ad", cache_salt="salt")) == {A: 2}
    assert idx.match(block_keys(prompt, BS, lora_name="ad")) == {}
    assert idx.match(block_keys(prompt, BS)) == {}
    assert extra_key(None) is None


def test_bound_under_churn() -> None:
    """Stored blocks never exceed the engine's num_gpu_blocks: the oldest are forgotten,
    and the key map shrinks with them (no leak across many distinct prompts)."""
    idx = index(A, B, gpu_blocks=50)
    block_hash = 0
    for i in range(2000):
        n = 1 + i % 7
        hashes = list(range(block_hash, block_hash + n))
        block_hash += n
        idx.stored(A if i % 2 else B, hashes, None, tokens(n, start=i * 100), BS)
        assert idx.blocks(A) <= 50
        assert idx.blocks(B) <= 50
    assert idx.blocks(A) == 50
    assert len(idx._where) <= 100
    assert sum(len(e.by_hash) for e in idx._engines.values()) <= 100
    assert idx.counters.evicted > 0


def test_hard_cap_without_num_gpu_blocks() -> None:
    idx = KvIndex(max_blocks_per_engine=10)
    idx.add_engine(A, block_size=BS)
    idx.stored(A, list(range(30)), None, tokens(30), BS)
    assert idx.blocks(A) == 10


def test_drop_and_re_add_forget_the_engine() -> None:
    idx = index(A, B)
    prompt = tokens(2)
    idx.stored(A, [1, 2], None, prompt, BS)
    idx.stored(B, [1, 2], None, prompt, BS)
    idx.add_engine(A, block_size=BS)  # a new registration
    assert idx.match(block_keys(prompt, BS)) == {B: 2}
    idx.drop(B)
    assert idx.match(block_keys(prompt, BS)) == {}
    assert len(idx._where) == 0
    assert B not in idx


def test_approximate_record_and_expire() -> None:
    idx = index(A, B)
    prompt = block_keys(tokens(6), BS)
    idx.record(A, prompt, now=1.0)
    idx.record(B, prompt[:2], now=5.0)
    assert idx.match(prompt) == {A: 6, B: 2}
    assert idx.expire(before=3.0) == 6
    assert idx.match(prompt) == {B: 2}


def test_match_holes_end_the_prefix() -> None:
    idx = index(A)
    prompt = block_keys(tokens(4), BS)
    idx.record(A, [prompt[0], prompt[1], prompt[3]], now=0.0)
    assert idx.match(prompt) == {A: 2}


def test_match_is_linear_in_blocks() -> None:
    """The lookup visits each block key at most once: count the key-map lookups."""
    idx = index(A, B)
    prompt = block_keys(tokens(2000), BS)
    idx.record(A, prompt, now=0.0)
    idx.record(B, prompt[:1000], now=0.0)

    class Counting(dict[int, set[tuple[str, int]]]):
        gets = 0

        def get(self, key, default=None):  # type: ignore[no-untyped-def,override]
            Counting.gets += 1
            return super().get(key, default)

    idx._where = Counting(idx._where)
    assert idx.match(prompt) == {A: 2000, B: 1000}
    assert Counting.gets == 2000


def test_bad_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_blocks"):
        KvIndex(max_blocks_per_engine=0)


def test_routed_prompts_mark_forks_only_where_the_index_holds_blocks() -> None:
    idx = index(A)
    shared = block_keys(tokens(2), BS)
    idx.record(A, shared, now=0.0)
    idx.note_prompt([*shared, 101])
    assert not idx.is_fork(shared[1])
    idx.note_prompt([*shared, 102])
    assert idx.is_fork(shared[1])
    idx.note_prompt([7, 8, 9], tail=10)  # nothing of it held: nothing kept
    assert set(idx._child) <= set(idx._where)
    idx.drop(A)
    assert not idx.is_fork(shared[1])
    assert idx._child == {}


def test_one_content_under_many_hashes_keeps_the_hash_map_bounded() -> None:
    """A publisher that stores the same blocks again and again under fresh hashes (a
    misbehaving engine, or one whose hashes the content key does not tell apart) must not
    grow the engine's hash map past its capacity: each content key keeps one hash."""
    idx = index(A, gpu_blocks=8)
    for h in range(1000):
        assert idx.stored(A, [h], None, tokens(1), BS)
    state = idx._engines[A]
    assert len(state.keys) == 1
    assert len(state.by_hash) <= idx.capacity(A)
    # the latest hash is the one that removes it
    idx.removed(A, [999])
    assert idx.match(block_keys(tokens(1), BS)) == {}


def test_deeply_nested_extra_keys_are_malformed_not_a_crash() -> None:
    """Extra keys nested hundreds deep (only a hostile publisher sends them) are counted as
    malformed; digesting them must not raise ``RecursionError`` into the feed task."""
    idx = index(A)
    deep: object = None
    for _ in range(5000):
        deep = [deep]
    assert not idx.stored(A, [1], None, tokens(1), BS, extra=[(deep,)])
    assert idx.counters.malformed == 1
    assert idx.stored(A, [2], None, tokens(1), BS, extra=[("salt",)])
