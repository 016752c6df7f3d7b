"""Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

from typing import ClassVar

from smg_trio.parsers.tools._json_calls import JsonCallParser
from smg_trio.parsers.tools.base import register

__all__ = ["HermesToolParser"]


@register("hermes")
class HermesToolParser(JsonCallParser):
    """Each call is one JSON object between ``<tool_call>`` and ``</tool_call>`` (special
    tokens in Hermes 2 Pro's vocabulary, so they are kept: vLLM does the same)."""

    needs_special_tokens: ClassVar[bool] = True
    starts = ("<tool_call>",)
    end = "</tool_call>"
    arg_keys = ("arguments",)
