"""llama3_json (Llama 3.1, 3.2, 3.3): ``{"name", "parameters"}`` objects, ``;``-separated,
optionally after ``<|python_tag|>`` (plain text in the tiny vocabulary)."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

TOOLS = [function_tool("get_weather", city="string"), function_tool("add", a="number", b="number")]

CASES: list[ToolCase] = [
    ToolCase(
        id="llama3-one",
        parser="llama3_json",
        text='{"name": "get_weather", "parameters": {"city": "São Paulo 🌧"}}',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "São Paulo 🌧"}')],
    ),
    ToolCase(
        id="llama3-python-tag-two",
        parser="llama3_json",
        text='<|python_tag|>{"name": "add", "parameters": {"a": 1.5, "b": -2}}; '
        '{"name": "get_weather", "parameters": {"city": "北京"}}',
        tools=TOOLS,
        content=None,
        calls=[("add", '{"a": 1.5, "b": -2}'), ("get_weather", '{"city": "北京"}')],
    ),
    ToolCase(
        id="llama3-plain-answer",
        parser="llama3_json",
        text="The weather in Paris is {mild} today.",
        tools=TOOLS,
        content="The weather in Paris is {mild} today.",
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="llama3-json-not-a-call",
        parser="llama3_json",
        text='{"city": "Paris", "temp": 21}',
        tools=TOOLS,
        content='{"city": "Paris", "temp": 21}',
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="llama3-unknown-function",
        parser="llama3_json",
        text='{"name": "rm_rf", "parameters": {}}',
        tools=TOOLS,
        content='{"name": "rm_rf", "parameters": {}}',
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="llama3-truncated",
        parser="llama3_json",
        text='{"name": "add", "parameters": {"a": 1, "b"',
        tools=TOOLS,
        content=None,
        calls=[("add", '{"a": 1, "b"')],
        finish_reason="length",
    ),
]
