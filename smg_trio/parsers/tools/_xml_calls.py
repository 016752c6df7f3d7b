"""The shared machine of the XML-style formats (Qwen3-Coder, GLM-4.5): one tag per parameter.

A call is ``<tool_call>``, a function name, then parameters (a key and a text value) until the
call's end; :mod:`._xmlargs` turns the values into JSON by the tool's schema. This base class
runs what the formats share: the text outside calls (scanning for ``<tool_call>``; the
whitespace after a call, which is content again when no call follows), a skipped call's raw
text, the arguments between parameters, a value's text and the end of the output. A subclass
sets its markers and runs the states of its own grammar (the name, the key) in
:meth:`XmlCallsParser._step_format`.

Malformed output (docs/tools.md): a call whose function name cannot be read or is not one of
the tools goes to ``content`` as its raw text; once the name is out the call is kept, and a
truncated call keeps its parameters as far as they came, closed to valid JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._markers import find_marker, merge_deltas
from smg_trio.parsers.tools._xmlargs import ArgsWriter, ValueStream, param_types
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec

__all__ = [
    "BETWEEN",
    "BODY",
    "KEY",
    "NAME",
    "NAME_CAP",
    "OUT",
    "OWN",
    "SKIP",
    "VALUE",
    "XmlCallsParser",
]

#: A function or parameter name longer than this is not one.
NAME_CAP = 256

#: A pushed piece longer than this is parsed this many characters at a time. Each step cuts
#: what it consumed off the front of the buffer and searches what remains, which in one big
#: piece (a mock script, a whole response) made a parse quadratic; with the pieces bounded,
#: every step costs at most this plus what a state holds back (a partial tag, a name up to
#: ``NAME_CAP``), whatever the feeding (issue 28 item 7). The output does not depend on it.
PIECE_CHARS = 512

#: The states: outside calls, after a call's end (whitespace held), a call read as raw text,
#: a function name, between parameters, a parameter key, its value. A subclass numbers its
#: own states from ``OWN``.
OUT, BETWEEN, SKIP, NAME, BODY, KEY, VALUE, OWN = range(8)


class XmlCallsParser:
    """A streaming parser for one format, set by the class attributes of a subclass."""

    needs_special_tokens: ClassVar[bool]
    TOOL_CALL: ClassVar[str]
    TOOL_CALL_END: ClassVar[str]
    #: The state after ``TOOL_CALL``.
    OPENED: ClassVar[int]
    #: The marker that starts a parameter, and those that end the call's parameters.
    PARAM: ClassVar[str]
    BODY_END: ClassVar[tuple[str, ...]]
    #: What ends a value: its own end marker (consumed) first, then the tags that end it too
    #: (kept for ``BODY``).
    VALUE_STOPS: ClassVar[tuple[str, ...]]
    #: Whether one leading and one trailing newline of a value are the layout's.
    STRIP_NEWLINES: ClassVar[bool]
    #: At the end of the output: the states whose text goes to content, and those inside a
    #: call whose name is out (the call is closed).
    RAW_STATES: ClassVar[tuple[int, ...]]
    OPEN_STATES: ClassVar[tuple[int, ...]]

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._types = param_types(tools)
        self._buf = ""
        #: Consumed text not yet content nor part of an emitted call, in pieces (a skipped
        #: call's text can be long: joined once, when it is decided).
        self._raw: list[str] = []
        self._value: ValueStream | None = None
        self._state = OUT
        self._index = 0
        self._args = ArgsWriter({})

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if len(text) <= PIECE_CHARS:
            self._buf += text
            return self._drive(final=False)
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        for start in range(0, len(text), PIECE_CHARS):
            self._buf += text[start : start + PIECE_CHARS]
            more, deltas = self._drive(final=False)
            content.append(more)
            calls += deltas
        return "".join(content), merge_deltas(calls)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content, calls = self._drive(final=True)
        if self._state in self.RAW_STATES:
            content += self._take_raw() + self._buf
        elif self._state in self.OPEN_STATES:
            if self._state == VALUE and self._value is not None:  # kept as far as it came
                calls.append(ToolCallDelta(index=self._index, arguments=self._value.end()))
            calls.append(self._close())
        self._buf = ""
        self._raw = []
        self._value = None
        self._state = OUT
        return content, merge_deltas(calls)

    def _step_format(
        self, state: int, buf: str, final: bool, content: list[str], calls: list[ToolCallDelta]
    ) -> bool:
        """One step of a state of the format's own grammar; ``True`` when it waits for more."""
        raise NotImplementedError

    def _after_call(self, marker: str) -> int:
        """The state after ``marker`` (one of ``BODY_END``) closed the call."""
        return BETWEEN

    def _close(self) -> ToolCallDelta:
        delta = ToolCallDelta(index=self._index, arguments=self._args.close())
        self._index += 1
        return delta

    def _certain(self, buf: str, pos: int, final: bool) -> str:
        """The text of ``buf`` before ``pos`` (all of it when ``final``); the rest stays."""
        cut = len(buf) if final else pos
        self._buf = buf[cut:]
        return buf[:cut]

    def _lstrip_raw(self, buf: str) -> str:
        """``buf`` without its leading whitespace, which is added to the raw text."""
        rest = buf.lstrip()
        if len(rest) < len(buf):
            self._raw.append(buf[: len(buf) - len(rest)])
        self._buf = rest
        return rest

    def _take_raw(self) -> str:
        """The raw text so far (now empty)."""
        raw = "".join(self._raw)
        self._raw = []
        return raw

    def _start_call(self, name: str, calls: list[ToolCallDelta]) -> bool:
        """Emits the call's ``name`` and opens its arguments; ``False`` (the call is skipped
        as raw content) when it is not one of the request's tools."""
        if not name or (self._types and name not in self._types):
            self._state = SKIP
            return False
        calls.append(ToolCallDelta(index=self._index, name=name))
        self._args = ArgsWriter(self._types.get(name, {}))
        self._raw = []
        self._state = BODY
        return True

    def _open_value(self, key: str) -> None:
        self._value = ValueStream(self._args, key, strip_newlines=self.STRIP_NEWLINES)
        self._state = VALUE

    def _drive(self, *, final: bool) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            if self._step(self._buf, final, content, calls):
                break
        return "".join(content), merge_deltas(calls)

    def _step(self, buf: str, final: bool, content: list[str], calls: list[ToolCallDelta]) -> bool:
        state = self._state
        if state in (OUT, BETWEEN):
            if state == BETWEEN:
                buf = self._lstrip_raw(buf)
                if not buf:
                    return True
                if not buf.startswith(self.TOOL_CALL):
                    if not final and self.TOOL_CALL.startswith(buf):
                        return True
                    content.append(self._take_raw())  # text after a call: content again
                self._raw = []
                self._state = OUT
            pos, marker = find_marker(buf, (self.TOOL_CALL,))
            if marker is None:
                content.append(self._certain(buf, pos, final))
                return True
            content.append(buf[:pos])
            self._raw = [marker]
            self._buf = buf[pos + len(marker) :]
            self._state = self.OPENED
        elif state == SKIP:
            pos, marker = find_marker(buf, (self.TOOL_CALL_END,))
            if marker is None:
                self._raw.append(self._certain(buf, pos, final))
                return True
            content.append(self._take_raw() + buf[: pos + len(marker)])
            self._buf = buf[pos + len(marker) :]
            self._state = OUT
        elif state == BODY:
            pos, marker = find_marker(buf, (self.PARAM, *self.BODY_END))
            if marker is None:  # stray text between parameters is dropped
                self._certain(buf, pos, final)
                return True
            self._buf = buf[pos + len(marker) :]
            if marker == self.PARAM:
                self._state = KEY
            else:
                calls.append(self._close())
                self._raw = []
                self._state = self._after_call(marker)
        elif state == VALUE:
            assert self._value is not None
            pos, marker = find_marker(buf, self.VALUE_STOPS)
            if marker is None:
                if fragment := self._value.feed(self._certain(buf, pos, final)):
                    calls.append(ToolCallDelta(index=self._index, arguments=fragment))
                return True
            fragment = self._value.feed(buf[:pos]) + self._value.end()
            calls.append(ToolCallDelta(index=self._index, arguments=fragment))
            self._value = None
            # Without its end marker, the value ends at the next tag (kept for BODY).
            self._buf = buf[pos + len(marker) :] if marker == self.VALUE_STOPS[0] else buf[pos:]
            self._state = BODY
        else:
            return self._step_format(state, buf, final, content, calls)
        return False
