"""``KvIndex``: which content-keyed KV blocks each engine (worker id, DP rank) holds.

A pure data structure, fed with plain values: the engines' own KV events (``stored``,
``removed``, ``cleared``; the feed in the worker layer decodes the wire) or, for engines that
publish none, the key chains of the prompts this gateway routed to them (``record``, an
approximation as smg's ``cache_aware`` keeps). A lookup finds, for a prompt's key chain
(:func:`~smg_trio.routing.blocks.block_keys`), the longest cached prefix in blocks on every
engine, in time linear in the prompt's block count.

Memory is bounded per engine by its reported ``num_gpu_blocks`` (when known) and a hard cap:
past it the engine's least recently stored blocks are forgotten (they are the ones its own LRU
evicts first). Only the engine's main medium counts (``GPU`` or unset) and only KV cache group
0 (``group_idx`` unset or 0): offloaded CPU/disk copies and the other groups of hybrid models
are ignored (and counted).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from smg_trio.routing.blocks import block_keys, chain_seed, extra_key

__all__ = [
    "DEFAULT_MAX_BLOCKS_PER_ENGINE",
    "EngineKey",
    "IndexCounters",
    "KvIndex",
]

#: An engine: (worker id, DP rank).
EngineKey = tuple[str, int]

#: The hard cap of blocks indexed per engine (about 100 bytes each, plus the shared key map).
DEFAULT_MAX_BLOCKS_PER_ENGINE: Final = 1 << 18

_MAIN_MEDIA: Final = frozenset({None, "GPU", "gpu"})
_MISSING: Final = object()


@dataclass
class IndexCounters:
    """What the index dropped or forgot, by kind (Prometheus counters)."""

    unknown_engine: int = 0
    unknown_parent: int = 0
    block_size_mismatch: int = 0
    malformed: int = 0
    other_medium: int = 0
    evicted: int = 0
    resets: int = 0


@dataclass(eq=False)
class _Engine:
    block_size: int | None
    capacity: int
    #: Content key -> the engine's block hash (events) or the last time it was routed
    #: (approximate); oldest first.
    keys: OrderedDict[int, object] = field(default_factory=OrderedDict)
    #: The engine's block hash -> content key (events only).
    by_hash: dict[object, int] = field(default_factory=dict)
    #: Events of this engine are ignored (a block size that contradicts its registration).
    ignored: bool = False


class KvIndex:
    """Content-keyed blocks per engine, and which engines hold each key.

    Engines are added with :meth:`add_engine` (their registration: block size, capacity); feed
    calls for an engine not added are counted (``unknown_engine``) and ignored. Not thread
    safe; every method runs to completion without blocking.
    """

    def __init__(self, *, max_blocks_per_engine: int = DEFAULT_MAX_BLOCKS_PER_ENGINE) -> None:
        if max_blocks_per_engine < 1:
            raise ValueError("max_blocks_per_engine must be >= 1")
        self.max_blocks_per_engine = max_blocks_per_engine
        self.counters = IndexCounters()
        self._engines: dict[EngineKey, _Engine] = {}
        #: Content key -> the engines holding it.
        self._where: dict[int, set[EngineKey]] = {}
        #: Content key -> the first key seen after it; keys seen with two different
        #: continuations are in ``_forks`` (a prefix several prompts share, such as a system
        #: prompt). Both shrink with ``_where``.
        self._child: dict[int, int] = {}
        self._forks: set[int] = set()

    # -- engines -------------------------------------------------------------------------

    def add_engine(
        self, engine: EngineKey, *, block_size: int | None, num_gpu_blocks: int | None = None
    ) -> None:
        """Start (or restart: its blocks are forgotten) indexing ``engine``. ``block_size`` is
        its registration's (``None``: taken from its first event); its capacity is
        ``num_gpu_blocks`` (when positive) within the hard cap."""
        self.drop(engine)
        cap = self.max_blocks_per_engine
        if num_gpu_blocks is not None and num_gpu_blocks > 0:
            cap = min(cap, num_gpu_blocks)
        self._engines[engine] = _Engine(block_size, cap)

    def drop(self, engine: EngineKey) -> None:
        """Forget ``engine`` and its blocks (a removed worker)."""
        state = self._engines.pop(engine, None)
        if state is not None:
            self._forget_all(engine, state)

    def reset(self, engine: EngineKey) -> None:
        """Forget ``engine``'s blocks but keep indexing it (a gap in its events, a restart)."""
        state = self._engines.get(engine)
        if state is not None:
            self._forget_all(engine, state)
            state.ignored = False
            self.counters.resets += 1

    def engines(self) -> list[EngineKey]:
        """The engines indexed."""
        return list(self._engines)

    def __contains__(self, engine: object) -> bool:
        return engine in self._engines

    def blocks(self, engine: EngineKey) -> int:
        """Blocks indexed for ``engine`` (0 if unknown)."""
        state = self._engines.get(engine)
        return 0 if state is None else len(state.keys)

    def capacity(self, engine: EngineKey) -> int:
        """The most blocks kept for ``engine`` (0 if unknown)."""
        state = self._engines.get(engine)
        return 0 if state is None else state.capacity

    def block_size(self, engine: EngineKey) -> int | None:
        """``engine``'s block size, if known."""
        state = self._engines.get(engine)
        return None if state is None else state.block_size

    def ignored(self, engine: EngineKey) -> bool:
        """Whether ``engine``'s events are being ignored (block size mismatch)."""
        state = self._engines.get(engine)
        return state is not None and state.ignored

    def __len__(self) -> int:
        return sum(len(s.keys) for s in self._engines.values())

    # -- the engines' events -------------------------------------------------------------

    def stored(
        self,
        engine: EngineKey,
        block_hashes: Sequence[object],
        parent_hash: object | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
        extra: Sequence[Sequence[object] | None] | None = None,
        *,
        medium: str | None = None,
        group_idx: int | None = None,
    ) -> bool:
        """A ``BlockStored`` event. Returns whether it was indexed: it is not (and is counted)
        for an unknown engine, a block size other than the engine's registration (the engine's
        events are then ignored until a reset), another medium or KV cache group, tokens that
        do not fill the blocks, or a parent the index does not know (events were missed)."""
        state = self._engines.get(engine)
        c = self.counters
        if state is None:
            c.unknown_engine += 1
            return False
        if state.ignored:
            return False
        if medium not in _MAIN_MEDIA or group_idx not in (None, 0):
            c.other_medium += 1
            return False
        if state.block_size is None and block_size > 0:
            state.block_size = block_size
        if block_size != state.block_size:
            c.block_size_mismatch += 1
            state.ignored = True
            self._forget_all(engine, state)
            return False
        if not block_hashes or len(token_ids) != len(block_hashes) * block_size:
            c.malformed += 1
            return False
        if parent_hash is None:
            parent = None
        else:
            parent = state.by_hash.get(parent_hash)
            if parent is None:
                c.unknown_parent += 1
                return False
        extras = None
        if extra is not None:
            try:
                extras = [
                    extra_key([v for v in values if v != lora_name]) if values else None
                    for values in extra
                ]
            except ValueError:  # nested too deeply
                c.malformed += 1
                return False
        keys = block_keys(
            token_ids,
            block_size,
            lora_name=lora_name,
            parent=parent if parent is not None else chain_seed(lora_name),
            extras=extras,
        )
        self._link(parent, keys)
        for h, key in zip(block_hashes, keys, strict=True):
            old = state.by_hash.get(h)
            if old is not None and old != key:
                self._remove_key(engine, state, old)
            # one hash per content key: the same blocks stored again under another hash
            # replace the earlier hash, so the hash map stays within the engine's capacity
            prev = state.keys.get(key, _MISSING)
            if prev is not _MISSING and prev != h and state.by_hash.get(prev) == key:
                del state.by_hash[prev]
            self._insert(engine, state, key, h)
            state.by_hash[h] = key
        return True

    def removed(
        self,
        engine: EngineKey,
        block_hashes: Iterable[object],
        *,
        medium: str | None = None,
        group_idx: int | None = None,
    ) -> None:
        """A ``BlockRemoved`` event: forget these blocks of ``engine`` (unknown hashes are
        ignored: the index may have evicted them first)."""
        state = self._engines.get(engine)
        if state is None:
            self.counters.unknown_engine += 1
            return
        if medium not in _MAIN_MEDIA or group_idx not in (None, 0):
            self.counters.other_medium += 1
            return
        for h in block_hashes:
            key = state.by_hash.pop(h, None)
            if key is not None:
                self._remove_key(engine, state, key)

    def cleared(self, engine: EngineKey) -> None:
        """An ``AllBlocksCleared`` event: ``engine`` holds nothing now."""
        if engine not in self._engines:
            self.counters.unknown_engine += 1
            return
        self.reset(engine)

    # -- the approximate index of routed prompts -----------------------------------------

    def record(self, engine: EngineKey, keys: Sequence[int], now: float) -> None:
        """``engine`` was sent a prompt with this key chain at ``now``: its blocks count as
        cached there (most recently used) until evicted by size or :meth:`expire`."""
        state = self._engines.get(engine)
        if state is None:
            self.counters.unknown_engine += 1
            return
        self._link(None, keys)
        for key in keys:
            self._insert(engine, state, key, now)

    def expire(self, before: float) -> int:
        """Forget every block recorded before ``before`` (approximate index only). Returns how
        many were forgotten."""
        gone = 0
        for engine, state in self._engines.items():
            keys = state.keys
            while keys:
                key, stamp = next(iter(keys.items()))
                if not isinstance(stamp, float | int) or stamp >= before:
                    break
                self._remove_key(engine, state, key)
                gone += 1
        return gone

    # -- lookup --------------------------------------------------------------------------

    def match(
        self, keys: Sequence[int], engines: Collection[EngineKey] | None = None
    ) -> dict[EngineKey, int]:
        """The longest prefix of ``keys`` (in blocks) each engine holds, for the engines (of
        ``engines``, if given) that hold at least its first block. One dict lookup and one
        small set intersection per block: linear in the prompt's block count."""
        result: dict[EngineKey, int] = {}
        cand: set[EngineKey] | None = None
        depth = 0
        where = self._where
        for key in keys:
            holders = where.get(key)
            if not holders:
                break
            if cand is None:
                cand = set(holders) if engines is None else holders.intersection(engines)
            elif not cand <= holders:
                for e in cand - holders:
                    result[e] = depth
                cand &= holders
            if not cand:
                break
            depth += 1
        for e in cand or ():
            result[e] = depth
        return result

    def note_prompt(self, keys: Sequence[int], tail: int | None = None) -> None:
        """A prompt routed with this key chain (and ``tail``, how it goes on past its full
        blocks): where the index holds a block of it, the prompt's next key is one more
        continuation of that block (see :meth:`is_fork`). Nothing is stored for keys the index
        does not hold."""
        where = self._where
        prev: int | None = None
        for key in (*keys, tail) if tail is not None else keys:
            if prev is not None and prev in where:
                self._link(prev, (key,))
            prev = key

    def is_fork(self, key: int) -> bool:
        """Whether prompts were seen continuing past the block ``key`` in two different ways
        (a shared prefix, such as a system prompt, rather than one conversation's history)."""
        return key in self._forks

    # -- internals -----------------------------------------------------------------------

    def _link(self, parent: int | None, keys: Sequence[int]) -> None:
        child = self._child
        prev = parent
        for key in keys:
            if prev is not None:
                seen = child.get(prev)
                if seen is None:
                    child[prev] = key
                elif seen != key:
                    self._forks.add(prev)
            prev = key

    def _insert(self, engine: EngineKey, state: _Engine, key: int, value: object) -> None:
        keys = state.keys
        if key in keys:
            keys.move_to_end(key)
            keys[key] = value
            return
        keys[key] = value
        holders = self._where.get(key)
        if holders is None:
            self._where[key] = {engine}
        else:
            holders.add(engine)
        while len(keys) > state.capacity:
            old, old_value = keys.popitem(last=False)
            self._unwhere(engine, old)
            if state.by_hash and state.by_hash.get(old_value) == old:
                del state.by_hash[old_value]
            self.counters.evicted += 1

    def _remove_key(self, engine: EngineKey, state: _Engine, key: int) -> None:
        if state.keys.pop(key, _MISSING) is not _MISSING:
            self._unwhere(engine, key)

    def _unwhere(self, engine: EngineKey, key: int) -> None:
        holders = self._where.get(key)
        if holders is not None:
            holders.discard(engine)
            if not holders:
                del self._where[key]
                self._child.pop(key, None)
                self._forks.discard(key)

    def _forget_all(self, engine: EngineKey, state: _Engine) -> None:
        for key in state.keys:
            self._unwhere(engine, key)
        state.keys.clear()
        state.by_hash.clear()
