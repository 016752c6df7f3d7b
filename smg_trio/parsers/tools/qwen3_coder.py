"""Qwen3-Coder tool calls: ``<tool_call><function=NAME><parameter=KEY>value</parameter>...``.

Values are text; :mod:`._xmlargs` converts them to JSON by the tool's schema (a ``string``
streams as it arrives; the newline after the opening tag and before the closing one are the
layout's, not the value's). Malformed output (docs/tools.md): a call whose function name
cannot be read or is not one of the tools goes to ``content`` as its raw text; once the name
is out the call is kept, and a truncated call keeps its parameters as far as they came,
closed to valid JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._markers import find_marker, merge_deltas
from smg_trio.parsers.tools._xmlargs import ArgsWriter, ValueStream, param_types
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec, register

__all__ = ["Qwen3CoderParser"]

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNC, FUNC_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
#: A function or parameter name longer than this is not one.
NAME_CAP = 256

_OUT, _CALL, _NAME, _SKIP, _FUNC, _KEY, _VALUE, _AFTER, _BETWEEN = range(9)


@register("qwen3_coder")
class Qwen3CoderParser:
    """``<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n
    </function>\\n</tool_call>``; several calls are several ``<tool_call>`` blocks."""

    needs_special_tokens: ClassVar[bool] = False

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._types = param_types(tools)
        self._buf = ""
        self._raw = ""
        self._value: ValueStream | None = None
        self._state = _OUT
        self._index = 0
        self._args = ArgsWriter({})

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        return self._drive(final=False)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content, calls = self._drive(final=True)
        if self._state in (_CALL, _NAME, _SKIP):
            content += self._raw + self._buf
        elif self._state in (_FUNC, _KEY, _VALUE):
            if self._state == _VALUE and self._value is not None:  # kept as far as it came
                calls.append(ToolCallDelta(index=self._index, arguments=self._value.end()))
            calls.append(self._close())
            calls = merge_deltas(calls)
        self._buf = self._raw = ""
        self._value = None
        self._state = _OUT
        return content, calls

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
                    ws, buf = buf[: len(buf) - len(rest)], rest
                    self._raw += ws
                    self._buf = buf
                    if not buf:
                        break
                    if not buf.startswith(TOOL_CALL) and (final or not TOOL_CALL.startswith(buf)):
                        content.append(self._raw)  # text after a call: content again
                    elif not buf.startswith(TOOL_CALL):
                        break
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
                self._state = _CALL
            elif state == _CALL:
                rest = buf.lstrip()
                self._raw += buf[: len(buf) - len(rest)]
                self._buf = buf = rest
                if not buf:
                    break
                if buf.startswith(FUNC):
                    self._raw += FUNC
                    self._buf = buf[len(FUNC) :]
                    self._state = _NAME
                elif final or not FUNC.startswith(buf):
                    content.append(self._raw)  # not a call after all
                    self._raw = ""
                    self._state = _OUT
                else:
                    break
            elif state == _NAME:
                pos = buf.find(">")
                if pos < 0 or pos > NAME_CAP:
                    if pos > NAME_CAP or len(buf) > NAME_CAP:
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
                self._buf = buf[pos + 1 :]
                self._state = _FUNC
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
            elif state == _FUNC:
                pos, marker = find_marker(buf, (PARAM, FUNC_END, TOOL_CALL_END))
                if marker is None:  # stray text between parameters is dropped
                    self._buf = buf[len(buf) if final else pos :]
                    if not final:
                        break
                    continue
                self._buf = buf[pos + len(marker) :]
                if marker == PARAM:
                    self._state = _KEY
                else:
                    calls.append(self._close())
                    self._state = _AFTER if marker == FUNC_END else _BETWEEN
                    self._raw = ""
            elif state == _KEY:
                pos = buf.find(">")
                if pos < 0 and len(buf) <= NAME_CAP:
                    break
                if pos < 0 or pos > NAME_CAP:
                    self._state = _FUNC  # not a parameter name: skipped
                    continue
                self._value = ValueStream(self._args, buf[:pos].strip(), strip_newlines=True)
                self._buf = buf[pos + 1 :]
                self._state = _VALUE
            elif state == _VALUE:
                assert self._value is not None
                pos, marker = find_marker(buf, (PARAM_END, PARAM, FUNC_END, TOOL_CALL_END))
                if marker is None:
                    cut = len(buf) if final else pos
                    if fragment := self._value.feed(buf[:cut]):
                        calls.append(ToolCallDelta(index=self._index, arguments=fragment))
                    self._buf = buf[cut:]
                    break
                fragment = self._value.feed(buf[:pos]) + self._value.end()
                calls.append(ToolCallDelta(index=self._index, arguments=fragment))
                self._value = None
                # Without its end tag, the parameter ends at the next tag (kept for _FUNC).
                self._buf = buf[pos + len(marker) :] if marker == PARAM_END else buf[pos:]
                self._state = _FUNC
            else:  # _AFTER: </function> came; </tool_call> should follow
                rest = buf.lstrip()
                self._buf = buf = rest
                if not buf:
                    break
                if buf.startswith(TOOL_CALL_END):
                    self._buf = buf[len(TOOL_CALL_END) :]
                elif not final and TOOL_CALL_END.startswith(buf):
                    break
                self._state = _BETWEEN
        return "".join(content), merge_deltas(calls)
