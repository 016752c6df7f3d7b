"""pythonic (Llama 4): a Python list of keyword-argument calls; arguments become JSON."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

TOOLS = [function_tool("get_weather", city="string"), function_tool("tag", names="array")]

CASES: list[ToolCase] = [
    ToolCase(
        id="pythonic-two",
        parser="pythonic",
        text='[get_weather(city="Kraków ☀"), tag(names=["a", \'b\'], extra={"k": None, "t": True})]',
        tools=TOOLS,
        content=None,
        calls=[
            ("get_weather", '{"city": "Kraków ☀"}'),
            ("tag", '{"names": ["a", "b"], "extra": {"k": null, "t": true}}'),
        ],
    ),
    ToolCase(
        id="pythonic-markers",
        parser="pythonic",
        text='<|python_start|>[get_weather(city="Oslo")]<|python_end|>',
        tools=TOOLS,
        content=None,
        calls=[("get_weather", '{"city": "Oslo"}')],
    ),
    ToolCase(
        id="pythonic-plain",
        parser="pythonic",
        text="It will rain (a little) in Oslo [citation needed].",
        tools=TOOLS,
        content="It will rain (a little) in Oslo [citation needed].",
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="pythonic-not-calls",
        parser="pythonic",
        text="[1, 2, 3] are the numbers",
        tools=TOOLS,
        content="[1, 2, 3] are the numbers",
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="pythonic-unknown-function",
        parser="pythonic",
        text='[get_weather(city="x"), format_disk(drive="c")]',
        tools=TOOLS,
        content='[get_weather(city="x"), format_disk(drive="c")]',
        calls=[],
        finish_reason="stop",
    ),
    ToolCase(
        id="pythonic-truncated",
        parser="pythonic",
        text='[get_weather(city="Ber',
        tools=TOOLS,
        content='[get_weather(city="Ber',
        calls=[],
        finish_reason="length",
    ),
]
