"""OpenAI harmony (gpt-oss) as text: its markers and a streaming message splitter.

The format (openai-harmony's docs): a completion is a run of messages, each
``[<|start|>ROLE]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY`` and a
terminator: ``<|end|>`` (more may follow), ``<|call|>`` (a tool call; a stop token) or
``<|return|>`` (done; a stop token). The first message has no ``<|start|>assistant``: the
prompt ends with it. The recipient may also stand in the role part
(``<|start|>assistant to=functions.f<|channel|>commentary``). The markers are special tokens of
the o200k_harmony vocabulary, so the detokenizer must keep them.

:class:`HarmonySplitter` is shared by the ``openai`` reasoning and tool-call parsers: it
streams text into events, holding back a marker split across pieces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import attrs

from smg_trio.tokenizer._holdback import PrefixIndex

__all__ = ["CALL", "END", "MESSAGE", "RETURN", "START", "Header", "HarmonySplitter"]

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN, CONSTRAIN = "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"

#: Longest header (up to its ``<|message|>``) kept while waiting for it; a longer one is not
#: harmony.
MAX_HEADER_CHARS = 1024

_OPENERS = (START, CHANNEL)
_TERMINATORS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


@attrs.frozen
class Header:
    """A message header: its ``channel`` and ``recipient`` (``None`` when absent) and its
    ``raw`` text (from the opening marker through ``<|message|>``)."""

    channel: str | None
    recipient: str | None
    raw: str

    @classmethod
    def parse(cls, raw: str) -> Header:
        m = _CHANNEL.search(raw)
        r = _RECIPIENT.search(raw)
        return cls(m.group(1) if m else None, r.group(1) if r else None, raw)

    @property
    def function(self) -> str | None:
        """The function name of a ``to=functions.NAME`` recipient, else ``None``."""
        if self.recipient is not None and self.recipient.startswith("functions."):
            return self.recipient[len("functions.") :] or None
        return None


#: Events: ("text", s) outside any message, ("header", Header), ("body", s),
#: ("end", terminator or "" at the end of the output).
Event = tuple[str, "str | Header"]

_OUTSIDE, _HEADER, _BODY = 0, 1, 2


class _Finder:
    """Marker positions in one buffer walked forward: the next occurrence of each marker is
    searched for once and reused until the walk passes it (none left is remembered too), so
    each marker costs one scan of the buffer however many events it is asked for."""

    __slots__ = ("buf", "next")

    def __init__(self, buf: str) -> None:
        self.buf = buf
        self.next: dict[str, int] = {}

    def find(self, marker: str, start: int) -> int:
        """The first position of ``marker`` at or after ``start`` (-1: none)."""
        i = self.next.get(marker)
        if i is None or 0 <= i < start:
            i = self.next[marker] = self.buf.find(marker, start)
        return i

    def first(self, markers: tuple[str, ...], start: int) -> tuple[int, str]:
        """The earliest of ``markers`` at or after ``start`` (``(-1, "")``: none)."""
        best, found = -1, ""
        for m in markers:
            i = self.find(m, start)
            if i >= 0 and (best < 0 or i < best):
                best, found = i, m
        return best, found


def _held_len(prefixes: PrefixIndex, buf: str, start: int) -> int:
    """``prefixes.partial_suffix_len`` of ``buf[start:]``, without copying a long tail."""
    if len(buf) - start <= prefixes.max_len:
        return prefixes.partial_suffix_len(buf[start:])
    return prefixes.partial_suffix_len(buf)


class HarmonySplitter:
    """Streaming harmony splitter: :meth:`push` yields events as text completes them.

    Linear in the text in every feeding pattern: the text is walked by index (no slicing of
    what remains after each event), each marker's next position is found once
    (:class:`_Finder`), and what is held between pieces is a partial marker or a header of
    at most ``MAX_HEADER_CHARS`` (issue 28 item 7)."""

    __slots__ = ("_held", "_state")

    _open_prefixes = PrefixIndex(_OPENERS)
    _term_prefixes = PrefixIndex(_TERMINATORS)

    def __init__(self) -> None:
        self._state = _OUTSIDE
        self._held = ""

    def push(self, text: str) -> Iterator[tuple[str, str | Header]]:
        buf = self._held + text if self._held else text
        self._held = ""
        at, n = 0, len(buf)
        marks = _Finder(buf)
        while at < n:
            if self._state == _OUTSIDE:
                i, _ = marks.first(_OPENERS, at)
                if i < 0:
                    cut = n - _held_len(self._open_prefixes, buf, at)
                    if cut > at:
                        yield "text", buf[at:cut]
                    self._held = buf[cut:]
                    return
                if i > at:
                    yield "text", buf[at:i]
                at = i
                self._state = _HEADER
            elif self._state == _HEADER:
                # <|message|> within the cap; not a header (plain text after all) once it
                # cannot start within the cap: decided on the text alone, so streamed and
                # whole agree
                i = marks.find(MESSAGE, at)
                if i - at > MAX_HEADER_CHARS or (
                    i < 0 and n - at >= MAX_HEADER_CHARS + len(MESSAGE)
                ):
                    self._state = _OUTSIDE
                    yield "text", buf[at]
                    at += 1
                    continue
                if i < 0:
                    self._held = buf[at:]
                    return
                yield "header", Header.parse(buf[at : i + len(MESSAGE)])
                at = i + len(MESSAGE)
                self._state = _BODY
            else:
                i, term = marks.first(_TERMINATORS, at)
                if i < 0:
                    cut = n - _held_len(self._term_prefixes, buf, at)
                    if cut > at:
                        yield "body", buf[at:cut]
                    self._held = buf[cut:]
                    return
                if i > at:
                    yield "body", buf[at:i]
                yield "end", term
                at = i + len(term)
                self._state = _OUTSIDE

    def finish(self) -> Iterator[tuple[str, str | Header]]:
        """The end of the output: held text, and an ``("end", "")`` for an open message. An
        unfinished header (no ``<|message|>`` yet) carries no text and is dropped."""
        held, self._held = self._held, ""
        state, self._state = self._state, _OUTSIDE
        if state == _OUTSIDE:
            if held:
                yield "text", held
        elif state == _BODY:
            if held:
                yield "body", held
            yield "end", ""
