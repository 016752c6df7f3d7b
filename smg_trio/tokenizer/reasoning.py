"""Reasoning parsers: split ``<think>...</think>`` output into reasoning and content, streaming."""

from __future__ import annotations

from smg_trio.tokenizer._holdback import PrefixIndex

__all__ = ["REASONING_PARSERS", "ReasoningParser", "get_reasoning_parser"]

_BEFORE, _REASONING, _CONTENT = 0, 1, 2


class ReasoningParser:
    """Streaming splitter for one reasoning block delimited by ``start`` / ``end`` tags.

    Not in reasoning (``in_reasoning=False``, e.g. Qwen3): text is content until the first
    ``start`` tag, then reasoning until ``end``, then content for good. With
    ``in_reasoning=True`` (the chat template already opened the block in the prompt, e.g.
    DeepSeek-R1) text is reasoning from the first character; a ``start`` tag the model
    repeats at the very beginning is dropped. Tags are removed from both outputs; a tag
    split across deltas is recognized (its partial prefix is held back, never leaked).
    Whitespace is passed through untouched, so streamed and :meth:`split` results agree.
    """

    __slots__ = (
        "_end",
        "_end_prefixes",
        "_held",
        "_initial",
        "_opened",
        "_start",
        "_start_prefixes",
        "_state",
        "_strip_start",
    )

    def __init__(
        self, start: str = "<think>", end: str = "</think>", *, in_reasoning: bool = False
    ) -> None:
        if not start or not end:
            raise ValueError("reasoning start and end tags must be non-empty")
        self._start = start
        self._end = end
        self._start_prefixes = PrefixIndex([start])
        self._end_prefixes = PrefixIndex([end])
        self._initial = in_reasoning
        self._state = _REASONING if in_reasoning else _BEFORE
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

    def push(self, delta: str) -> tuple[str, str]:
        """Feed new text; return ``(reasoning_delta, content_delta)``, either may be ``""``."""
        buf = self._held + delta
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
            i = buf.find(self._end)
            if i >= 0:
                reasoning.append(buf[:i])
                buf = buf[i + len(self._end) :]
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

    def split(self, text: str) -> tuple[str | None, str]:
        """Non-streaming: ``(reasoning or None if no block was opened, content)`` of a whole
        output, starting from this parser's initial mode; this parser's state is untouched."""
        parser = ReasoningParser(self._start, self._end, in_reasoning=self._initial)
        r1, c1 = parser.push(text)
        r2, c2 = parser.flush()
        return (r1 + r2 if parser.reasoning_seen else None), c1 + c2


#: Registered parser names -> (start tag, end tag, starts in reasoning).
REASONING_PARSERS: dict[str, tuple[str, str, bool]] = {
    "deepseek_r1": ("<think>", "</think>", True),
    "qwen3": ("<think>", "</think>", False),
}


def get_reasoning_parser(name: str, *, in_reasoning: bool | None = None) -> ReasoningParser:
    """A fresh parser for ``name`` (``"qwen3"`` or ``"deepseek_r1"``); ``in_reasoning``
    overrides the parser's default (e.g. when ``enable_thinking`` made the template open the
    block). Raises ``ValueError`` listing the valid names for an unknown one."""
    try:
        start, end, default = REASONING_PARSERS[name]
    except KeyError:
        valid = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r}; valid names: {valid}") from None
    return ReasoningParser(
        start, end, in_reasoning=default if in_reasoning is None else in_reasoning
    )
