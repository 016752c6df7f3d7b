"""The glm45 and qwen3_coder tool parsers and the harmony splitter are linear in their input in
every feeding pattern (issue 28 item 7: one big piece, such as a mock script or a whole
response, was quadratic), and their output does not depend on how the text is cut.

Work is counted, not timed: the pieces are :class:`~tests.parsers.counting.CountingStr`, which
count the characters every buffer operation copies or scans. Four times the input must cost
at most :data:`RATIO` times the work (a quadratic parser costs about 16 times)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from smg_trio.parsers.harmony import HarmonySplitter, Header
from smg_trio.parsers.tools import ToolCallDelta, ToolSpec, get_tool_parser
from tests.parsers.counting import COUNT, CountingStr, pieces

#: The most work 4n characters may cost, as a multiple of n's.
RATIO = 5.0
PATTERNS = ("whole", "chars", "random")

TOOLS = [ToolSpec("f", {"type": "object", "properties": {"s": {"type": "string"}, "n": {}}})]


def _qwen_call(i: int) -> str:
    return (
        f"<tool_call>\n<function=f>\n<parameter=s>\nv{i}\n</parameter>\n"
        f"<parameter=n>\n{i}\n</parameter>\n</function>\n</tool_call>\ntext {i} "
    )


def _glm_call(i: int) -> str:
    return (
        f"<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>v{i}</arg_value>\n"
        f"<arg_key>n</arg_key><arg_value>{i}</arg_value>\n</tool_call>\ntext {i} "
    )


#: (parser, builder of an input of about ``k`` units): many calls; one call with many
#: parameters and its end only at the end; calls whose name is not a tool (skipped as text);
#: one long value, key or skipped call; plain text full of ``<``.
TOOL_INPUTS: dict[str, tuple[str, Callable[[int], str]]] = {
    "qwen many calls": ("qwen3_coder", lambda k: "".join(_qwen_call(i) for i in range(k))),
    "qwen many params": (
        "qwen3_coder",
        lambda k: (
            "<tool_call>\n<function=f>\n"
            + "".join(f"<parameter=s>\nx{i}\n</parameter>\n" for i in range(k))
            + "</function>\n</tool_call>"
        ),
    ),
    "qwen unknown calls": (
        "qwen3_coder",
        lambda k: "".join(f"<tool_call>\n<function=g{i}>\nx\n</tool_call>" for i in range(k)),
    ),
    "qwen long value": (
        "qwen3_coder",
        lambda k: "<tool_call>\n<function=f>\n<parameter=n>\n" + "12345678" * 8 * k,
    ),
    "qwen long skipped": (
        "qwen3_coder",
        lambda k: "<tool_call>\n<function=nope>\n" + "skipped " * 8 * k,
    ),
    "qwen lt text": ("qwen3_coder", lambda k: "a < b <tool <t " * 8 * k),
    "glm many calls": ("glm45", lambda k: "".join(_glm_call(i) for i in range(k))),
    "glm many params": (
        "glm45",
        lambda k: (
            "<tool_call>f\n"
            + "".join(f"<arg_key>s</arg_key><arg_value>x{i}</arg_value>\n" for i in range(k))
            + "</tool_call>"
        ),
    ),
    "glm unknown calls": (
        "glm45",
        lambda k: "".join(f"<tool_call>g{i}\n<arg_key>s</arg_key></tool_call>" for i in range(k)),
    ),
    "glm long key": ("glm45", lambda k: "<tool_call>f\n<arg_key>" + "key " * 16 * k),
    "glm long value": (
        "glm45",
        lambda k: "<tool_call>f\n<arg_key>n</arg_key><arg_value>" + "1234" * 16 * k,
    ),
}

#: Harmony inputs: many messages, many calls, openers that never become headers, a long body.
HARMONY_INPUTS: dict[str, Callable[[int], str]] = {
    "messages": lambda k: "".join(
        f"<|channel|>analysis<|message|>think {i}<|end|><|start|>assistant"
        f"<|channel|>final<|message|>say {i}<|end|>"
        for i in range(k)
    ),
    "calls": lambda k: "".join(
        f"<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json"
        f'<|message|>{{"i": {i}}}<|call|>'
        for i in range(k)
    ),
    "openers without message": lambda k: "<|channel|>x " * 8 * k,
    "long body": lambda k: "<|channel|>final<|message|>" + "body text " * 16 * k,
    "text with bars": lambda k: "<| a |> <|end <|start " * 8 * k,
}


def _run_tools(parser: str, chunks: list[CountingStr]) -> tuple[str, list[tuple[int, str, str]]]:
    p = get_tool_parser(parser)(TOOLS)
    content: list[str] = []
    calls: dict[int, list[str]] = {}

    def take(out: tuple[str, list[ToolCallDelta]]) -> None:
        text, deltas = out
        content.append(text)
        for d in deltas:
            calls.setdefault(d.index, [d.name or "", ""])
            calls[d.index][1] += d.arguments

    for chunk in chunks:
        take(p.push(chunk))
    take(p.finish())
    return "".join(content), [(i, *calls[i]) for i in sorted(calls)]  # type: ignore[misc]


def _run_harmony(chunks: list[CountingStr]) -> list[tuple[str, str]]:
    splitter = HarmonySplitter()
    events: list[tuple[str, Any]] = []
    for chunk in chunks:
        events.extend(splitter.push(chunk))
    events.extend(splitter.finish())
    # joined per kind run: the events' cut points may follow the pieces, their text may not
    out: list[tuple[str, str]] = []
    for kind, value in events:
        text = value.raw if isinstance(value, Header) else str(value)
        if out and kind in ("text", "body") and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def _work(run: Callable[[list[CountingStr]], Any], text: str, pattern: str) -> int:
    chunks = pieces(text, pattern)
    COUNT[0] = 0
    run(chunks)
    return COUNT[0] + 1


def _assert_linear(run: Callable[[list[CountingStr]], Any], build: Callable[[int], str]) -> None:
    for pattern in PATTERNS:
        small, large = build(100), build(400)
        ratio = _work(run, large, pattern) / _work(run, small, pattern)
        assert ratio <= RATIO * len(large) / (4 * len(small)), (pattern, ratio)


@pytest.mark.parametrize("name", sorted(TOOL_INPUTS))
def test_tool_parsers_are_linear(name: str) -> None:
    parser, build = TOOL_INPUTS[name]
    _assert_linear(lambda chunks: _run_tools(parser, chunks), build)


@pytest.mark.parametrize("name", sorted(HARMONY_INPUTS))
def test_the_harmony_splitter_is_linear(name: str) -> None:
    _assert_linear(_run_harmony, HARMONY_INPUTS[name])


@pytest.mark.parametrize("name", sorted(TOOL_INPUTS))
def test_tool_parser_output_does_not_depend_on_the_cuts(name: str) -> None:
    parser, build = TOOL_INPUTS[name]
    text = build(30)
    want = _run_tools(parser, pieces(text, "whole"))
    assert want[1] or parser == "qwen3_coder" or want[0]  # something came out
    for pattern in ("chars", "random"):
        for seed in range(3):
            assert _run_tools(parser, pieces(text, pattern, seed)) == want, (pattern, seed)


@pytest.mark.parametrize("name", sorted(HARMONY_INPUTS))
def test_harmony_output_does_not_depend_on_the_cuts(name: str) -> None:
    text = HARMONY_INPUTS[name](30)
    want = _run_harmony(pieces(text, "whole"))
    for pattern in ("chars", "random"):
        for seed in range(3):
            assert _run_harmony(pieces(text, pattern, seed)) == want, (pattern, seed)


def test_random_texts_parse_alike_in_every_cut() -> None:
    """Random mixtures of both formats' tags and text: one piece, by character and random
    cuts give the same content and calls."""
    rng = random.Random(7)
    atoms = [
        "<tool_call>", "</tool_call>", "<function=f>", "</function>", "<parameter=s>",
        "</parameter>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "f", "\n",
        " ", "x", "<", ">", "=", "1", "<|channel|>", "<|message|>", "<|end|>", "<|start|>",
    ]  # fmt: skip
    for _ in range(60):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 80)))
        for parser in ("qwen3_coder", "glm45"):
            want = _run_tools(parser, pieces(text, "whole"))
            assert _run_tools(parser, pieces(text, "chars")) == want, (parser, text)
            assert _run_tools(parser, pieces(text, "random", 1)) == want, (parser, text)
        want_h = _run_harmony(pieces(text, "whole"))
        assert _run_harmony(pieces(text, "chars")) == want_h, text
