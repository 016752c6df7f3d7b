"""Shared helper: how much of a text's tail could still grow into one of some markers."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """The proper prefixes of some markers, in memory linear in their total length.

    For each marker it keeps, per character, the prefix lengths ``k`` whose last character is
    that character (``marker[k - 1]``), longest first. A suffix of the text can only be a
    marker prefix of length ``k`` if it ends with that prefix's last character, so a lookup
    checks just those candidates. (Materialising every prefix would cost memory quadratic in
    a marker's length, which a long stop string turns into a memory lever.)
    """

    __slots__ = ("_index", "max_len")

    def __init__(self, markers: Iterable[str]) -> None:
        self._index: list[tuple[str, dict[str, list[int]]]] = []
        longest = 0
        for marker in dict.fromkeys(m for m in markers if m):
            by_last: dict[str, list[int]] = {}
            for k in range(len(marker) - 1, 0, -1):
                by_last.setdefault(marker[k - 1], []).append(k)
            self._index.append((marker, by_last))
            longest = max(longest, len(marker) - 1)
        #: The longest proper prefix, in characters (0 with no marker longer than 1).
        self.max_len = longest

    def partial_suffix_len(self, text: str) -> int:
        """Length in characters of the longest suffix of ``text`` that is a proper prefix of
        some marker; 0 when none is. The cost does not grow with ``len(text)``."""
        if not text:
            return 0
        last = text[-1]
        best = 0
        n = len(text)
        for marker, by_last in self._index:
            for k in by_last.get(last, ()):
                if k <= best:
                    break
                if k <= n and marker.startswith(text[n - k :]):
                    best = k
                    break
        return best
