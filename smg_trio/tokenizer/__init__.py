"""Gateway-side tokenization: tokenizer, chat templates, EOS, detokenizer, stops."""

from __future__ import annotations

from smg_trio.tokenizer.chat_template import (
    CONTENT_FORMATS,
    ChatTemplate,
    normalize_messages,
    request_template,
)
from smg_trio.tokenizer.core import Tokenizer
from smg_trio.tokenizer.detokenizer import IncrementalDetokenizer
from smg_trio.tokenizer.eos import resolve_eos
from smg_trio.tokenizer.logprobs import token_bytes, token_text
from smg_trio.tokenizer.stop import StopMatcher, single_token_stop_ids

__all__ = [
    "CONTENT_FORMATS",
    "ChatTemplate",
    "IncrementalDetokenizer",
    "StopMatcher",
    "Tokenizer",
    "normalize_messages",
    "request_template",
    "resolve_eos",
    "single_token_stop_ids",
    "token_bytes",
    "token_text",
]
