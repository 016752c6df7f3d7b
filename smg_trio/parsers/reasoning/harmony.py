"""gpt-oss harmony (``--reasoning-parser openai``): the ``analysis`` channel is reasoning.

The contract with the ``openai`` tool-call parser: this parser removes what is reasoning and
unwraps what is plain answer, and passes tool calls on untouched.

- an ``analysis`` message (no ``functions.`` recipient; the built-in ``browser``/``python``
  tools the gateway does not run included): its body is reasoning, its framing is dropped;
- a ``final`` message, or a ``commentary`` message without a recipient (a preamble meant for
  the user): its body is content, its framing dropped;
- a message to ``functions.NAME`` (on any channel): content, verbatim, header and terminator
  included, so the tool parser after this one sees the call exactly as the model wrote it;
- text outside any message (a model that does not write harmony): content, as it is;
- two messages of one kind (two ``analysis`` messages, a preamble then the ``final``): a
  newline between their bodies, as vLLM's harmony output parse joins them.

The markers are special tokens, so the detokenizer keeps special tokens for this parser.
Output starts between messages (the prompt ends with ``<|start|>assistant``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from smg_trio.parsers.harmony import HarmonySplitter, Header
from smg_trio.parsers.reasoning.base import ReasoningFactory, register

__all__ = ["HarmonyFormat", "HarmonyReasoningParser"]

_CONTENT, _REASONING, _VERBATIM = 0, 1, 2


class HarmonyReasoningParser:
    """Streaming harmony splitter into ``(reasoning, content)`` (see the module docs)."""

    needs_special_tokens: ClassVar[bool] = True
    __slots__ = ("_kind", "_seen", "_splitter")

    def __init__(self) -> None:
        self._splitter = HarmonySplitter()
        self._kind = _CONTENT
        self._seen = [False, False]  # a reasoning / an unwrapped content message began

    def _route(self, events: Iterable[tuple[str, str | Header]]) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        for kind, value in events:
            if isinstance(value, Header):
                if value.function is not None:
                    self._kind = _VERBATIM
                    content.append(value.raw)
                    continue
                self._kind = _REASONING if value.channel == "analysis" else _CONTENT
                # messages of one kind are joined by a newline, as vLLM's harmony output
                # parse joins them (parse_chat_output); streamed the same as whole
                if self._seen[self._kind]:
                    (reasoning if self._kind == _REASONING else content).append("\n")
                self._seen[self._kind] = True
            elif kind == "body":
                (reasoning if self._kind == _REASONING else content).append(value)
            elif kind == "end":
                if self._kind == _VERBATIM:
                    content.append(value)
                self._kind = _CONTENT
            else:  # text between messages
                content.append(value)
        return "".join(reasoning), "".join(content)

    def push(self, text: str) -> tuple[str, str]:
        return self._route(self._splitter.push(text))

    def flush(self) -> tuple[str, str]:
        return self._route(self._splitter.finish())


class HarmonyFormat:
    """Harmony has no thinking switch (the system message's ``Reasoning:`` level only
    changes how much the model reasons), and always starts between messages."""

    def start(
        self, prompt: str, chat_template_kwargs: Mapping[str, Any] | None
    ) -> ReasoningFactory | None:
        del prompt, chat_template_kwargs
        return HarmonyReasoningParser


register("openai", HarmonyFormat())
