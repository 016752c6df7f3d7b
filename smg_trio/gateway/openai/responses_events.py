"""A streamed background response's events, kept (bounded) for the stream that started it and for ``GET /v1/responses/{id}?stream=true&starting_after=N``."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator

import msgspec
import trio

from smg_trio.errors import ValidationError

__all__ = ["MAX_LOG_BYTES", "EventLog"]

#: Most bytes of events one log keeps: past it the oldest go (a reader that keeps up never
#: needs them; one that resumes before what is kept gets a 400, one that fell that far behind
#: gets an ``error`` event and the end of its stream).
MAX_LOG_BYTES = 1024 * 1024


class EventLog:
    """The SSE events of one streamed background response, numbered as their
    ``sequence_number`` (the renderer's, from 0), appended by the task that runs it and read
    by any number of :meth:`follow` streams; each follower wakes on every append."""

    def __init__(self, max_bytes: int = MAX_LOG_BYTES) -> None:
        self._events: deque[bytes] = deque()
        self._first = 0  # the sequence number of _events[0]
        self._bytes = 0
        self._max_bytes = max_bytes
        self._changed = trio.Event()
        self.ended = False

    @property
    def size(self) -> int:
        """The bytes of events kept."""
        return self._bytes

    def extend(self, frames: bytes) -> None:
        """Append the events of ``frames`` (``event: ...\\ndata: ...\\n\\n`` each; the data
        is one JSON line), dropping the oldest past :data:`MAX_LOG_BYTES`."""
        for part in frames.split(b"\n\n"):
            if part:
                event = part + b"\n\n"
                self._events.append(event)
                self._bytes += len(event)
        while self._bytes > self._max_bytes and len(self._events) > 1:
            self._bytes -= len(self._events.popleft())
            self._first += 1
        self._wake()

    def close(self) -> None:
        """The response ended: followers end after the last event."""
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def check_start(self, starting_after: int | None) -> int:
        """The index a follower starting after ``starting_after`` reads from; a 400 naming
        ``starting_after`` when those events are no longer kept."""
        start = 0 if starting_after is None else starting_after + 1
        if start < self._first:
            raise ValidationError(
                f"events before sequence number {self._first} of this response are no longer "
                f"kept (at most {self._max_bytes} bytes of events are); resume from there",
                param="starting_after",
            )
        return start

    async def follow(self, start: int) -> AsyncIterator[bytes]:
        """The events from index ``start`` on, as they come, until the response ended."""
        i = start
        while True:
            changed = self._changed
            if i < self._first:  # this reader fell behind what is kept
                yield b"event: error\ndata: " + msgspec.json.encode(_lagged(self._first)) + b"\n\n"
                return
            while i < self._first + len(self._events):
                yield self._events[i - self._first]
                i += 1
                if i < self._first:
                    break
            else:
                if self.ended:
                    return
                await changed.wait()


def _lagged(first: int) -> dict[str, object]:
    return {
        "type": "error",
        "code": "events_dropped",
        "message": f"this stream fell behind the events kept (from {first}); resume with "
        f"GET /v1/responses/{{id}}?stream=true&starting_after={first - 1}",
        "param": None,
    }
