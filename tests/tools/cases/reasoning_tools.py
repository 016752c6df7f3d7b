"""Reasoning and tool calls in one answer: a tag reasoning parser ahead of a tool parser."""

from __future__ import annotations

from smg_trio.parsers.tools import tool_parser_names
from tests.tools.toolcase import ToolCase, function_tool

WEATHER = function_tool("get_weather", city="string")
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
KIMI_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
)

CASES = [
    ToolCase(
        id="qwen3-hermes-think-call",
        parser="hermes",
        reasoning="qwen3",
        text="<think>The user wants the weather 😀.</think>" + HERMES_CALL,
        tools=[WEATHER],
        content=None,
        calls=[("get_weather", '{"city": "Paris"}')],
        reasoning_content="The user wants the weather 😀.",
    ),
    ToolCase(
        id="qwen3-hermes-think-text-call",
        parser="hermes",
        reasoning="qwen3",
        text="<think>r</think>Let me check." + HERMES_CALL,
        tools=[WEATHER],
        content="Let me check.",
        calls=[("get_weather", '{"city": "Paris"}')],
        reasoning_content="r",
    ),
    ToolCase(
        # the call markup inside the reasoning is reasoning, not a call
        id="qwen3-hermes-call-in-reasoning",
        parser="hermes",
        reasoning="qwen3",
        text="<think>maybe " + HERMES_CALL + "</think>No call needed.",
        tools=[WEATHER],
        content="No call needed.",
        calls=[],
        finish_reason="stop",
        reasoning_content="maybe " + HERMES_CALL,
    ),
]

# Kimi K2's tool parser is another module's; the row runs once that parser is registered.
KIMI_CASES = [
    ToolCase(
        # Kimi K2 opens its tool-call section without closing its thinking
        id="kimi-k2-implicit-end",
        parser="kimi_k2",
        reasoning="kimi_k2",
        text="I need the weather." + KIMI_CALL,
        tools=[WEATHER],
        content=None,
        calls=[("get_weather", '{"city": "Paris"}')],
        reasoning_content="I need the weather.",
    ),
]

if "kimi_k2" in tool_parser_names():
    CASES += KIMI_CASES
