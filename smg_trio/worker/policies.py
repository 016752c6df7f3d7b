"""Load-balancing policies that pick one worker from a model's candidates (smg ``--policy``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol, TypeVar

from smg_trio.routing.cache_aware import (
    CacheAwareConfig,
    CacheAwareRouter,
    EngineCandidate,
    RouteRequest,
)

__all__ = [
    "DEFAULT_POLICY",
    "POLICY_NAMES",
    "CacheAwarePolicy",
    "LeastLoadPolicy",
    "LoadBalancingPolicy",
    "PowerOfTwoPolicy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "RouteRequest",
    "WorkerView",
    "make_policy",
]


class WorkerView(Protocol):
    """What a policy may see of a worker."""

    @property
    def worker_id(self) -> str:
        """Stable id."""
        ...

    @property
    def inflight(self) -> int:
        """Requests this gateway has dispatched to the worker and not yet finished."""
        ...

    @property
    def healthy(self) -> bool:
        """Whether the worker may be picked at all (ready, circuit not open)."""
        ...

    def load_score(self) -> float:
        """Outstanding requests, lower is better: ``max(inflight, running + waiting)``
        (``math.inf`` for a worker with no connection)."""
        ...


W = TypeVar("W", bound=WorkerView)


def _rank_loads(worker: WorkerView) -> Sequence[tuple[int, float]]:
    """``(DP rank, load)`` of a worker's connected engines (``rank_loads()`` where the view
    has it), else the worker as one engine of rank 0."""
    ranks: Callable[[], Sequence[tuple[int, float]]] | None = getattr(worker, "rank_loads", None)
    if ranks is None:
        return [(0, worker.load_score())]
    return ranks()


class LoadBalancingPolicy(Protocol):
    """Picks a worker. Implementations skip unhealthy workers and return ``None`` when no
    healthy one is left. Stateful policies (counters, RNG) are not shared across threads; call
    them from trio tasks."""

    @property
    def name(self) -> str:
        """The ``--policy`` name."""
        ...

    def select(self, workers: Sequence[W], request: RouteRequest | None = None) -> W | None:
        """One of ``workers``, or ``None`` if none is healthy. ``request`` (the prompt and
        session key) is read by ``cache_aware`` only."""
        ...


def _healthy(workers: Sequence[W]) -> list[W]:
    return [w for w in workers if w.healthy]


class RoundRobinPolicy:
    """Healthy workers in turn. The counter advances on every pick, so with a changing healthy
    set the rotation shifts but never starves a worker for long."""

    name: Final = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, workers: Sequence[W], request: RouteRequest | None = None) -> W | None:
        candidates = _healthy(workers)
        if not candidates:
            return None
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen


class RandomPolicy:
    """A uniformly random healthy worker. ``seed`` makes the sequence reproducible."""

    name: Final = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, workers: Sequence[W], request: RouteRequest | None = None) -> W | None:
        candidates = _healthy(workers)
        return self._rng.choice(candidates) if candidates else None


class LeastLoadPolicy:
    """The healthy worker with the lowest ``load_score()``.

    The score is ``max(own in-flight, engine running + waiting)`` as in smg's ZMQ connector:
    our own count reacts instantly to dispatches; the engine's piggybacked stats catch load from
    other gateways and requests still queued inside the engine. (smg's HTTP ``least_load`` uses
    a token-work/throughput model; the ZMQ path reports no token work, so requests it is.)
    Ties rotate, so equally loaded workers share traffic even before their scores move.
    """

    name: Final = "least_load"

    def __init__(self) -> None:
        self._tie = 0

    def select(self, workers: Sequence[W], request: RouteRequest | None = None) -> W | None:
        candidates = _healthy(workers)
        if not candidates:
            return None
        best = min(w.load_score() for w in candidates)
        tied = [w for w in candidates if w.load_score() == best]
        chosen = tied[self._tie % len(tied)]
        self._tie += 1
        return chosen


class PowerOfTwoPolicy:
    """Samples two distinct healthy workers and takes the less loaded (ties: the first drawn).

    Nearly as good as least-load at a fraction of the herd effect when scores are stale.
    ``seed`` makes the draws reproducible.
    """

    name: Final = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, workers: Sequence[W], request: RouteRequest | None = None) -> W | None:
        candidates = _healthy(workers)
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        first, second = self._rng.sample(candidates, 2)
        return second if second.load_score() < first.load_score() else first


class CacheAwarePolicy:
    """The engine (worker and DP rank) holding the longest prefix of the prompt, against load
    (:mod:`smg_trio.routing.cache_aware`). Its :attr:`router` keeps the KV block indexes: the
    worker layer's KV event feed fills the one of engines that publish events; the prompts
    routed to the others fill their approximate one. Without a request (no prompt) it picks
    the least loaded worker."""

    name: Final = "cache_aware"

    def __init__(
        self,
        config: CacheAwareConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = CacheAwareRouter(config)
        self._clock = clock
        self._least = LeastLoadPolicy()

    def select(self, workers: Sequence[W], request: RouteRequest | None = None) -> W | None:
        chosen = self.select_engine(workers, request)
        return None if chosen is None else chosen[0]

    def select_engine(
        self, workers: Sequence[W], request: RouteRequest | None
    ) -> tuple[W, int | None] | None:
        """The worker and the DP rank to send ``request`` to (the rank ``None`` when the
        choice was by load alone), or ``None`` if no worker is healthy."""
        candidates = _healthy(workers)
        if not candidates:
            return None
        if request is None:
            worker = self._least.select(candidates)
            return None if worker is None else (worker, None)
        engines: list[EngineCandidate] = []
        owner: dict[tuple[str, int], W] = {}
        for w in candidates:
            for rank, load in _rank_loads(w):
                key = (w.worker_id, rank)
                engines.append(EngineCandidate(key, load))
                owner[key] = w
        if not engines:  # every rank of every worker is down: let the connector say so
            worker = self._least.select(candidates)
            return None if worker is None else (worker, None)
        decision = self.router.choose(request, engines, self._clock())
        return owner[decision.engine], decision.engine[1]


#: Valid ``make_policy`` names, sorted.
POLICY_NAMES: Final = ("cache_aware", "least_load", "power_of_two", "random", "round_robin")

#: ``--policy`` unset: ``cache_aware``, as smg's default.
DEFAULT_POLICY: Final = "cache_aware"


def make_policy(
    name: str, *, seed: int | None = None, cache: CacheAwareConfig | None = None
) -> LoadBalancingPolicy:
    """A fresh policy by its ``--policy`` name.

    Args:
        name: One of :data:`POLICY_NAMES`.
        seed: RNG seed for ``random`` and ``power_of_two``; ignored by the others.
        cache: ``cache_aware``'s knobs (default: smg's defaults); ignored by the others.

    Raises:
        ValueError: an unknown name; the message lists the valid ones.
    """
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "random":
        return RandomPolicy(seed)
    if name == "least_load":
        return LeastLoadPolicy()
    if name == "power_of_two":
        return PowerOfTwoPolicy(seed)
    if name == "cache_aware":
        return CacheAwarePolicy(cache)
    raise ValueError(f"unknown load-balancing policy {name!r}; valid: {', '.join(POLICY_NAMES)}")
