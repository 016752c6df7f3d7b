"""mistral: ``[TOOL_CALLS][{...}]`` (before tokenizer v11) and ``[TOOL_CALLS]name[ARGS]{...}``
(v11 on). ``[TOOL_CALLS]`` is plain text in the tiny vocabulary (a special token in
Mistral's, which the parser asks the detokenizer to keep)."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

TOOLS = [function_tool("get_weather", city="string"), function_tool("search", query="string")]

CASES: list[ToolCase] = [
    ToolCase(
        id="mistral-array",
        parser="mistral",
        text='[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Genève"}}, '
        '{"name": "search", "arguments": {"query": "ñandú 🦤"}}]',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Genève"}'), ("search", '{"query": "ñandú 🦤"}')],
    ),
    ToolCase(
        id="mistral-v11-text-before",
        parser="mistral",
        text='Checking both. [TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}'
        '[TOOL_CALLS]search[ARGS]{"query": "a [b] {c}"}',
        tools=TOOLS,
        content="Checking both. ",
        calls=[("get_weather", '{"city": "Nice"}'), ("search", '{"query": "a [b] {c}"}')],
    ),
    ToolCase(
        id="mistral-v11-unknown",
        parser="mistral",
        text='[TOOL_CALLS]drop_tables[ARGS]{"all": true}',
        tools=TOOLS,
        content='[TOOL_CALLS]drop_tables[ARGS]{"all": true}',
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="mistral-array-bad-json",
        parser="mistral",
        text="[TOOL_CALLS][{name: get_weather}]",
        tools=TOOLS,
        content="[TOOL_CALLS][{name: get_weather}]",
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="mistral-v11-truncated",
        parser="mistral",
        text='[TOOL_CALLS]search[ARGS]{"query": "unfin',
        tools=TOOLS,
        content=None,
        calls=[("search", '{"query": "unfin')],
        finish_reason="length",
    ),
    ToolCase(
        id="mistral-no-call",
        parser="mistral",
        text="No tools needed: it is 21 °C.",
        tools=TOOLS,
        content="No tools needed: it is 21 °C.",
        calls=[],
        finish_reason="stop",
    ),
]
