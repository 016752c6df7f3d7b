"""GLM-4.5 tool calls: ``<tool_call>NAME`` then ``<arg_key>K</arg_key><arg_value>V</arg_value>``.

Values are text; :mod:`._xmlargs` converts them to JSON by the tool's schema (a ``string``
streams as it arrives). The machine shared with Qwen3-Coder, and the handling of malformed
output (docs/tools.md), is :mod:`._xml_calls`; this module reads GLM-4.5's own grammar: the
name after ``<tool_call>`` and the key/value pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools import _xml_calls as xc
from smg_trio.parsers.tools._markers import find_marker
from smg_trio.parsers.tools._xml_calls import NAME_CAP, XmlCallsParser
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec, register

__all__ = ["Glm45Parser"]

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"

_PREVALUE = xc.OWN  # between </arg_key> and <arg_value>


@register("glm45")
class Glm45Parser(XmlCallsParser):
    """``<tool_call>get_weather\\n<arg_key>city</arg_key>\\n<arg_value>Paris</arg_value>\\n
    </tool_call>`` (GLM-4.5/4.6; the newlines are optional, as GLM-4.7 omits them)."""

    #: The tags are added tokens; GLM's tokenizers mark them ``special: false``, but
    #: transformers 5 lists them as extra special tokens. vLLM (its glm45 parser's
    #: ``adjust_request``) and SGLang (a request with tools) keep special tokens, and so does
    #: this: the tags reach the parser whichever way a vocabulary marks them.
    needs_special_tokens: ClassVar[bool] = True
    TOOL_CALL = TOOL_CALL
    TOOL_CALL_END = TOOL_CALL_END
    OPENED = xc.NAME
    PARAM = KEY
    BODY_END = (TOOL_CALL_END,)
    VALUE_STOPS = (VALUE_END, KEY, TOOL_CALL_END)
    STRIP_NEWLINES = False
    RAW_STATES = (xc.NAME, xc.SKIP)
    OPEN_STATES = (xc.BODY, xc.KEY, _PREVALUE, xc.VALUE)

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__(tools)
        self._text: list[str] = []  # a key's text as far as it came, in pieces
        self._key = ""

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        out = super().finish()
        self._text = []
        return out

    def _step_format(
        self, state: int, buf: str, final: bool, content: list[str], calls: list[ToolCallDelta]
    ) -> bool:
        if state == xc.NAME:
            buf = self._lstrip_raw(buf)
            if not buf:
                return True
            pos, marker = find_marker(buf, ("\n", KEY, TOOL_CALL_END))
            if marker is None or pos > NAME_CAP:
                if pos > NAME_CAP:
                    self._state = xc.SKIP
                    return False
                return True
            if self._start_call(buf[:pos].strip(), calls):
                self._buf = buf[pos:]
        elif state == xc.KEY:
            pos, marker = find_marker(buf, (KEY_END, TOOL_CALL_END))
            if marker is None:
                self._text.append(self._certain(buf, pos, final))
                return True
            if marker == KEY_END:
                self._key = ("".join(self._text) + buf[:pos]).strip()
                self._buf = buf[pos + len(marker) :]
                self._state = _PREVALUE
            else:  # a key without a value: skipped
                self._buf = buf[pos:]
                self._state = xc.BODY
            self._text = []
        else:  # _PREVALUE
            pos, marker = find_marker(buf, (VALUE, KEY, TOOL_CALL_END))
            if marker is None:
                self._certain(buf, pos, final)
                return True
            if marker == VALUE:
                self._buf = buf[pos + len(marker) :]
                self._open_value(self._key)
            else:  # a key without a value: skipped
                self._buf = buf[pos:]
                self._state = xc.BODY
        return False
