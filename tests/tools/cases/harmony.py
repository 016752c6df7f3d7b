"""gpt-oss harmony (``openai``) tool calls, with and without ``--reasoning-parser openai``.

The markers are special tokens of o200k_harmony; the tiny vocabulary has none of them, so
here they are plain text, one character piece at a time (``special_tokens=False``): the
parsers see the same text a real vocabulary's detokenizer gives with special tokens kept.
"""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

WEATHER = function_tool("get_weather", city="string")
TIME = function_tool("get_time", tz="string")
TOOLS = [WEATHER, TIME]

ANALYSIS = "<|channel|>analysis<|message|>Need the weather for Paris.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
TIME_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
    '<|message|>{"tz": "Europe/Paris"}<|call|>'
)

CASES = [
    ToolCase(
        id="harmony-analysis-call",
        parser="openai",
        reasoning="openai",
        text=ANALYSIS + CALL,
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Paris"}')],
        reasoning_content="Need the weather for Paris.",
    ),
    ToolCase(
        id="harmony-preamble-call",
        parser="openai",
        reasoning="openai",
        text=ANALYSIS
        + "<|start|>assistant<|channel|>commentary<|message|>Checking the weather ☀.<|end|>"
        + CALL,
        tools=TOOLS,
        content="Checking the weather ☀.",
        calls=[("get_weather", '{"city": "Paris"}')],
        reasoning_content="Need the weather for Paris.",
    ),
    ToolCase(
        id="harmony-call-first",
        parser="openai",
        reasoning="openai",
        text='<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "UTC"}',
        tools=TOOLS,
        content=None,
        calls=[("get_time", '{"tz": "UTC"}')],
    ),
    ToolCase(
        id="harmony-recipient-in-role",
        parser="openai",
        reasoning="openai",
        text=ANALYSIS
        + '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Nîmes"}<|call|>',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Nîmes"}')],
        reasoning_content="Need the weather for Paris.",
    ),
    ToolCase(
        id="harmony-two-calls",
        parser="openai",
        reasoning="openai",
        text=ANALYSIS + CALL + TIME_CALL,
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "Europe/Paris"}')],
        reasoning_content="Need the weather for Paris.",
    ),
    ToolCase(
        id="harmony-empty-arguments",
        parser="openai",
        reasoning="openai",
        text="<|channel|>commentary to=functions.get_time <|constrain|>json<|message|><|call|>",
        tools=TOOLS,
        content=None,
        calls=[("get_time", "{}")],
    ),
    ToolCase(
        id="harmony-final-no-call",
        parser="openai",
        reasoning="openai",
        text="<|channel|>analysis<|message|>No tool needed.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello 😀!<|return|>",
        tools=TOOLS,
        content="Hello 😀!",
        calls=[],
        finish_reason="stop",
        reasoning_content="No tool needed.",
    ),
    ToolCase(
        # without the reasoning parser the tool parser unwraps every message: the analysis
        # text is content (docs/reasoning.md: run both with gpt-oss)
        id="harmony-without-reasoning-parser",
        parser="openai",
        text=ANALYSIS + CALL,
        tools=TOOLS,
        content="Need the weather for Paris.",
        calls=[("get_weather", '{"city": "Paris"}')],
    ),
]
