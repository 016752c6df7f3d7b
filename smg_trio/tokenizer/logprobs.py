"""Logprob rendering helpers: each token's text and UTF-8 bytes as OpenAI shows them."""

from __future__ import annotations

from smg_trio.tokenizer.core import Tokenizer

__all__ = ["token_bytes", "token_text"]


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """Text of ``token_id`` decoded on its own with special tokens kept (``"<|im_end|>"``
    stays); a token holding part of a multi-byte character yields U+FFFD."""
    return tokenizer.token_text(token_id)


def token_bytes(tokenizer: Tokenizer, token_id: int) -> list[int]:
    """UTF-8 bytes (ints 0-255) of :func:`token_text`, for OpenAI ``logprobs[].bytes``; a
    partial-character token therefore gives ``[239, 191, 189]`` (U+FFFD)."""
    return tokenizer.token_bytes(token_id)
