"""The shared machine of the special-token formats whose arguments are the model's own JSON.

DeepSeek V3, V3.1 and Kimi K2 write a section of calls between begin/end markers; each call
is a begin marker, a header that names the function, a marker, the JSON arguments and an end
marker. The arguments stream through verbatim, so their concatenation is the model's text.

Malformed output (docs/tools.md): before a call's name is emitted, a call that cannot be read
(no header end, an unknown function, a truncated header) and a section with no readable call
go to ``content`` as the raw text; once the name is out the call is kept, and its arguments
are the text up to the end marker (or the end of the output when it is truncated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._markers import find_marker, merge_deltas
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec

__all__ = ["SectionedJsonParser"]

_OUT, _SECTION, _HEADER, _ARGS, _SKIP = range(5)

#: A header (type, name, id) longer than this is not a header: the call is malformed.
HEADER_CAP = 512


class SectionedJsonParser:
    """A streaming parser for one format, set by the class attributes of a subclass."""

    needs_special_tokens: ClassVar[bool] = True
    SECTION_BEGIN: ClassVar[tuple[str, ...]]
    SECTION_END: ClassVar[tuple[str, ...]]
    CALL_BEGIN: ClassVar[str]
    HEADER_END: ClassVar[str]
    #: What ends the arguments (the first found wins; the call end marker must be one).
    ARGS_END: ClassVar[tuple[str, ...]]
    CALL_END: ClassVar[str]

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._names = frozenset(t.name for t in tools)
        self._buf = ""
        self._raw = ""  # consumed text not yet content nor part of an emitted call
        self._state = _OUT
        self._index = 0
        self._section_has_call = False

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        """``(name, id)`` from a call's header, or ``None`` when it is not one."""
        raise NotImplementedError

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        return self._drive(final=False)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content, calls = self._drive(final=True)
        if self._state == _SECTION and self._section_has_call:
            content += self._buf  # the section's end marker never came: nothing is lost
        elif self._state != _ARGS:
            content += self._raw + self._buf
        self._buf = self._raw = ""
        self._state = _OUT
        return content, calls

    def _known(self, name: str) -> bool:
        return bool(name) and (not self._names or name in self._names)

    def _drive(self, *, final: bool) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            buf = self._buf
            if self._state == _OUT:
                pos, marker = find_marker(buf, self.SECTION_BEGIN)
                if marker is None:
                    cut = len(buf) if final else pos
                    content.append(buf[:cut])
                    self._buf = buf[cut:]
                    break
                content.append(buf[:pos])
                self._raw = marker
                self._buf = buf[pos + len(marker) :]
                self._state = _SECTION
                self._section_has_call = False
            elif self._state == _SECTION:
                rest = buf.lstrip()
                self._raw += buf[: len(buf) - len(rest)]
                self._buf = buf = rest
                if not buf:
                    break
                if buf.startswith(self.CALL_BEGIN):
                    self._raw += self.CALL_BEGIN
                    self._buf = buf[len(self.CALL_BEGIN) :]
                    self._state = _HEADER
                    continue
                end = next((m for m in self.SECTION_END if buf.startswith(m)), None)
                if end is not None:
                    if not self._section_has_call:
                        content.append(self._raw + end)
                    self._raw = ""
                    self._buf = buf[len(end) :]
                    self._state = _OUT
                    continue
                if not final and any(
                    m.startswith(buf) for m in (self.CALL_BEGIN, *self.SECTION_END)
                ):
                    break  # a marker split across pieces
                # Not a call: the section is over; what follows is content.
                content.append(self._raw)
                self._raw = ""
                self._state = _OUT
            elif self._state == _HEADER:
                markers = (self.HEADER_END, self.CALL_END, *self.SECTION_END)
                pos, marker = find_marker(buf, markers)
                longest = max(len(m) for m in markers)
                if marker is None:
                    if len(buf) > HEADER_CAP + longest:
                        self._state = _SKIP
                        continue
                    break
                if pos > HEADER_CAP:
                    self._state = _SKIP
                    continue
                if marker == self.HEADER_END:
                    parsed = self.parse_header(buf[:pos])
                    if parsed is None or not self._known(parsed[0]):
                        self._state = _SKIP
                        continue
                    name, call_id = parsed
                    calls.append(ToolCallDelta(index=self._index, name=name, id=call_id))
                    self._raw = ""
                    self._buf = buf[pos + len(marker) :]
                    self._state = _ARGS
                    continue
                # The call (or the section) ended inside the header: raw text.
                content.append(self._raw + buf[: pos + len(marker)])
                self._raw = ""
                self._buf = buf[pos + len(marker) :]
                self._state = _SECTION if marker == self.CALL_END else _OUT
            elif self._state == _SKIP:
                pos, marker = find_marker(buf, (self.CALL_END, *self.SECTION_END))
                if marker is None:
                    cut = len(buf) if final else pos
                    self._raw += buf[:cut]
                    self._buf = buf[cut:]
                    break
                content.append(self._raw + buf[: pos + len(marker)])
                self._raw = ""
                self._buf = buf[pos + len(marker) :]
                self._state = _SECTION if marker == self.CALL_END else _OUT
            else:  # _ARGS
                pos, marker = find_marker(buf, self.ARGS_END)
                if marker is None:
                    cut = len(buf) if final else pos
                    if cut:
                        calls.append(ToolCallDelta(index=self._index, arguments=buf[:cut]))
                    self._buf = buf[cut:]
                    break
                if pos:
                    calls.append(ToolCallDelta(index=self._index, arguments=buf[:pos]))
                self._buf = buf[pos + len(marker) :]
                self._index += 1
                self._section_has_call = True
                self._state = _SECTION
        return "".join(content), merge_deltas(calls)
