"""Utility calls' bookkeeping: call ids, one pending entry per call, resolved by the output loop."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import trio

from smg_trio.errors import UtilityCallFailed
from smg_trio.protocol.types import UtilityReply

__all__ = ["PendingCall", "UtilityCalls"]

log = logging.getLogger(__name__)

#: vLLM's call ids are unsigned 64-bit (``uuid1().int >> 64``); -1 and -2 are its reserved
#: notification ids. Ours count up from a random start below 2**62, so that an answer to a
#: previous life's call (a restarted frontend re-binding the same output socket) is unknown
#: here, not mistaken for one of ours.
_CALL_ID_SPAN = 2**62


class PendingCall:
    """One utility call waiting for its engine's answer."""

    __slots__ = ("call_id", "done", "error", "method", "rank", "reply", "slot")

    def __init__(self, call_id: int, method: str, slot: int, rank: int) -> None:
        self.call_id = call_id
        self.method = method
        self.slot = slot
        self.rank = rank
        self.done = trio.Event()
        self.reply: UtilityReply | None = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        """The result, or raise the failure (``UtilityCallFailed``) or the client's death."""
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        if self.reply.failure_message is not None:
            raise UtilityCallFailed(self.method, self.rank, self.reply.failure_message)
        return self.reply.result


class UtilityCalls:
    """The pending utility calls of one engine client. The caller owns each entry's lifetime
    (:meth:`open`, then :meth:`discard` in a ``finally``), so a cancelled call leaves nothing
    behind; the output loop resolves entries (:meth:`resolve`), the client's death fails them."""

    def __init__(self) -> None:
        self._next = secrets.randbelow(_CALL_ID_SPAN)
        self._pending: dict[int, PendingCall] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def open(self, method: str, slot: int, rank: int) -> PendingCall:
        """A new pending call with a fresh call id."""
        self._next = (self._next + 1) % _CALL_ID_SPAN
        call = PendingCall(self._next, method, slot, rank)
        self._pending[call.call_id] = call
        return call

    def discard(self, call: PendingCall) -> None:
        """Forget ``call`` (answered, failed or abandoned); a late answer is then dropped."""
        if self._pending.get(call.call_id) is call:
            del self._pending[call.call_id]

    def resolve(self, reply: UtilityReply) -> None:
        """The engine's answer: wake its caller. An answer nobody waits for (a cancelled call,
        a previous life's) is logged and dropped."""
        call = self._pending.pop(reply.call_id, None)
        if call is None:
            log.debug("dropping the answer to utility call %d: nobody waits for it", reply.call_id)
            return
        call.reply = reply
        call.done.set()

    def fail(self, error: BaseException, slot: int | None = None) -> None:
        """Fail the pending calls (of engine ``slot``, or all) with ``error``."""
        for call_id, call in list(self._pending.items()):
            if slot is None or call.slot == slot:
                del self._pending[call_id]
                call.error = error
                call.done.set()
