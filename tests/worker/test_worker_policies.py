"""Load-balancing policies over plain worker views."""

from __future__ import annotations

from collections import Counter

import attrs
import pytest

from smg_trio.worker.policies import (
    POLICY_NAMES,
    LeastLoadPolicy,
    LoadBalancingPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
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
        ValueError, match=r"'cache_aware'.*least_load, power_of_two, random, round_robin"
    ):
        make_policy("cache_aware")
