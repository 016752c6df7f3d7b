"""XML-style parameters to JSON: each value converted by its schema type, deterministically.

The formats that write one tag per parameter (Qwen3-Coder, GLM-4.5) carry text values; the
tool's JSON Schema says what each one is. The arguments are streamed one complete parameter
at a time (``{"a": 1`` then ``, "b": "x"`` then ``}``), so the fragments concatenate to exactly
``json.dumps(arguments, ensure_ascii=False)``, the non-streamed text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from smg_trio.parsers.tools.base import ToolSpec

__all__ = ["ArgsWriter", "convert_value", "param_types"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def param_types(tools: Sequence[ToolSpec]) -> dict[str, dict[str, str | None]]:
    """Per tool name, each parameter's JSON Schema type (``None`` where none is given)."""
    out: dict[str, dict[str, str | None]] = {}
    for tool in tools:
        props = tool.parameters.get("properties") if isinstance(tool.parameters, Mapping) else None
        types: dict[str, str | None] = {}
        if isinstance(props, Mapping):
            for key, schema in props.items():
                types[str(key)] = _schema_type(schema)
        out[tool.name] = types
    return out


def _schema_type(schema: Any) -> str | None:
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first non-null type
        kind = next((k for k in kind if k != "null"), None)
    if isinstance(kind, str):
        return kind
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                found = _schema_type(option)
                if found and found != "null":
                    return found
    return None


def convert_value(text: str, kind: str | None) -> Any:
    """The JSON value of parameter text ``text`` whose schema type is ``kind``.

    ``string``: the text itself. ``integer``/``number``/``boolean``/``object``/``array``/
    ``null``: the text parsed as JSON when it is a JSON value of that type (``True`` and
    ``False`` are accepted for booleans); otherwise, and for an untyped parameter, the text
    parsed as JSON if it is JSON, else the text as a string.
    """
    if kind == "string":
        return text
    stripped = text.strip()
    if kind == "boolean" and stripped in ("True", "False"):
        return stripped == "True"
    try:
        value = _loads(stripped)
    except ValueError:
        return text
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class ArgsWriter:
    """Builds one call's arguments JSON a parameter at a time; ``add`` and ``close`` return
    the next fragment."""

    __slots__ = ("_count", "_types")

    def __init__(self, types: Mapping[str, str | None]) -> None:
        self._types = types
        self._count = 0

    def add(self, key: str, text: str) -> str:
        value = convert_value(text, self._types.get(key))
        lead = "{" if self._count == 0 else ", "
        self._count += 1
        return (
            f"{lead}{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
        )

    def close(self) -> str:
        return "{}" if self._count == 0 else "}"
