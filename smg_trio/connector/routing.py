"""DP rank selection (pinned or least-loaded with reservation) and the lockstep wave clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from smg_trio.errors import EngineDeadError, InvalidDataParallelRank
from smg_trio.protocol.types import EngineLoad

__all__ = ["RankRouter", "SharedRankLoad", "WaveClock"]

#: smg's KV-pressure weight: waiting requests cost more once the KV cache is over half full.
_KV_PENALTY_WEIGHT = 6.0
_KV_PENALTY_KNEE = 0.5
_NO_LOAD = EngineLoad()


class SharedRankLoad(Protocol):
    """In-flight counts per DP rank of one worker that several engine clients (the frontend
    processes of ``--api-server-count``) publish and sum: each client publishes its own count,
    and ``total`` is every client's, its own included."""

    def publish(self, rank: int, inflight: int) -> None:
        """Record this client's in-flight count on DP rank ``rank``."""

    def total(self, rank: int) -> int:
        """Every client's in-flight count on DP rank ``rank``."""


class RankRouter:
    """Per-rank load (latest engine report) and this client's own in-flight reservations.

    ``indices[i]`` is the DP rank index of engine slot ``i`` (from its 2-byte identity).
    With ``shared``, a rank's in-flight count is every client's (other frontends' requests
    on the same engines), not only this one's: engines report their load to one client only.
    """

    def __init__(self, indices: Sequence[int], shared: SharedRankLoad | None = None) -> None:
        self.indices = list(indices)
        self.shared = shared
        self._slot_of = {idx: slot for slot, idx in enumerate(self.indices)}
        self.loads: list[EngineLoad | None] = [None] * len(self.indices)
        self.inflight: list[set[str]] = [set() for _ in self.indices]
        #: Slots not taking requests: their input connection closed (dead, or in the
        #: reconnect grace period). Unpinned requests go to the other slots.
        self.down: list[bool] = [False] * len(self.indices)
        self._scan_start = 0

    def slot_for_index(self, engine_index: int) -> int | None:
        """The slot of the engine with this rank index, if any."""
        return self._slot_of.get(engine_index)

    def inflight_count(self, slot: int) -> int:
        """Requests in flight on ``slot``: this client's, or with ``shared`` every client's."""
        own = len(self.inflight[slot])
        if self.shared is None:
            return own
        return max(own, self.shared.total(self.indices[slot]))

    def _publish(self, slot: int) -> None:
        if self.shared is not None:
            self.shared.publish(self.indices[slot], len(self.inflight[slot]))

    def score(self, slot: int) -> float:
        """``max(in-flight, waiting + running)`` plus a KV penalty on waiting requests."""
        load = self.loads[slot] or _NO_LOAD
        score = float(max(self.inflight_count(slot), load.num_waiting + load.num_running))
        if load.num_waiting > 0:
            score += (
                load.num_waiting
                * _KV_PENALTY_WEIGHT
                * max(load.kv_cache_usage - _KV_PENALTY_KNEE, 0.0)
            )
        return score

    def reserve(self, request_id: str, pinned_rank: int | None, hint: int | None = None) -> int:
        """Pick a slot and reserve ``request_id`` on it. A pinned rank is authoritative; a
        ``hint`` (the routing policy's rank) is taken when that rank is connected, else the
        least loaded rank is.

        Raises ``InvalidDataParallelRank`` when no engine has the pinned index, and
        ``EngineDeadError`` when the pinned rank (or, unpinned, every rank) is down.
        """
        n = len(self.indices)
        down = self.down
        if pinned_rank is not None:
            slot = self._slot_of.get(pinned_rank)
            if slot is None:
                raise InvalidDataParallelRank(pinned_rank, n)
            if down[slot]:
                raise EngineDeadError(f"engine {pinned_rank} is not connected")
        elif (
            hint is not None
            and (hinted := self._slot_of.get(hint)) is not None
            and not (down[hinted])
        ):
            slot = hinted
        elif n == 1:
            if down[0]:
                raise EngineDeadError("the engine is not connected")
            slot = 0
        else:
            start = self._scan_start % n
            self._scan_start += 1
            best_slot, best = -1, 0.0
            for j in range(n):
                s = (start + j) % n
                if down[s]:
                    continue
                sc = self.score(s)
                if best_slot < 0 or sc < best:
                    best_slot, best = s, sc
            if best_slot < 0:
                raise EngineDeadError("no engine rank is connected")
            slot = best_slot
        self.inflight[slot].add(request_id)
        self._publish(slot)
        return slot

    def scores(self) -> list[tuple[int, float]]:
        """``(rank, score)`` of every connected rank (see :meth:`score`)."""
        return [
            (self.indices[s], self.score(s)) for s in range(len(self.indices)) if not self.down[s]
        ]

    def release(self, slot: int, request_id: str) -> None:
        """Drop a reservation (idempotent). An emptied rank sheds its stale running/waiting
        counts: its last report predates its final finish."""
        inflight = self.inflight[slot]
        if request_id in inflight:
            inflight.discard(request_id)
            self._publish(slot)
            if not inflight:
                load = self.loads[slot]
                if load is not None and (load.num_running or load.num_waiting):
                    self.loads[slot] = EngineLoad(0, 0, load.kv_cache_usage)

    def clear(self) -> None:
        """Forget every reservation (the client died)."""
        for slot, reserved in enumerate(self.inflight):
            reserved.clear()
            self._publish(slot)


class WaveClock:
    """The gateway-owned DP wave clock of a lockstep vLLM MoE group (no coordinator runs).

    Every submit bumps the clock and wakes every rank with ``START_DP_WAVE [clock, nil]``;
    bumping unconditionally keeps the wave above each rank's own increment after a drain.
    """

    def __init__(self) -> None:
        self.wave = 0

    def next_wake(self) -> int:
        """Bump and return the wave to broadcast."""
        self.wave += 1
        return self.wave

    def wave_complete(self, wave: int) -> None:
        """A rank finished ``wave``; the next wake must name a later one. Does not wake."""
        self.wave = max(self.wave, wave + 1)

    def start_wave(self, wave: int) -> int:
        """A rank asked for ``wave`` to start: returns the wave to broadcast now."""
        self.wave = max(self.wave, wave)
        return self.next_wake()
