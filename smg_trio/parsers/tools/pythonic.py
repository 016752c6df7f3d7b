"""Pythonic tool calls (Llama 4, Llama 3.2 small models): ``[f(a=1), g(b="x")]`` as the
output, optionally between ``<|python_start|>`` and ``<|python_end|>``."""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from smg_trio.parsers.tools._scan import partial_suffix_len
from smg_trio.parsers.tools.base import ToolCallDelta, ToolSpec, register

__all__ = ["PythonicToolParser"]

_START, _END = "<|python_start|>", "<|python_end|>"
_WS = " \t\r\n"
_OPENERS, _CLOSERS = "([{", ")]}"


def _calls(source: str, names: frozenset[str]) -> list[tuple[str, str]] | None:
    """``[(name, JSON arguments)]`` of a list of keyword-argument calls whose argument
    values are Python literals, or ``None`` when ``source`` is not one."""
    try:
        tree = ast.parse(source, mode="eval")
        if not isinstance(tree.body, ast.List):
            return None
        out = []
        for node in tree.body.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            name = node.func.id
            if names and name not in names:
                return None
            args: dict[str, Any] = {}
            for kw in node.keywords:
                if kw.arg is None:
                    return None
                args[kw.arg] = ast.literal_eval(kw.value)
            out.append((name, json.dumps(args, ensure_ascii=False)))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return out


@register("pythonic")
class PythonicToolParser:
    """A list of calls that opens the output (after optional whitespace and
    ``<|python_start|>``) is read whole, to its closing ``]``, and parsed as Python: each
    call's keyword arguments become a JSON object (``json.dumps``, non-ASCII kept), so the
    arguments arrive in one fragment per call. Output that does not open with ``[`` is
    content; a list that is not such calls (or names an unknown function, or is cut short)
    is content too."""

    needs_special_tokens: ClassVar[bool] = False

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._names = frozenset(t.name for t in tools)
        self._state = "start"  # start, list, after, plain
        self._buf = ""
        self._depth = 0
        self._quote = ""
        self._esc = False
        self._scanned = 0
        self._head = ""  # the text before the list (given back if it is not calls)

    def _scan(self) -> int:
        """Index just past the list's closing ``]`` in ``_buf``, or -1."""
        buf = self._buf
        for i in range(self._scanned, len(buf)):
            ch = buf[i]
            if self._quote:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == self._quote:
                    self._quote = ""
            elif ch in "'\"":
                self._quote = ch
            elif ch in _OPENERS:
                self._depth += 1
            elif ch in _CLOSERS:
                self._depth -= 1
                if self._depth == 0:
                    self._scanned = i + 1
                    return i + 1
        self._scanned = len(buf)
        return -1

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            if self._state == "plain":
                content.append(self._buf)
                self._buf = ""
            elif self._state == "start":
                stripped = self._buf.lstrip(_WS)
                if stripped.startswith(_START):
                    stripped = stripped[len(_START) :].lstrip(_WS)
                elif stripped and _START.startswith(stripped):
                    break  # maybe the start marker
                if not stripped:
                    break
                if stripped[0] != "[":
                    self._state = "plain"
                    continue
                self._state = "list"
                self._head = self._buf[: len(self._buf) - len(stripped)]
                self._buf = stripped
            elif self._state == "list":
                end = self._scan()
                if end < 0:
                    break
                found = _calls(self._buf[:end], self._names)
                if found is None:
                    self._state = "plain"
                    self._buf = self._head + self._buf
                    continue
                calls += [
                    ToolCallDelta(i, name=name, arguments=args)
                    for i, (name, args) in enumerate(found)
                ]
                self._buf = self._buf[end:]
                self._state = "after"
            elif self._state == "after":  # drop the end marker and the space around it
                stripped = self._buf.lstrip(_WS)
                if stripped.startswith(_END):
                    stripped = stripped[len(_END) :]
                elif not stripped or partial_suffix_len(stripped, (_END,)) == len(stripped):
                    break
                rest = stripped.lstrip(_WS)
                if not rest:
                    self._buf = stripped
                    break
                self._buf = rest
                self._state = "plain"
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        state, self._state = self._state, "plain"
        if state == "start":
            return buf, []
        if state == "list":
            return self._head + buf, []
        return "", []
