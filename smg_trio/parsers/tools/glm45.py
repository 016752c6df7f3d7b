"""GLM-4.5 tool calls: ``<tool_call>NAME`` then ``<arg_key>K</arg_key><arg_value>V</arg_value>``.

Values are text; :mod:`._xmlargs` converts them to JSON by the tool's schema (a ``string``
streams as it arrives). Malformed output (docs/tools.md): a call whose function name cannot
be read or is not one of the tools goes to ``content`` as its raw text; once the name is out
the call is kept, and a truncated call keeps its parameters as far as they came, closed to
valid JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._markers import find_marker, merge_deltas
from smg_trio.parsers.tools._xmlargs import ArgsWriter, ValueStream, param_types
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec, register

__all__ = ["Glm45Parser"]

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"
#: A function or parameter name longer than this is not one.
NAME_CAP = 256

_OUT, _NAME, _SKIP, _ARGS, _KEY, _PREVALUE, _VALUE, _BETWEEN = range(8)


@register("glm45")
class Glm45Parser:
    """``<tool_call>get_weather\\n<arg_key>city</arg_key>\\n<arg_value>Paris</arg_value>\\n
    </tool_call>`` (GLM-4.5/4.6; the newlines are optional, as GLM-4.7 omits them)."""

    #: GLM-4.5's vocabulary has its tool tags as special tokens: they must be kept.
    needs_special_tokens: ClassVar[bool] = True

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._types = param_types(tools)
        self._buf = ""
        self._raw = ""
        self._text = ""
        self._key = ""
        self._value: ValueStream | None = None
        self._state = _OUT
        self._index = 0
        self._args = ArgsWriter({})

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        return self._drive(final=False)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content, calls = self._drive(final=True)
        if self._state in (_NAME, _SKIP):
            content += self._raw + self._buf
        elif self._state in (_ARGS, _KEY, _PREVALUE, _VALUE):
            if self._state == _VALUE and self._value is not None:  # kept as far as it came
                calls.append(ToolCallDelta(index=self._index, arguments=self._value.end()))
            calls.append(self._close())
        self._buf = self._raw = self._text = ""
        self._value = None
        self._state = _OUT
        return content, merge_deltas(calls)

    def _close(self) -> ToolCallDelta:
        delta = ToolCallDelta(index=self._index, arguments=self._args.close())
        self._index += 1
        return delta

    def _drive(self, *, final: bool) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            buf = self._buf
            state = self._state
            if state in (_OUT, _BETWEEN):
                if state == _BETWEEN:
                    rest = buf.lstrip()
                    self._raw += buf[: len(buf) - len(rest)]
                    self._buf = buf = rest
                    if not buf:
                        break
                    if not buf.startswith(TOOL_CALL):
                        if not final and TOOL_CALL.startswith(buf):
                            break
                        content.append(self._raw)  # text after a call: content again
                    self._raw = ""
                    self._state = _OUT
                pos, marker = find_marker(buf, (TOOL_CALL,))
                if marker is None:
                    cut = len(buf) if final else pos
                    content.append(buf[:cut])
                    self._buf = buf[cut:]
                    break
                content.append(buf[:pos])
                self._raw = marker
                self._buf = buf[pos + len(marker) :]
                self._state = _NAME
            elif state == _NAME:
                rest = buf.lstrip()
                self._raw += buf[: len(buf) - len(rest)]
                self._buf = buf = rest
                if not buf:
                    break
                pos, marker = find_marker(buf, ("\n", KEY, TOOL_CALL_END))
                if marker is None or pos > NAME_CAP:
                    if pos > NAME_CAP:
                        self._state = _SKIP
                        continue
                    break
                name = buf[:pos].strip()
                if not name or (self._types and name not in self._types):
                    self._state = _SKIP  # not one of the request's tools: raw content
                    continue
                calls.append(ToolCallDelta(index=self._index, name=name))
                self._args = ArgsWriter(self._types.get(name, {}))
                self._raw = ""
                self._buf = buf[pos:]
                self._state = _ARGS
            elif state == _SKIP:
                pos, marker = find_marker(buf, (TOOL_CALL_END,))
                if marker is None:
                    cut = len(buf) if final else pos
                    self._raw += buf[:cut]
                    self._buf = buf[cut:]
                    break
                content.append(self._raw + buf[: pos + len(marker)])
                self._raw = ""
                self._buf = buf[pos + len(marker) :]
                self._state = _OUT
            elif state == _ARGS:
                pos, marker = find_marker(buf, (KEY, TOOL_CALL_END))
                if marker is None:  # stray text between arguments is dropped
                    self._buf = buf[len(buf) if final else pos :]
                    if not final:
                        break
                    continue
                self._buf = buf[pos + len(marker) :]
                if marker == KEY:
                    self._text = ""
                    self._state = _KEY
                else:
                    calls.append(self._close())
                    self._state = _BETWEEN
            elif state == _KEY:
                pos, marker = find_marker(buf, (KEY_END, TOOL_CALL_END))
                if marker is None:
                    cut = len(buf) if final else pos
                    self._text += buf[:cut]
                    self._buf = buf[cut:]
                    break
                if marker == KEY_END:
                    self._key = (self._text + buf[:pos]).strip()
                    self._buf = buf[pos + len(marker) :]
                    self._state = _PREVALUE
                else:  # a key without a value: skipped
                    self._buf = buf[pos:]
                    self._state = _ARGS
                self._text = ""
            elif state == _VALUE:
                assert self._value is not None
                pos, marker = find_marker(buf, (VALUE_END, KEY, TOOL_CALL_END))
                if marker is None:
                    cut = len(buf) if final else pos
                    if fragment := self._value.feed(buf[:cut]):
                        calls.append(ToolCallDelta(index=self._index, arguments=fragment))
                    self._buf = buf[cut:]
                    break
                fragment = self._value.feed(buf[:pos]) + self._value.end()
                calls.append(ToolCallDelta(index=self._index, arguments=fragment))
                self._value = None
                # Without </arg_value>, the value ends at the next tag (kept for _ARGS).
                self._buf = buf[pos + len(marker) :] if marker == VALUE_END else buf[pos:]
                self._state = _ARGS
            else:  # _PREVALUE: between </arg_key> and <arg_value>
                pos, marker = find_marker(buf, (VALUE, KEY, TOOL_CALL_END))
                if marker is None:
                    self._buf = buf[len(buf) if final else pos :]
                    if not final:
                        break
                    continue
                if marker == VALUE:
                    self._buf = buf[pos + len(marker) :]
                    self._value = ValueStream(self._args, self._key, strip_newlines=False)
                    self._state = _VALUE
                else:  # a key without a value: skipped
                    self._buf = buf[pos:]
                    self._state = _ARGS
        return "".join(content), merge_deltas(calls)
