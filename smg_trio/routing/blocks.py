"""Content keys of a prompt's full KV blocks, chained from the prompt's start.

Key ``i`` is a 64-bit hash of (key ``i-1``, block ``i``'s token ids, the block's extra keys),
and the chain starts from a seed made of the LoRA name (an adapter's KV differs from the base
model's), so two prompts share key ``i`` exactly when they share their first ``i + 1`` blocks
(and adapter and cache salt). Matching keys, not the engine's own block hashes, makes the index
independent of the engine's ``--prefix-caching-hash-algo`` and its per-process seed.

Deterministic across processes: Python's ``hash`` of a tuple of ints does not depend on
``PYTHONHASHSEED`` (only ``str``/``bytes`` hashing is salted), and every string or bytes value
is digested with BLAKE2b first, so every frontend process computes the same keys. The cost is
one tuple slice and one tuple hash per block: linear in the prompt's token count, a few
microseconds per thousand tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

__all__ = [
    "MAX_EXTRA_DEPTH",
    "ROOT_KEY",
    "block_keys",
    "chain_seed",
    "extra_key",
    "stable_digest",
    "tail_key",
]

#: The seed of a chain with no LoRA adapter.
ROOT_KEY: Final = 0
#: The deepest nesting of tuples and lists an extra key may have (vLLM's are flat tuples of
#: strings, ints and bytes); deeper is malformed rather than a ``RecursionError``.
MAX_EXTRA_DEPTH: Final = 16


def stable_digest(value: object, _depth: int = 0) -> int:
    """A process-independent 64-bit integer for an extra-key value: an int as itself, ``str``
    and ``bytes`` by BLAKE2b, tuples and lists element-wise, ``None`` as a constant, anything
    else by its ``repr``. Raises ``ValueError`` for tuples and lists nested deeper than
    :data:`MAX_EXTRA_DEPTH`."""
    if value is None:
        return -2  # hash(None) is the object's address before Python 3.12
    if isinstance(value, int):  # bool too
        return hash(value)
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes | bytearray | memoryview):
        return int.from_bytes(hashlib.blake2b(bytes(value), digest_size=8).digest(), "big")
    if isinstance(value, tuple | list):
        if _depth >= MAX_EXTRA_DEPTH:
            raise ValueError(f"extra key nested deeper than {MAX_EXTRA_DEPTH}")
        return hash(tuple(stable_digest(v, _depth + 1) for v in value))
    return stable_digest(repr(value))


def chain_seed(lora_name: str | None) -> int:
    """The key a chain starts from: :data:`ROOT_KEY` for the base model, else a digest of the
    adapter's name."""
    return ROOT_KEY if not lora_name else hash((ROOT_KEY, stable_digest(lora_name)))


def extra_key(values: Sequence[object] | None) -> int | None:
    """One block's extra key (cache salt, multimodal identifiers) as one integer, ``None``
    when the block has none."""
    return None if not values else stable_digest(tuple(values))


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    *,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    parent: int | None = None,
    extras: Sequence[int | None] | None = None,
) -> list[int]:
    """The content keys of the full blocks of ``token_ids`` (a partial last block has none).

    Args:
        token_ids: The prompt's tokens (or, with ``parent``, the tokens after its blocks).
        block_size: Tokens per block, ``>= 1``.
        lora_name: The adapter the prompt runs with, if any (the chain's seed).
        cache_salt: The request's cache salt (vLLM's ``cache_salt``): an extra key of the
            prompt's first block, as vLLM hashes it. Ignored with ``parent``.
        parent: Continue the chain after the block of this key (events' ``parent_block_hash``
            already resolved to a key) instead of starting it.
        extras: Per-block extra keys (see :func:`extra_key`) overriding ``cache_salt``.

    Raises:
        ValueError: ``block_size < 1``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = len(token_ids) // block_size
    if n == 0:
        return []
    prev = chain_seed(lora_name) if parent is None else parent
    if extras is None and cache_salt and parent is None:
        extras = [extra_key((cache_salt,))]
    tokens = token_ids if isinstance(token_ids, list | tuple) else list(token_ids)
    out = [0] * n
    start = 0
    for i in range(n):
        block = tuple(tokens[start : start + block_size])
        start += block_size
        extra = extras[i] if extras is not None and i < len(extras) else None
        prev = hash((prev, block)) if extra is None else hash((prev, block, extra))
        out[i] = prev
    return out


def tail_key(token_ids: Sequence[int], block_size: int, keys: Sequence[int]) -> int | None:
    """A key for the tokens after the prompt's full blocks (``keys``, from
    :func:`block_keys`), ``None`` when there are none: never a block of the index, only how
    this prompt goes on past its last full block."""
    start = len(keys) * block_size
    if start >= len(token_ids):
        return None
    parent = keys[-1] if keys else ROOT_KEY
    return hash((parent, -1, tuple(token_ids[start:])))
