"""hermes (Qwen2.5, Qwen3, Hermes): ``<tool_call>{json}</tool_call>`` blocks."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

WEATHER = function_tool("get_weather", city="string", unit="string")
SEARCH = function_tool("search", query="string")
TOOLS = [WEATHER, SEARCH]

CASES: list[ToolCase] = [
    ToolCase(
        id="hermes-one",
        parser="hermes",
        text='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
        "</tool_call>",
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Paris", "unit": "c"}')],
    ),
    ToolCase(
        id="hermes-text-before-multibyte",
        parser="hermes",
        text="Je vérifie 🌦️ pour 日本.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich 東京 😀", "unit": "°C"}}\n'
        "</tool_call>",
        tools=TOOLS,
        content="Je vérifie 🌦️ pour 日本.\n",
        calls=[("get_weather", '{"city": "Zürich 東京 😀", "unit": "°C"}')],
    ),
    ToolCase(
        id="hermes-two-calls",
        parser="hermes",
        text='<tool_call>\n{"name": "search", "arguments": {"query": "trio"}}\n</tool_call>\n'
        '<tool_call>\n{"arguments": {"city": "Oslo", "unit": "f"}, "name": "get_weather"}\n'
        "</tool_call>",
        tools=TOOLS,
        content=None,
        calls=[("search", '{"query": "trio"}'), ("get_weather", '{"city": "Oslo", "unit": "f"}')],
    ),
    ToolCase(
        id="hermes-nested-args",
        parser="hermes",
        text='<tool_call>{"name": "search", "arguments": {"query": "a \\"quoted\\" {x}", '
        '"filters": [{"k": [1, 2]}, null]}}</tool_call>',
        tools=TOOLS,
        content=None,
        calls=[("search", '{"query": "a \\"quoted\\" {x}", "filters": [{"k": [1, 2]}, null]}')],
    ),
    ToolCase(
        id="hermes-no-call",
        parser="hermes",
        text="It is sunny in Paris today.",
        tools=TOOLS,
        content="It is sunny in Paris today.",
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="hermes-parallel-off",
        parser="hermes",
        text='<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>',
        tools=TOOLS,
        content=None,
        calls=[("search", '{"query": "a"}')],
        parallel_tool_calls=False,
    ),
    # -- malformed: the text stays content, the stream never breaks (docs/tools.md) --
    ToolCase(
        id="hermes-bad-json",
        parser="hermes",
        text="Trying: <tool_call>{name: get_weather}</tool_call>",
        tools=TOOLS,
        content="Trying: <tool_call>{name: get_weather}</tool_call>",
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="hermes-unknown-function",
        parser="hermes",
        text='<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call> done',
        tools=TOOLS,
        content='<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call> done',
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="hermes-unknown-then-good",
        parser="hermes",
        text='<tool_call>{"name": "nope", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "ok"}}</tool_call>',
        tools=TOOLS,
        content='<tool_call>{"name": "nope", "arguments": {}}</tool_call>\n',
        calls=[("search", '{"query": "ok"}')],
    ),
    ToolCase(
        id="hermes-truncated-args",
        parser="hermes",
        text='<tool_call>{"name": "search", "arguments": {"query": "unfini',
        tools=TOOLS,
        content=None,
        calls=[("search", '{"query": "unfini')],
        finish_reason="length",
    ),
    ToolCase(
        id="hermes-truncated-before-name",
        parser="hermes",
        text='Let me look. <tool_call>{"name": "sea',
        tools=TOOLS,
        content='Let me look. <tool_call>{"name": "sea',
        calls=[],
        finish_reason="length",
    ),
    # -- with a reasoning parser: the reasoning is split first; a call in it is no call --
    ToolCase(
        id="hermes-qwen3-reasoning-then-call",
        parser="hermes",
        reasoning="qwen3",
        text="<think>The user wants <tool_call> weather, ça va.</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Köln", "unit": "c"}}\n</tool_call>',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Köln", "unit": "c"}')],
        reasoning_content="The user wants <tool_call> weather, ça va.",
    ),
    ToolCase(
        id="hermes-qwen3-reasoning-only-answer",
        parser="hermes",
        reasoning="qwen3",
        text="<think>No tool needed.</think>It is 21 °C.",
        tools=TOOLS,
        content="It is 21 °C.",
        calls=[],
        finish_reason="stop",
        reasoning_content="No tool needed.",
    ),
    # -- tool_choice modes (the mock does not constrain: the script writes the JSON) --
    ToolCase(
        id="hermes-required",
        parser="hermes",
        text='[{"name": "search", "parameters": {"query": "ß"}}, '
        '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}]',
        tools=TOOLS,
        content=None,
        calls=[("search", '{"query": "ß"}'), ("get_weather", '{"city": "Rome", "unit": "c"}')],
        tool_choice="required",
    ),
    ToolCase(
        id="hermes-named",
        parser="hermes",
        text='{"city": "Lyon", "unit": "c"}',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Lyon", "unit": "c"}')],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    ToolCase(
        id="hermes-none",
        parser="hermes",
        text='<tool_call>{"name": "search", "arguments": {}}</tool_call>',
        tools=TOOLS,
        content='<tool_call>{"name": "search", "arguments": {}}</tool_call>',
        calls=[],
        finish_reason="stop",
        tool_choice="none",
    ),
]
