"""Admission: the global cap on concurrent inference requests, with a bounded wait queue ordered
by request priority, then arrival."""

from __future__ import annotations

import heapq
import itertools
import math

import trio

from smg_trio.gateway.openai.errors import ApiError

__all__ = ["QUEUED_BODIES_MAX_BYTES", "RETRY_AFTER_S", "AdmissionGate", "overflow_places"]

#: ``Retry-After`` seconds sent with a 429 (a slot frees as soon as any request ends).
RETRY_AFTER_S = 1
#: The bodies queued requests may hold, together, while they wait for a slot (per process). A
#: queued request whose ``Content-Length`` fits what is left reads its body and waits by its
#: priority; one that does not (or has no ``Content-Length``) waits unread at the default
#: priority, 0, and reads its body once it has its slot. So the bodies in memory stay bounded
#: by the slots' bodies plus this.
QUEUED_BODIES_MAX_BYTES = 64 * 1024 * 1024


def overflow_places(queue_size: int) -> int:
    """Queue places beyond ``queue_size`` for arrivals that find the queue full: their body is
    read (it carries the priority) and a more urgent one takes the least urgent waiter's
    place. A quarter of the queue, at least one; none without a queue."""
    return max(1, queue_size // 4) if queue_size > 0 else 0


def _overloaded(message: str) -> ApiError:
    return ApiError(
        429,
        message,
        code="too_many_requests",
        error_type="rate_limit_error",
        retry_after=RETRY_AFTER_S,
    )


class _Place:
    """One borrower's place in the queue, from its arrival to its slot (or refusal)."""

    __slots__ = ("body_bytes", "error", "granted", "key", "overflow", "seq")

    def __init__(self, seq: int, overflow: bool) -> None:
        self.seq = seq
        self.overflow = overflow
        #: Its share of :data:`QUEUED_BODIES_MAX_BYTES` while it holds its body queued.
        self.body_bytes = 0
        #: ``(priority, seq)`` once it waits for a slot (its body read); ``None`` before.
        self.key: tuple[int, int] | None = None
        self.granted = trio.Event()
        self.error: ApiError | None = None


class AdmissionGate:
    """At most ``limit`` requests hold a slot; up to ``queue_size`` more wait for one, each
    for at most ``timeout_s`` seconds. A request that finds the queue full, or waits too long,
    gets 429 with ``Retry-After``. A slot is held on behalf of its ``RequestCall`` and
    released synchronously by :meth:`leave`, so a stream holds it until its body ends.

    Two steps, so that the wait can be ordered by the request's ``priority`` (in its body)
    while bodies in memory stay bounded: :meth:`arrive` (before the body: a free slot when
    nobody waits, else a queue place, else 429) and :meth:`wait_turn` (after it: the slot,
    granted to waiters by priority, lower first, then arrival). An arrival that finds the
    queue full takes one of :func:`overflow_places`; once its priority is known it replaces
    the least urgent waiter if it is more urgent (that waiter gets the 429), else it gets the
    429 itself. A more urgent request is thus never refused, nor queued behind, because the
    queue is full of less urgent ones."""

    def __init__(self, limit: int, queue_size: int, timeout_s: float) -> None:
        self._limit = limit
        self._queue_size = queue_size
        self._overflow = overflow_places(queue_size)
        self._timeout_s = timeout_s
        self._holders: set[int] = set()
        #: Queue places by borrower id: arrivals reading their body, and waiters.
        self._places: dict[int, _Place] = {}
        #: Places that are overflow places; places waiting for a slot (their priority known).
        self._overflowing = 0
        self._waiters = 0
        #: Bytes of the bodies queued places hold (:data:`QUEUED_BODIES_MAX_BYTES`).
        self.queued_body_bytes = 0
        #: Waiters by ``(priority, seq)``; entries whose place left are skipped when popped.
        self._heap: list[tuple[tuple[int, int], int]] = []
        self._seq = itertools.count()
        #: Requests refused with 429 so far.
        self.rejected = 0

    @property
    def active(self) -> int:
        """Slots held."""
        return len(self._holders)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot (queued, their body being read or read)."""
        return len(self._places)

    def _refuse(self, message: str) -> ApiError:
        self.rejected += 1
        return _overloaded(message)

    def arrive(self, borrower: object) -> None:
        """Before the body: take a free slot when nobody waits, else a queue place (raises the
        429 ``ApiError`` when there is none). Not a checkpoint."""
        key = id(borrower)
        if key in self._holders or key in self._places:
            return
        if len(self._holders) < self._limit and not self._waiters:
            self._holders.add(key)
            return
        if self._timeout_s <= 0 or self._queue_size <= 0:
            raise self._refuse(
                f"the gateway is at its limit of {self._limit} concurrent requests "
                "and its queue is full; retry later"
            )
        if len(self._places) - self._overflowing < self._queue_size:
            self._places[key] = _Place(next(self._seq), overflow=False)
        elif self._overflowing < self._overflow:
            self._places[key] = _Place(next(self._seq), overflow=True)
            self._overflowing += 1
        else:
            raise self._refuse(
                f"the gateway is at its limit of {self._limit} concurrent requests "
                "and its queue is full; retry later"
            )

    def may_read_body(self, borrower: object, content_length: int | None) -> bool:
        """Whether ``borrower`` reads its body before its slot: yes with the slot, or queued
        with a ``content_length`` that fits :data:`QUEUED_BODIES_MAX_BYTES` (reserved until
        it leaves the queue); else it waits for its slot unread, at priority 0. An overflow
        place that cannot read its body (its priority is all it is there for) is refused
        (raises the 429 ``ApiError``)."""
        key = id(borrower)
        place = self._places.get(key)
        if place is None:
            return True  # holds its slot
        room = QUEUED_BODIES_MAX_BYTES - self.queued_body_bytes
        if content_length is not None and content_length <= room:
            place.body_bytes = content_length
            self.queued_body_bytes += content_length
            return True
        if place.overflow:
            self._drop(key)
            raise self._refuse(
                f"the gateway is at its limit of {self._limit} concurrent requests "
                "and its queue is full; retry later"
            )
        return False

    async def wait_turn(self, borrower: object, priority: int = 0) -> None:
        """After the body: wait for the slot, ordered by ``priority`` (lower first) then
        arrival, for at most ``timeout_s`` (raises the 429 ``ApiError`` then, or when a more
        urgent arrival took this place). Returns at once when the slot is held."""
        key = id(borrower)
        if key in self._holders:
            return
        place = self._places.get(key)
        if place is None:
            raise RuntimeError("wait_turn() without arrive()")
        if place.overflow:
            self._settle_overflow(key, place, priority)
        place.key = (priority, place.seq)
        self._waiters += 1
        heapq.heappush(self._heap, (place.key, key))
        self._grant()
        timeout = self._timeout_s if math.isfinite(self._timeout_s) else math.inf
        with trio.move_on_after(timeout):
            await place.granted.wait()
        if key in self._holders:
            return
        self._drop(key)
        if len(self._heap) > 2 * self._waiters + 64:  # timed-out entries pile up: sweep them
            self._heap = [e for e in self._heap if self._places.get(e[1]) is not None]
            heapq.heapify(self._heap)
        if place.error is not None:
            raise place.error
        raise self._refuse(
            f"the gateway is at its limit of {self._limit} concurrent requests "
            f"and no slot freed within {self._timeout_s:g} s; retry later"
        )

    def _drop(self, key: int) -> _Place | None:
        """Forget ``key``'s queue place (its heap entry is skipped when popped)."""
        place = self._places.pop(key, None)
        if place is not None:
            self.queued_body_bytes -= place.body_bytes
            if place.overflow:
                self._overflowing -= 1
            if place.key is not None:
                self._waiters -= 1
        return place

    def _settle_overflow(self, key: int, place: _Place, priority: int) -> None:
        """An arrival that found the queue full, its priority now known: a normal place if one
        freed, else the least urgent waiter's if this one is more urgent, else 429. (A scan
        of the waiters, only while the queue is full.)"""
        place.overflow = False
        self._overflowing -= 1
        if len(self._places) - self._overflowing <= self._queue_size:
            return
        worst_key: int | None = None
        worst: _Place | None = None
        worst_rank = (priority, -1)  # a waiter less urgent than this (ties: not displaced)
        for k, p in self._places.items():
            if not p.overflow and p.key is not None and p.key[0] > priority and p.key > worst_rank:
                worst_key, worst, worst_rank = k, p, p.key
        if worst_key is None or worst is None:
            self._drop(key)
            raise self._refuse(
                f"the gateway is at its limit of {self._limit} concurrent requests and its "
                f"queue is full of requests of priority {priority} or more urgent; retry later"
            )
        worst.error = self._refuse(
            f"the gateway is at its limit of {self._limit} concurrent requests and a more "
            "urgent request took this one's place in the queue; retry later"
        )
        self._drop(worst_key)
        worst.granted.set()

    def _grant(self) -> None:
        """Hand free slots to the most urgent waiters."""
        while len(self._holders) < self._limit and self._heap:
            key_, borrower = heapq.heappop(self._heap)
            place = self._places.get(borrower)
            if place is None or place.key != key_:
                continue  # left (timed out, cancelled, displaced)
            self._drop(borrower)
            self._holders.add(borrower)
            place.granted.set()

    def leave(self, borrower: object) -> None:
        """Release ``borrower``'s slot or queue place (no-op when it holds none)."""
        key = id(borrower)
        if key in self._holders:
            self._holders.discard(key)
            self._grant()
        else:
            self._drop(key)
