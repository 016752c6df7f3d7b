"""Qwen3-Coder tool calls: ``<tool_call><function=NAME><parameter=KEY>value</parameter>...``.

Values are text; :mod:`._xmlargs` converts them to JSON by the tool's schema (a ``string``
streams as it arrives; the newline after the opening tag and before the closing one are the
layout's, not the value's). The machine shared with GLM-4.5, and the handling of malformed
output (docs/tools.md), is :mod:`._xml_calls`; this module reads Qwen3-Coder's own grammar:
``<function=NAME>``, ``<parameter=KEY>`` and the ``</function>`` before ``</tool_call>``.
"""

from __future__ import annotations

from typing import ClassVar

from smg_trio.parsers.tools import _xml_calls as xc
from smg_trio.parsers.tools._xml_calls import NAME_CAP, XmlCallsParser
from smg_trio.parsers.tools.base import ToolCallDelta, register

__all__ = ["Qwen3CoderParser"]

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNC, FUNC_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"

_CALL, _AFTER = xc.OWN, xc.OWN + 1  # after <tool_call>; after </function>


@register("qwen3_coder")
class Qwen3CoderParser(XmlCallsParser):
    """``<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n
    </function>\\n</tool_call>``; several calls are several ``<tool_call>`` blocks."""

    needs_special_tokens: ClassVar[bool] = False
    TOOL_CALL = TOOL_CALL
    TOOL_CALL_END = TOOL_CALL_END
    OPENED = _CALL
    PARAM = PARAM
    BODY_END = (FUNC_END, TOOL_CALL_END)
    VALUE_STOPS = (PARAM_END, PARAM, FUNC_END, TOOL_CALL_END)
    STRIP_NEWLINES = True
    RAW_STATES = (_CALL, xc.NAME, xc.SKIP)
    OPEN_STATES = (xc.BODY, xc.KEY, xc.VALUE)

    def _after_call(self, marker: str) -> int:
        return _AFTER if marker == FUNC_END else xc.BETWEEN

    def _step_format(
        self, state: int, buf: str, final: bool, content: list[str], calls: list[ToolCallDelta]
    ) -> bool:
        if state == _CALL:
            buf = self._lstrip_raw(buf)
            if not buf:
                return True
            if buf.startswith(FUNC):
                self._raw.append(FUNC)
                self._buf = buf[len(FUNC) :]
                self._state = xc.NAME
            elif final or not FUNC.startswith(buf):
                content.append(self._take_raw())  # not a call after all
                self._state = xc.OUT
            else:
                return True
        elif state == xc.NAME:
            pos = buf.find(">")
            if pos < 0 or pos > NAME_CAP:
                if pos > NAME_CAP or len(buf) > NAME_CAP:
                    self._state = xc.SKIP
                    return False
                return True
            if self._start_call(buf[:pos].strip(), calls):
                self._buf = buf[pos + 1 :]
        elif state == xc.KEY:
            pos = buf.find(">")
            if pos < 0 and len(buf) <= NAME_CAP:
                return True
            if pos < 0 or pos > NAME_CAP:
                self._state = xc.BODY  # not a parameter name: skipped
                return False
            self._open_value(buf[:pos].strip())
            self._buf = buf[pos + 1 :]
        else:  # _AFTER: </function> came; </tool_call> should follow
            self._buf = buf = buf.lstrip()
            if not buf:
                return True
            if buf.startswith(TOOL_CALL_END):
                self._buf = buf[len(TOOL_CALL_END) :]
            elif not final and TOOL_CALL_END.startswith(buf):
                return True
            self._state = xc.BETWEEN
        return False
