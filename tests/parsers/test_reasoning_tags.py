"""Reasoning parsers: tag blocks split into reasoning and content, streamed or whole; each
format's start state from the prompt and chat_template_kwargs; the registry's names."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.parsers.harmony import MAX_HEADER_CHARS
from smg_trio.parsers.reasoning import (
    ReasoningParser,
    TagParser,
    get_reasoning_format,
    reasoning_parser_names,
    split,
)
from smg_trio.tokenizer import IncrementalDetokenizer, Tokenizer

NAMES = {"deepseek_r1", "deepseek_v31", "glm45", "kimi_k2", "mistral", "openai", "qwen3"}
NAMES |= {"glm47", "openai_gptoss"}  # vLLM 0.32's names for glm45 and openai (aliases)


def _new(name: str, prompt: str = "", kwargs: dict[str, Any] | None = None) -> ReasoningParser:
    factory = get_reasoning_format(name).start(prompt, kwargs)
    assert factory is not None
    return factory()


def _stream(p: ReasoningParser, deltas: list[str]) -> tuple[str, str]:
    reasoning, content = [], []
    for d in deltas:
        r, c = p.push(d)
        reasoning.append(r)
        content.append(c)
        assert "</think>" not in r  # the end tag never leaks into reasoning
    r, c = p.flush()
    return "".join(reasoning) + r, "".join(content) + c


def _chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_qwen3_tags_split_across_deltas() -> None:
    p = _new("qwen3")
    assert isinstance(p, TagParser)
    assert not p.in_reasoning
    assert p.push("<thi") == ("", "")  # partial tag held back, not leaked as content
    assert p.push("nk>\nLet me") == ("\nLet me", "")
    assert (p.in_reasoning, p.reasoning_seen) == (True, True)
    assert p.push(" think.</") == (" think.", "")
    assert p.push("think>\n\nAnswer") == ("", "\n\nAnswer")
    assert not p.in_reasoning
    assert p.push(" <think>x</think>") == ("", " <think>x</think>")  # one block only
    assert p.flush() == ("", "")


def test_qwen3_without_think_is_content() -> None:
    p = _new("qwen3")
    assert isinstance(p, TagParser)
    assert p.push("Hello <") == ("", "Hello ")
    assert p.push("b>") == ("", "<b>")
    assert p.flush() == ("", "")
    assert not p.reasoning_seen


def test_deepseek_r1_starts_in_reasoning() -> None:
    assert _new("deepseek_r1").push("Thinking...</think>Done") == ("Thinking...", "Done")
    # a <think> the model repeats at the very start is dropped, even when split
    p = _new("deepseek_r1")
    assert p.push("<th") == ("", "")
    assert p.push("ink>abc</think>x") == ("abc", "x")
    # truncated reasoning (no end tag) stays reasoning, and the held partial tag flushes there
    p = _new("deepseek_r1")
    assert p.push("still thinking </thi") == ("still thinking ", "")
    assert p.flush() == ("</thi", "")


def test_start_state_follows_the_prompt() -> None:
    # the template opened the block: reasoning from the first character (qwen3 2507 thinking)
    assert _stream(_new("qwen3", "<|im_start|>assistant\n<think>\n"), ["r</think>c"]) == (
        "r",
        "c",
    )
    # the template closed an empty block (thinking off): all content
    assert _stream(_new("deepseek_r1", "<|Assistant|></think>"), ["abc"]) == ("", "abc")
    # ... a later block the model writes included (vLLM streams it all as content)
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert _stream(_new("qwen3", closed), ["a<th", "ink>r</think>c"]) == ("", "a<think>r</think>c")


def test_split_whole_outputs() -> None:
    fmt = get_reasoning_format("qwen3").start("", None)
    assert fmt is not None
    assert split(fmt, "<think>\nwhy\n</think>\n\nbecause") == ("\nwhy\n", "\n\nbecause")
    assert split(fmt, "<think>unfinished") == ("unfinished", "")
    assert split(fmt, "pre<think>r</think>post") == ("r", "prepost")


@pytest.mark.parametrize(
    ("name", "kwargs", "on"),
    [
        ("deepseek_v31", None, False),  # off by default
        ("deepseek_v31", {"thinking": True}, True),
        ("deepseek_v31", {"enable_thinking": True}, True),
        ("deepseek_v31", {"thinking": False}, False),
        ("kimi_k2", None, True),  # on by default
        ("kimi_k2", {"thinking": False}, False),
        ("qwen3", {"enable_thinking": False}, True),  # no switch: the template decides
    ],
)
def test_thinking_switch(name: str, kwargs: dict[str, Any] | None, on: bool) -> None:
    assert (get_reasoning_format(name).start("", kwargs) is not None) is on


def test_kimi_k2_tool_section_ends_reasoning_and_stays_content() -> None:
    text = "<think>plan<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    assert _stream(_new("kimi_k2"), list(text)) == (
        "plan",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0",
    )
    assert _stream(_new("kimi_k2"), ["no open tag</think>answer"]) == ("no open tag", "answer")
    assert _new("kimi_k2").needs_special_tokens


def test_mistral_think_tags() -> None:
    p = _new("mistral")
    assert p.needs_special_tokens
    assert _stream(p, ["pre[TH", "INK]why[/TH", "INK]answer"]) == ("why", "preanswer")
    assert _stream(_new("mistral"), ["[THINK]cut off"]) == ("cut off", "")


HARMONY = (
    "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
)
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)


def test_harmony_channels() -> None:
    assert _stream(_new("openai"), [HARMONY]) == ("User asks 2+2. Easy.", "2 + 2 = 4.")
    # a call is passed on verbatim (for the openai tool parser), the analysis is reasoning
    r, c = _stream(_new("openai"), [HARMONY_CALL])
    assert r == "Need weather."
    assert c == HARMONY_CALL[HARMONY_CALL.index("<|start|>") :]
    # a commentary preamble is content; text outside any message is content as it is
    preamble = "plain <|channel|>commentary<|message|>Will check.<|end|>"
    assert _stream(_new("openai"), [preamble]) == ("", "plain Will check.")
    # cut off inside the analysis: reasoning so far, the held partial marker included
    assert _stream(_new("openai"), ["<|channel|>analysis<|message|>hmm <|en"]) == (
        "hmm <|en",
        "",
    )
    assert _new("openai").needs_special_tokens


@pytest.mark.parametrize("name", sorted(NAMES))
def test_streaming_matches_whole(name: str) -> None:
    rng = random.Random(11)
    pieces = {
        "mistral": ["[THINK]", "[/THINK]", "[TH", "[/", "a", " ", "\n", "K]", "é", "😀"],
        "openai": [
            "<|channel|>analysis<|message|>",
            "<|end|>",
            "<|start|>assistant<|channel|>final<|message|>",
            "<|start|>assistant<|channel|>commentary to=functions.f<|message|>",
            "<|call|>",
            "<|",
            "a",
            " ",
            "😀",
        ],
    }.get(name, ["<think>", "</think>", "<th", "</", "a", " ", "\n", "b>", "ink>", "é"])
    fmt = get_reasoning_format(name).start("", {"thinking": True})
    assert fmt is not None
    for _ in range(800):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert _stream(fmt(), _chunks(text, rng)) == split(fmt, text), text


@pytest.mark.parametrize("pad", [MAX_HEADER_CHARS - 40, MAX_HEADER_CHARS + 40])
def test_harmony_headers_near_the_cap_stream_as_whole(pad: int) -> None:
    """A header is at most MAX_HEADER_CHARS up to its ``<|message|>``: a longer one is text.
    Streamed, that was decided on how far the text had come (a long header that completes
    was text), whole on the whole header (a header): they differed."""
    rng = random.Random(5)
    fmt = get_reasoning_format("openai").start("", None)
    assert fmt is not None
    text = f"<|channel|>analysis{' ' * pad}<|message|>why<|end|>" + HARMONY
    whole = split(fmt, text)
    assert ("why" in whole[0]) == (pad < MAX_HEADER_CHARS)  # a header below the cap
    for _ in range(50):
        assert _stream(fmt(), _chunks(text, rng)) == whole
    assert _stream(fmt(), list(text)) == whole


def test_registry_names_and_errors() -> None:
    assert set(reasoning_parser_names()) == NAMES
    with pytest.raises(ValueError, match="deepseek_r1, deepseek_v31, glm45"):
        get_reasoning_format("nope")
    with pytest.raises(ValueError, match="non-empty"):
        TagParser("", "x")


def test_with_tiny_model_detokenized_text(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(build_tiny_model(tmp_path / "m"))
    ids = tok.encode("<think>\nI should greet.\n</think>\n\nHello 😀!<|im_end|>")
    d = IncrementalDetokenizer(tok, skip_special_tokens=True)
    p = _new("qwen3")
    reasoning, content = "", ""
    for i in ids:
        r, c = p.push(d.push([i]))
        reasoning += r
        content += c
    r, c = p.push(d.flush())
    r2, c2 = p.flush()
    assert (reasoning + r + r2, content + c + c2) == ("\nI should greet.\n", "\n\nHello 😀!")
