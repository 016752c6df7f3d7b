"""``GET /openapi.json``: an OpenAPI 3.1 document built from the msgspec schemas and a route table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs
import msgspec

from smg_trio.gateway.openai.chat_batch import BatchChatCompletionRequest
from smg_trio.gateway.openai.errors import ErrorBody
from smg_trio.gateway.openai.invocations import InvocationRequest
from smg_trio.gateway.openai.messages_schemas import (
    AnthropicMessage,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
)
from smg_trio.gateway.openai.pooling_apis import POOLING_APIS
from smg_trio.gateway.openai.responses_schemas import (
    ResponseDeleted,
    ResponseObject,
    ResponsesRequest,
)
from smg_trio.gateway.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from smg_trio.gateway.openai.tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    VersionResponse,
)

__all__ = ["OPERATIONS", "Operation", "openapi_document"]

#: Who may call an operation: ``api`` needs ``--api-key`` when one is set, ``admin`` needs
#: ``--admin-api-key`` (or the ``--api-key`` when no admin key is set), ``public`` is open.
Auth = Literal["api", "admin", "public"]

_REF = "#/components/schemas/{name}"
_JSON = "application/json"
_SSE = "text/event-stream"
_TEXT = "text/plain"
_OBJECT: dict[str, Any] = {"type": "object"}


@attrs.frozen
class Operation:
    """One documented route. ``request``/``response`` are msgspec types (``None``: no body, or
    a free-form JSON object). ``path`` uses OpenAPI's ``{param}``; each ``{param}`` is a string.
    ``stream``: ``"stream": true`` answers ``text/event-stream``. ``errors``: the documented
    error statuses (each an OpenAI error envelope)."""

    method: Literal["get", "post", "delete"]
    path: str
    operation_id: str
    summary: str
    auth: Auth
    tag: str
    request: type | None = None
    response: type | None = None
    response_type: str = _JSON
    stream: bool = False
    query: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


_INFERENCE_ERRORS = ("400", "401", "404", "413", "415", "429", "500", "503", "504")
#: The engine-free routes' (``http/utility.py``): the body and admission steps, no engine.
_UTILITY_ERRORS = ("400", "401", "404", "413", "415", "429")


def _inference(
    path: str, operation_id: str, summary: str, tag: str, request: type, response: type
) -> Operation:
    """An inference route (an ``INFERENCE_APIS`` row): a JSON body, SSE with stream=true."""
    return Operation(
        "post",
        path,
        operation_id,
        summary,
        "api",
        tag,
        request=request,
        response=response,
        stream=True,
        errors=_INFERENCE_ERRORS,
    )


def _utility(
    name: str, summary: str, alias_summary: str, request: type, response: type
) -> tuple[Operation, Operation]:
    """A vLLM utility route at ``/v1/{name}`` and the same at vLLM's own ``/{name}``."""
    v1 = Operation(
        "post",
        f"/v1/{name}",
        name,
        summary,
        "api",
        "vllm",
        request=request,
        response=response,
        errors=_UTILITY_ERRORS,
    )
    return v1, attrs.evolve(v1, path=f"/{name}", operation_id=f"{name}Vllm", summary=alias_summary)


#: The documented API. A new route (Responses, Messages, tokenize...) adds a row here, with
#: its msgspec request and response types.
OPERATIONS: tuple[Operation, ...] = (
    _inference(
        "/v1/chat/completions",
        "createChatCompletion",
        "Chat completion (OpenAI); streams SSE with stream=true",
        "openai",
        ChatCompletionRequest,
        ChatCompletion,
    ),
    _inference(
        "/v1/completions",
        "createCompletion",
        "Text completion (OpenAI legacy); streams SSE with stream=true",
        "openai",
        CompletionRequest,
        Completion,
    ),
    Operation(
        "post",
        "/v1/chat/completions/batch",
        "createChatCompletionBatch",
        "vLLM's batch chat completion: messages is a list of conversations, one choice each "
        "(no streaming, no tools, n = 1)",
        "api",
        "vllm",
        request=BatchChatCompletionRequest,
        response=ChatCompletion,
        errors=_INFERENCE_ERRORS,
    ),
    _inference(
        "/invocations",
        "invocations",
        "SageMaker's route (vLLM's): a chat completion for a body with messages, else a "
        "completion for one with prompt",
        "vllm",
        InvocationRequest,
        ChatCompletion,
    ),
    _inference(
        "/v1/responses",
        "createResponse",
        "OpenAI Responses; streams response.* events with stream=true",
        "openai",
        ResponsesRequest,
        ResponseObject,
    ),
    Operation(
        "post",
        "/v1/responses/{response_id}/cancel",
        "cancelResponse",
        "Cancel a background response that runs in this process (vLLM's route)",
        "api",
        "openai",
        response=ResponseObject,
        errors=("400", "401", "404", "409"),
    ),
    Operation(
        "get",
        "/v1/responses/{response_id}",
        "getResponse",
        "A stored response (this process's store)",
        "api",
        "openai",
        response=ResponseObject,
        errors=("401", "404"),
    ),
    Operation(
        "delete",
        "/v1/responses/{response_id}",
        "deleteResponse",
        "Delete a stored response",
        "api",
        "openai",
        response=ResponseDeleted,
        errors=("401", "404"),
    ),
    _inference(
        "/v1/messages",
        "createMessage",
        "Anthropic Messages; streams Anthropic's events with stream=true; errors in "
        "Anthropic's envelope; x-api-key or bearer auth",
        "anthropic",
        MessagesRequest,
        AnthropicMessage,
    ),
    Operation(
        "post",
        "/v1/messages/count_tokens",
        "countMessageTokens",
        "Anthropic Messages: the prompt's input_tokens",
        "api",
        "anthropic",
        request=CountTokensRequest,
        response=CountTokensResponse,
        errors=_UTILITY_ERRORS,
    ),
    *_utility(
        "tokenize",
        "Tokenize a prompt or chat messages (vLLM's shape; also at /tokenize)",
        "Tokenize (vLLM's path)",
        TokenizeRequest,
        TokenizeResponse,
    ),
    *_utility(
        "detokenize",
        "Decode token ids (vLLM's shape; also at /detokenize); an id outside the vocabulary "
        "is a 400",
        "Decode token ids (vLLM's path)",
        DetokenizeRequest,
        DetokenizeResponse,
    ),
    Operation(
        "get",
        "/version",
        "version",
        "The gateway's version",
        "public",
        "probes",
        response=VersionResponse,
    ),
    Operation(
        "get", "/v1/models", "listModels", "The served models", "api", "openai", response=ModelList
    ),
    Operation(
        "get",
        "/v1/models/{model_id}",
        "retrieveModel",
        "One served model",
        "api",
        "openai",
        response=ModelCard,
        errors=("401", "404"),
    ),
    *(
        Operation(
            "post",
            r.path,
            r.operation_id,
            r.summary,
            "api",
            "vllm",
            request=r.api.body_type,
            response=r.response,
            errors=_INFERENCE_ERRORS,
        )
        for r in POOLING_APIS
    ),
    Operation(
        "get",
        "/health",
        "health",
        "200 while an engine is alive, else 503",
        "public",
        "probes",
        response_type=_TEXT,
    ),
    Operation(
        "get",
        "/ping",
        "ping",
        "SageMaker's probe (vLLM's route): /health's answer",
        "public",
        "probes",
        response_type=_TEXT,
    ),
    Operation(
        "post",
        "/ping",
        "pingPost",
        "SageMaker's probe (vLLM's route): /health's answer",
        "public",
        "probes",
        response_type=_TEXT,
    ),
    Operation(
        "get",
        "/liveness",
        "liveness",
        "200 while the process serves",
        "public",
        "probes",
        response_type=_TEXT,
    ),
    Operation(
        "get",
        "/readiness",
        "readiness",
        "200 when a worker and its tokenizer are ready and the gateway is not draining, else 503",
        "public",
        "probes",
    ),
    Operation(
        "get",
        "/metrics",
        "metrics",
        "Prometheus metrics",
        "public",
        "probes",
        response_type=_TEXT,
    ),
    Operation("get", "/openapi.json", "openapi", "This document", "public", "probes"),
)

_SECURITY = {"api": "apiKey", "admin": "adminKey"}


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def _content(media: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {media: {"schema": schema}}


def _operation(op: Operation, schemas: dict[type, dict[str, Any]]) -> dict[str, Any]:
    ok_schema = schemas[op.response] if op.response is not None else _OBJECT
    if op.response_type != _JSON:
        ok_schema = {"type": "string"}
    ok_content = _content(op.response_type, ok_schema)
    if op.stream:
        ok_content |= _content(_SSE, {"type": "string"})
    status = "202" if op.operation_id == "addWorker" else "200"
    responses: dict[str, Any] = {status: {"description": "success", "content": ok_content}}
    error = {
        "description": "an OpenAI error envelope",
        "content": _content(_JSON, schemas[ErrorBody]),
    }
    for code in op.errors:
        responses[code] = error
    if op.auth != "public" and "401" not in responses:
        responses["401"] = error
    responses["4XX"] = error  # any other client error: still the envelope
    doc: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "security": [{_SECURITY[op.auth]: []}] if op.auth != "public" else [],
        "responses": responses,
    }
    params = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in _path_params(op.path)
    ] + [
        {"name": q, "in": "query", "required": False, "schema": {"type": "string"}}
        for q in op.query
    ]
    if params:
        doc["parameters"] = params
    if op.request is not None:
        doc["requestBody"] = {"required": True, "content": _content(_JSON, schemas[op.request])}
    return doc


def openapi_document(
    operations: Sequence[Operation] = OPERATIONS, *, version: str = "0", extra: Iterable[type] = ()
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``; ``extra``: more msgspec types to publish in
    ``components.schemas``. Security applies only when the gateway runs with the matching key
    (``--api-key``, ``--admin-api-key``)."""
    types: list[type] = [ErrorBody]
    for op in operations:
        types += [t for t in (op.request, op.response) if t is not None]
    types += list(extra)
    unique = list(dict.fromkeys(types))
    refs, components = msgspec.json.schema_components(unique, ref_template=_REF)
    schemas = dict(zip(unique, refs, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method] = _operation(op, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "smg_trio",
            "version": version,
            "description": "An OpenAI-compatible gateway. Errors are OpenAI envelopes "
            '{"error": {"message", "type", "param", "code"}}. The keys apply only when the '
            "gateway is started with --api-key / --admin-api-key; without --admin-api-key the "
            "--api-key also guards the admin routes.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "--api-key: inference and model routes",
                },
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "--admin-api-key (default: the --api-key): /workers, /get_loads",
                },
            },
        },
    }
