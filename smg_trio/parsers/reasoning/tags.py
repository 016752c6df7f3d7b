"""Tag-delimited reasoning (``<think>...</think>``, ``[THINK]...[/THINK]``), streaming."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

import attrs

from smg_trio.parsers.reasoning.base import ReasoningFactory, switch_on
from smg_trio.tokenizer._holdback import PrefixIndex

__all__ = ["TagFormat", "TagParser"]

_BEFORE, _REASONING, _CONTENT = 0, 1, 2


class TagParser:
    """Streaming splitter for one reasoning block delimited by ``start`` / ``end`` tags.

    Not in reasoning (``in_reasoning=False``, e.g. Qwen3): text is content until the first
    ``start`` tag, then reasoning until ``end``, then content for good. With
    ``in_reasoning=True`` (the chat template already opened the block in the prompt, e.g.
    DeepSeek-R1) text is reasoning from the first character; a ``start`` tag the model
    repeats at the very beginning is dropped. Tags are removed from both outputs; a tag
    split across deltas is recognized (its partial prefix is held back, never leaked).
    ``implicit_ends`` are markers that also end the block but belong to the content and stay
    in it (Kimi K2 starts its tool-call section without closing its thinking). With
    ``after_block=True`` (the prompt closed the block: thinking off) everything is content,
    a later ``start`` tag included, as vLLM streams it.
    Whitespace is passed through untouched, so streamed and whole results agree.
    """

    needs_special_tokens: ClassVar[bool] = False

    __slots__ = (
        "_end",
        "_end_prefixes",
        "_ends",
        "_held",
        "_opened",
        "_start",
        "_start_prefixes",
        "_state",
        "_strip_start",
    )

    def __init__(
        self,
        start: str = "<think>",
        end: str = "</think>",
        *,
        in_reasoning: bool = False,
        implicit_ends: Sequence[str] = (),
        after_block: bool = False,
    ) -> None:
        if not start or not end or not all(implicit_ends):
            raise ValueError("reasoning start and end tags must be non-empty")
        self._start = start
        self._end = end
        self._ends = (end, *implicit_ends)
        self._start_prefixes = PrefixIndex([start])
        self._end_prefixes = PrefixIndex(self._ends)
        self._state = _CONTENT if after_block else _REASONING if in_reasoning else _BEFORE
        self._opened = in_reasoning
        self._strip_start = in_reasoning
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        """Whether text pushed now would be reasoning."""
        return self._state == _REASONING

    @property
    def reasoning_seen(self) -> bool:
        """Whether a reasoning block was opened (in the prompt or by a ``start`` tag)."""
        return self._opened

    def _find_end(self, buf: str) -> tuple[int, str]:
        best, marker = -1, ""
        for m in self._ends:
            i = buf.find(m)
            if i >= 0 and (best < 0 or i < best):
                best, marker = i, m
        return best, marker

    def push(self, text: str) -> tuple[str, str]:
        """Feed new text; return ``(reasoning_delta, content_delta)``, either may be ``""``."""
        buf = self._held + text
        self._held = ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            if self._state == _CONTENT:
                content.append(buf)
                break
            if self._state == _BEFORE:
                i = buf.find(self._start)
                if i >= 0:
                    content.append(buf[:i])
                    buf = buf[i + len(self._start) :]
                    self._state = _REASONING
                    self._opened = True
                    continue
                cut = len(buf) - self._start_prefixes.partial_suffix_len(buf)
                content.append(buf[:cut])
                self._held = buf[cut:]
                break
            if self._strip_start:  # reasoning opened by the prompt: drop a repeated start tag
                if len(buf) < len(self._start) and self._start.startswith(buf):
                    self._held = buf
                    break
                self._strip_start = False
                if buf.startswith(self._start):
                    buf = buf[len(self._start) :]
                    continue
            i, marker = self._find_end(buf)
            if i >= 0:
                reasoning.append(buf[:i])
                # the end tag is dropped; an implicit end stays, as the content's start
                buf = buf[i + len(marker) :] if marker == self._end else buf[i:]
                self._state = _CONTENT
                continue
            cut = len(buf) - self._end_prefixes.partial_suffix_len(buf)
            reasoning.append(buf[:cut])
            self._held = buf[cut:]
            break
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """Release held-back partial tags at the end: ``(reasoning_delta, content_delta)``."""
        held, self._held = self._held, ""
        self._strip_start = False
        return (held, "") if self._state == _REASONING else ("", held)


class _SpecialTagParser(TagParser):
    """A :class:`TagParser` whose tags are special tokens of the model's vocabulary."""

    needs_special_tokens: ClassVar[bool] = True
    __slots__ = ()


@attrs.frozen(kw_only=True)
class TagFormat:
    """A tag format: its tags, whether output starts inside the block by default
    (``in_reasoning``), its thinking switch (``switch``: ``chat_template_kwargs`` keys, and
    ``switch_default`` when none is given; ``()`` for none) and its ``implicit_ends``.

    The start state follows the rendered prompt first: a prompt ending with the start tag
    (the template opened the block) starts inside it, one ending with the end tag (the
    template closed an empty block: thinking off) starts after it (all content, as vLLM's
    serving layer treats a prompt whose reasoning ended), else ``in_reasoning``.
    """

    start_tag: str
    end_tag: str
    in_reasoning: bool = False
    switch: tuple[str, ...] = ()
    switch_default: bool = True
    implicit_ends: tuple[str, ...] = ()
    special_tokens: bool = False

    def start(
        self, prompt: str, chat_template_kwargs: Mapping[str, Any] | None
    ) -> ReasoningFactory | None:
        if self.switch and not switch_on(chat_template_kwargs, self.switch, self.switch_default):
            return None
        tail = prompt.rstrip()
        after_block = False
        if tail.endswith(self.start_tag):
            in_reasoning = True
        elif tail.endswith(self.end_tag):
            in_reasoning, after_block = False, True
        else:
            in_reasoning = self.in_reasoning
        cls = _SpecialTagParser if self.special_tokens else TagParser
        return partial(
            cls,
            self.start_tag,
            self.end_tag,
            in_reasoning=in_reasoning,
            implicit_ends=self.implicit_ends,
            after_block=after_block,
        )
