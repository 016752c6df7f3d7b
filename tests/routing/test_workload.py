"""issue 25's multi-turn workload against simulated LRU engine caches: cache_aware's cached
share of prompt tokens against one engine holding all the cache, and requests per engine.

Deterministic (seeded): sessions sharing a system prompt, each turn adding a user message
and the engine's reply; the sessions interleaved in random order with 8 requests in flight;
each engine's LRU block cache as large as its share of the sessions' final contexts. With
events, the engines' BlockStored/BlockRemoved feed the index; without, the routed prompts do.
Speed is the benchmark's business (bench/); this checks the routing decisions only.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict

import pytest

from smg_trio.routing.blocks import block_keys
from smg_trio.routing.cache_aware import CacheAwareRouter, EngineCandidate, RouteRequest


class LruEngine:
    """A prefix cache of full blocks with LRU eviction, publishing into ``router``'s index."""

    def __init__(self, name: str, capacity: int, block_size: int) -> None:
        self.key = (name, 0)
        self.capacity = capacity
        self.bs = block_size
        self.blocks: OrderedDict[int, int] = OrderedDict()  # content key -> block hash
        self.next_hash = 0

    def serve(self, prompt: list[int], reply: list[int], router: CacheAwareRouter | None) -> int:
        """Cached prompt tokens; then stores the prompt's and reply's full blocks."""
        keys = block_keys(prompt, self.bs)
        hit = 0
        for k in keys:
            if k not in self.blocks:
                break
            hit += 1
        tokens = prompt + reply
        keys = block_keys(tokens, self.bs)
        new: list[tuple[int, int]] = []
        removed: list[int] = []
        for i, k in enumerate(keys):
            if k in self.blocks:
                self.blocks.move_to_end(k)
                continue
            self.next_hash += 1
            self.blocks[k] = self.next_hash
            new.append((i, self.next_hash))
            while len(self.blocks) > self.capacity:
                removed.append(self.blocks.popitem(last=False)[1])
        if router is not None and router.has_events(self.key):
            if new:
                first = new[0][0]
                parent = self.blocks.get(keys[first - 1]) if first else None
                hashes = [h for _, h in new]
                span = tokens[first * self.bs : (first + len(hashes)) * self.bs]
                router.events.stored(self.key, hashes, parent, span, self.bs)
            if removed:
                router.events.removed(self.key, removed)
        return hit * self.bs


def run(
    sessions: int, turns: int, n_engines: int, mode: str, block_size: int
) -> tuple[float, float]:
    """(cached share of prompt tokens, requests per engine max/min)."""
    rng = random.Random(25)
    system = [rng.randrange(1000) for _ in range(512)]
    user, reply = 120, 150
    final_blocks = (len(system) + turns * (user + reply)) // block_size
    capacity = sessions // n_engines * final_blocks
    if mode == "reference":
        engines = [LruEngine("ref", capacity * n_engines, block_size)]
    else:
        engines = [LruEngine(f"e{i}", capacity, block_size) for i in range(n_engines)]
    router = CacheAwareRouter()
    for e in engines:
        router.add_engine(
            e.key, block_size=block_size, num_gpu_blocks=capacity, events=mode == "events"
        )
    history = {s: list(system) for s in range(sessions)}
    order = []
    for _ in range(turns):
        ss = list(range(sessions))
        rng.shuffle(ss)
        order += ss
    total = cached = 0
    served: Counter[str] = Counter()
    inflight: Counter[tuple[str, int]] = Counter()
    window: list[tuple[str, int]] = []
    for s in order:
        h = history[s]
        h += [rng.randrange(1000) for _ in range(user)]
        prompt = list(h)
        if mode == "reference":
            engine = engines[0]
        else:
            cands = [EngineCandidate(e.key, float(inflight[e.key])) for e in engines]
            chosen = router.choose(RouteRequest(prompt), cands, now=0.0).engine
            engine = next(e for e in engines if e.key == chosen)
        inflight[engine.key] += 1
        window.append(engine.key)
        if len(window) > 8:
            inflight[window.pop(0)] -= 1
        served[engine.key[0]] += 1
        total += len(prompt)
        out = [rng.randrange(1000) for _ in range(reply)]
        cached += engine.serve(prompt, out, router if mode != "reference" else None)
        h += out
    return cached / total, max(served.values()) / min(served.values())


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize(("sessions", "turns", "n_engines"), [(32, 6, 2), (64, 8, 4)])
@pytest.mark.parametrize("mode", ["events", "approx"])
def test_cached_share_near_one_engine_with_all_the_cache(
    sessions: int, turns: int, n_engines: int, mode: str, block_size: int
) -> None:
    reference, _ = run(sessions, turns, n_engines, "reference", block_size)
    share, spread = run(sessions, turns, n_engines, mode, block_size)
    assert share >= 0.95 * reference, (share, reference)
    assert spread <= 1.5
