"""Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (tokenizers before v11)
and ``[TOOL_CALLS]name[ARGS]{...}`` (v11 on; optionally ``name[CALL_ID]id[ARGS]{...}``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._json_calls import JsonCallParser
from smg_trio.parsers.tools._scan import JsonValueScanner, split_at_marker
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec, register

__all__ = ["MistralToolParser"]

_ARGS, _CALL_ID = "[ARGS]", "[CALL_ID]"


@register("mistral")
class MistralToolParser(JsonCallParser):
    """``[TOOL_CALLS]`` (a special token) opens either a JSON array of call objects or one
    ``name[ARGS]arguments`` call; each v11 call repeats the marker. The arguments text is
    the model's own JSON."""

    needs_special_tokens: ClassVar[bool] = True
    starts = ("[TOOL_CALLS]",)
    shape = "array"
    arg_keys = ("arguments",)

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__(tools)
        self._part = ""  # "name", "id" or "args" inside a v11 call
        self._text = ""  # the name (or call id) read so far
        self._call_id: str | None = None
        self._value: JsonValueScanner | None = None
        self._pending_name = ""

    def _open_other(self) -> bool:
        self._part, self._text, self._call_id = "name", "", None
        return True

    def _push_other(self, buf: str, content: list[str], calls: list[ToolCallDelta]) -> str:
        if self._part in ("name", "id"):
            before, marker, after, held = split_at_marker(self._text + buf, (_ARGS, _CALL_ID))
            if marker is None:
                self._text = before + held
                return ""
            if self._part == "name":
                name = before.strip()
                if not name or (self._names and name not in self._names):
                    content.append(self._raw + before + marker)
                    self._pass_through()
                    return after
                self._pending_name = name
            else:
                self._call_id = before.strip() or None
            self._raw += before + marker
            self._text = ""
            if marker == _CALL_ID:
                self._part = "id"
                return after
            calls.append(ToolCallDelta(self._index, name=self._pending_name, id=self._call_id))
            self._part, self._value = "args", JsonValueScanner()
            return after.lstrip()
        value = self._value
        assert value is not None
        used = value.push(buf)
        if value.error:  # not JSON: the call keeps what it had, the text goes on
            self._end_call()
            return buf
        piece = buf if used < 0 else buf[:used]
        if piece:
            calls.append(ToolCallDelta(self._index, arguments=piece))
        if used < 0:
            return ""
        self._end_call()
        return buf[used:]

    def _end_call(self) -> None:
        self._index += 1
        self._value = None
        self._raw = ""
        self._leave_other()

    def _finish_other(self, held: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        if self._part in ("name", "id"):
            content.append(self._raw + self._text + held)
