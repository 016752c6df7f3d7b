"""msgspec Structs of the OpenAI Responses API: the ``POST /v1/responses`` body and the
``response`` object."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = ["ResponseDeleted", "ResponseObject", "ResponsesRequest"]


Includable = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses``. ``input`` is a string or a list of items; ``store`` defaults
    to true, as OpenAI's. Unknown fields are ignored; ``n`` other than 1 is refused;
    ``background`` needs the store."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    background: bool | None = False
    truncation: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    #: OpenAI's cache routing key: sticky routing under ``--policy cache_aware``.
    prompt_cache_key: str | None = None
    #: Not OpenAI's (a response has one output): read only to refuse anything but 1.
    n: int | None = None
    #: OpenAI's includable names (vLLM 0.32 takes the same list); only
    #: ``message.output_text.logprobs`` changes the answer (with ``top_logprobs``).
    include: list[Includable] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    #: vLLM's: the engine's prefix cache (and ``cache_aware`` routing) key blocks by it.
    cache_salt: str | None = None
    #: vLLM's: ``false`` leaves the reasoning items (and the logprobs) out of the answer.
    include_reasoning: bool | None = True


class ResponseObject(msgspec.Struct, kw_only=True):
    """The ``response`` object (``status``: ``completed``, ``incomplete``, ``failed``, or
    ``in_progress`` while streaming)."""

    id: str
    object: str = "response"
    created_at: int
    model: str
    status: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    text: dict[str, Any]
    reasoning: dict[str, Any] | None = None
    store: bool
    metadata: dict[str, Any]
    truncation: str = "disabled"
    background: bool = False


class ResponseDeleted(msgspec.Struct):
    """``DELETE /v1/responses/{id}``."""

    id: str
    object: str = "response.deleted"
    deleted: bool = True
