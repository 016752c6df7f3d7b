"""The reasoning parser interface, how a request picks its start state, and the registry.

A reasoning parser sees a choice's detokenized text piece by piece and splits it into
reasoning (``reasoning``) and content. Everything that is not reasoning is content and
is passed on unchanged, in order (markers of the reasoning block itself removed), so the
tool-call parser after it sees the content text as the model wrote it.

A *format* (one per ``--reasoning-parser`` name) decides once per request, from the rendered
prompt and the request's ``chat_template_kwargs``, whether the split runs at all (a thinking
switch that is off means no split, and no ``reasoning``) and in which state it starts
(inside a block the chat template opened, or before one); it returns a factory that makes one
fresh parser per choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol

__all__ = [
    "FORMAT_MODULES",
    "ReasoningFactory",
    "ReasoningFormat",
    "ReasoningParser",
    "get_reasoning_format",
    "reasoning_parser_names",
    "register",
    "split",
    "switch_on",
]


class ReasoningParser(Protocol):
    """Streaming splitter of one choice's text into ``(reasoning, content)`` deltas.

    ``push`` takes the next text piece and returns the reasoning and the content it completes
    (either may be ``""``); a marker split across pieces is held back, never leaked.
    ``flush`` is called once at the end of the choice and releases what is held.
    """

    #: Whether the format's markers are special tokens (the detokenizer must keep them).
    needs_special_tokens: ClassVar[bool]

    def push(self, text: str) -> tuple[str, str]: ...

    def flush(self) -> tuple[str, str]: ...


#: Makes a fresh parser for one choice.
ReasoningFactory = Callable[[], ReasoningParser]


class ReasoningFormat(Protocol):
    """One ``--reasoning-parser`` format."""

    def start(
        self, prompt: str, chat_template_kwargs: Mapping[str, Any] | None
    ) -> ReasoningFactory | None:
        """The factory of this request's parsers, or ``None`` when its thinking switch
        (in ``chat_template_kwargs``) is off: no split, the text is all content."""
        ...


def switch_on(kwargs: Mapping[str, Any] | None, keys: Iterable[str], default: bool) -> bool:
    """A thinking switch: true when any of ``keys`` present in ``kwargs`` is truthy, false
    when some are present and none is, ``default`` when none is present (vLLM's rule)."""
    values = [kwargs[k] for k in keys if kwargs and k in kwargs]
    return any(bool(v) for v in values) if values else default


def split(factory: ReasoningFactory, text: str) -> tuple[str, str]:
    """A whole output through a fresh parser: ``(reasoning, content)``."""
    parser = factory()
    r1, c1 = parser.push(text)
    r2, c2 = parser.flush()
    return r1 + r2, c1 + c2


_REGISTRY: dict[str, ReasoningFormat] = {}

#: The format modules under ``smg_trio/parsers/reasoning/`` (one per format family).
FORMAT_MODULES: tuple[str, ...] = ("think", "deepseek_v31", "kimi_k2", "mistral", "harmony")


def register(name: str, fmt: ReasoningFormat) -> None:
    """Make ``fmt`` available as ``--reasoning-parser name``."""
    _REGISTRY[name] = fmt


def _load_formats() -> None:
    # The format modules register themselves on import.
    import importlib

    for module in FORMAT_MODULES:
        importlib.import_module(f"smg_trio.parsers.reasoning.{module}")
    for alias, name in ALIASES.items():
        _REGISTRY.setdefault(alias, _REGISTRY[name])


#: vLLM 0.32's ``--reasoning-parser`` names for formats registered here under another name
#: (vLLM maps ``glm47`` and ``glm45`` to one class; ``openai_gptoss`` is gpt-oss's harmony).
ALIASES: dict[str, str] = {"openai_gptoss": "openai", "glm47": "glm45"}


def reasoning_parser_names() -> list[str]:
    """The registered ``--reasoning-parser`` names, sorted."""
    _load_formats()
    return sorted(_REGISTRY)


def get_reasoning_format(name: str) -> ReasoningFormat:
    """Format ``name``; raises ``ValueError`` listing the valid names for an unknown one."""
    _load_formats()
    try:
        return _REGISTRY[name]
    except KeyError:
        valid = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown reasoning parser {name!r}; valid names: {valid}") from None
