"""The engine of the JSON-call formats: marked sections of ``{"name", "arguments"}`` objects.

One state machine serves every format whose calls are JSON objects: a start marker (or the
very start of the output) opens a section holding one object, an array of objects, or
objects separated by ``;``, optionally closed by an end marker. What a client sees for a
malformed call is the same streamed and not (docs/tools.md): text that is not a call object,
or a call whose name is not one of the request's tools, is released as content, markers
included, up to the end marker (or the end of the output); a call whose name was emitted
keeps the arguments text the model wrote, even when it is cut short.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._scan import JsonCallScanner, split_at_marker
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec

__all__ = ["JsonCallParser"]

_WS = " \t\r\n"
_TEXT, _OPEN, _OBJ, _SEP, _AFTER, _PASS, _PLAIN, _EXT = range(8)


class JsonCallParser:
    """Subclasses set the class attributes:

    ``starts``: markers that open a call section (``()``: none). ``at_start``: a section may
    also open at the start of the output when its first non-space character is ``{`` (or
    ``[`` for arrays); when ``starts`` is empty the output is otherwise plain content.
    ``shape``: ``"object"`` (one object per section), ``"array"`` (``[obj, ...]``) or
    ``"seq"`` (``obj; obj``). ``end``: the marker that closes a section, if any.
    ``arg_keys``: the keys of the arguments object.
    """

    needs_special_tokens: ClassVar[bool] = False
    starts: tuple[str, ...] = ()
    at_start = False
    shape = "object"
    end: str | None = None
    arg_keys: tuple[str, ...] = ("arguments", "parameters")

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._names = frozenset(t.name for t in tools)
        self._state = _TEXT
        self._held = ""
        self._ws = ""  # whitespace held at the start or after a call: dropped before a call
        self._trim = True
        self._raw = ""
        self._scan: JsonCallScanner | None = None
        self._emitted = False
        self._index = 0
        self._began = False  # any non-space output seen (for at_start)

    # -- helpers -----------------------------------------------------------------------

    def _content(self, text: str, out: list[str]) -> None:
        if not text:
            return
        if self._trim:
            if not text.strip(_WS):
                self._ws += text
                return
            text, self._ws, self._trim = self._ws + text, "", False
        out.append(text)

    def _open_object(self, raw: str) -> None:
        self._state = _OBJ
        self._scan = JsonCallScanner(self.arg_keys)
        self._raw = raw
        self._emitted = False

    def _drain(self, calls: list[ToolCallDelta]) -> bool:
        """Emit what the scanner has; ``False`` when the call turned out to be malformed."""
        scan = self._scan
        assert scan is not None
        if not self._emitted:
            if scan.name is None:
                return not scan.error
            if self._names and scan.name not in self._names:
                return False
            calls.append(ToolCallDelta(self._index, name=scan.name, arguments=scan.take_args()))
            self._emitted = True
            return True
        args = scan.take_args()
        if args:
            calls.append(ToolCallDelta(self._index, arguments=args))
        return True

    def _call_done(self) -> None:
        self._index += 1
        self._emitted = False
        self._scan = None

    # -- a format's own section syntax (after a start marker, where no ``[`` follows) ------

    def _open_other(self) -> bool:
        """Whether the format has another syntax after its start marker (then
        :meth:`_push_other` reads the section); by default such text is not a call."""
        return False

    def _push_other(self, buf: str, content: list[str], calls: list[ToolCallDelta]) -> str:
        """Read ``buf`` in the format's own section; return what is left for the base."""
        raise NotImplementedError

    def _finish_other(self, held: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        """The output ended inside the format's own section (``held``: text held back)."""

    def _leave_other(self) -> None:
        """Back to text after the format's own section (whitespace next is trimmed)."""
        self._state, self._trim = _TEXT, True

    def _pass_through(self) -> None:
        """The rest of the section (up to the end marker, if any) is content."""
        self._state = _PASS

    # -- the protocol ------------------------------------------------------------------

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        buf, self._held = self._held + text, ""
        while buf:
            st = self._state
            if st == _PLAIN:
                content.append(buf)
                break
            if st == _TEXT:
                if self.at_start and not self._began:
                    stripped = buf.lstrip(_WS)
                    if not stripped:
                        self._content(buf, content)
                        break
                    self._began = True
                    lead = buf[: len(buf) - len(stripped)]
                    opener = "[" if self.shape == "array" else "{"
                    if stripped.startswith(opener):
                        self._content(lead, content)
                        self._ws = ""
                        if self.shape == "array":
                            self._state, self._raw = _OPEN, lead
                        else:
                            self._open_object(lead)
                        buf = stripped
                        continue
                    if not self.starts:
                        self._state = _PLAIN
                        continue
                before, marker, after, held = split_at_marker(buf, self.starts)
                if marker is None:
                    self._content(before, content)
                    self._held = held
                    break
                self._content(before, content)
                self._ws = ""
                self._began = True
                if self.shape == "array":
                    self._state, self._raw = _OPEN, marker
                else:
                    self._open_object(marker)
                buf = after
            elif st == _OPEN:
                stripped = buf.lstrip(_WS)
                self._raw += buf[: len(buf) - len(stripped)]
                if not stripped:
                    break
                if stripped[0] != "[":
                    if self._open_other():
                        self._state = _EXT
                    else:
                        self._state = _PASS
                        content.append(self._raw)
                    buf = stripped
                    continue
                self._open_object(self._raw + "[")
                buf = stripped[1:]
            elif st == _OBJ:
                scan = self._scan
                assert scan is not None
                used = scan.push(buf)
                self._raw += buf[:used]
                buf = buf[used:]
                if not self._drain(calls) or (scan.error and not self._emitted):
                    self._state = _PASS
                    content.append(self._raw)
                    continue
                if scan.done:
                    self._state = _AFTER if self.shape == "object" else _SEP
                    self._call_done()
                    self._raw = ""
            elif st == _SEP:
                stripped = buf.lstrip(_WS)
                if not stripped:
                    self._held = buf
                    break
                ch = stripped[0]
                if (self.shape == "array" and ch == ",") or (self.shape == "seq" and ch == ";"):
                    self._open_object("")
                    buf = stripped[1:]
                elif self.shape == "array" and ch == "]":
                    self._state = _AFTER
                    buf = stripped[1:]
                elif self.shape == "seq" and ch == "{":
                    self._open_object("")
                    buf = stripped
                else:
                    self._state = _AFTER
                    buf = stripped
            elif st == _AFTER:
                if self.end is None:
                    self._state, self._trim = _TEXT, True
                    continue
                _, marker, after, held = split_at_marker(buf, (self.end,))
                if marker is None:  # the section is the call's until its end marker
                    self._held = held
                    break
                self._state, self._trim = _TEXT, True
                buf = after
            elif st == _EXT:
                buf = self._push_other(buf, content, calls)
            elif st == _PASS:
                self._trim, self._ws = False, ""  # pass-through text is content
                if self.end is None:
                    content.append(buf)
                    break
                before, marker, after, held = split_at_marker(buf, (self.end,))
                content.append(before + (marker or ""))
                if marker is None:
                    self._held = held
                    break
                self._state = _TEXT
                buf = after
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        held, self._held = self._held, ""
        st = self._state
        if st == _TEXT:
            if held or self._index == 0:
                content.append(self._ws + held)
            self._ws = ""
        elif st == _OPEN:
            content.append(self._raw)
        elif st == _OBJ:
            scan = self._scan
            assert scan is not None
            scan.finish()
            if not self._drain(calls) or not self._emitted:
                content.append(self._raw)
        elif st == _PASS:
            content.append(held)
        elif st == _EXT:
            self._finish_other(held, content, calls)
        self._state = _PLAIN
        return "".join(content), calls
