"""granite (IBM Granite 3.0/3.1, vLLM 0.32's ``granite`` tool parser): a JSON array of
``{"name", "arguments"}`` after ``<|tool_call|>`` (3.0) or ``<tool_call>`` (3.1)."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

TOOLS = [function_tool("get_weather", city="string"), function_tool("add", a="number", b="number")]

CASES: list[ToolCase] = [
    ToolCase(
        id="granite-30-one",
        parser="granite",
        text='<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Zürich"}}]',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Zürich"}')],
    ),
    ToolCase(
        id="granite-31-two",
        parser="granite",
        text='<tool_call> [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        tools=TOOLS,
        content=None,
        calls=[("add", '{"a": 1, "b": 2}'), ("get_weather", '{"city": "Oslo"}')],
    ),
    ToolCase(
        id="granite-plain-answer",
        parser="granite",
        text="It is [mild] in Paris.",
        tools=TOOLS,
        content="It is [mild] in Paris.",
        calls=[],
        finish_reason="stop",
    ),
]
