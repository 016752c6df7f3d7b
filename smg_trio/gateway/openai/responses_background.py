"""Background responses (``background: true``): the running ones, by response id."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

from smg_trio.gateway.openai.responses_events import EventLog

__all__ = ["FINISHED_LOGS", "BackgroundResponses"]

#: Streamed background responses whose events are kept after they ended (the latest ones),
#: for ``GET /v1/responses/{id}?stream=true``; each log holds at most ``MAX_LOG_BYTES``.
FINISHED_LOGS = 64


@attrs.define
class BackgroundResponses:
    """The background responses of one gateway process: each runs in ``nursery()`` (the
    app's, which lives as long as the server) under its own cancel scope, kept here by
    response id until it ends. At most ``limit`` run at once (the store's size: a
    response that could not be stored could not be polled)."""

    #: The app's nursery (``None`` before its lifespan started, e.g. an embedding server
    #: that runs no lifespan: background responses are then refused).
    nursery: Callable[[], trio.Nursery | None]
    limit: int
    #: Response id -> its cancel scope and the event set once it ended (and was stored).
    running: dict[str, tuple[trio.CancelScope, trio.Event]] = attrs.field(factory=dict)
    #: Response id -> the events of a streamed one (running, or among the latest ended).
    logs: dict[str, EventLog] = attrs.field(factory=dict)
    _ended_logs: deque[str] = attrs.field(factory=deque)

    def open_log(self, response_id: str) -> EventLog:
        """A new event log for the streamed background response ``response_id``."""
        log = self.logs[response_id] = EventLog()
        return log

    def close_log(self, response_id: str) -> None:
        """The response ended: its followers end; its log is kept among the latest
        :data:`FINISHED_LOGS` ended ones."""
        log = self.logs.get(response_id)
        if log is None:
            return
        log.close()
        self._ended_logs.append(response_id)
        while len(self._ended_logs) > FINISHED_LOGS:
            self.logs.pop(self._ended_logs.popleft(), None)

    def has_room(self) -> bool:
        return len(self.running) < self.limit

    def cancel(self, response_id: str) -> trio.Event | None:
        """Cancel the running response ``response_id``: the event set once it stored its
        ``cancelled`` state, or ``None`` when none runs here."""
        entry = self.running.get(response_id)
        if entry is None:
            return None
        entry[0].cancel()
        return entry[1]
