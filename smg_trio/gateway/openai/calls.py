"""Tool-call deltas (``ToolCallDelta``: index, name on the first, argument fragments) merged
into whole calls, for the APIs that render calls as items or blocks (Messages, Responses)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any

import attrs

from smg_trio.parsers.tools import ToolCallDelta

__all__ = ["Call", "call_input", "merge_calls", "new_call_id"]


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


def call_input(arguments: str) -> Any:
    """A call's arguments as a JSON value (Anthropic's ``input``): ``{}`` for no text, the
    text itself wrapped as ``{"_raw": text}`` when the model wrote JSON that does not parse."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
