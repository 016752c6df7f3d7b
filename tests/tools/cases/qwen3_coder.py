"""Qwen3-Coder (``qwen3_coder``): XML calls, values converted to JSON by the schema types."""

from __future__ import annotations

from typing import Any

from tests.tools.toolcase import ToolCase, function_tool


def _typed_tool() -> dict[str, Any]:
    tool = function_tool(
        "set_alarm", time="string", enabled="boolean", tags="array", meta="object", volume="number"
    )
    tool["function"]["parameters"]["properties"]["label"] = {"type": ["string", "null"]}
    return tool


TOOLS = [
    function_tool("get_weather", city="string", days="integer"),
    _typed_tool(),
    function_tool("ping"),
]


def call(name: str, **params: str) -> str:
    """One call as Qwen3-Coder's chat template writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


_PARIS = call("get_weather", city="Paris", days="3")
_Q = {"parser": "qwen3_coder", "tools": TOOLS}

CASES: list[ToolCase] = [
    ToolCase(id="qwen3c-one", text=_PARIS, content=None,
             calls=[("get_weather", '{"city": "Paris", "days": 3}')], **_Q),
    ToolCase(id="qwen3c-two-after-text",
             text=f"I'll check both.\n{_PARIS}\n{call('get_weather', city='1984', days='1')}",
             content="I'll check both.\n",
             calls=[("get_weather", '{"city": "Paris", "days": 3}'),
                    ("get_weather", '{"city": "1984", "days": 1}')], **_Q),
    ToolCase(id="qwen3c-typed",
             text=call("set_alarm", time="07:00", enabled="true", tags='["work", "早"]',
                       meta='{"snooze": 5}', volume="0.5", label="null"),
             content=None,
             calls=[("set_alarm", '{"time": "07:00", "enabled": true, "tags": ["work", "早"], '
                                  '"meta": {"snooze": 5}, "volume": 0.5, "label": "null"}')],
             **_Q),
    ToolCase(id="qwen3c-multibyte-multiline",
             text="好的。" + call("get_weather", city="São Paulo 🌞\nBrasil", days="2"),
             content="好的。", calls=[("get_weather", '{"city": "São Paulo 🌞\\nBrasil", "days": 2}')],
             **_Q),
    ToolCase(id="qwen3c-no-params", text=call("ping"), content=None, calls=[("ping", "{}")], **_Q),
    ToolCase(id="qwen3c-bad-typed-value", text=call("get_weather", city="Rome", days="a few"),
             content=None, calls=[("get_weather", '{"city": "Rome", "days": "a few"}')], **_Q),
    ToolCase(id="qwen3c-truncated-in-int", text=_PARIS[: _PARIS.index("<parameter=days>") + 18],
             content=None, calls=[("get_weather", '{"city": "Paris", "days": 3}')],
             finish_reason="length", **_Q),
    ToolCase(id="qwen3c-truncated-in-string", text=_PARIS[: _PARIS.index("Paris") + 2],
             content=None, calls=[("get_weather", '{"city": "Pa"}')],
             finish_reason="length", **_Q),
    ToolCase(id="qwen3c-truncated-before-params", text=_PARIS[: _PARIS.index("<parameter=")],
             content=None, calls=[("get_weather", "{}")], finish_reason="length", **_Q),
    ToolCase(id="qwen3c-truncated-name", text="Sure.\n<tool_call>\n<function=get_wea",
             content="Sure.\n<tool_call>\n<function=get_wea", calls=[],
             finish_reason="length", **_Q),
    ToolCase(id="qwen3c-unknown-function", text=call("rm_rf", path="/"),
             content=call("rm_rf", path="/"), calls=[], finish_reason="stop", **_Q),
    ToolCase(id="qwen3c-text-after-call", text=f"{_PARIS}\nThat is all.",
             content="\nThat is all.", calls=[("get_weather", '{"city": "Paris", "days": 3}')],
             **_Q),
]  # fmt: skip
