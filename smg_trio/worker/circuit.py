"""A per-worker circuit breaker (closed / open / half-open) on trio's clock."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

import attrs
import trio

__all__ = ["CircuitBreaker", "CircuitState"]


class CircuitState(enum.StrEnum):
    """Whether a worker may receive requests."""

    #: Healthy: requests flow; failures are counted.
    CLOSED = "closed"
    #: Tripped: requests are refused until ``open_duration_s`` has passed.
    OPEN = "open"
    #: Probation: requests flow; ``success_threshold`` successes close it, one failure reopens it.
    HALF_OPEN = "half_open"


@attrs.define(eq=False)
class CircuitBreaker:
    """Stops routing to a worker that keeps failing, then lets it prove itself again.

    Closed → open after ``failure_threshold`` consecutive failures, all within the last
    ``failure_window_s`` seconds (``None``: no window). Open → half-open once
    ``open_duration_s`` seconds have passed (observed lazily by :meth:`allow` and
    :attr:`state`). Half-open → closed after ``success_threshold`` consecutive successes;
    half-open → open on any failure. A success while closed resets the failure count.
    Defaults are smg's CLI defaults (10 failures in 120 s, half-open after 60 s, 3 successes).

    What to record (the caller's duty): only engine and transport faults are failures
    (``EngineDeadError``, a handshake or send timeout, a dropped stream). A request the gateway
    or the client got wrong (4xx: validation, unsupported field, bad DP rank) is *neither* a
    success nor a failure and must not be recorded, so client errors never trip the breaker;
    the same goes for capacity refusals (smg treats 429 that way).

    Single-threaded by design: call it from trio tasks; no locking. Times come from ``clock``
    (``trio.current_time`` by default, so it must be used inside ``trio.run``).

    Raises:
        ValueError: a threshold ``< 1`` or a duration ``<= 0``.
    """

    failure_threshold: int = 10
    success_threshold: int = 3
    open_duration_s: float = 60.0
    failure_window_s: float | None = 120.0
    enabled: bool = True
    clock: Callable[[], float] = attrs.field(default=trio.current_time, repr=False)
    _state: CircuitState = attrs.field(default=CircuitState.CLOSED, init=False)
    _failures: deque[float] = attrs.field(factory=deque, init=False, repr=False)
    _successes: int = attrs.field(default=0, init=False)
    _opened_at: float | None = attrs.field(default=None, init=False)
    #: How many times the breaker has opened, for metrics.
    open_count: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.failure_threshold < 1 or self.success_threshold < 1:
            raise ValueError(
                f"circuit thresholds must be >= 1, got failure_threshold={self.failure_threshold}, "
                f"success_threshold={self.success_threshold}"
            )
        if self.open_duration_s <= 0:
            raise ValueError(f"open_duration_s must be > 0 s, got {self.open_duration_s}")
        if self.failure_window_s is not None and self.failure_window_s <= 0:
            raise ValueError(f"failure_window_s must be > 0 s or None, got {self.failure_window_s}")

    @property
    def state(self) -> CircuitState:
        """The current state, moving open → half-open if the open duration has passed."""
        if (
            self._state is CircuitState.OPEN
            and self._opened_at is not None
            and self.clock() >= self._opened_at + self.open_duration_s
        ):
            self._state = CircuitState.HALF_OPEN
            self._successes = 0
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Failures counted toward opening (within the window)."""
        return len(self._failures)

    def allow(self) -> bool:
        """Whether a request may be sent now: always when disabled, else unless open."""
        return not self.enabled or self.state is not CircuitState.OPEN

    def record_success(self) -> None:
        """An engine round-trip succeeded."""
        state = self.state
        if state is CircuitState.CLOSED:
            self._failures.clear()
        elif state is CircuitState.HALF_OPEN:
            self._successes += 1
            if self._successes >= self.success_threshold:
                self._state = CircuitState.CLOSED
                self._failures.clear()
                self._opened_at = None
        # OPEN: a straggler from before the trip; it proves nothing about now.

    def record_failure(self) -> None:
        """An engine or transport fault (never a client error; see the class docstring)."""
        state = self.state
        now = self.clock()
        if state is CircuitState.HALF_OPEN:
            self._trip(now)
        elif state is CircuitState.CLOSED:
            self._failures.append(now)
            if self.failure_window_s is not None:
                horizon = now - self.failure_window_s
                while self._failures and self._failures[0] < horizon:
                    self._failures.popleft()
            if len(self._failures) >= self.failure_threshold:
                self._trip(now)
        # OPEN: a straggler; the open period is not extended.

    def reset(self) -> None:
        """Force the breaker closed (e.g. an engine reconnected)."""
        self._state = CircuitState.CLOSED
        self._failures.clear()
        self._successes = 0
        self._opened_at = None

    def _trip(self, now: float) -> None:
        self._state = CircuitState.OPEN
        self._opened_at = now
        self._failures.clear()
        self._successes = 0
        self.open_count += 1
