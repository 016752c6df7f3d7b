"""msgspec Structs of Anthropic's Messages API: the request of ``POST /v1/messages`` (and of
``count_tokens``) and the ``message`` it answers."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

__all__ = [
    "AnthropicMessage",
    "AnthropicUsage",
    "CountTokensRequest",
    "CountTokensResponse",
    "MessagesRequest",
]


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/messages/count_tokens``: what shapes the prompt (no sampling fields)."""

    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    """``POST /v1/messages``. ``max_tokens`` is required (>= 1), as Anthropic's API has it;
    ``temperature`` >= 0, ``top_p`` in (0, 1], ``top_k`` >= -1. Unknown fields (``metadata``,
    ``service_tier``...) are ignored."""

    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None
    #: vLLM's: the engine's prefix cache (and ``cache_aware`` routing) key blocks by it.
    cache_salt: str | None = None


class CountTokensResponse(msgspec.Struct):
    """``{"input_tokens": N}``."""

    input_tokens: int


class AnthropicUsage(msgspec.Struct, omit_defaults=True):
    """``usage``: prompt and generated token counts (``cache_read_input_tokens``, the prompt
    tokens read from the prefix cache, only with ``--enable-prompt-tokens-details``; then
    ``input_tokens`` excludes them)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True):
    """The ``message`` object: ``content`` blocks (``thinking``, ``text``, ``tool_use``),
    ``stop_reason`` (``end_turn``, ``max_tokens``, ``stop_sequence``, ``tool_use``)."""

    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None = None
    usage: AnthropicUsage
