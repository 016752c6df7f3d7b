"""Completions prompts: a string, a batch of strings, token ids or a batch of them, checked
and tokenized (each refused before encoding when it cannot fit the context)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from smg_trio.errors import ValidationError
from smg_trio.tokenizer import Tokenizer

__all__ = ["FitCheck", "count_prompts", "parse_prompts"]


def _bad_prompt(message: str, param: str = "prompt") -> ValidationError:
    return ValidationError(message, param=param, code="invalid_value")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_ids(ids: Sequence[Any], vocab: int, param: str) -> list[int]:
    if not ids:
        raise _bad_prompt("a token prompt must not be empty", param)
    for j, t in enumerate(ids):
        if not _is_int(t) or not 0 <= t < vocab:
            raise _bad_prompt(f"{param}[{j}] = {t!r} is not a token id in [0, {vocab})", param)
    return list(ids)


#: ``fits(prompt, param)``: raises when a text or token-id prompt cannot fit the context,
#: before it is encoded whole (or its ids checked).
FitCheck = Callable[[str | Sequence[Any], str], None]


def _no_check(prompt: str | Sequence[Any], param: str) -> None:
    pass


def count_prompts(raw: Any) -> int:
    """How many prompts ``raw`` holds, without looking at each (for the sequence limit)."""
    if isinstance(raw, list) and raw and not _is_int(raw[0]):
        return len(raw)
    return 1


def parse_prompts(
    raw: Any, tok: Tokenizer, max_prompts: int, fits: FitCheck = _no_check
) -> list[list[int]]:
    """Token ids of each prompt: a string, a list of strings, a list of token ids, or a
    list of lists of token ids. Raises ``ValidationError`` (400, ``param: prompt``) for
    anything else, an empty prompt, an id outside the vocabulary, or more than
    ``max_prompts`` prompts; ``fits`` refuses a prompt too long for the context before it is
    encoded. Text is encoded with the tokenizer's special tokens (BOS)."""
    vocab = tok.vocab_size
    if raw is None:
        raise ValidationError(
            "'prompt' is required", param="prompt", code="missing_required_parameter"
        )
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw and _is_int(raw[0]):
        fits(raw, "prompt")
        if all(_is_int(t) for t in raw):
            return [_check_ids(raw, vocab, "prompt")]
        items = raw
    elif isinstance(raw, list):
        items = raw
    else:
        raise _bad_prompt("prompt must be a string, a list of strings or a list of token ids")
    if not items:
        raise _bad_prompt("prompt must not be empty")
    if len(items) > max_prompts:
        raise _bad_prompt(f"at most {max_prompts} prompts per request, got {len(items)}")
    out: list[list[int]] = []
    for p, item in enumerate(items):
        param = f"prompt[{p}]"
        if isinstance(item, str):
            if not item:
                raise _bad_prompt("a prompt must not be empty", param)
            fits(item, "prompt" if raw is item else param)
            ids = tok.encode(item, add_special_tokens=True)
            if not ids:
                raise _bad_prompt("the prompt encodes to no tokens", param)
            out.append(ids)
        elif isinstance(item, list):
            fits(item, param)
            out.append(_check_ids(item, vocab, param))
        else:
            raise _bad_prompt(
                "prompt must be a string, a list of strings or a list of token ids", param
            )
    return out
