"""A connection's fault stays in its connection: it is closed, and logged in one rate-limited line.

A client controls every byte of its connection, so an exception raised while serving one (an
h11 ``LocalProtocolError`` after a protocol race, an unexpected fault in the fast path) must
neither leave the connection's task (it would take the server, and the process, down) nor
write a traceback per connection to the log (a client could fill the disk). :func:`contain`
is the ``except`` of every connection handler of smg_trio's servers; :func:`note` logs a
fault at most once per connection (:func:`connection_scope` marks one) and at most
:data:`BURST` lines, then one per :data:`REFILL_S` seconds, process-wide; lines held back are
counted in the next one. The traceback goes to the DEBUG level only.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

__all__ = ["BURST", "REFILL_S", "connection_scope", "contain", "note"]

log = logging.getLogger(__name__)

#: The most fault lines logged at once, process-wide.
BURST: Final = 10
#: After a burst, one more line per this many seconds.
REFILL_S: Final = 1.0
#: The most characters of an exception's message a line carries.
MESSAGE_CHARS: Final = 200


class _Limiter:
    """A token bucket of :data:`BURST` lines refilled at one per :data:`REFILL_S` seconds."""

    def __init__(self) -> None:
        self.tokens = float(BURST)
        self.at = time.monotonic()
        self.held_back = 0

    def take(self) -> int | None:
        """The count of lines held back since the last one, or ``None``: hold this one back."""
        now = time.monotonic()
        self.tokens = min(float(BURST), self.tokens + (now - self.at) / REFILL_S)
        self.at = now
        if self.tokens < 1.0:
            self.held_back += 1
            return None
        self.tokens -= 1.0
        held, self.held_back = self.held_back, 0
        return held


_LIMITER = _Limiter()


class _Connection:
    __slots__ = ("logged",)

    def __init__(self) -> None:
        self.logged = False


#: The connection the current task serves (its tasks share it: trio copies the context).
_CURRENT: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar(
    "smg_trio_connection_fault", default=None
)


@contextmanager
def connection_scope() -> Iterator[None]:
    """Mark the code inside (and the tasks it starts) as serving one connection."""
    if _CURRENT.get() is not None:  # a hand-over: still the same connection
        yield
        return
    token = _CURRENT.set(_Connection())
    try:
        yield
    finally:
        _CURRENT.reset(token)


def note(where: str, exc: BaseException) -> None:
    """Log ``exc``, a fault of the current connection, in one line (once per connection,
    rate-limited); its traceback at DEBUG."""
    conn = _CURRENT.get()
    if conn is not None:
        if conn.logged:
            log.debug("%s: another fault on the same connection", where, exc_info=exc)
            return
        conn.logged = True
    held = _LIMITER.take()
    if held is None:
        log.debug("%s: connection fault (line held back)", where, exc_info=exc)
        return
    message = str(exc)
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    suffix = f" ({held} similar line(s) held back)" if held else ""
    log.warning(
        "%s: connection failed (%s: %r), closed%s", where, type(exc).__name__, message, suffix
    )
    log.debug("%s: the fault's traceback", where, exc_info=exc)


def contain(where: str, exc: BaseException) -> None:
    """The ``except BaseException`` of a connection handler: the connection's faults (every
    ``Exception``, in a group or not) are :func:`note`-d and end there; what else ``exc``
    holds (``Cancelled``, ``KeyboardInterrupt``) is raised on."""
    if isinstance(exc, BaseExceptionGroup):
        faults, rest = exc.split(Exception)
        if faults is not None:
            leaf: BaseException = faults
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            note(where, leaf)
        if rest is not None:
            if rest is exc:
                raise exc
            raise rest from None
        return
    if isinstance(exc, Exception):
        note(where, exc)
        return
    raise exc
