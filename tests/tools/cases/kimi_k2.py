"""Kimi K2 (``kimi_k2``): a section of calls, each with the model's id ``functions.NAME:N``."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

B, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
TOOLS = [function_tool("get_weather", city="string"), function_tool("get_time", zone="string")]

#: The ids the model wrote, per case id, in call order (the parser passes them through).
IDS: dict[str, list[str]] = {}


def call(call_id: str, args: str) -> str:
    """One call as Kimi K2's chat template writes it."""
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


_W0 = call("functions.get_weather:0", '{"city": "Paris"}')
_T1 = call("functions.get_time:1", '{"zone": "UTC"}')
_BJ = call("functions.get_weather:0", '{"city": "北京 ☀️"}')
_K = {"parser": "kimi_k2", "tools": TOOLS}

CASES: list[ToolCase] = [
    ToolCase(id="kimi-one", text=f"{B}{_W0}{E}", content=None,
             calls=[("get_weather", '{"city": "Paris"}')], **_K),
    ToolCase(id="kimi-two-after-text", text=f"I will look both up.{B}{_W0}{_T1}{E}",
             content="I will look both up.",
             calls=[("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "UTC"}')], **_K),
    ToolCase(id="kimi-multibyte",
             text=f"好的。我查一下。{B}{_BJ}{E}",
             content="好的。我查一下。", calls=[("get_weather", '{"city": "北京 ☀️"}')], **_K),
    ToolCase(id="kimi-singular-section",
             text=f"<|tool_call_section_begin|>{_W0}<|tool_call_section_end|>", content=None,
             calls=[("get_weather", '{"city": "Paris"}')], **_K),
    ToolCase(id="kimi-text-after-section", text=f"{B}{_W0}{E}Done.", content="Done.",
             calls=[("get_weather", '{"city": "Paris"}')], **_K),
    ToolCase(id="kimi-truncated-args", text=f"{B}{_W0[: _W0.index('Par')]}", content=None,
             calls=[("get_weather", '{"city": "')], finish_reason="length", **_K),
    ToolCase(id="kimi-truncated-header", text=f"{B}<|tool_call_begin|>functions.get_wea",
             content=f"{B}<|tool_call_begin|>functions.get_wea", calls=[],
             finish_reason="length", **_K),
    ToolCase(id="kimi-unknown-function", text=f"{B}{call('functions.rm_rf:0', '{}')}{E}",
             content=f"{B}{call('functions.rm_rf:0', '{}')}{E}", calls=[], finish_reason="stop",
             **_K),
    ToolCase(id="kimi-no-call", text="Hello! No tools today.", content="Hello! No tools today.",
             calls=[], finish_reason="stop", **_K),
]  # fmt: skip

IDS.update(
    {
        "kimi-one": ["functions.get_weather:0"],
        "kimi-two-after-text": ["functions.get_weather:0", "functions.get_time:1"],
        "kimi-singular-section": ["functions.get_weather:0"],
    }
)
