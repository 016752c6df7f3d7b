"""Reasoning parsers: <think> blocks split into reasoning and content, streamed or whole."""

from __future__ import annotations

import random

import pytest

from smg_trio.tokenizer import (
    REASONING_PARSERS,
    ReasoningParser,
    Tokenizer,
    get_reasoning_parser,
)


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
    p = get_reasoning_parser("qwen3")
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
    p = get_reasoning_parser("qwen3")
    assert p.push("Hello <") == ("", "Hello ")
    assert p.push("b>") == ("", "<b>")
    assert p.flush() == ("", "")
    assert not p.reasoning_seen
    assert p.split("just text") == (None, "just text")


def test_deepseek_r1_starts_in_reasoning() -> None:
    p = get_reasoning_parser("deepseek_r1")
    assert p.in_reasoning
    assert p.push("Thinking...</think>Done") == ("Thinking...", "Done")
    # a <think> the model repeats at the very start is dropped, even when split
    p = get_reasoning_parser("deepseek_r1")
    assert p.push("<th") == ("", "")
    assert p.push("ink>abc</think>x") == ("abc", "x")
    # truncated reasoning (no end tag) stays reasoning, and the held partial tag flushes there
    p = get_reasoning_parser("deepseek_r1")
    assert p.push("still thinking </thi") == ("still thinking ", "")
    assert p.flush() == ("</thi", "")


def test_in_reasoning_override() -> None:
    p = get_reasoning_parser("qwen3", in_reasoning=True)
    assert p.split("r</think>c") == ("r", "c")
    assert get_reasoning_parser("deepseek_r1", in_reasoning=False).split("abc") == (None, "abc")


def test_split() -> None:
    p = ReasoningParser()
    assert p.split("<think>\nwhy\n</think>\n\nbecause") == ("\nwhy\n", "\n\nbecause")
    assert p.split("<think>unfinished") == ("unfinished", "")
    assert p.split("pre<think>r</think>post") == ("r", "prepost")
    assert ReasoningParser(in_reasoning=True).split("") == ("", "")
    assert not p.reasoning_seen  # split leaves the parser itself untouched


def test_streaming_matches_split() -> None:
    rng = random.Random(11)
    pieces = ["<think>", "</think>", "<th", "</", "a", " ", "\n", "b>", "ink>", "x"]
    for in_reasoning in (False, True):
        for _ in range(1500):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
            ref = ReasoningParser(in_reasoning=in_reasoning)
            whole = ref.split(text)
            p = ReasoningParser(in_reasoning=in_reasoning)
            r, c = _stream(p, _chunks(text, rng))
            assert (r if p.reasoning_seen else None, c) == whole, text


def test_custom_tags_and_errors() -> None:
    p = ReasoningParser("[R]", "[/R]")
    assert p.split("[R]a[/R]b") == ("a", "b")
    with pytest.raises(ValueError, match="non-empty"):
        ReasoningParser("", "x")
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        get_reasoning_parser("nope")
    assert set(REASONING_PARSERS) == {"qwen3", "deepseek_r1"}


def test_with_tiny_model_detokenized_text(tok: Tokenizer) -> None:
    from smg_trio.tokenizer import IncrementalDetokenizer

    ids = tok.encode("<think>\nI should greet.\n</think>\n\nHello 😀!<|im_end|>")
    d = IncrementalDetokenizer(tok, skip_special_tokens=True)
    p = get_reasoning_parser("qwen3")
    reasoning, content = "", ""
    for i in ids:
        r, c = p.push(d.push([i]))
        reasoning += r
        content += c
    r, c = p.push(d.flush())
    r2, c2 = p.flush()
    assert (reasoning + r + r2, content + c + c2) == ("\nI should greet.\n", "\n\nHello 😀!")
