"""DP rank selection (pinned or least-loaded with reservation) and the lockstep wave clock."""

from __future__ import annotations

from collections.abc import Sequence

from smg_trio.errors import EngineDeadError, InvalidDataParallelRank
from smg_trio.protocol.types import EngineLoad

__all__ = ["RankRouter", "WaveClock"]

#: smg's KV-pressure weight: waiting requests cost more once the KV cache is over half full.
_KV_PENALTY_WEIGHT = 6.0
_KV_PENALTY_KNEE = 0.5
_NO_LOAD = EngineLoad()


class RankRouter:
    """Per-rank load (latest engine report) and this client's own in-flight reservations.

    ``indices[i]`` is the DP rank index of engine slot ``i`` (from its 2-byte identity).
    """

    def __init__(self, indices: Sequence[int]) -> None:
        self.indices = list(indices)
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

    def score(self, slot: int) -> float:
        """``max(own in-flight, waiting + running)`` plus a KV penalty on waiting requests."""
        load = self.loads[slot] or _NO_LOAD
        score = float(max(len(self.inflight[slot]), load.num_waiting + load.num_running))
        if load.num_waiting > 0:
            score += (
                load.num_waiting
                * _KV_PENALTY_WEIGHT
                * max(load.kv_cache_usage - _KV_PENALTY_KNEE, 0.0)
            )
        return score

    def reserve(self, request_id: str, pinned_rank: int | None) -> int:
        """Pick a slot and reserve ``request_id`` on it. A pinned rank is authoritative.

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
        return slot

    def release(self, slot: int, request_id: str) -> None:
        """Drop a reservation (idempotent). An emptied rank sheds its stale running/waiting
        counts: its last report predates its final finish."""
        inflight = self.inflight[slot]
        if request_id in inflight:
            inflight.discard(request_id)
            if not inflight:
                load = self.loads[slot]
                if load is not None and (load.num_running or load.num_waiting):
                    self.loads[slot] = EngineLoad(0, 0, load.kv_cache_usage)

    def clear(self) -> None:
        """Forget every reservation (the client died)."""
        for s in self.inflight:
            s.clear()


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
