"""gpt-oss harmony tool calls (``--tool-call-parser openai``): messages to ``functions.NAME``.

A message whose header names the recipient ``functions.NAME`` (``to=functions.NAME``, in the
role or the channel part; gpt-oss writes it on the ``commentary`` channel, usually with
``<|constrain|>json``) is a call: its name comes with the header, its body (the JSON
arguments) streams as argument fragments up to ``<|call|>`` (or ``<|end|>``/``<|return|>``).
A call with an empty body gets ``"{}"``. A call cut off by the end of the output keeps the
arguments it has (``finish_reason`` tells the client it was cut). A recipient that is not one
of the request's tools is not a call: the whole message, as written, is content.

This parser runs after the ``openai`` reasoning parser, which has already removed the
``analysis`` messages and unwrapped the ``final`` ones, so it mostly sees plain content and
verbatim call messages. On its own it also unwraps any message that is not a call (its body is
content: without ``--reasoning-parser openai`` the ``analysis`` text is content too). Text
outside any message is content as it is. The markers are special tokens (o200k_harmony).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from smg_trio.parsers.harmony import HarmonySplitter, Header
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec, register

__all__ = ["HarmonyToolParser"]

_CONTENT, _CALL, _RAW = 0, 1, 2


@register("openai")
class HarmonyToolParser:
    """Streaming harmony tool-call parser (see the module docs)."""

    needs_special_tokens: ClassVar[bool] = True
    __slots__ = ("_args_sent", "_index", "_kind", "_names", "_splitter")

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._names = frozenset(t.name for t in tools)
        self._splitter = HarmonySplitter()
        self._kind = _CONTENT
        self._index = -1
        self._args_sent = False

    def _route(self, events: Iterable[tuple[str, str | Header]]) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        for kind, value in events:
            if isinstance(value, Header):
                name = value.function
                if name is not None and name in self._names:
                    self._kind = _CALL
                    self._index += 1
                    self._args_sent = False
                    calls.append(ToolCallDelta(self._index, name=name))
                elif value.recipient is not None:
                    self._kind = _RAW
                    content.append(value.raw)
                else:
                    self._kind = _CONTENT
            elif kind == "body":
                if self._kind == _CALL:
                    if value:
                        calls.append(ToolCallDelta(self._index, arguments=value))
                        self._args_sent = True
                else:
                    content.append(value)
            elif kind == "end":
                if self._kind == _CALL and not self._args_sent:
                    calls.append(ToolCallDelta(self._index, arguments="{}"))
                elif self._kind == _RAW:
                    content.append(value)
                self._kind = _CONTENT
            else:
                content.append(value)
        return "".join(content), calls

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        return self._route(self._splitter.push(text))

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        return self._route(self._splitter.finish())
