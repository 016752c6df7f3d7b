"""Per-request output queues and the ``RequestStream`` a ``generate`` block yields."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from smg_trio.errors import RequestStreamClosed
from smg_trio.protocol.types import EngineOutput

__all__ = ["RequestStream"]


class _Entry:
    """One in-flight request in the client's registry.

    The queue is unbounded on purpose: the output loop must never block on one slow consumer
    (that would stall every other request's delivery). A request's queue is bounded by its own
    ``max_tokens``, since every non-terminal engine output carries at least one token or a
    prompt-logprob slice. A consumer that falls behind drains several outputs per wakeup.
    """

    __slots__ = (
        "aborted",
        "closed",
        "dp_rank",
        "error",
        "finished",
        "identity",
        "lot",
        "queue",
        "rank",
        "request_id",
        "sent",
        "waker",
    )

    def __init__(
        self, request_id: str, rank: int, identity: bytes, dp_rank: int | None = None
    ) -> None:
        self.request_id = request_id
        self.rank = rank  # the engine's slot in the client (HELLO order)
        self.dp_rank = rank if dp_rank is None else dp_rank  # its DP rank index
        self.identity = identity
        self.queue: deque[EngineOutput] = deque()
        self.lot = trio.lowlevel.ParkingLot()
        self.finished = False  # the terminal output was delivered to the queue
        self.closed = False  # no more outputs will arrive (finished, retired or failed)
        self.error: BaseException | None = None
        self.sent = False
        self.aborted = False  # retired by an eager abort: its ABORT is queued already
        #: Called instead of waking a parked task (see ``RequestStream.set_waker``).
        self.waker: Callable[[], None] | None = None

    def put(self, out: EngineOutput) -> None:
        """Queue ``out`` without waking the consumer (the caller calls :meth:`wake`)."""
        self.queue.append(out)
        if out.finish_reason is not None:
            self.finished = True
            self.closed = True

    def close(self, error: BaseException | None = None) -> None:
        if self.end(error):
            self.wake()

    def end(self, error: BaseException | None = None) -> bool:
        """Mark the stream ended without waking the consumer; ``False`` if it already was."""
        if self.closed:
            return False
        self.closed = True
        self.error = error
        return True

    def wake(self) -> None:
        """Run the waker, or wake the parked task."""
        if self.waker is not None:
            self.waker()
        elif self.lot:
            self.lot.unpark_all()


class RequestStream:
    """The outputs of one request, in order, ending with its terminal output.

    Iterate with ``async for output in stream`` (one :class:`EngineOutput` at a time) or call
    :meth:`receive_some` to drain everything pending in one wakeup. Raises
    :class:`~smg_trio.errors.EngineDeadError` if the engine died, and
    :class:`~smg_trio.errors.RequestStreamClosed` if the stream ended without a terminal output
    (aborted, or finished out of band): a truncated stream never looks complete.
    """

    __slots__ = ("_entry",)

    def __init__(self, entry: _Entry) -> None:
        self._entry = entry

    @property
    def request_id(self) -> str:
        """The engine request id."""
        return self._entry.request_id

    @property
    def rank(self) -> int:
        """The DP rank index of the engine serving this request (its 2-byte identity; the
        pinned ``data_parallel_rank`` when one was given)."""
        return self._entry.dp_rank

    @property
    def finished(self) -> bool:
        """True once the terminal output has been queued."""
        return self._entry.finished

    @property
    def ended(self) -> bool:
        """True once no more outputs will arrive (finished, retired or failed). A waker that
        drained the queue of an ended stream is not called again: it calls
        :meth:`receive_nowait` once more to learn how the stream ended."""
        return self._entry.closed

    @property
    def aborted(self) -> bool:
        """True once the request was retired by an eager abort
        (:meth:`~smg_trio.connector.client.EngineClient.abort_nowait`: its client is gone)."""
        return self._entry.aborted

    def _end(self) -> list[EngineOutput]:
        e = self._entry
        if e.finished:
            return []
        if e.error is not None:
            raise e.error
        raise RequestStreamClosed(e.request_id)

    def receive_nowait(self) -> list[EngineOutput]:
        """Every pending output, possibly none; not a checkpoint. ``[]`` also after the
        terminal output was consumed. Raises as described on the class once the stream ended
        without a terminal output and nothing is pending."""
        e = self._entry
        if not e.queue:
            return self._end() if e.closed else []
        items = list(e.queue)
        e.queue.clear()
        return items

    def set_waker(self, waker: Callable[[], None] | None) -> None:
        """Have the engine output loop call ``waker()`` whenever an output is queued or the
        stream ends, instead of waking a task parked in :meth:`receive_some`; ``None`` restores
        that. ``waker`` runs inside the output loop: it must not block or raise, and typically
        drains :meth:`receive_nowait` at once (the zero-wake-up streaming path)."""
        self._entry.waker = waker

    async def receive_some(self) -> list[EngineOutput]:
        """Wait for at least one output and return all pending ones; ``[]`` after the terminal
        output was consumed. Raises as described on the class."""
        e = self._entry
        while not e.queue:
            if e.closed:
                return self._end()
            await e.lot.park()
        items = list(e.queue)
        e.queue.clear()
        return items

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineOutput:
        e = self._entry
        while not e.queue:
            if e.closed:
                self._end()
                raise StopAsyncIteration
            await e.lot.park()
        return e.queue.popleft()
