"""``/tokenize``, ``/detokenize`` and ``/version`` in vLLM's shapes: no engine involved, only
the served model's tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.chat import check_chat_input
from smg_trio.gateway.openai.template_kwargs import merge_template_kwargs
from smg_trio.gateway.openai.translate import encode_within_context

__all__ = [
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TokenizeRequest",
    "TokenizeResponse",
    "VersionResponse",
    "detokenize",
    "tokenize",
]


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``TokenizeCompletionRequest`` (``prompt``) or ``TokenizeChatRequest``
    (``messages``), exactly one of the two. ``add_special_tokens`` defaults to true for a
    prompt and false for messages (the chat template writes them), as in vLLM."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    return_token_strs: bool | None = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    """``count`` ids, the model's ``max_model_len``, the ids, and (when asked) each id's
    vocabulary string (``null`` otherwise)."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """``tokens``: the ids to decode (each in the vocabulary)."""

    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct):
    """The decoded text, under vLLM's name ``prompt``."""

    prompt: str


class VersionResponse(msgspec.Struct):
    """``GET /version``."""

    version: str


def tokenize(
    body: TokenizeRequest,
    served: ServedModel,
    default_chat_template_kwargs: Mapping[str, Any] | None = None,
) -> TokenizeResponse:
    """Encode ``body.prompt``, or render ``body.messages`` with the chat template and encode
    that. Raises ``ValidationError`` (400) for neither or both, for options that contradict,
    for messages or tools that chat would refuse (:func:`check_chat_input`), and for a text
    of more tokens than the model's context (:func:`encode_within_context`)."""
    tok = served.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise ValidationError(
            "exactly one of 'prompt' and 'messages' is required",
            param="prompt" if body.prompt is not None else "messages",
            code="invalid_value",
        )
    if body.prompt is not None:
        special = body.add_special_tokens is not False
        ids = encode_within_context(served, body.prompt, "prompt", add_special_tokens=special)
    else:
        assert body.messages is not None
        if body.continue_final_message and body.add_generation_prompt:
            raise ValidationError(
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message",
                code="invalid_value",
            )
        check_chat_input(body.messages, body.tools)  # chat answers these with a 400 too
        text = tok.apply_chat_template(
            body.messages,
            tools=body.tools,
            add_generation_prompt=bool(body.add_generation_prompt),
            continue_final_message=bool(body.continue_final_message),
            chat_template_kwargs=merge_template_kwargs(
                body.chat_template_kwargs, defaults=default_chat_template_kwargs
            ),
        )
        ids = encode_within_context(
            served, text, "messages", add_special_tokens=bool(body.add_special_tokens)
        )
    strs = None
    if body.return_token_strs:
        strs = [tok.id_to_token(i) or "" for i in ids]
    return TokenizeResponse(
        count=len(ids), max_model_len=served.max_model_len, tokens=ids, token_strs=strs
    )


def detokenize(body: DetokenizeRequest, served: ServedModel) -> DetokenizeResponse:
    """Decode ``body.tokens`` (special tokens kept, as vLLM's ``/detokenize``). Raises
    ``ValidationError`` (400 naming ``tokens[i]``) for an id outside the vocabulary, and
    (``tokens``) for more ids than the model's context: a text of that many ids can be up to
    the longest token's length times longer, and no route produces more."""
    tok = served.tokenizer
    vocab = tok.vocab_size
    if len(body.tokens) > served.max_model_len:
        raise ValidationError(
            f"This model's maximum context length is {served.max_model_len} tokens, but "
            f"{len(body.tokens)} were given; this gateway decodes at most that many.",
            param="tokens",
            code="context_length_exceeded",
        )
    for i, t in enumerate(body.tokens):
        if not 0 <= t < vocab:
            raise ValidationError(
                f"token id {t} is outside the vocabulary [0, {vocab})",
                param=f"tokens[{i}]",
                code="invalid_value",
            )
    return DetokenizeResponse(tok.decode(body.tokens, skip_special_tokens=False))
