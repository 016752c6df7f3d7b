"""The tool-call parser interface and its registry of formats.

A parser sees a choice's content text (after the reasoning split and stop strings) piece by
piece, as the detokenizer releases it, and splits it into plain content and tool-call deltas.
Streaming and non-streaming feed the same parser, so a call's concatenated ``arguments``
fragments equal the non-streamed ``arguments`` byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import attrs

__all__ = [
    "ToolCallDelta",
    "ToolParser",
    "ToolParserFactory",
    "ToolSpec",
    "get_tool_parser",
    "register",
    "tool_parser_names",
]


@attrs.frozen
class ToolSpec:
    """One function tool of the request: its ``name`` and JSON Schema ``parameters``."""

    name: str
    parameters: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ToolCallDelta:
    """A piece of call number ``index`` (0-based, in output order) of one choice.

    The first delta of a call carries its ``name`` (complete, never split) and, when the
    format writes one (Kimi K2's ``functions.name:0``), the model's call ``id``; later deltas
    carry ``name=None``. ``arguments`` is the next fragment of the call's JSON arguments text
    (may be ``""``). The caller assigns ``id``s the format does not carry.
    """

    index: int
    name: str | None = None
    arguments: str = ""
    id: str | None = None


class ToolParser(Protocol):
    """Streaming splitter of content text into content and tool calls.

    ``push`` takes the next text piece and returns ``(content, calls)``: the content that is
    certain not to be part of a call (a possible start marker split across pieces is held
    back) and the call deltas completed so far. ``finish`` is called once at the end of the
    choice and releases whatever is held (a truncated or malformed call: see docs/tools.md).
    """

    #: Whether the format's markers are special tokens (the detokenizer must keep them).
    needs_special_tokens: ClassVar[bool]

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]: ...

    def finish(self) -> tuple[str, list[ToolCallDelta]]: ...


#: Makes a fresh parser for one choice from the request's tools.
ToolParserFactory = Callable[[Sequence[ToolSpec]], ToolParser]

_REGISTRY: dict[str, Callable[[], ToolParserFactory]] = {}


def register(name: str) -> Callable[[ToolParserFactory], ToolParserFactory]:
    """Class decorator: make a parser class available as ``--tool-call-parser name``."""

    def deco(factory: ToolParserFactory) -> ToolParserFactory:
        _REGISTRY[name] = lambda: factory
        return factory

    return deco


def _load_formats() -> None:
    # The format modules register themselves on import (see FORMAT_MODULES).
    import importlib

    for module in FORMAT_MODULES:
        importlib.import_module(f"smg_trio.parsers.tools.{module}")
    for alias, name in ALIASES.items():
        _REGISTRY.setdefault(alias, _REGISTRY[name])


#: vLLM 0.32's ``--tool-call-parser`` names for formats registered here under another name
#: (vLLM's registry maps each to the same parser class, or to the same format).
ALIASES: dict[str, str] = {
    "llama4_json": "llama3_json",
    "llama4_pythonic": "pythonic",  # <|python_start|>[call(...)]<|python_end|>
    "qwen3_xml": "qwen3_coder",
    "qwen3_json": "hermes",
    "glm47": "glm45",  # vLLM's glm45 and glm47 are one class; glm45 here reads both layouts
}


#: The format modules under ``smg_trio/parsers/tools/`` (one per format family).
FORMAT_MODULES: tuple[str, ...] = (
    "hermes",
    "llama3_json",
    "mistral",
    "openai",
    "pythonic",
    "deepseek_v3",
    "deepseek_v31",
    "kimi_k2",
    "qwen3_coder",
    "glm45",
    "granite",
)


def tool_parser_names() -> list[str]:
    """The registered ``--tool-call-parser`` names, sorted."""
    _load_formats()
    return sorted(_REGISTRY)


def get_tool_parser(name: str) -> ToolParserFactory:
    """The factory of parser ``name``; raises ``ValueError`` listing the valid names."""
    _load_formats()
    try:
        return _REGISTRY[name]()
    except KeyError:
        valid = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise ValueError(f"unknown tool call parser {name!r}; valid names: {valid}") from None
