"""Incremental detokenization: token ids in, UTF-8-safe text deltas out (prefix/read offsets)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import decoders

from smg_trio.tokenizer.core import Tokenizer

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"
# Pending tokens (decoded text still ending in U+FFFD) after which text is released anyway.
# An incomplete UTF-8 character spans at most 3 bytes, so only invalid byte soup gets here.
_MAX_PENDING = 32
# How many trailing cut points a multi-token push tries when its end is an incomplete char.
_BACKOFF = 4
# Prompt context: like vLLM, the shortest tail of >= 5 ids (up to 24) that decodes cleanly.
_CONTEXT_MIN = 5
_CONTEXT_MAX = 24


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text deltas.

    Uses the prefix-offset / read-offset technique of vLLM's ``detokenize_incrementally`` and
    HF's ``DecodeStream``: each step decodes only a short window (the tokens of the last
    emitted delta plus the pending ones) and emits the part past the window's prefix text,
    so SentencePiece leading spaces survive and the cost per token is bounded. While the
    window's text ends in U+FFFD (a multi-byte character split across tokens) nothing is
    emitted. ``"".join(deltas) + flush()`` equals
    ``tokenizer.decode(all_ids, skip_special_tokens=...)`` whenever no ``prompt_ids`` are
    given (the one exception: more than 32 consecutive tokens that all leave invalid UTF-8
    at the end are released as decoded so far).

    ``prompt_ids``: optional prompt tail used only as decode context, so the first generated
    token keeps a leading space the decoder would strip at the start of a text. It is never
    emitted. ``spaces_between_special_tokens`` is accepted for vLLM parity and has no effect
    with fast tokenizers (as in vLLM's fast path and smg).
    """

    __slots__ = ("_concat", "_decode", "_ids", "_prefix_len", "_read", "_skip")

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        prompt_ids: Sequence[int] = (),
    ) -> None:
        del spaces_between_special_tokens  # no effect with a fast tokenizer
        self._decode = tokenizer.hf.decode
        self._skip = skip_special_tokens
        # A byte-level decoder is concatenative: decoding from a clean cut (not inside a
        # character) gives exactly the emitted delta, so the next prefix needs no re-decode.
        self._concat = isinstance(tokenizer.hf.decoder, decoders.ByteLevel)
        # _ids[0] is the prefix offset; _ids[:_read] is the already emitted prefix window.
        self._ids: list[int] = self._context(prompt_ids)
        self._read = len(self._ids)
        self._prefix_len = len(self._text(self._ids)) if self._ids else 0

    def _text(self, ids: list[int]) -> str:
        return str(self._decode(ids, skip_special_tokens=self._skip))

    def _context(self, prompt_ids: Sequence[int]) -> list[int]:
        n = len(prompt_ids)
        if n == 0:
            return []
        for k in range(min(n, _CONTEXT_MIN), min(n, _CONTEXT_MAX) + 1):
            tail = list(prompt_ids[n - k :])
            if _REPLACEMENT not in self._text(tail):
                return tail
        return []

    def _advance(self, text: str, cut: int, clean: bool = True) -> str:
        """Emit ``text`` past the prefix and make ``_ids[_read:cut]`` the next prefix.
        ``clean``: ``text`` does not end inside a character."""
        delta = text[self._prefix_len :]
        ids = self._ids
        del ids[: self._read]
        self._read = cut - self._read
        if clean and self._concat:
            self._prefix_len = len(delta)
        else:
            self._prefix_len = len(self._text(ids[: self._read])) if self._read else 0
        return delta

    def push(self, token_ids: Sequence[int]) -> str:
        """Append generated ids; return the newly completed text (often ``""``)."""
        if not token_ids:
            return ""
        ids = self._ids
        ids.extend(token_ids)
        n = len(ids)
        text = self._text(ids)
        if not text.endswith(_REPLACEMENT):
            if len(text) > self._prefix_len or n - self._read > _MAX_PENDING:
                return self._advance(text, n)
            return ""
        # The end is an incomplete character: release up to the last clean cut, if any.
        for cut in range(n - 1, max(self._read, n - _BACKOFF - 1), -1):
            head = self._text(ids[:cut])
            if len(head) > self._prefix_len and not head.endswith(_REPLACEMENT):
                return self._advance(head, cut)
        if n - self._read > _MAX_PENDING:
            return self._advance(text, n, clean=False)
        return ""

    def flush(self) -> str:
        """Release whatever is pending (an unfinished character becomes U+FFFD). Call once,
        when the sequence ends."""
        if len(self._ids) == self._read:
            return ""
        text = self._text(self._ids)
        return self._advance(text, len(self._ids), clean=not text.endswith(_REPLACEMENT))
