"""Each format's cases through its parser alone: one piece, every two-piece split, one character
at a time. The gateway-level harness (test_tool_calls_e2e) runs the same cases end to end."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable

import attrs
import pytest

from smg_trio.parsers.tools import (
    ToolCallDelta,
    ToolSpec,
    deepseek_v3,
    get_tool_parser,
    tool_parser_names,
)
from tests.tools.cases import kimi_k2
from tests.tools.toolcase import ToolCase

_MODULES = ("deepseek", "kimi_k2", "qwen3_coder", "glm45")
CASES: list[ToolCase] = [
    case for m in _MODULES for case in importlib.import_module(f"tests.tools.cases.{m}").CASES
]


@attrs.define
class Result:
    content: str
    names: dict[int, str]
    ids: dict[int, str | None]
    args: dict[int, str]


def _specs(case: ToolCase) -> list[ToolSpec]:
    return [
        ToolSpec(t["function"]["name"], t["function"].get("parameters", {})) for t in case.tools
    ]


def _run(case: ToolCase, pieces: Iterable[str]) -> Result:
    parser = get_tool_parser(case.parser)(_specs(case))
    content: list[str] = []
    res = Result("", {}, {}, {})

    def take(out: tuple[str, list[ToolCallDelta]]) -> None:
        text, deltas = out
        content.append(text)
        for d in deltas:
            if d.name is not None:  # the first delta of a call, and only that one
                assert d.index not in res.names, f"call {d.index} named twice"
                assert d.index == len(res.names), "calls come in index order"
                res.names[d.index], res.ids[d.index], res.args[d.index] = d.name, d.id, ""
            else:
                assert d.index in res.names, f"arguments before the name of call {d.index}"
                assert d.id is None
            res.args[d.index] += d.arguments

    for piece in pieces:
        take(parser.push(piece))
    take(parser.finish())
    res.content = "".join(content)
    return res


def _expected(case: ToolCase) -> tuple[str, list[tuple[str, str]]]:
    return case.content or "", case.calls


def _got(res: Result) -> tuple[str, list[tuple[str, str]]]:
    return res.content, [(res.names[i], res.args[i]) for i in sorted(res.names)]


def test_the_formats_are_registered() -> None:
    assert {"deepseek_v3", "deepseek_v31", "kimi_k2", "qwen3_coder", "glm45"} <= set(
        tool_parser_names()
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_in_one_piece(case: ToolCase) -> None:
    assert _got(_run(case, [case.text])) == _expected(case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_split_at_every_boundary(case: ToolCase) -> None:
    want = _expected(case)
    text = case.text
    for i in range(len(text) + 1):
        assert _got(_run(case, [text[:i], text[i:]])) == want, f"split at {i}: {text[:i]!r}"
    assert _got(_run(case, list(text))) == want, "one character at a time"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_arguments_are_json_where_the_format_builds_them(case: ToolCase) -> None:
    # The XML formats build the arguments: always valid JSON, even for a truncated call.
    if case.parser in ("qwen3_coder", "glm45"):
        for _, args in case.calls:
            json.loads(args)


@pytest.mark.parametrize("case_id", sorted(kimi_k2.IDS))
def test_kimi_passes_the_model_ids_through(case_id: str) -> None:
    case = next(c for c in CASES if c.id == case_id)
    res = _run(case, list(case.text))
    assert [res.ids[i] for i in sorted(res.ids)] == kimi_k2.IDS[case_id]


def test_no_marker_prefix_leaks_while_streaming() -> None:
    # A possible start marker is held back, not sent as content and taken back later.
    for name, marker in (
        ("deepseek_v3", deepseek_v3.CALLS_BEGIN),
        ("kimi_k2", "<|tool_calls_section_begin|>"),
        ("qwen3_coder", "<tool_call>"),
        ("glm45", "<tool_call>"),
    ):
        parser = get_tool_parser(name)([ToolSpec("f")])
        assert parser.push("Hi " + marker[:-1]) == ("Hi ", [])
        content, _ = parser.finish()
        assert content == marker[:-1]


def test_a_truncated_call_never_raises() -> None:
    # Every prefix of every case, finished there: no exception, and nothing is lost (the
    # content plus the calls' text accounts for what was pushed).
    for case in CASES:
        for i in range(len(case.text) + 1):
            res = _run(case, [case.text[:i]])
            if not res.names:
                assert res.content == case.text[:i]


@pytest.mark.parametrize(
    ("parser", "head", "fragment"),
    [
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=s>\nhello wor", '{"s": "hello wor'),
        ("glm45", "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>hello wor", '{"s": "hello wor'),
        ("deepseek_v31", f"{deepseek_v3.CALLS_BEGIN}{deepseek_v3.CALL_BEGIN}f{deepseek_v3.SEP}"
         '{"s": "hello wor', '{"s": "hello wor'),
    ],
)  # fmt: skip
def test_arguments_stream_before_the_call_ends(parser: str, head: str, fragment: str) -> None:
    # A long string argument (a file a coding model writes) streams as it is generated.
    tool = ToolSpec("f", {"type": "object", "properties": {"s": {"type": "string"}}})
    p = get_tool_parser(parser)([tool])
    content, deltas = p.push(head)
    assert content == ""
    assert [(d.name, d.arguments) for d in deltas] == [("f", fragment)]


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>"),
        ("glm45", "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"),
        ("deepseek_v31", f"{deepseek_v3.CALLS_BEGIN}{deepseek_v3.CALL_BEGIN}f{deepseek_v3.SEP}"
         f'{{"n": 2}}{deepseek_v3.CALL_END}{deepseek_v3.CALLS_END}'),
    ],
)  # fmt: skip
def test_without_tools_every_name_is_a_call(parser: str, text: str) -> None:
    # As the JSON formats do: a name is unknown only when the request lists tools.
    p = get_tool_parser(parser)([])
    content, deltas = p.push(text)
    more, rest = p.finish()
    assert content + more == ""
    args = "".join(d.arguments for d in [*deltas, *rest])
    assert [d.name for d in deltas if d.name] == ["f"]
    assert json.loads(args) in ({"n": 2}, {"n": "2"})
