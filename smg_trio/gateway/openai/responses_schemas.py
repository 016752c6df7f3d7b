"""msgspec Structs of the OpenAI Responses API: the ``POST /v1/responses`` body and the
``response`` object."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

__all__ = ["ResponseDeleted", "ResponseObject", "ResponsesRequest"]


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses``. ``input`` is a string or a list of items; ``store`` defaults
    to true, as OpenAI's. Unknown fields are ignored; ``background`` and ``n`` other than 1 are refused."""

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
