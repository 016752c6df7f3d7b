"""Load-balancing policies over plain worker views."""

from __future__ import annotations

from collections import Counter

import attrs
import pytest

from smg_trio.worker.policies import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    CacheAwarePolicy,
    LeastLoadPolicy,
    LoadBalancingPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    RouteRequest,
    make_policy,
)


@attrs.define
class FakeWorker:
    worker_id: str
    inflight: int = 0
    healthy: bool = True
    engine_load: int = 0

    def load_score(self) -> float:
        return float(max(self.inflight, self.engine_load))


def _dispatch(policy: LoadBalancingPolicy, workers: list[FakeWorker], n: int) -> Counter[str]:
    """Pick ``n`` times, counting each pick as a request that stays in flight."""
    picks: Counter[str] = Counter()
    for _ in range(n):
        chosen = policy.select(workers)
        assert chosen is not None
        chosen.inflight += 1
        picks[chosen.worker_id] += 1
    return picks


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_spreads_load_across_two_workers(name: str) -> None:
    workers = [FakeWorker("a"), FakeWorker("b")]
    picks = _dispatch(make_policy(name, seed=1234), workers, 100)
    assert picks["a"] + picks["b"] == 100
    if name == "random":
        assert 35 <= picks["a"] <= 65  # deterministic for this seed
    else:
        assert picks == Counter(a=50, b=50)


def test_round_robin_alternates() -> None:
    policy = RoundRobinPolicy()
    workers = [FakeWorker("a"), FakeWorker("b")]
    assert [policy.select(workers).worker_id for _ in range(4)] == ["a", "b", "a", "b"]  # type: ignore[union-attr]


@pytest.mark.parametrize("cls", [RandomPolicy, PowerOfTwoPolicy])
def test_seeded_policies_are_reproducible(cls: type[RandomPolicy | PowerOfTwoPolicy]) -> None:
    def run() -> list[str]:
        policy = cls(seed=42)
        workers = [FakeWorker(str(i), engine_load=i % 3) for i in range(5)]
        return [policy.select(workers).worker_id for _ in range(50)]  # type: ignore[union-attr]

    assert run() == run()


def test_least_load_picks_the_least_loaded() -> None:
    policy = LeastLoadPolicy()
    workers = [
        FakeWorker("a", inflight=5),
        FakeWorker("b", inflight=2),
        FakeWorker("c", inflight=7),
    ]
    assert policy.select(workers) is workers[1]


def test_least_load_combines_own_inflight_with_engine_load() -> None:
    policy = LeastLoadPolicy()
    # a: we sent 1, but the engine reports 10 running+waiting (other gateways): score 10.
    # b: we sent 3, the engine has not reported them yet: score 3.
    workers = [FakeWorker("a", inflight=1, engine_load=10), FakeWorker("b", inflight=3)]
    assert policy.select(workers) is workers[1]


def test_least_load_rotates_ties() -> None:
    policy = LeastLoadPolicy()
    workers = [FakeWorker("a"), FakeWorker("b"), FakeWorker("c", inflight=1)]
    assert [policy.select(workers).worker_id for _ in range(4)] == ["a", "b", "a", "b"]  # type: ignore[union-attr]


def test_power_of_two_never_picks_the_most_loaded_of_three() -> None:
    policy = PowerOfTwoPolicy(seed=7)
    workers = [FakeWorker("a"), FakeWorker("b"), FakeWorker("hot", engine_load=100)]
    picks = Counter(policy.select(workers).worker_id for _ in range(200))  # type: ignore[union-attr]
    assert picks["hot"] == 0
    assert picks["a"] > 0
    assert picks["b"] > 0


def test_power_of_two_with_two_workers_picks_the_lower() -> None:
    policy = PowerOfTwoPolicy(seed=3)
    workers = [FakeWorker("a", inflight=4), FakeWorker("b", inflight=1)]
    assert {policy.select(workers).worker_id for _ in range(20)} == {"b"}  # type: ignore[union-attr]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_unhealthy_workers_are_skipped(name: str) -> None:
    policy = make_policy(name, seed=0)
    workers = [FakeWorker("down", healthy=False), FakeWorker("up", inflight=50)]
    assert {policy.select(workers).worker_id for _ in range(20)} == {"up"}  # type: ignore[union-attr]
    assert policy.select([FakeWorker("x", healthy=False)]) is None
    assert policy.select([]) is None


def test_make_policy_names() -> None:
    for name in POLICY_NAMES:
        assert make_policy(name).name == name
    with pytest.raises(
        ValueError, match=r"'prefix_hash'.*cache_aware, least_load, power_of_two, random"
    ):
        make_policy("prefix_hash")
    assert DEFAULT_POLICY == "cache_aware"


@attrs.define
class RankedWorker(FakeWorker):
    ranks: list[float] = attrs.Factory(lambda: [0.0])

    def rank_loads(self) -> list[tuple[int, float]]:
        return list(enumerate(self.ranks))


def test_cache_aware_routes_a_conversation_to_the_rank_holding_it() -> None:
    """Through the policy: turn 1 is placed (on the idle rank), its engine stores the
    prompt's blocks (an event), and turn 2, a longer prompt, goes to that worker and rank
    even though it is now the busier one."""
    policy = CacheAwarePolicy(clock=lambda: 0.0)
    w1, w2 = RankedWorker("w1", ranks=[1.0, 0.0]), RankedWorker("w2", ranks=[1.0])
    for w in (w1, w2):
        for rank in range(len(w.ranks)):
            policy.router.add_engine((w.worker_id, rank), block_size=4, events=True)
    turn1 = list(range(40))
    chosen = policy.select_engine([w1, w2], RouteRequest(turn1))
    assert chosen == (w1, 1)
    policy.router.events.stored(("w1", 1), list(range(10)), None, turn1, 4)
    w1.ranks = [1.0, 3.0]
    turn2 = turn1 + list(range(100, 120))
    assert policy.select_engine([w1, w2], RouteRequest(turn2)) == (w1, 1)
    # select() without a request is least-load; select() with one agrees with select_engine
    assert policy.select([w1, w2]) is w1  # w1's in-flight 0 == w2's: first tied
    assert policy.select([w1, w2], RouteRequest(turn2)) is w1


def test_cache_aware_routes_by_the_prompts_it_sent_without_events() -> None:
    policy = make_policy("cache_aware")
    assert isinstance(policy, CacheAwarePolicy)
    workers = [RankedWorker("a"), RankedWorker("b")]
    for w in workers:
        policy.router.add_engine((w.worker_id, 0), block_size=None, events=False)
    first = policy.select(workers, RouteRequest(list(range(64))))
    assert first is not None
    first.ranks = [5.0]
    for turn in range(2, 6):
        prompt = list(range(64 * turn))
        assert policy.select(workers, RouteRequest(prompt)) is first
