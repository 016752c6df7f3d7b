"""The cache_aware choice: cache beats load until the imbalance thresholds, new sessions
spread evenly, session keys stick, engines without events use the routed prompts."""

from __future__ import annotations

from collections import Counter

import pytest

from smg_trio.routing.blocks import block_keys
from smg_trio.routing.cache_aware import (
    CacheAwareConfig,
    CacheAwareRouter,
    EngineCandidate,
    RouteRequest,
)

A = ("w1", 0)
B = ("w2", 0)
C = ("w2", 1)
BS = 4


def router(*engines: tuple[str, int], events: bool = True, **cfg: float) -> CacheAwareRouter:
    r = CacheAwareRouter(CacheAwareConfig(**cfg))  # type: ignore[arg-type]
    for e in engines:
        r.add_engine(e, block_size=BS, events=events)
    return r


def cands(**loads: float) -> list[EngineCandidate]:
    names = {"a": A, "b": B, "c": C}
    return [EngineCandidate(names[k], v) for k, v in loads.items()]


_next_hash = iter(range(10**9))


def store(r: CacheAwareRouter, engine: tuple[str, int], tokens: list[int]) -> None:
    """The engine stored the prompt's full blocks (fresh engine hashes, one event)."""
    n = len(tokens) // BS
    hashes = [next(_next_hash) for _ in range(n)]
    assert r.events.stored(engine, hashes, None, tokens[: n * BS], BS)


PROMPT = list(range(40))  # 10 blocks


def test_cache_beats_load_below_the_thresholds() -> None:
    r = router(A, B)
    store(r, B, PROMPT[:32])
    d = r.choose(RouteRequest(PROMPT), cands(a=0, b=10), now=0)
    assert d.engine == B
    assert d.reason == "cache"
    assert (d.matched_blocks, d.total_blocks) == (8, 10)


def test_imbalance_overrides_the_cache() -> None:
    r = router(A, B, balance_abs_threshold=4, balance_rel_threshold=1.5)
    store(r, B, PROMPT)
    # 5 more and 6x: both thresholds exceeded
    d = r.choose(RouteRequest(PROMPT), cands(a=1, b=6), now=0)
    assert (d.engine, d.reason) == (A, "balance")
    # 5 more but under 1.5x: the cache still wins
    assert r.choose(RouteRequest(PROMPT), cands(a=10, b=15), now=0).engine == B


def test_a_short_match_below_the_threshold_is_placed_by_load() -> None:
    r = router(A, B, cache_threshold=0.5)
    store(r, B, PROMPT[:16])  # 4 of 10 blocks
    d = r.choose(RouteRequest(PROMPT), cands(a=0, b=1), now=0)
    assert (d.engine, d.reason) == (A, "placement")


def test_new_sessions_spread_evenly_and_their_turns_follow() -> None:
    """32 sessions sharing a system prompt (cached everywhere) start at idle engines: they
    alternate, and every later turn goes where the session's first turn went."""
    r = router(A, B)
    system = list(range(10_000, 10_000 + 8 * BS))
    store(r, A, system)
    store(r, B, system)
    home: dict[int, tuple[str, int]] = {}
    for s in range(32):
        prompt = system + [s] * (2 * BS)
        d = r.choose(RouteRequest(prompt), cands(a=0, b=0), now=0)
        home[s] = d.engine
        store(r, d.engine, prompt)
    spread = Counter(home.values())
    assert spread[A] == spread[B] == 16
    for s in range(32):
        prompt = system + [s] * (2 * BS) + [s + 100] * (3 * BS)
        assert r.choose(RouteRequest(prompt), cands(a=3, b=0), now=1).engine == home[s]


def test_session_key_is_sticky_and_moves_only_when_its_engine_leaves() -> None:
    r = router(A, B, C)
    keys = [f"user-{i}" for i in range(30)]
    first = {
        k: r.choose(RouteRequest(PROMPT, session_key=k), cands(a=0, b=0, c=0), 0) for k in keys
    }
    assert {d.reason for d in first.values()} == {"session"}
    assert len({d.engine for d in first.values()}) == 3  # spread over the engines
    for k in keys:
        again = r.choose(RouteRequest(PROMPT, session_key=k), cands(c=2, b=1, a=0), 1)
        assert again.engine == first[k].engine
    # without C, only C's sessions move
    for k in keys:
        d = r.choose(RouteRequest(PROMPT, session_key=k), cands(a=0, b=0), 2)
        if first[k].engine != C:
            assert d.engine == first[k].engine


def test_session_key_yields_to_imbalance() -> None:
    r = router(A, B, balance_abs_threshold=2)
    key = next(
        f"k{i}"
        for i in range(100)
        if r.choose(RouteRequest(PROMPT, session_key=f"k{i}"), cands(a=0, b=0), 0).engine == B
    )
    d = r.choose(RouteRequest(PROMPT, session_key=key), cands(a=0, b=10), 0)
    assert (d.engine, d.reason) == (A, "balance")


def test_engines_without_events_use_the_routed_prompts() -> None:
    r = router(A, B, events=False)
    first = r.choose(RouteRequest(PROMPT), cands(a=0, b=0), now=0)
    assert first.reason == "placement"
    other = A if first.engine == B else B
    # the next turn extends the prompt: it follows, even onto the busier engine
    d = r.choose(
        RouteRequest(PROMPT + list(range(50, 58))),
        cands(a=3 if first.engine == A else 0, b=3 if first.engine == B else 0),
        now=1,
    )
    assert (d.engine, d.reason) == (first.engine, "cache")
    assert r.blocks(other) == 0


def test_the_approximate_index_ages_out() -> None:
    r = router(A, B, events=False, eviction_interval_secs=10)
    r.choose(RouteRequest(PROMPT), cands(a=0, b=0), now=0)
    assert r.blocks(A) + r.blocks(B) == 10
    r.choose(RouteRequest([7] * 3), cands(a=0, b=0), now=100)  # 100 > 5 intervals
    assert r.blocks(A) + r.blocks(B) == 0


def test_events_engines_are_not_recorded_by_routing() -> None:
    r = router(A, events=True)
    r.choose(RouteRequest(PROMPT), cands(a=0), now=0)
    assert r.blocks(A) == 0


def test_unknown_engines_route_by_load() -> None:
    r = router()
    assert r.choose(RouteRequest(PROMPT), cands(a=2, b=1), 0).engine == B


def test_dp_ranks_are_engines() -> None:
    r = router(B, C)
    store(r, C, PROMPT)
    assert r.choose(RouteRequest(PROMPT), cands(b=0, c=0), 0).engine == C


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareConfig(cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance"):
        CacheAwareConfig(balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="no candidate"):
        router(A).choose(RouteRequest(PROMPT), [], 0)


def test_a_shared_prefix_does_not_pull_every_new_session_to_one_engine() -> None:
    """Without events, the system prompt is known only where sessions went. Once two
    sessions continued past it differently (a fork), a new session matching only the system
    prompt is placed for balance, not sent after them; a session's own history still wins."""
    r = router(A, B, events=False)
    system = list(range(1000, 1000 + 8 * BS))
    homes = []
    for s in range(8):
        d = r.choose(RouteRequest(system + [s] * (2 * BS)), cands(a=0, b=0), now=0)
        homes.append(d.engine)
    assert Counter(homes)[A] == Counter(homes)[B] == 4
    for s in range(8):
        nxt = system + [s] * (2 * BS) + [s + 50] * BS
        assert r.choose(RouteRequest(nxt), cands(a=0, b=0), now=0).engine == homes[s]
    assert r.approx.is_fork(block_keys(system, BS)[-1])


def test_a_lone_engine_is_chosen_without_index_work() -> None:
    """One candidate: it is the choice, and no prompt is keyed, recorded or counted (the
    per-request cost of a single engine); once there are two, prompts are recorded again."""
    r = router(A, events=False)
    d = r.choose(RouteRequest(PROMPT), cands(a=0), now=0)
    assert (d.engine, d.reason) == (A, "placement")
    assert r.blocks(A) == 0
    assert sum(r.decisions.values()) == 0
    r.add_engine(B, block_size=BS, events=False)
    first = r.choose(RouteRequest(PROMPT), cands(a=0, b=0), now=1)
    assert r.blocks(first.engine) == len(PROMPT) // BS
    assert sum(r.decisions.values()) == 1
