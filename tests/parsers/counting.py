"""A ``str`` that counts the characters its operations copy or scan: a deterministic measure of a
parser's work (no clock). Every string derived from one (slices, concatenations, stripped
copies) is one too, so a parser fed :class:`CountingStr` pieces reports all the work done on
its buffers in :data:`COUNT`. A ``str`` method this does not count fails the test, so a
parser cannot escape the count by using one."""

from __future__ import annotations

from typing import Any, SupportsIndex

#: ``COUNT[0]``: characters copied or scanned so far.
COUNT = [0]

#: Methods that are counted (below) or cost O(1) or O(len(argument)) at most.
_ALLOWED = frozenset(
    {
        "find",
        "startswith",
        "endswith",
        "lstrip",
        "strip",
        "removeprefix",
        "removesuffix",
        "isspace",
        "isdigit",
        "encode",
    }
)


class CountingStr(str):
    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_") and name not in _ALLOWED:
            raise AssertionError(f"CountingStr.{name} is not counted")
        return super().__getattribute__(name)

    def __add__(self, other: str) -> CountingStr:  # type: ignore[override]
        out = str.__add__(self, other)
        COUNT[0] += len(out)
        return CountingStr(out)

    def __radd__(self, other: str) -> CountingStr:
        out = str.__add__(other, self)
        COUNT[0] += len(out)
        return CountingStr(out)

    def __getitem__(self, key: SupportsIndex | slice) -> CountingStr:  # type: ignore[override]
        out = str.__getitem__(self, key)
        COUNT[0] += max(len(out), 1)
        return CountingStr(out)

    def __contains__(self, sub: object) -> bool:  # type: ignore[override]
        COUNT[0] += len(self)
        return str.__contains__(self, sub)  # type: ignore[operator]

    def find(self, sub: str, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        lo = 0 if start is None else min(max(start, 0), len(self))
        hi = len(self) if end is None else min(max(end, 0), len(self))
        i = str.find(self, sub, lo, hi)
        COUNT[0] += max((i + len(sub) if i >= 0 else hi) - lo, 1)
        return i

    def lstrip(self, chars: str | None = None) -> CountingStr:
        out = str.lstrip(self, chars)
        COUNT[0] += len(self)
        return CountingStr(out)

    def strip(self, chars: str | None = None) -> CountingStr:
        out = str.strip(self, chars)
        COUNT[0] += len(self)
        return CountingStr(out)

    def removeprefix(self, prefix: str) -> CountingStr:
        out = str.removeprefix(self, prefix)
        COUNT[0] += len(out)
        return CountingStr(out)

    def removesuffix(self, suffix: str) -> CountingStr:
        out = str.removesuffix(self, suffix)
        COUNT[0] += len(out)
        return CountingStr(out)


def pieces(text: str, pattern: str, seed: int = 0) -> list[CountingStr]:
    """``text`` cut into counted pieces: ``whole``, ``chars`` (one each) or ``random``
    (1 to 64 characters)."""
    import random

    if pattern == "whole":
        return [CountingStr(text)]
    if pattern == "chars":
        return [CountingStr(c) for c in text]
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 64)
        out.append(CountingStr(text[i : i + n]))
        i += n
    return out
