"""The memory budget of requests in flight: bytes every request reserves for its body and its
decoded form before it reads and decodes them, held until it ends (docs/security.md,
"Memory")."""

from __future__ import annotations

from collections import deque

import trio

__all__ = ["BodyBudget", "decoded_bytes"]

#: Bytes a decoded JSON value may take per structural character of its text, beyond the text
#: itself (CPython 3.11's sizes: a str header up to 80 bytes, a dict 64 empty and 184 with
#: keys, a list 56 and 8 a slot): ``{`` a dict, ``[`` a list, ``:`` a key, its value and
#: their slot, ``,`` an element and its slot.
_PER_DICT = 192
_PER_LIST = 72
_PER_MEMBER = 200
_PER_ELEMENT = 96
#: CPython keeps a string in 1, 2 or 4 bytes a character, after its widest one: one astral
#: character makes the whole string 4 bytes a character.
_WIDEST_CHAR = 4


def decoded_bytes(data: bytes) -> int:
    """An upper estimate of the memory a JSON body takes decoded into Python objects (msgspec,
    ``Any`` fields): its text (four times over unless it is ASCII without ``\\u`` escapes)
    plus an object per ``{``, ``[``, ``:`` and ``,``, wherever they are (inside strings too:
    prose is estimated at 2-8 times its size, ``[{},{},...]`` at 96 times, 4 times what it
    takes). Linear and in C, on the event loop like the decode that follows: about 3 ms a
    MiB, as much as that decode."""
    # ``\\u`` escapes may name any character (``\\`` first: one byte, found by memchr).
    narrow = data.isascii() and (b"\\" not in data or b"\\u" not in data)
    text = len(data) if narrow else _WIDEST_CHAR * len(data)
    return (
        text
        + _PER_DICT * data.count(b"{")
        + _PER_LIST * data.count(b"[")
        + _PER_MEMBER * data.count(b":")
        + _PER_ELEMENT * data.count(b",")
    )


class BodyBudget:
    """At most ``limit`` bytes reserved at once, over every request. :meth:`reserve` waits,
    first come first served, for room (a reservation larger than ``limit`` raises
    ``ValueError`` at once); :meth:`try_resize` adds to a reservation only when there is
    room now (no request waits for more while holding some, so none waits on another that
    waits), and gives back what is no longer needed; :meth:`release` returns all of an owner's bytes and wakes the waiters that now
    fit."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the body budget must be >= 1 byte, got {limit}")
        self.limit = limit
        #: Bytes reserved now.
        self.held = 0
        self._owners: dict[object, int] = {}
        self._waiters: deque[tuple[object, int, trio.Event]] = deque()

    @property
    def waiting(self) -> int:
        """Reservations waiting for room."""
        return len(self._waiters)

    def _fits(self, nbytes: int) -> bool:
        return self.held + nbytes <= self.limit

    def _grant(self, owner: object, nbytes: int) -> None:
        self.held += nbytes
        self._owners[owner] = self._owners.get(owner, 0) + nbytes

    def try_reserve(self, owner: object, nbytes: int) -> bool:
        """Reserve ``nbytes`` for ``owner`` if there is room now and nobody waits."""
        if self._waiters or not self._fits(nbytes):
            return False
        self._grant(owner, nbytes)
        return True

    async def reserve(self, owner: object, nbytes: int) -> None:
        """Reserve ``nbytes`` for ``owner``, waiting behind earlier waiters for room (the
        caller bounds the wait with a cancel scope)."""
        if nbytes > self.limit:
            raise ValueError(f"{nbytes} bytes is more than the budget of {self.limit}")
        if not self._waiters and self._fits(nbytes):
            self._grant(owner, nbytes)
            # A schedule point, not a cancel point: a caller's zero timeout never undoes a
            # reservation that needed no wait.
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        entry = (owner, nbytes, trio.Event())
        self._waiters.append(entry)
        try:
            await entry[2].wait()
        except BaseException:
            if entry[2].is_set():  # granted, then cancelled before it could return
                self.release(owner)
            else:
                self._waiters.remove(entry)
                self._wake()  # the head may have been this one, holding back smaller ones
            raise

    def reserved(self, owner: object) -> int:
        """The bytes ``owner`` holds."""
        return self._owners.get(owner, 0)

    def try_resize(self, owner: object, nbytes: int) -> bool:
        """Make ``owner``'s reservation ``nbytes``: less always (the rest wakes the waiters
        that fit), more only if there is room now (ahead of the waiters: an admitted request
        finishes before new ones start)."""
        held = self._owners.get(owner, 0)
        if nbytes > held and not self._fits(nbytes - held):
            return False
        self.held += nbytes - held
        if nbytes:
            self._owners[owner] = nbytes
        else:
            self._owners.pop(owner, None)
        if nbytes < held:
            self._wake()
        return True

    def release(self, owner: object) -> None:
        """Return ``owner``'s bytes (none held: a no-op)."""
        nbytes = self._owners.pop(owner, 0)
        if nbytes:
            self.held -= nbytes
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._fits(waiters[0][1]):
            owner, nbytes, event = waiters.popleft()
            self._grant(owner, nbytes)
            event.set()
