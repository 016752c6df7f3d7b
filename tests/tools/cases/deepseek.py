"""DeepSeek V3 (``deepseek_v3``) and V3.1 (``deepseek_v31``): special-token markers, model JSON."""

from __future__ import annotations

from collections.abc import Callable

from tests.tools.toolcase import ToolCase, function_tool

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

TOOLS = [function_tool("get_weather", city="string"), function_tool("get_time", zone="string")]


def v3_call(name: str, args: str) -> str:
    """One call as DeepSeek-V3's chat template writes it."""
    return f"{CB}function{SEP}{name}\n```json\n{args}\n```{CE}"


def v31_call(name: str, args: str) -> str:
    """One call as DeepSeek-V3.1's chat template writes it."""
    return f"{CB}{name}{SEP}{args}{CE}"


def _cases(parser: str, call: Callable[[str, str], str]) -> list[ToolCase]:
    one = call("get_weather", '{"city": "Paris"}')
    two = call("get_time", '{"zone": "UTC"}')
    sep = "\n" if parser == "deepseek_v3" else ""
    cjk = call("get_weather", '{"city": "東京 🌸", "note": "naïve"}')
    unknown = call("launch_rocket", '{"target": "moon"}')
    head = one[: one.index(SEP) + 2]  # cut inside the header
    args_cut = one[: one.index('"Par') + 4]  # cut inside the arguments
    p = parser
    common = {"parser": p, "tools": TOOLS, "special_tokens": True}
    return [
        ToolCase(
            id=f"{p}-one", text=f"{B}{one}{E}", content=None,
            calls=[("get_weather", '{"city": "Paris"}')], **common,
        ),
        ToolCase(
            id=f"{p}-two-after-text", text=f"Let me check both.{B}{one}{sep}{two}{E}",
            content="Let me check both.",
            calls=[("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "UTC"}')],
            **common,
        ),
        ToolCase(
            id=f"{p}-multibyte", text=f"天気を調べます。{B}{cjk}{E}", content="天気を調べます。",
            calls=[("get_weather", '{"city": "東京 🌸", "note": "naïve"}')], **common,
        ),
        ToolCase(
            id=f"{p}-no-call", text="No tool is needed: it is 12°C in Paris.",
            content="No tool is needed: it is 12°C in Paris.", calls=[], finish_reason="stop",
            **common,
        ),
        ToolCase(
            id=f"{p}-truncated-args", text=f"{B}{args_cut}", content=None,
            calls=[("get_weather", '{"city": "Par')], finish_reason="length", **common,
        ),
        ToolCase(
            id=f"{p}-truncated-header", text=f"Sure.{B}{head}", content=f"Sure.{B}{head}",
            calls=[], finish_reason="length", **common,
        ),
        ToolCase(
            id=f"{p}-unknown-function", text=f"{B}{unknown}{E}", content=f"{B}{unknown}{E}",
            calls=[], finish_reason="stop", **common,
        ),
        ToolCase(
            id=f"{p}-bad-json-kept", text=f"{B}{call('get_weather', '{city: Paris}')}{E}",
            content=None, calls=[("get_weather", "{city: Paris}")], **common,
        ),
        ToolCase(
            id=f"{p}-unknown-then-known", text=f"{B}{unknown}{sep}{one}{E}",
            content=f"{B}{unknown}", calls=[("get_weather", '{"city": "Paris"}')], **common,
        ),
    ]  # fmt: skip


CASES: list[ToolCase] = [*_cases("deepseek_v3", v3_call), *_cases("deepseek_v31", v31_call)]
