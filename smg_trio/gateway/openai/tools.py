"""Tool calling for chat: ``tools``/``tool_choice`` checked, the parser chosen, and the JSON
schema that constrains the engine for ``required`` and a named function (as vLLM builds it)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from smg_trio.errors import ValidationError
from smg_trio.parsers.tools import ToolParser, ToolSpec, get_tool_parser
from smg_trio.parsers.tools.constrained import NamedCallParser, RequiredCallsParser
from smg_trio.protocol.types import StructuredOutputs

__all__ = ["AUTO_NEEDS_FLAGS", "ToolPlan", "plan_tools", "tool_choice_schema", "tool_specs"]

#: vLLM's message for ``tool_choice: auto`` (explicit, or implied by ``tools``) without the flags.
AUTO_NEEDS_FLAGS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


@attrs.frozen
class ToolPlan:
    """What a chat request's tools mean for its choices: ``parser`` makes each choice's
    tool-call parser (``None``: no parsing), ``constraint`` is the structured output the
    engine must follow (``required``, a named function), ``max_calls`` the calls kept,
    ``keep_special_tokens`` whether the detokenizer keeps special tokens (the format's markers)."""

    parser: Callable[[], ToolParser] | None = None
    constraint: StructuredOutputs | None = None
    max_calls: int | None = None
    keep_special_tokens: bool = False


def _bad(message: str, param: str, code: str = "invalid_value") -> ValidationError:
    return ValidationError(message, param=param, code=code)


def tool_specs(tools: Sequence[dict[str, Any]]) -> list[ToolSpec]:
    """The function specs, refusing a name given twice (the tools were checked before)."""
    seen: dict[str, int] = {}
    out = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        name = fn["name"]
        if name in seen:
            raise _bad(
                f"tool {name!r} is defined twice (tools[{seen[name]}] and tools[{i}])",
                f"tools[{i}].function.name",
            )
        seen[name] = i
        out.append(ToolSpec(name, fn.get("parameters") or {}))
    return out


def _named(choice: dict[str, Any], names: set[str]) -> str:
    if choice.get("type") != "function":
        raise _bad(
            f"tool_choice.type must be 'function', got {choice.get('type')!r}", "tool_choice.type"
        )
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise _bad(
            "a named tool_choice needs function.name", "tool_choice.function.name", "invalid_type"
        )
    if name not in names:
        raise _bad(
            f"tool_choice names {name!r}, which is not in tools", "tool_choice.function.name"
        )
    return name


def _parameters(spec: ToolSpec) -> dict[str, Any]:
    return dict(spec.parameters) or {"type": "object", "properties": {}}


def tool_choice_schema(
    specs: Sequence[ToolSpec], named: str | None, parallel: bool = True
) -> dict[str, Any]:
    """The JSON schema of constrained tool calling: a named function's parameters, or (for
    ``required``) an array of at least one ``{"name", "parameters"}`` object, one ``anyOf``
    branch per tool (at most one item without ``parallel``)."""
    if named is not None:
        return _parameters(next(s for s in specs if s.name == named))
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [s.name]},
                        "parameters": _parameters(s),
                    },
                    "required": ["name", "parameters"],
                }
                for s in specs
            ],
        },
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


def plan_tools(
    tools: Sequence[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None,
    *,
    parser_name: str | None,
    enable_auto: bool,
) -> ToolPlan:
    """Check ``tool_choice`` against ``tools`` (each already checked as a function tool) and
    the server's flags; raises ``ValidationError`` (400 naming the field)."""
    specs = tool_specs(tools or ())
    names = {s.name for s in specs}
    max_calls = 1 if parallel_tool_calls is False else None
    parallel = parallel_tool_calls is not False
    if isinstance(tool_choice, dict):
        if not specs:
            raise _bad("a named tool_choice needs tools", "tool_choice")
        name = _named(tool_choice, names)
        return ToolPlan(
            functools.partial(NamedCallParser, name, specs),
            StructuredOutputs(json=tool_choice_schema(specs, name)),
            1,
        )
    if tool_choice not in (None, "none", "auto", "required"):
        raise _bad(
            f"tool_choice must be 'none', 'auto', 'required' or a named function, got "
            f"{tool_choice!r}",
            "tool_choice",
        )
    if tool_choice == "required":
        if not specs:
            raise _bad("tool_choice 'required' needs tools", "tool_choice")
        return ToolPlan(
            functools.partial(RequiredCallsParser, specs),
            StructuredOutputs(json=tool_choice_schema(specs, None, parallel)),
            max_calls,
        )
    if tool_choice == "none" or not specs:
        return ToolPlan()
    if parser_name is None or not enable_auto:  # "auto", explicit or implied by tools
        raise _bad(AUTO_NEEDS_FLAGS, "tool_choice")
    factory = get_tool_parser(parser_name)
    return ToolPlan(
        functools.partial(factory, specs),
        None,
        max_calls,
        bool(getattr(factory, "needs_special_tokens", False)),
    )
