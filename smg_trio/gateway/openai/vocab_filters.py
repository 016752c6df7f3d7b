"""vLLM's per-request vocabulary fields, checked and tokenized as its frontend does: ``allowed_token_ids``, ``bad_words``, ``cache_salt``."""

from __future__ import annotations

from collections.abc import Sequence

from smg_trio.errors import ValidationError
from smg_trio.tokenizer import Tokenizer

__all__ = [
    "MAX_BAD_WORDS",
    "MAX_BAD_WORD_CHARS",
    "MAX_CACHE_SALT_CHARS",
    "allowed_token_ids",
    "bad_words_token_ids",
    "check_cache_salt",
]

#: Most token sequences the ``bad_words`` may tokenize to (vLLM's ``VLLM_MAX_NUM_BAD_WORDS``
#: default; each word gives one or two).
MAX_BAD_WORDS = 128
#: Longest bad word, in characters: each is encoded twice on the event loop, so it is held to
#: the stop strings' bound (``MAX_STOP_CHARS``). vLLM sets none.
MAX_BAD_WORD_CHARS = 1024
#: vLLM 0.32's ``validate_cache_salt``: at most 128 characters, none of ``@ / \\`` or NUL.
MAX_CACHE_SALT_CHARS = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")


def allowed_token_ids(ids: Sequence[int] | None, vocab: int) -> list[int] | None:
    """vLLM's ``_validate_allowed_token_ids``: a 400 naming ``allowed_token_ids`` when it is
    empty or holds an id outside the vocabulary (vLLM's messages)."""
    if ids is None:
        return None
    if not ids:
        raise ValidationError("allowed_token_ids is not None and empty!", param="allowed_token_ids")
    outside = [t for t in ids if not 0 <= t < vocab]
    if outside:
        raise ValidationError(
            f"allowed_token_ids contains out-of-vocab token id! {outside}",
            param="allowed_token_ids",
        )
    return list(dict.fromkeys(ids))


def bad_words_token_ids(
    words: Sequence[str] | None, tokenizer: Tokenizer
) -> tuple[list[str], list[list[int]]] | None:
    """``(words, id sequences)`` as vLLM's ``SamplingParams.update_from_tokenizer`` makes them:
    each word (de-duplicated, leading spaces stripped) encoded as is, and with a leading space
    when that gives a different first token and as many tokens. 400s naming ``bad_words``: an
    empty word, one that encodes to nothing, more than :data:`MAX_BAD_WORDS` sequences."""
    if not words:
        return None
    unique = list(dict.fromkeys(words))
    out: list[list[int]] = []
    for word in unique:
        if not word:
            raise ValidationError(
                f"bad_words cannot contain an empty string. Got bad_words={unique}",
                param="bad_words",
            )
        if len(word) > MAX_BAD_WORD_CHARS:
            raise ValidationError(
                f"a bad word may have at most {MAX_BAD_WORD_CHARS} characters",
                param="bad_words",
            )
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not plain:
            raise ValidationError(
                "bad_words entries must tokenize to at least one token.", param="bad_words"
            )
        out.append(plain)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
        if len(out) > MAX_BAD_WORDS:
            raise ValidationError(
                f"Too many bad words after tokenization: {len(out)}. "
                f"The max number is {MAX_BAD_WORDS}.",
                param="bad_words",
            )
    return unique, out


def check_cache_salt(salt: str | None) -> str | None:
    """vLLM 0.32's ``validate_cache_salt``: ``None``, or a 400 naming ``cache_salt`` unless it
    is a non-empty string of at most :data:`MAX_CACHE_SALT_CHARS` characters without
    ``@``, ``/``, ``\\`` or NUL (its messages)."""
    if salt is None:
        return None
    if not salt:
        raise ValidationError(
            "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt"
        )
    if len(salt) > MAX_CACHE_SALT_CHARS or not _SALT_FORBIDDEN.isdisjoint(salt):
        raise ValidationError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.",
            param="cache_salt",
        )
    return salt
