"""One scripted model output and the tool calls a format's parser must find in it."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class ToolCase:
    """``text`` is what the (scripted mock) model generates for a chat request with ``tools``
    under ``--tool-call-parser parser`` (and ``--reasoning-parser reasoning``, if set). The
    gateway must answer, streamed and not, with ``content`` and ``calls`` (``(name,
    arguments)``: ``arguments`` is the exact JSON string of ``function.arguments``) and
    ``finish_reason``; ``reasoning_content`` when a reasoning parser is set.

    ``special_tokens``: the format's markers are special tokens (need a vocabulary that has
    them, e.g. the DeepSeek fixture); ``None`` content means ``content: null``.
    """

    id: str
    parser: str
    text: str
    tools: list[dict[str, Any]]
    content: str | None
    calls: list[tuple[str, str]]
    finish_reason: str = "tool_calls"
    reasoning: str | None = None
    reasoning_content: str | None = None
    special_tokens: bool = False
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True


def function_tool(name: str, **properties: str) -> dict[str, Any]:
    """An OpenAI function tool whose parameters are ``properties`` (name -> JSON type)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in properties.items()},
                "required": list(properties),
            },
        },
    }
