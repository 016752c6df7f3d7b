"""Circuit breaker transitions on trio's (autojump) clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from smg_trio.worker.circuit import CircuitBreaker, CircuitState


def state(cb: CircuitBreaker) -> CircuitState:
    """Read the state without mypy narrowing it across calls that change it."""
    return cb.state


def _fail(cb: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        cb.record_failure()


async def test_opens_after_threshold_consecutive_failures() -> None:
    cb = CircuitBreaker(failure_threshold=3)
    _fail(cb, 2)
    assert state(cb) is CircuitState.CLOSED
    assert cb.allow()
    cb.record_failure()
    assert state(cb) is CircuitState.OPEN
    assert not cb.allow()
    assert cb.open_count == 1


async def test_success_resets_the_failure_count() -> None:
    cb = CircuitBreaker(failure_threshold=3)
    _fail(cb, 2)
    cb.record_success()
    assert cb.consecutive_failures == 0
    _fail(cb, 2)
    assert state(cb) is CircuitState.CLOSED


async def test_failures_outside_the_window_do_not_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cb = CircuitBreaker(failure_threshold=3, failure_window_s=10.0)
    _fail(cb, 2)
    await trio.sleep(10.5)
    cb.record_failure()
    assert state(cb) is CircuitState.CLOSED
    assert cb.consecutive_failures == 1


async def test_full_cycle_open_half_open_closed(autojump_clock: trio.testing.MockClock) -> None:
    cb = CircuitBreaker(failure_threshold=2, success_threshold=2, open_duration_s=30.0)
    _fail(cb, 2)
    assert state(cb) is CircuitState.OPEN
    await trio.sleep(29.0)
    assert not cb.allow()
    cb.record_success()  # a straggler from before the trip proves nothing
    cb.record_failure()  # nor extends the open period
    await trio.sleep(1.0)
    assert cb.allow()
    assert state(cb) is CircuitState.HALF_OPEN
    cb.record_success()
    assert state(cb) is CircuitState.HALF_OPEN
    cb.record_success()
    assert state(cb) is CircuitState.CLOSED
    assert cb.consecutive_failures == 0


async def test_failure_while_half_open_reopens(autojump_clock: trio.testing.MockClock) -> None:
    cb = CircuitBreaker(failure_threshold=1, success_threshold=3, open_duration_s=5.0)
    cb.record_failure()
    await trio.sleep(5.0)
    assert state(cb) is CircuitState.HALF_OPEN
    cb.record_success()
    cb.record_failure()
    assert state(cb) is CircuitState.OPEN
    assert cb.open_count == 2
    await trio.sleep(4.0)
    assert not cb.allow()  # the open period restarted at the second trip
    await trio.sleep(1.0)
    assert cb.allow()


async def test_disabled_breaker_always_allows() -> None:
    cb = CircuitBreaker(failure_threshold=1, enabled=False)
    cb.record_failure()
    assert cb.allow()


async def test_reset_closes() -> None:
    cb = CircuitBreaker(failure_threshold=1)
    cb.record_failure()
    cb.reset()
    assert state(cb) is CircuitState.CLOSED
    assert cb.allow()


def test_injected_clock_needs_no_trio_run() -> None:
    now = [0.0]
    cb = CircuitBreaker(failure_threshold=1, open_duration_s=2.0, clock=lambda: now[0])
    cb.record_failure()
    assert not cb.allow()
    now[0] = 2.0
    assert cb.allow()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_threshold": 0},
        {"success_threshold": 0},
        {"open_duration_s": 0.0},
        {"failure_window_s": -1.0},
    ],
)
def test_invalid_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]
