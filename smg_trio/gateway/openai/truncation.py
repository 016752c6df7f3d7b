"""vLLM's prompt truncation: ``truncate_prompt_tokens`` and ``truncation_side``."""

from __future__ import annotations

from collections.abc import Sequence

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.schemas import SamplingRequest

__all__ = ["truncate_all", "truncate_ids", "truncation_limit"]


def truncation_limit(body: SamplingRequest, max_model_len: int) -> int | None:
    """How many prompt tokens to keep (``None``: no truncation), as vLLM 0.32's renderer
    reads ``truncate_prompt_tokens``: ``-1`` is the context less one token (room for the
    completion); more than the context is a 400 in vLLM's words."""
    n = body.truncate_prompt_tokens
    if n is None:
        return None
    if n == -1:
        return max(0, max_model_len - 1)
    if n > max_model_len:
        raise ValidationError(
            f"truncate_prompt_tokens={n} cannot be greater than max_model_len = "
            f"{max_model_len}. Please request a smaller truncation size.",
            param="truncate_prompt_tokens",
        )
    return n


def truncate_ids(ids: list[int], limit: int | None, side: str | None) -> list[int]:
    """``ids`` cut to ``limit`` tokens: ``left`` (vLLM's default for generation) keeps the
    last ones, ``right`` the first ones."""
    if limit is None or len(ids) <= limit:
        return ids
    return ids[:limit] if side == "right" else ids[len(ids) - limit :]


def truncate_all(
    prompts: Sequence[list[int]], limit: int | None, side: str | None
) -> list[list[int]]:
    """:func:`truncate_ids` of each prompt."""
    return [truncate_ids(p, limit, side) for p in prompts]
