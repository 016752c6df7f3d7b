"""Parsers of constrained output: ``tool_choice`` ``required`` (a JSON array of calls) and a
named function (the JSON arguments object itself). Not ``--tool-call-parser`` formats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg_trio.parsers.tools._json_calls import JsonCallParser
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec

__all__ = ["NamedCallParser", "RequiredCallsParser"]


class RequiredCallsParser(JsonCallParser):
    """``[{"name": "f", "parameters": {...}}, ...]``: the shape of vLLM's ``required``
    schema; each object's ``parameters`` text is the call's arguments."""

    at_start = True
    shape = "array"
    arg_keys = ("parameters",)


class NamedCallParser:
    """The whole output is the arguments of the one named function (call 0)."""

    needs_special_tokens: ClassVar[bool] = False

    def __init__(self, name: str, tools: Sequence[ToolSpec] = ()) -> None:
        self._name = name
        self._started = False

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if not text:
            return "", []
        if not self._started:
            self._started = True
            return "", [ToolCallDelta(0, name=self._name, arguments=text)]
        return "", [ToolCallDelta(0, arguments=text)]

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        return "", []
