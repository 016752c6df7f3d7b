"""Tool-call parsers, one module per model format, behind :class:`ToolParser`."""

from __future__ import annotations

from smg_trio.parsers.tools.base import (
    ToolCallDelta,
    ToolParser,
    ToolParserFactory,
    ToolSpec,
    get_tool_parser,
    tool_parser_names,
)

__all__ = [
    "ToolCallDelta",
    "ToolParser",
    "ToolParserFactory",
    "ToolSpec",
    "get_tool_parser",
    "tool_parser_names",
]
