"""The mock engine's prefix cache: an LRU of full KV blocks keyed like vLLM's, and its KV events.

Modelled on vLLM 0.32's ``vllm/v1/core/kv_cache_utils.py`` and ``block_pool.py``:

- a block is ``block_size`` tokens; only full blocks are cached;
- a block's hash chains over its parent's hash and its own token ids (so a block is found only
  after the same prefix), from a per-engine seed (vLLM's ``NONE_HASH``; set
  ``PYTHONHASHSEED``-like with ``seed``), published as a 64-bit integer (vLLM's
  ``ExternalBlockHash`` with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``);
- a lookup stops at ``len(prompt) - 1`` tokens (the last token is always recomputed for its
  logits, vLLM's ``max_cache_hit_length``);
- at most ``capacity`` blocks are held; storing past it evicts the least recently used block.
  A request's blocks are touched tail first, so that its last blocks go before its first
  (vLLM frees a request's blocks in reverse order);
- every change is an event (``BlockStored`` with the parent hash and the blocks' tokens,
  ``BlockRemoved`` on eviction, ``AllBlocksCleared`` on :meth:`PrefixCache.reset`), gathered
  until :meth:`PrefixCache.take_events` (vLLM batches them per engine step).

Not modelled: the blocks of running requests are not pinned, and the capacity bounds the cached
full blocks only (vLLM's pool also holds running requests' partial blocks).
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import attrs

from smg_trio.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KvEvent,
)

__all__ = ["CacheStats", "PrefixCache", "block_hashes"]

_MASK64 = (1 << 64) - 1


def block_hashes(seed: int, tokens: Sequence[int], block_size: int) -> list[int]:
    """The chained hashes of the full blocks of ``tokens`` (a partial last block has none):
    each is a 64-bit BLAKE2b of its parent's hash and its token ids."""
    full = len(tokens) // block_size
    data = array("q", tokens[: full * block_size]).tobytes()
    step = 8 * block_size
    out: list[int] = []
    parent = (seed & _MASK64).to_bytes(8, "big")
    for start in range(0, full * step, step):
        parent = hashlib.blake2b(parent + data[start : start + step], digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


@attrs.define
class CacheStats:
    """vLLM's ``PrefixCacheStats`` counters since the last :meth:`PrefixCache.take_stats`:
    requests looked up, prompt tokens queried, of which found cached."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    reset: bool = False


class PrefixCache:
    """An LRU of at most ``capacity`` full blocks of ``block_size`` tokens (see the module)."""

    def __init__(
        self,
        block_size: int,
        capacity: int,
        *,
        seed: int | None = None,
        events: bool = True,
        medium: str = "GPU",
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.block_size = block_size
        self.capacity = capacity
        self.seed = int.from_bytes(os.urandom(8), "big") if seed is None else seed & _MASK64
        self.events_enabled = events
        self.medium = medium
        #: block hash -> nothing; insertion order is recency (last = most recently used).
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._events: list[KvEvent] = []
        self.stats = CacheStats()
        #: Totals over the cache's life (for a benchmark's figures): requests, queries, hits.
        self.total = CacheStats()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def hashes(self, tokens: Sequence[int]) -> list[int]:
        """:func:`block_hashes` of ``tokens`` with this cache's seed and block size (none
        when the cache holds nothing)."""
        return block_hashes(self.seed, tokens, self.block_size) if self.capacity else []

    def lookup(self, prompt: Sequence[int], hashes: Sequence[int] | None = None) -> int:
        """Count a request's prompt against the cache and return its cached tokens: the full
        blocks of its longest cached prefix, short of the prompt's last token. The hit blocks
        become the most recently used. ``hashes`` are the prompt's (:meth:`hashes`), when
        known."""
        if hashes is None:
            hashes = self.hashes(prompt)
        hashes = hashes[: max(0, len(prompt) - 1) // self.block_size]
        hit = 0
        for h in hashes:
            if h not in self._lru:
                break
            hit += 1
        for h in reversed(hashes[:hit]):
            self._lru.move_to_end(h)
        cached = hit * self.block_size
        for stats in (self.stats, self.total):
            stats.requests += 1
            stats.queries += len(prompt)
            stats.hits += cached
        return cached

    def store(self, tokens: Sequence[int], hashes: Sequence[int] | None = None) -> None:
        """Cache the full blocks of ``tokens`` (computed tokens: a prompt, or a finished
        request's prompt and output), evicting the least recently used blocks past the
        capacity. New blocks are one ``BlockStored`` (chained to the parent of the first),
        each eviction a ``BlockRemoved``. ``hashes`` are the tokens' (:meth:`hashes`), when
        known."""
        if self.capacity == 0:
            return
        if hashes is None:
            hashes = self.hashes(tokens)
        first_new = next((i for i, h in enumerate(hashes) if h not in self._lru), len(hashes))
        new = hashes[first_new:]
        # Touch tail first: the prefix ends up most recent, the tail goes first.
        for h in reversed(hashes[:first_new]):
            self._lru.move_to_end(h)
        if not new:
            return
        room = self.capacity - first_new  # a chain needs its head: only the first blocks fit
        if room <= 0:
            return
        new = new[:room]
        removed: list[ExternalBlockHash] = []
        while len(self._lru) + len(new) > self.capacity:
            victim, _ = self._lru.popitem(last=False)
            removed.append(victim)
        self.evicted += len(removed)
        if removed and self.events_enabled:
            self._events.append(BlockRemoved(block_hashes=removed, medium=self.medium))
        for h in reversed(new):
            self._lru[h] = None
        for h in reversed(hashes[:first_new]):
            self._lru.move_to_end(h)
        if self.events_enabled:
            bs = self.block_size
            start = first_new * bs
            self._events.append(
                BlockStored(
                    block_hashes=list(new),
                    parent_block_hash=hashes[first_new - 1] if first_new else None,
                    token_ids=list(tokens[start : start + len(new) * bs]),
                    block_size=bs,
                    lora_id=None,
                    medium=self.medium,
                    lora_name=None,
                )
            )

    def reset(self) -> None:
        """Drop every block (vLLM's ``reset_prefix_cache``): one ``AllBlocksCleared``."""
        self._lru.clear()
        self.stats.reset = True
        if self.events_enabled:
            self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KvEvent]:
        """The events since the last call (one engine step's batch), oldest first."""
        events, self._events = self._events, []
        return events

    def take_stats(self) -> CacheStats:
        """The counters since the last call (the scheduler stats of one step), then zero."""
        stats, self.stats = self.stats, CacheStats()
        return stats
