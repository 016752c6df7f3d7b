"""Reasoning parsers, one module per model format family, behind :class:`ReasoningParser`."""

from __future__ import annotations

from smg_trio.parsers.reasoning.base import (
    ReasoningFactory,
    ReasoningFormat,
    ReasoningParser,
    get_reasoning_format,
    reasoning_parser_names,
    split,
)
from smg_trio.parsers.reasoning.tags import TagFormat, TagParser

__all__ = [
    "ReasoningFactory",
    "ReasoningFormat",
    "ReasoningParser",
    "TagFormat",
    "TagParser",
    "get_reasoning_format",
    "reasoning_parser_names",
    "split",
]
