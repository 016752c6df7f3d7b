"""GLM-4.5 (``glm45``): ``<tool_call>NAME`` with ``<arg_key>``/``<arg_value>`` pairs."""

from __future__ import annotations

from tests.tools.toolcase import ToolCase, function_tool

TOOLS = [
    function_tool("get_weather", city="string", days="integer"),
    function_tool("search", query="string", filters="object", exact="boolean"),
]


def call(name: str, sep: str = "\n", **params: str) -> str:
    """One call as GLM-4.5's chat template writes it (``sep=""``: GLM-4.7's layout)."""
    body = "".join(
        f"{sep}<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>" for k, v in params.items()
    )
    return f"<tool_call>{name}{body}{sep}</tool_call>"


_PARIS = call("get_weather", city="Paris", days="3")
_G = {"parser": "glm45", "tools": TOOLS}

CASES: list[ToolCase] = [
    ToolCase(id="glm45-one", text=_PARIS, content=None,
             calls=[("get_weather", '{"city": "Paris", "days": 3}')], **_G),
    ToolCase(id="glm45-two-after-text",
             text=f"Checking.\n{_PARIS}\n{call('search', query='trio', exact='false')}",
             content="Checking.\n",
             calls=[("get_weather", '{"city": "Paris", "days": 3}'),
                    ("search", '{"query": "trio", "exact": false}')], **_G),
    ToolCase(id="glm45-no-newlines", text=call("get_weather", sep="", city="Oslo", days="7"),
             content=None, calls=[("get_weather", '{"city": "Oslo", "days": 7}')], **_G),
    ToolCase(id="glm45-object-value",
             text=call("search", query="42", filters='{"lang": ["de", "fr"]}'), content=None,
             calls=[("search", '{"query": "42", "filters": {"lang": ["de", "fr"]}}')], **_G),
    ToolCase(id="glm45-multibyte", text="好的。" + call("get_weather", city="Zürich 🏔️", days="1"),
             content="好的。", calls=[("get_weather", '{"city": "Zürich 🏔️", "days": 1}')], **_G),
    ToolCase(id="glm45-truncated-in-int", text=_PARIS[: _PARIS.index("<arg_value>3") + 12],
             content=None, calls=[("get_weather", '{"city": "Paris", "days": 3}')],
             finish_reason="length", **_G),
    ToolCase(id="glm45-truncated-in-string", text=_PARIS[: _PARIS.index("Paris") + 3],
             content=None, calls=[("get_weather", '{"city": "Par"}')],
             finish_reason="length", **_G),
    ToolCase(id="glm45-string-with-newlines",
             text=call("search", query="line one\nline two\n"), content=None,
             calls=[("search", '{"query": "line one\\nline two\\n"}')], **_G),
    ToolCase(id="glm45-truncated-name", text="One moment.<tool_call>get_wea",
             content="One moment.<tool_call>get_wea", calls=[], finish_reason="length", **_G),
    ToolCase(id="glm45-unknown-function", text=call("rm_rf", path="/"),
             content=call("rm_rf", path="/"), calls=[], finish_reason="stop", **_G),
    ToolCase(id="glm45-no-call", text="Nothing to call.", content="Nothing to call.", calls=[],
             finish_reason="stop", **_G),
]  # fmt: skip
