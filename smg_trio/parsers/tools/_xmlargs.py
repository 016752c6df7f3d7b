"""XML-style parameters to JSON: each value converted by its schema type, deterministically.

The formats that write one tag per parameter (Qwen3-Coder, GLM-4.5) carry text values; the
tool's JSON Schema says what each one is. A ``string`` parameter streams as it arrives, any
other goes out when complete (``{"a": 1`` then ``, "b": "x`` then ``y"`` then ``}``), and the
fragments concatenate to exactly ``json.dumps(arguments, ensure_ascii=False)``, whatever the
pieces the text came in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from smg_trio.parsers.tools.base import ToolSpec

__all__ = ["ArgsWriter", "ValueStream", "convert_value", "param_types"]


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


def _escape(text: str) -> str:
    """``text`` as it appears inside a JSON string (per character, so it concatenates)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class ArgsWriter:
    """Builds one call's arguments JSON a parameter at a time; each method returns the next
    fragment."""

    __slots__ = ("_count", "_types")

    def __init__(self, types: Mapping[str, str | None]) -> None:
        self._types = types
        self._count = 0

    def is_string(self, key: str) -> bool:
        return self._types.get(key) == "string"

    def _lead(self, key: str) -> str:
        lead = "{" if self._count == 0 else ", "
        self._count += 1
        return f"{lead}{json.dumps(key, ensure_ascii=False)}: "

    def add(self, key: str, text: str) -> str:
        value = convert_value(text, self._types.get(key))
        return self._lead(key) + json.dumps(value, ensure_ascii=False)

    def open_string(self, key: str) -> str:
        return self._lead(key) + '"'

    def close(self) -> str:
        return "{}" if self._count == 0 else "}"


class ValueStream:
    """One parameter's value text, arriving in pieces (none holding a tag), turned into
    arguments fragments: a ``string`` parameter streams as it comes, any other is converted
    when complete. ``strip_newlines``: one leading and one trailing newline are not part of
    the value (Qwen3-Coder's layout)."""

    __slots__ = (
        "_key",
        "_lead_done",
        "_opened",
        "_parts",
        "_pending",
        "_string",
        "_strip",
        "_writer",
    )

    def __init__(self, writer: ArgsWriter, key: str, *, strip_newlines: bool) -> None:
        self._writer = writer
        self._key = key
        self._string = writer.is_string(key)
        self._strip = strip_newlines
        self._lead_done = not strip_newlines
        self._opened = False
        self._pending = ""
        #: A value that is not a string, in pieces until it is complete (joined once).
        self._parts: list[str] = []

    def feed(self, text: str) -> str:
        if not self._string:
            if text:
                self._parts.append(text)
            return ""
        self._pending += text
        if not self._pending:
            return ""
        if not self._lead_done:
            self._pending = self._pending.removeprefix("\n")
            self._lead_done = True
        out = ""
        if not self._opened:
            out, self._opened = self._writer.open_string(self._key), True
        emit = self._pending
        hold = "\n" if self._strip and emit.endswith("\n") else ""  # maybe the last one
        self._pending = hold
        return out + _escape(emit[: len(emit) - len(hold)])

    def end(self) -> str:
        """The value is complete (or the output ended inside it): its last fragment."""
        value = self._pending if self._string else "".join(self._parts)
        self._pending = ""
        self._parts = []
        if not self._lead_done:
            value = value.removeprefix("\n")
        if self._strip:
            value = value.removesuffix("\n")
        if not self._string:
            return self._writer.add(self._key, value)
        out = "" if self._opened else self._writer.open_string(self._key)
        return out + _escape(value) + '"'
