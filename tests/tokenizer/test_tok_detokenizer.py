"""Incremental detokenization: deltas concatenate to the full decode, never split a character."""

from __future__ import annotations

import random
from typing import Any

import pytest

from smg_trio.tokenizer import IncrementalDetokenizer, Tokenizer


def _stream(
    tok: Tokenizer, ids: list[int], rng: random.Random | None = None, **kw: Any
) -> list[str]:
    """Push ``ids`` one at a time (or in random chunks of 1-4); deltas plus the flush."""
    d = IncrementalDetokenizer(tok, **kw)
    out: list[str] = []
    i = 0
    while i < len(ids):
        k = rng.randint(1, 4) if rng else 1
        out.append(d.push(ids[i : i + k]))
        i += k
    out.append(d.flush())
    return out


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_property(tok: Tokenizer, skip: bool) -> None:
    rng = random.Random(1234 + skip)
    for _ in range(1500):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 24))]
        deltas = _stream(tok, ids, rng, skip_special_tokens=skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip), ids


@pytest.mark.parametrize("skip", [True, False])
def test_unicode_texts_stream_cleanly(tok: Tokenizer, unicode_text: str, skip: bool) -> None:
    ids = tok.encode(unicode_text)
    for rng in (None, random.Random(7)):
        deltas = _stream(tok, ids, rng, skip_special_tokens=skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in d for d in deltas)  # valid text: never a replacement char


def test_multibyte_char_held_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1
    d = IncrementalDetokenizer(tok)
    deltas = [d.push([i]) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == "😀"
    # A multi-token push whose tail is an incomplete character releases the complete part.
    d = IncrementalDetokenizer(tok)
    head = tok.encode("ab")
    assert d.push(head + ids[:1]) == "ab"
    assert d.push(ids[1:]) == "😀"
    # An unfinished character at the end becomes U+FFFD on flush, like a full decode.
    d = IncrementalDetokenizer(tok)
    assert d.push(ids[:1]) == ""
    assert d.flush() == tok.decode(ids[:1]) == "\ufffd"
    assert d.flush() == ""


def test_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("hi<|im_end|><|endoftext|>")
    assert "".join(_stream(tok, ids)) == "hi"
    assert "".join(_stream(tok, ids, skip_special_tokens=False)) == "hi<|im_end|><|endoftext|>"
    # spaces_between_special_tokens is accepted and, with fast tokenizers, changes nothing
    assert (
        "".join(_stream(tok, ids, skip_special_tokens=False, spaces_between_special_tokens=False))
        == "hi<|im_end|><|endoftext|>"
    )


def test_sentencepiece_leading_spaces(metaspace_tok: Tokenizer) -> None:
    tok = metaspace_tok
    ids = tok.encode("hello world the fox")
    assert len(ids) == 4
    deltas = _stream(tok, ids)
    assert deltas == ["hello", " world", " the", " fox", ""]
    assert "".join(deltas) == tok.decode(ids)
    rng = random.Random(3)
    for _ in range(300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 16))]
        assert "".join(_stream(tok, ids, rng)) == tok.decode(ids)


def test_prompt_context_keeps_first_space(metaspace_tok: Tokenizer) -> None:
    tok = metaspace_tok
    prompt = tok.encode("the quick brown fox jumps")
    ids = tok.encode("hello world")
    d = IncrementalDetokenizer(tok, prompt_ids=prompt)
    out = "".join(d.push([i]) for i in ids) + d.flush()
    assert out == " hello world"
    assert out == tok.decode(prompt + ids)[len(tok.decode(prompt)) :]


def test_byte_fallback_unicode(byte_fallback_tok: Tokenizer, unicode_text: str) -> None:
    tok = byte_fallback_tok
    ids = tok.encode(unicode_text)
    deltas = _stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


def test_window_stays_bounded(tok: Tokenizer) -> None:
    text = "Streaming 中文 and emoji 😀 with café. " * 200
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok)
    out: list[str] = []
    longest = 0
    for i in ids:
        out.append(d.push([i]))
        longest = max(longest, len(d._ids))
    out.append(d.flush())
    assert "".join(out) == text
    assert longest <= 8  # window = last delta's tokens + pending ones, not the whole text


def test_pending_garbage_is_released(tok: Tokenizer) -> None:
    # A token that is a lone UTF-8 lead byte keeps the text ending in U+FFFD forever;
    # the detokenizer must not buffer without bound.
    lead = next(
        i
        for i in range(tok.vocab_size)
        if tok.decode([i]) == "\ufffd" and tok.decode([i, i]) == "\ufffd\ufffd"
    )
    d = IncrementalDetokenizer(tok)
    emitted = "".join(d.push([lead]) for _ in range(100))
    assert emitted
    assert len(d._ids) <= 40
