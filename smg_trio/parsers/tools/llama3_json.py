"""Llama 3.1, 3.2 and 3.3 JSON tool calls: ``{"name": ..., "parameters": {...}}`` at the
start of the output, optionally after ``<|python_tag|>``; several are separated by ``;``."""

from __future__ import annotations

from typing import ClassVar

from smg_trio.parsers.tools._json_calls import JsonCallParser
from smg_trio.parsers.tools.base import register

__all__ = ["Llama3JsonToolParser"]


@register("llama3_json")
class Llama3JsonToolParser(JsonCallParser):
    """Calls open the output (``{``) or follow ``<|python_tag|>`` (a special token, kept);
    the arguments key is ``parameters`` (``arguments`` is accepted too)."""

    needs_special_tokens: ClassVar[bool] = True
    starts = ("<|python_tag|>",)
    at_start = True
    shape = "seq"
    arg_keys = ("parameters", "arguments")
