"""The ``cache_aware`` policy's choice: the engine holding the longest prefix of a prompt,
weighed against load, with smg's knobs.

Pure: the worker layer hands it the routable engines (worker id, DP rank) with their load and
the request's prompt, and feeds the two indexes it keeps: :attr:`CacheAwareRouter.events`
from the engines' KV events, :attr:`CacheAwareRouter.approx` from the prompts routed to the
engines that publish none (recorded here, as smg's ``cache_aware`` does).

The rule (in order):

1. **Imbalance overrides everything** (smg): when the most and least loaded engines differ by
   more than ``balance_abs_threshold`` requests *and* the most loaded carries more than
   ``balance_rel_threshold`` times the least, the least loaded engine gets the request.
2. **A session key** (``x-session-id``, ``prompt_cache_key``, ``user``) is sticky: rendezvous
   hashing among the routable engines, so the same key lands on the same engine while it is
   routable and moves only when its engine leaves.
3. **Cache**: each engine's longest cached prefix of the prompt, in blocks of that engine's
   block size. When the best share of the prompt's full blocks is above ``cache_threshold``,
   the engines with that best match compete (one, usually: the engine that served the
   conversation's earlier turns).
4. **Placement**: otherwise the least loaded engine, ties broken by the fewest
   conversations placed so far, then the longest match, then the fewest blocks indexed. A
   match that ends at a *fork* (a block other prompts continued past differently: a prefix
   many conversations share, such as a system prompt) is a new conversation, so it is
   placed too, instead of every new conversation following the first to the engine that
   first held the shared prompt. New conversations are thus spread evenly, and each one's
   next turn looks, through the index, where its first turn went.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from smg_trio.routing.blocks import block_keys, stable_digest, tail_key
from smg_trio.routing.index import DEFAULT_MAX_BLOCKS_PER_ENGINE, EngineKey, KvIndex

__all__ = [
    "APPROX_MAX_AGE_INTERVALS",
    "CacheAwareConfig",
    "CacheAwareRouter",
    "Decision",
    "EngineCandidate",
    "RouteRequest",
]

#: Blocks of the approximate index not routed to for this many eviction intervals are
#: forgotten (the engine has most likely evicted them too).
APPROX_MAX_AGE_INTERVALS: Final = 5


@dataclass(frozen=True)
class CacheAwareConfig:
    """smg's ``cache_aware`` knobs, with smg's defaults.

    Attributes:
        cache_threshold: ``--cache-threshold``: the least share of the prompt's full blocks
            that must be cached on an engine to prefer it by cache.
        balance_abs_threshold: ``--balance-abs-threshold``: requests of load difference
            between the most and least loaded engines...
        balance_rel_threshold: ``--balance-rel-threshold``: ...and their load ratio, both of
            which must be exceeded before load overrides the cache.
        block_size: ``--block-size``: tokens per block of the approximate index for an engine
            whose registration names none.
        max_tree_size: ``--max-tree-size``: blocks kept per engine in the approximate index
            (also bounded by the engine's ``num_gpu_blocks``).
        eviction_interval_secs: ``--eviction-interval-secs``: how often the approximate index
            forgets blocks not routed to in the last :data:`APPROX_MAX_AGE_INTERVALS`
            intervals.
    """

    cache_threshold: float = 0.3
    balance_abs_threshold: float = 64.0
    balance_rel_threshold: float = 1.5
    block_size: int = 16
    max_tree_size: int = 1 << 26
    eviction_interval_secs: float = 120.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0, balance_rel_threshold >= 1")
        if self.block_size < 1 or self.max_tree_size < 1:
            raise ValueError("block_size and max_tree_size must be >= 1")
        if self.eviction_interval_secs <= 0:
            raise ValueError("eviction_interval_secs must be > 0")


@dataclass(frozen=True)
class RouteRequest:
    """What routing needs of a request: its prompt, adapter, cache salt and session key."""

    prompt_token_ids: Sequence[int]
    lora_name: str | None = None
    cache_salt: str | None = None
    session_key: str | None = None


@dataclass(frozen=True)
class EngineCandidate:
    """A routable engine and its load (requests: in flight, or running + waiting)."""

    engine: EngineKey
    load: float


Reason = Literal["balance", "session", "cache", "placement"]


@dataclass(frozen=True)
class Decision:
    """The engine chosen, why, and its cached prefix (blocks of the prompt's ``total``)."""

    engine: EngineKey
    reason: Reason
    matched_blocks: int = 0
    total_blocks: int = 0


class CacheAwareRouter:
    """Chooses engines for prompts and keeps the indexes the choice reads."""

    def __init__(
        self,
        config: CacheAwareConfig | None = None,
        *,
        max_blocks_per_engine: int = DEFAULT_MAX_BLOCKS_PER_ENGINE,
    ) -> None:
        self.config = config or CacheAwareConfig()
        #: Fed by the engines' KV events (the worker layer's feed).
        self.events = KvIndex(max_blocks_per_engine=max_blocks_per_engine)
        #: Fed here with the prompts routed to engines without events.
        self.approx = KvIndex(
            max_blocks_per_engine=min(max_blocks_per_engine, self.config.max_tree_size)
        )
        self._placements: dict[EngineKey, int] = {}
        self._next_eviction: float | None = None
        #: Decisions by reason (Prometheus).
        self.decisions: dict[Reason, int] = {
            "balance": 0,
            "session": 0,
            "cache": 0,
            "placement": 0,
        }

    # -- engines -------------------------------------------------------------------------

    def add_engine(
        self,
        engine: EngineKey,
        *,
        block_size: int | None,
        num_gpu_blocks: int | None = None,
        events: bool = False,
    ) -> None:
        """Route to ``engine`` from now on, by its KV events (``events``) or by the prompts
        routed to it. A known engine is re-registered: what was indexed of it is forgotten."""
        self.drop_engine(engine)
        if events:
            self.events.add_engine(engine, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
        else:
            self.approx.add_engine(
                engine,
                block_size=block_size or self.config.block_size,
                num_gpu_blocks=num_gpu_blocks,
            )
        self._placements[engine] = min(self._placements.values(), default=0)

    def drop_engine(self, engine: EngineKey) -> None:
        """Forget ``engine`` (its worker was removed)."""
        self.events.drop(engine)
        self.approx.drop(engine)
        self._placements.pop(engine, None)

    def has_events(self, engine: EngineKey) -> bool:
        """Whether ``engine`` is indexed by its KV events."""
        return engine in self.events

    def known(self, engine: EngineKey) -> bool:
        """Whether ``engine`` was added."""
        return engine in self.events or engine in self.approx

    def blocks(self, engine: EngineKey) -> int:
        """Blocks indexed for ``engine`` (either index)."""
        return self.events.blocks(engine) + self.approx.blocks(engine)

    # -- choice --------------------------------------------------------------------------

    def choose(
        self, request: RouteRequest, candidates: Sequence[EngineCandidate], now: float
    ) -> Decision:
        """The engine for ``request`` among ``candidates`` (non-empty; engines not added are
        routed by load alone). When it is an engine without events, the prompt's blocks are
        recorded there. A single candidate is returned as it is: nothing is recorded or
        counted."""
        if not candidates:
            raise ValueError("no candidate engine")
        if len(candidates) == 1:
            # Nothing to choose: no key chain, no index work on every request of a lone
            # engine (its approximate index learns the prompts once there is a choice).
            return Decision(candidates[0].engine, "placement")
        self._maybe_evict(now)
        chains: dict[int, list[int]] = {}
        decision = self._decide(request, candidates, chains)
        self.decisions[decision.reason] += 1
        engine = decision.engine
        for index in (self.events, self.approx):
            if engine not in index:
                continue
            bs = index.block_size(engine) or self.config.block_size
            keys = self._chain(request, bs, chains)
            if index is self.approx:
                index.record(engine, keys, now)
            # how the prompt goes on past its full blocks: a second, different continuation
            # of a block marks it as shared (a fork) before the engine reports anything
            index.note_prompt(keys, tail_key(request.prompt_token_ids, bs, keys))
        return decision

    def _chain(self, request: RouteRequest, bs: int, chains: dict[int, list[int]]) -> list[int]:
        keys = chains.get(bs)
        if keys is None:
            keys = chains[bs] = block_keys(
                request.prompt_token_ids,
                bs,
                lora_name=request.lora_name,
                cache_salt=request.cache_salt,
            )
        return keys

    def _decide(
        self,
        request: RouteRequest,
        candidates: Sequence[EngineCandidate],
        chains: dict[int, list[int]],
    ) -> Decision:
        cfg = self.config
        loads = [c.load for c in candidates]
        lo, hi = min(loads), max(loads)
        if hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold:
            return Decision(self._place(candidates), "balance")
        if request.session_key is not None:
            return Decision(_rendezvous(request.session_key, candidates), "session")
        matched, total, forked = self._matches(request, candidates, chains)
        best_share = 0.0
        for c in candidates:
            t = total.get(c.engine, 0)
            if t:
                best_share = max(best_share, matched.get(c.engine, 0) / t)
        if best_share > cfg.cache_threshold:
            best = [
                c
                for c in candidates
                if total.get(c.engine, 0)
                and matched.get(c.engine, 0) / total[c.engine] >= best_share
            ]
            if not all(c.engine in forked for c in best):
                engine = best[0].engine if len(best) == 1 else self._place(best, matched)
                return Decision(engine, "cache", matched.get(engine, 0), total.get(engine, 0))
            # the match ends where other prompts went on differently: a prefix shared by
            # many conversations (a system prompt), not this one's history. A new
            # conversation: placed for balance (holding the shared prefix breaks ties).
        engine = self._place(candidates, matched)
        return Decision(engine, "placement", matched.get(engine, 0), total.get(engine, 0))

    def _matches(
        self,
        request: RouteRequest,
        candidates: Sequence[EngineCandidate],
        chains: dict[int, list[int]],
    ) -> tuple[dict[EngineKey, int], dict[EngineKey, int], set[EngineKey]]:
        """Matched and total full blocks of the prompt per engine (engines of one block size
        share one key chain and one lookup per index), and the engines whose match ends at a
        fork (see :meth:`KvIndex.is_fork`) with more of the prompt after it."""
        by_size: dict[tuple[int, bool], list[EngineKey]] = {}
        for c in candidates:
            e = c.engine
            if e in self.events:
                bs = self.events.block_size(e)
                if bs is None or self.events.ignored(e):
                    continue
                by_size.setdefault((bs, True), []).append(e)
            elif e in self.approx:
                bs = self.approx.block_size(e) or self.config.block_size
                by_size.setdefault((bs, False), []).append(e)
        matched: dict[EngineKey, int] = {}
        total: dict[EngineKey, int] = {}
        forked: set[EngineKey] = set()
        for (bs, from_events), engines in by_size.items():
            keys = self._chain(request, bs, chains)
            index = self.events if from_events else self.approx
            found = index.match(keys, engines)
            matched.update(found)
            for e in engines:
                total[e] = len(keys)
            for e, depth in found.items():
                if depth > 0 and index.is_fork(keys[depth - 1]):
                    forked.add(e)
        return matched, total, forked

    def _place(
        self, candidates: Sequence[EngineCandidate], matched: dict[EngineKey, int] | None = None
    ) -> EngineKey:
        """The least loaded engine; ties: fewest conversations placed, then the longest
        match, then fewest indexed blocks. Counts a placement (not for ``balance``, which
        passes no ``matched``)."""
        placements = self._placements
        m = matched or {}
        best = min(
            candidates,
            key=lambda c: (
                c.load,
                placements.get(c.engine, 0),
                -m.get(c.engine, 0),
                self.blocks(c.engine),
            ),
        )
        if matched is not None and best.engine in placements:
            placements[best.engine] += 1
        return best.engine

    def _maybe_evict(self, now: float) -> None:
        interval = self.config.eviction_interval_secs
        if self._next_eviction is None:
            self._next_eviction = now + interval
        elif now >= self._next_eviction:
            self._next_eviction = now + interval
            self.approx.expire(now - APPROX_MAX_AGE_INTERVALS * interval)


def _rendezvous(session_key: str, candidates: Sequence[EngineCandidate]) -> EngineKey:
    """Highest-random-weight hashing: the engine whose (key, engine) hash is highest."""
    digest = stable_digest(session_key)
    return max(
        candidates,
        key=lambda c: hash((digest, stable_digest(c.engine[0]), c.engine[1])),
    ).engine
