"""Shared helper: how much of a text's tail could still grow into one of some markers."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["proper_prefixes", "partial_suffix_len"]


def proper_prefixes(markers: Iterable[str]) -> frozenset[str]:
    """All non-empty proper prefixes of ``markers`` (``"abc"`` gives ``"a"``, ``"ab"``)."""
    return frozenset(m[:k] for m in markers for k in range(1, len(m)))


def partial_suffix_len(text: str, prefixes: frozenset[str], max_len: int) -> int:
    """Length in characters of the longest suffix of ``text`` found in ``prefixes``.

    ``max_len`` bounds the search (the longest marker's length minus one), so the cost is
    O(max_len) regardless of ``len(text)``. Returns 0 when no suffix qualifies.
    """
    for k in range(min(len(text), max_len), 0, -1):
        if text[-k:] in prefixes:
            return k
    return 0
