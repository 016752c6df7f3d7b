"""A lower bound on a long text's token count from encoding only a prefix of it.

Encoding costs memory per character, not just per token (with DeepSeek's vocabulary about 50
bytes per character plus 300 per token: a 16 MiB prompt costs 2 GB, bench/prefix_rss.py). The character bound of :mod:`smg_trio.tokenizer.bound` lets through texts of up
to ``max_model_len * L`` characters (16.7M for DeepSeek at 128K context), so a text longer
than :func:`prefix_chars` is first judged by encoding prefixes of it, the smallest first.

Why the prefix's count is a safe lower bound (for the pipelines :func:`~smg_trio.tokenizer.
bound.max_token_chars` accepts: BPE without dropout, normalizers and pre-tokenizers that never
delete input):

- Tokens never cross a pre-token (a "word": one piece of the pre-tokenizer's split, or one
  added token), and BPE encodes a word the same wherever it appears. So every word of the
  prefix that is also a word of the whole text, at the same place, contributes the same
  tokens to both.
- The pipeline's steps are local: the added-token matcher (leftmost-longest over tokens of a
  few dozen characters), the pre-tokenizers' regexes (ByteLevel's and the Split patterns in
  use match runs of character classes, with one character of look-ahead) and Digits,
  Punctuation, Metaspace, UnicodeScripts decide a word from the text at most a few
  characters past its end. Any word of the prefix that ends :data:`_MARGIN` characters before
  the cut was therefore decided on text the whole shares, and is a word of the whole too
  (by induction from the start, where both begin the same, ``add_prefix_space`` included).
- The normalizers are local too except Unicode normalization, whose canonical reordering runs
  over a whole combining sequence; so with a normalizer the cut is placed before a character
  that starts a new sequence and composes with nothing before it (:func:`_clean_cut`), where
  the normal form of the prefix is a prefix of the whole's.

So the words before the first one to reach into the last :data:`_MARGIN` characters are
words of the whole, and their tokens are tokens of the whole; the rest of the whole, from
where those words end, is at least ``ceil(rest / L)`` more tokens (the character bound).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any, Literal

from smg_trio.tokenizer.bound import min_tokens

__all__ = ["PREFIX_CHARS_PER_TOKEN", "prefix_bound_ok", "prefix_chars", "prefix_min_tokens"]

#: Characters per token that prose and code rarely exceed (about 4 for English with
#: DeepSeek's vocabulary): a text longer than ``limit`` times this is judged by a prefix of
#: that length. A sparser text is not refused for it: it costs a full encode, as before.
PREFIX_CHARS_PER_TOKEN = 8
#: Characters before the cut in which a word may still differ from the whole text's (see the
#: module doc); at least twice the longest added token.
_MARGIN = 256
#: How far before the nominal cut a clean one is looked for.
_CUT_SEARCH = 1024
_FORMS: tuple[Literal["NFC", "NFD", "NFKC", "NFKD"], ...] = ("NFC", "NFD", "NFKC", "NFKD")


def prefix_chars(limit: int) -> int:
    """The prefix length judged for a context of ``limit`` tokens."""
    return limit * PREFIX_CHARS_PER_TOKEN


def prefix_bound_ok(hf: Any) -> tuple[bool, bool, int]:
    """Whether a prefix count is a safe bound for ``hf`` (no BPE dropout: deterministic),
    whether it has a normalizer (the cut must then be clean) and the margin to keep (at least
    twice its longest added token)."""
    spec = json.loads(hf.to_str())
    model = spec.get("model") or {}
    deterministic = not model.get("dropout")
    norm = spec.get("normalizer")
    normalizes = norm is not None and not (
        norm.get("type") == "Sequence" and not norm.get("normalizers")
    )
    added = [len(t.get("content", "")) for t in spec.get("added_tokens") or []]
    return deterministic, normalizes, max(_MARGIN, 2 * max(added, default=0))


def _stable_at(text: str, k: int) -> bool:
    """Whether every Unicode normal form of ``text`` splits at ``k``: ``text[k]`` starts a
    combining sequence (class 0) and composes with nothing before it."""
    c = text[k]
    if c.isascii():
        return True
    if unicodedata.combining(c):
        return False
    pair, prev = text[k - 1 : k + 1], text[k - 1]
    return all(
        unicodedata.normalize(f, pair)
        == unicodedata.normalize(f, prev) + unicodedata.normalize(f, c)
        for f in _FORMS
    )


def _clean_cut(text: str, k: int) -> int | None:
    """The largest cut ``<= k`` (at most :data:`_CUT_SEARCH` back) where normalization splits."""
    for i in range(k, max(0, k - _CUT_SEARCH), -1):
        if _stable_at(text, i):
            return i
    return None


def prefix_min_tokens(
    encode: Any, text: str, limit: int, longest: int, *, normalizes: bool, margin: int
) -> int:
    """At least how many tokens ``text`` (no special tokens added) encodes to, encoding only
    prefixes of it (see the module doc): of ``limit`` characters, then twice as many, up to
    :func:`prefix_chars`, stopping at the first that puts it over ``limit`` (a dense text is
    refused after the first, small, encode). ``encode`` is the tokenizer's ``encode_batch``
    (offsets and word ids are needed), ``longest`` its longest token in characters. A text no
    longer than the prefix, or one the character bound alone puts over ``limit``, is not
    encoded."""
    n = len(text)
    lower = min_tokens(n, longest)
    if n <= prefix_chars(limit) or lower >= limit:
        return lower
    chars = limit
    while lower < limit and chars <= prefix_chars(limit):
        cut: int | None = chars
        if normalizes:
            cut = _clean_cut(text, chars)
        if cut is not None:
            found = _bound_from_prefix(encode, text, cut, longest, margin)
            if not found:
                # No word of the prefix is sure (one pre-token spans it, e.g. a run of
                # millions of dashes): a longer prefix would most likely only cost more.
                break
            lower = max(lower, found)
        chars *= 2
    return lower


def _bound_from_prefix(encode: Any, text: str, cut: int, longest: int, margin: int) -> int:
    """The tokens of the prefix's words that are surely words of ``text``, plus the character
    bound of the rest (0 when no word is sure)."""
    enc = encode([text[:cut]], add_special_tokens=False)[0]
    words, offsets = enc.word_ids, enc.offsets
    if not offsets:
        return 0
    horizon = cut - margin
    first = next((i for i, (_, end) in enumerate(offsets) if end > horizon), len(offsets) - 1)
    # Drop the word of the first token that reaches the margin, and the word before it too:
    # offsets are trimmed of whitespace (ByteLevel trim_offsets), so a word's tokens may end
    # before the word does; the word before the unsure one ends, trimmed or not, no later
    # than that word's first token starts.
    for _ in range(2):
        word = words[first]
        while first > 0 and word is not None and words[first - 1] == word:
            first -= 1
        if first == 0:
            return 0
        first -= 1
    first += 1
    # The rest starts where the first dropped token starts (a trimmed start is only later,
    # which undercounts the rest: still safe).
    return first + min_tokens(len(text) - offsets[first][0], longest)
