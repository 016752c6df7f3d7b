"""IBM Granite 3.0/3.1: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` (3.1 writes
the plain-text ``<tool_call>``), as vLLM 0.32's ``granite`` parser reads it."""

from __future__ import annotations

from typing import ClassVar

from smg_trio.parsers.tools._json_calls import JsonCallParser
from smg_trio.parsers.tools.base import register

__all__ = ["GraniteToolParser"]


@register("granite")
class GraniteToolParser(JsonCallParser):
    """A marker (``<|tool_call|>``, a special token, or ``<tool_call>``) opens a JSON array
    of call objects, closed by its ``]``; prose around it is content."""

    needs_special_tokens: ClassVar[bool] = True
    starts = ("<|tool_call|>", "<tool_call>")
    shape = "array"
    arg_keys = ("arguments",)
