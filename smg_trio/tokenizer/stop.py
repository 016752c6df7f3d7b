"""Stop strings: a streaming matcher that never leaks a stop's prefix, and single-token stop ids."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from smg_trio.tokenizer._holdback import PrefixIndex
from smg_trio.tokenizer.core import Tokenizer

__all__ = ["StopMatcher", "single_token_stop_ids"]


class StopMatcher:
    """Finds stop strings in streamed text.

    Only the longest suffix of the text seen so far that is a proper prefix of some stop is
    held back; everything before it is released at once. When a stop appears, the text
    before it (plus the stop itself if ``include_stop_str_in_output``) is released and the
    stop reported; from then on nothing more is emitted. If several stops match, the one
    starting earliest wins, ties going to the one listed first. Empty and duplicate stops are
    ignored; with no stops every delta passes straight through.
    """

    __slots__ = ("_held", "_include", "_matched", "_prefixes", "_stops")

    def __init__(self, stops: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._prefixes = PrefixIndex(self._stops)
        self._include = include_stop_str_in_output
        self._held = ""
        self._matched: str | None = None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, or ``None``."""
        return self._matched

    @property
    def held(self) -> str:
        """Text currently held back as a possible stop prefix."""
        return self._held

    def push(self, delta: str) -> tuple[str, str | None]:
        """Feed new text; return ``(text safe to emit now, matched stop or None)``. The stop is
        reported once, by the push that completes it."""
        if self._matched is not None:
            return "", None
        if not self._stops:
            return delta, None
        buf = self._held + delta
        best = -1
        best_stop: str | None = None
        for stop in self._stops:
            i = buf.find(stop)
            if i >= 0 and (best_stop is None or i < best):
                best, best_stop = i, stop
        if best_stop is not None:
            self._matched = best_stop
            self._held = ""
            end = best + len(best_stop) if self._include else best
            return buf[:end], best_stop
        hold = self._prefixes.partial_suffix_len(buf)
        cut = len(buf) - hold
        self._held = buf[cut:]
        return buf[:cut], None

    def flush(self) -> str:
        """Release held-back text at the end of the stream (``""`` after a match)."""
        held, self._held = self._held, ""
        return "" if self._matched is not None else held


def single_token_stop_ids(tokenizer: Tokenizer, stops: Iterable[str]) -> list[int]:
    """Ids of the stop strings that encode (no special tokens added) to exactly one token,
    deduplicated in order; the engine can then stop on them itself."""
    out: dict[int, None] = {}
    for stop in stops:
        if stop:
            ids = tokenizer.encode(stop, add_special_tokens=False)
            if len(ids) == 1:
                out[ids[0]] = None
    return list(out)
