"""A safe lower bound on a text's token count from its length: the vocabulary's longest token.

Every token of a tokenizer whose pipeline never deletes input covers at most ``L`` input
characters, where ``L`` is the longest vocabulary or added-token string in characters: a
byte-level vocabulary writes one character per byte (an input character is at least one byte),
metaspace writes ``▁`` for a space, and byte-fallback tokens (``<0x41>``) cover one byte. So a
text of ``c`` characters has at least ``ceil(c / L)`` tokens, known without encoding it.

Normalizers and pre-tokenizers that drop or merge input (whitespace splitting, control-character
cleaning, accent stripping, a fused ``unk`` token) break that bound; for those
:func:`max_token_chars` returns ``None`` and no early refusal is made. NFC/NFKC composition can
turn up to a few characters into one, so their bound is scaled by :data:`_COMPOSE_FACTOR`.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["max_token_chars", "min_tokens"]

#: Characters canonical composition may merge into one (Hangul L+V+T, Vietnamese base+2 marks),
#: with margin.
_COMPOSE_FACTOR = 4
_KEEP_NORMALIZERS = frozenset({"Prepend", "NFD", "NFKD", "Lowercase", "Precompiled"})
_COMPOSE_NORMALIZERS = frozenset({"NFC", "NFKC"})
_KEEP_PRE = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts"})


def _normalizer_factor(node: Any) -> int | None:
    """1 or :data:`_COMPOSE_FACTOR` when ``node`` never deletes input, else ``None``."""
    if node is None:
        return 1
    kind = node.get("type")
    if kind == "Sequence":
        factor = 1
        for child in node.get("normalizers", []):
            f = _normalizer_factor(child)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":
        return 1 if node.get("content") else None
    if kind in _COMPOSE_NORMALIZERS:
        return _COMPOSE_FACTOR
    return 1 if kind in _KEEP_NORMALIZERS else None


def _pre_keeps(node: Any) -> bool:
    if node is None:
        return True
    kind = node.get("type")
    if kind == "Sequence":
        return all(_pre_keeps(child) for child in node.get("pretokenizers", []))
    if kind == "Split":
        return bool(node.get("behavior") != "Removed")
    return kind in _KEEP_PRE


def max_token_chars(hf: Any) -> int | None:
    """``L`` for a ``tokenizers.Tokenizer`` (see the module doc), or ``None`` when its
    pipeline may delete input and no bound is safe."""
    spec = json.loads(hf.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    if (
        model.get("unk_token") is not None
        and model.get("fuse_unk")
        and not model.get("byte_fallback")
    ):
        return None
    factor = _normalizer_factor(spec.get("normalizer"))
    if factor is None or not _pre_keeps(spec.get("pre_tokenizer")):
        return None
    vocab = hf.get_vocab(with_added_tokens=True)
    if not vocab:
        return None
    return factor * max(len(token) for token in vocab)


def min_tokens(chars: int, bound: int | None) -> int:
    """The fewest tokens a ``chars``-character text can encode to (0 when unbounded)."""
    if bound is None or chars <= 0:
        return 0
    return -(-chars // bound)
