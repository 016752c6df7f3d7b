"""Admission: the global cap on concurrent inference requests, with a bounded wait queue."""

from __future__ import annotations

import math

import trio

from smg_trio.gateway.openai.errors import ApiError

__all__ = ["RETRY_AFTER_S", "AdmissionGate"]

#: ``Retry-After`` seconds sent with a 429 (a slot frees as soon as any request ends).
RETRY_AFTER_S = 1


def _overloaded(message: str) -> ApiError:
    return ApiError(
        429,
        message,
        code="too_many_requests",
        error_type="rate_limit_error",
        retry_after=RETRY_AFTER_S,
    )


class AdmissionGate:
    """At most ``limit`` requests hold a slot; up to ``queue_size`` more wait for one, each
    for at most ``timeout_s`` seconds. A request that finds the queue full, or waits too long,
    gets 429 with ``Retry-After``. A slot is held on behalf of its ``RequestCall`` and
    released synchronously by :meth:`leave`, so a stream holds it until its body ends."""

    def __init__(self, limit: int, queue_size: int, timeout_s: float) -> None:
        self._limiter = trio.CapacityLimiter(limit)
        self._queue_size = queue_size
        self._timeout_s = timeout_s
        #: Requests refused with 429 so far.
        self.rejected = 0

    @property
    def active(self) -> int:
        """Slots held."""
        return int(self._limiter.borrowed_tokens)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return int(self._limiter.statistics().tasks_waiting)

    async def enter(self, borrower: object) -> None:
        """Take a slot for ``borrower`` (raises the 429 ``ApiError`` when none comes)."""
        limiter = self._limiter
        try:
            limiter.acquire_on_behalf_of_nowait(borrower)
            return
        except trio.WouldBlock:
            pass
        if self.waiting >= self._queue_size or self._timeout_s <= 0:
            self.rejected += 1
            raise _overloaded(
                f"the gateway is at its limit of {int(limiter.total_tokens)} concurrent requests "
                "and its queue is full; retry later"
            )
        timeout = self._timeout_s if math.isfinite(self._timeout_s) else math.inf
        with trio.move_on_after(timeout):
            await limiter.acquire_on_behalf_of(borrower)
            return
        self.rejected += 1
        raise _overloaded(
            f"the gateway is at its limit of {int(limiter.total_tokens)} concurrent requests "
            f"and no slot freed within {self._timeout_s:g} s; retry later"
        )

    def leave(self, borrower: object) -> None:
        """Release ``borrower``'s slot (no-op when it holds none)."""
        try:
            self._limiter.release_on_behalf_of(borrower)
        except RuntimeError:
            pass
