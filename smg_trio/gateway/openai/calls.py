"""Tool-call deltas (``ToolCallDelta``: index, name on the first, argument fragments) merged
into whole calls, for the APIs that render calls as items or blocks (Messages, Responses)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any

import attrs

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.tools import AUTO_NEEDS_FLAGS
from smg_trio.parsers.tools import ToolCallDelta

__all__ = [
    "AUTO_NEEDS_FLAGS",
    "Call",
    "call_input",
    "input_json",
    "merge_calls",
    "needs_flags",
    "new_call_id",
]


@attrs.define
class Call:
    """One whole call: its ``id`` (the model's, or one made up), ``name`` and JSON
    ``arguments`` text."""

    index: int
    id: str
    name: str
    arguments: str = ""


def new_call_id(prefix: str) -> str:
    """A fresh call id, ``prefix`` then 24 hex digits (``toolu_``, ``call_``)."""
    return f"{prefix}{secrets.token_hex(12)}"


def merge_calls(deltas: Iterable[ToolCallDelta], id_prefix: str) -> list[Call]:
    """The calls of one choice from its deltas, in index order."""
    calls: dict[int, Call] = {}
    for d in deltas:
        call = calls.get(d.index)
        if call is None:
            call = calls[d.index] = Call(d.index, d.id or new_call_id(id_prefix), d.name or "")
        elif d.name and not call.name:
            call.name = d.name
        call.arguments += d.arguments
    return [calls[i] for i in sorted(calls)]


def call_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a JSON object (Anthropic's ``input``): ``{}`` for no text, the
    text itself wrapped as ``{"_raw": text}`` when the model wrote JSON that does not parse
    (or is not an object: a call cut short by ``max_tokens``, say)."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def input_json(arguments: str) -> str:
    """The JSON text whose value is :func:`call_input` of ``arguments``: the model's own text
    when it is a JSON object, else that value encoded (a client's JSON parser never fails)."""
    value = call_input(arguments)
    if value and "_raw" not in value:
        return arguments
    return json.dumps(value, ensure_ascii=False)


def needs_flags(exc: ValidationError, others: str) -> ValidationError:
    """``exc`` reworded for an API whose clients never named ``auto``: chat's refusal of tools
    under ``tool_choice: auto`` without ``--enable-auto-tool-choice --tool-call-parser``
    says what to start the server with, or which ``tool_choice`` (``others``) needs no parser.
    Any other error is returned as it is."""
    if exc.message != AUTO_NEEDS_FLAGS:
        return exc
    return ValidationError(
        "tools with tool_choice auto (the default) need the server started with "
        "--enable-auto-tool-choice and --tool-call-parser NAME (vLLM's flags) to parse the "
        f"model's tool calls; {others} work without them",
        param="tool_choice",
        code=exc.code,
    )
