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


def _first(buf: str, markers: tuple[str, ...]) -> tuple[int, str]:
    best, found = -1, ""
    for m in markers:
        i = buf.find(m)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, m
    return best, found


class HarmonySplitter:
    """Streaming harmony splitter: :meth:`push` yields events as text completes them."""

    __slots__ = ("_held", "_state")

    _open_prefixes = PrefixIndex(_OPENERS)
    _term_prefixes = PrefixIndex(_TERMINATORS)

    def __init__(self) -> None:
        self._state = _OUTSIDE
        self._held = ""

    def push(self, text: str) -> Iterator[tuple[str, str | Header]]:
        buf = self._held + text
        self._held = ""
        while buf:
            if self._state == _OUTSIDE:
                i, _ = _first(buf, _OPENERS)
                if i < 0:
                    cut = len(buf) - self._open_prefixes.partial_suffix_len(buf)
                    if cut:
                        yield "text", buf[:cut]
                    self._held = buf[cut:]
                    return
                if i:
                    yield "text", buf[:i]
                buf = buf[i:]
                self._state = _HEADER
            elif self._state == _HEADER:
                i = buf.find(MESSAGE)
                # not a header (plain text after all) once <|message|> cannot start within
                # the cap: decided on the text alone, so streamed and whole agree
                if i > MAX_HEADER_CHARS or (i < 0 and len(buf) >= MAX_HEADER_CHARS + len(MESSAGE)):
                    self._state = _OUTSIDE
                    yield "text", buf[:1]
                    buf = buf[1:]
                    continue
                if i < 0:
                    self._held = buf
                    return
                yield "header", Header.parse(buf[: i + len(MESSAGE)])
                buf = buf[i + len(MESSAGE) :]
                self._state = _BODY
            else:
                i, term = _first(buf, _TERMINATORS)
                if i < 0:
                    cut = len(buf) - self._term_prefixes.partial_suffix_len(buf)
                    if cut:
                        yield "body", buf[:cut]
                    self._held = buf[cut:]
                    return
                if i:
                    yield "body", buf[:i]
                yield "end", term
                buf = buf[i + len(term) :]
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
