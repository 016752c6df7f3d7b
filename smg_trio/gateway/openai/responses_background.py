"""Background responses (``background: true``): the running ones, by response id."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

__all__ = ["BackgroundResponses"]


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
