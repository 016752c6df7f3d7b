"""Content keys of a prompt's blocks: chained, deterministic across processes, cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from smg_trio.routing.blocks import block_keys, chain_seed, extra_key, stable_digest


def test_only_full_blocks_get_keys() -> None:
    assert block_keys(list(range(15)), 16) == []
    assert len(block_keys(list(range(16)), 16)) == 1
    assert len(block_keys(list(range(47)), 16)) == 2


def test_keys_are_chained_from_the_start() -> None:
    a = block_keys([1] * 16 + [2] * 16 + [3] * 16, 16)
    b = block_keys([1] * 16 + [2] * 16 + [4] * 16, 16)
    c = block_keys([9] * 16 + [2] * 16 + [3] * 16, 16)
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    # the same block after a different prefix is a different key
    assert set(a).isdisjoint(c)


def test_continuing_from_a_parent_gives_the_same_keys() -> None:
    tokens = list(range(64))
    whole = block_keys(tokens, 16)
    tail = block_keys(tokens[32:], 16, parent=whole[1])
    assert tail == whole[2:]


def test_lora_and_salt_separate_the_chains() -> None:
    tokens = list(range(32))
    base = block_keys(tokens, 16)
    lora = block_keys(tokens, 16, lora_name="adapter")
    salted = block_keys(tokens, 16, cache_salt="s1")
    assert set(base).isdisjoint(lora)
    assert set(base).isdisjoint(salted)
    assert block_keys(tokens, 16, cache_salt="s1") == salted
    # the salt is the first block's extra key, as vLLM hashes it
    assert salted == block_keys(tokens, 16, extras=[extra_key(("s1",)), None])
    assert chain_seed(None) != chain_seed("adapter")


def test_bad_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="block_size"):
        block_keys([1, 2], 0)


_CHILD = (
    "from smg_trio.routing.blocks import block_keys, stable_digest;"
    "print(block_keys(list(range(100)), 16, lora_name='x', cache_salt='y'),"
    " stable_digest(('a', b'b', None, 3)))"
)


def test_keys_are_the_same_in_another_process() -> None:
    """str hashing is salted per process; the keys must not be (every frontend computes
    them). The child runs with another PYTHONHASHSEED."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    here = f"{block_keys(list(range(100)), 16, lora_name='x', cache_salt='y')} " + str(
        stable_digest(("a", b"b", None, 3))
    )
    assert out == here


def test_a_long_prompt_costs_one_hash_per_block() -> None:
    """Linear shape: 32k tokens of 16-token blocks are 2048 keys (no quadratic re-hashing of
    the prefix: each key hashes its parent key, not the parent's tokens)."""
    keys = block_keys(list(range(32768)), 16)
    assert len(keys) == 2048
    assert len(set(keys)) == 2048
