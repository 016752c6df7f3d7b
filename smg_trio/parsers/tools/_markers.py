"""Marker search over a streamed buffer (the earliest marker, or what to hold back); deltas joined."""

from __future__ import annotations

from collections.abc import Sequence

from smg_trio.parsers.tools.base import ToolCallDelta

__all__ = ["find_marker", "held_len", "merge_deltas"]


def held_len(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of one of ``markers``
    (text that may still become a marker when the next piece arrives)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buf)), best, -1):
            if buf.endswith(marker[:n]):
                best = n
                break
    return best


def find_marker(buf: str, markers: Sequence[str]) -> tuple[int, str | None]:
    """``(position, marker)`` of the earliest complete marker in ``buf`` (the longest at
    that position), or ``(len(buf) - held, None)``: the text before that cut is certain not
    to start a marker."""
    best, found = -1, None
    for marker in markers:
        i = buf.find(marker)
        if i >= 0 and (found is None or i < best or (i == best and len(marker) > len(found))):
            best, found = i, marker
    if found is not None:
        return best, found
    return len(buf) - held_len(buf, markers), None


def merge_deltas(calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Adjacent argument fragments of one call joined into one delta (the first keeps its
    ``name`` and ``id``)."""
    out: list[ToolCallDelta] = []
    for delta in calls:
        prev = out[-1] if out else None
        if prev is not None and prev.index == delta.index and delta.name is None:
            out[-1] = ToolCallDelta(
                index=prev.index,
                name=prev.name,
                id=prev.id,
                arguments=prev.arguments + delta.arguments,
            )
        else:
            out.append(delta)
    return out
