"""Pooling requests, engine-neutral: input items checked and tokenized under the per-request
limits, one engine request per item run together in one nursery, the pooled vectors out."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

import attrs
import msgspec
import numpy as np
import numpy.typing as npt
import trio

from smg_trio.backend import ServedModel
from smg_trio.connector.client import EngineClient
from smg_trio.connector.stream import RequestStream
from smg_trio.errors import RequestStreamClosed, ValidationError
from smg_trio.exc_groups import first_failure
from smg_trio.gateway.openai.errors import EngineRequestFailed, engine_failure
from smg_trio.gateway.openai.schemas import Usage
from smg_trio.protocol.types import EngineOutput, GenerateRequest, PoolingOptions, SamplingOptions
from smg_trio.tokenizer import Tokenizer

__all__ = [
    "PoolingApi",
    "check_generates",
    "ListResponse",
    "PoolingLimits",
    "PoolingPlan",
    "TextInput",
    "Vector",
    "encode_vector",
    "run_pooling",
    "tokenize_input",
    "tokenize_items",
    "too_long",
    "too_many",
    "truncate_ids",
]

#: One pooled output (a float32 numpy array).
Vector = npt.NDArray[Any]

_NO_SAMPLING = SamplingOptions(max_tokens=1)


def _bad(message: str, param: str, code: str = "invalid_value") -> ValidationError:
    return ValidationError(message, param=param, code=code)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@attrs.frozen
class PoolingLimits:
    """What one pooling request may ask: ``max_items`` inputs (engine requests), each of at
    most ``max_model_len`` tokens (after ``truncate_prompt_tokens``), ``max_tokens`` in all."""

    max_items: int
    max_tokens: int
    max_model_len: int


@attrs.define
class PoolingPlan:
    """A checked, tokenized pooling request: the token ids of each engine request, their
    pooling options, and how the vectors become the response."""

    items: list[list[int]]
    options: PoolingOptions
    render: Callable[[list[Vector], str, int], msgspec.Struct]
    priority: int = 0
    #: Per item, where items differ (a cross-encoder pair's token types); else ``options``.
    item_options: list[PoolingOptions] | None = None
    #: The model pooling task the plan was made for (``None``: any).
    model_task: str | None = None

    @property
    def prompt_tokens(self) -> int:
        """``usage.prompt_tokens``: every item's tokens."""
        return sum(len(i) for i in self.items)


D = TypeVar("D")


class ListResponse(msgspec.Struct, Generic[D], kw_only=True):
    """vLLM's list envelope of a pooling response: one ``data`` entry per input, usage."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[D]
    usage: Usage

    @classmethod
    def of(cls, data: list[D], response_id: str, created: int, model: str, tokens: int) -> Self:
        """The response for ``model`` with ``tokens`` prompt tokens (no completion)."""
        return cls(
            id=response_id, created=created, model=model, data=data, usage=Usage(tokens, 0, tokens)
        )


B = TypeVar("B")


class PoolingApi(Protocol[B]):
    """One pooling API: its metrics ``endpoint`` label, response id prefix, body schema, and
    its planner (check and tokenize the body; may run in a worker thread)."""

    @property
    def name(self) -> str: ...

    @property
    def id_prefix(self) -> str: ...

    @property
    def body_type(self) -> type[B]: ...

    def plan(
        self, body: B, served: ServedModel, limits: PoolingLimits, model_task: str | None
    ) -> PoolingPlan:
        """The plan for a model whose own pooling task is ``model_task`` (``None``: not
        known yet): an API whose plan depends on it (score, ``/pooling`` without a task) sets
        ``PoolingPlan.model_task``, and the route plans again if the engine's differs."""
        ...


def check_generates(client: EngineClient, model: str) -> None:
    """400 for a generation request to an engine known to pool only (``--runner pooling``)."""
    if client.tasks.refuses_generation():
        tasks = ", ".join(sorted(client.tasks.tasks or ()))
        raise ValidationError(
            f"model {model!r} is a pooling model (its engine serves: {tasks}); it does not "
            "generate text: use /v1/embeddings, /classify, /score or /rerank",
            param="model",
            code="unsupported_task",
        )


def check_count(count: int, limits: PoolingLimits, param: str) -> None:
    """400 for no item or more than ``limits.max_items``, before any is tokenized."""
    if count == 0:
        raise _bad(f"'{param}' must not be empty", param)
    if count > limits.max_items:
        raise _bad(
            f"at most {limits.max_items} inputs per request, got {count}",
            param,
            "too_many_inputs",
        )


def too_long(where: str, count: str, limits: PoolingLimits, param: str) -> ValidationError:
    """400 ``context_length_exceeded`` for an item over the model's context."""
    return _bad(
        f"{where} has {count} tokens, more than the model's context of "
        f"{limits.max_model_len} (set truncate_prompt_tokens to truncate it)",
        param,
        "context_length_exceeded",
    )


def too_many(limits: PoolingLimits, param: str) -> ValidationError:
    """400 ``too_many_tokens`` for inputs over the request's token budget."""
    return _bad(
        f"the inputs hold more than {limits.max_tokens} tokens in all", param, "too_many_tokens"
    )


def truncate_ids(ids: list[int], truncate: int | None, side: str, max_len: int) -> list[int]:
    """``ids`` cut to ``truncate`` tokens (``-1``: the context) from ``side``."""
    if truncate is None:
        return ids
    keep = max_len if truncate < 0 else truncate
    if len(ids) <= keep:
        return ids
    return ids[-keep:] if side == "left" and keep else ids[:keep]


def tokenize_items(
    raw: Sequence[Any] | str,
    tok: Tokenizer,
    limits: PoolingLimits,
    *,
    param: str,
    truncate_prompt_tokens: int | None = None,
    truncation_side: Literal["left", "right"] = "right",
    add_special_tokens: bool = True,
) -> list[list[int]]:
    """Token ids of each input of ``raw``: a string, a list of strings, a list of token ids
    or a list of such lists (OpenAI's ``input``). 400 naming ``param`` for an empty input or
    item, an id outside the vocabulary, too many items, an item over the context (unless
    ``truncate_prompt_tokens`` truncates it) or more than ``limits.max_tokens`` in all,
    checked as each item is encoded."""
    if isinstance(raw, str):
        items: Sequence[Any] = [raw]
    elif isinstance(raw, list) and raw and all(_is_int(t) for t in raw):
        items = [raw]
    elif isinstance(raw, list):
        items = raw
    else:
        raise _bad(f"'{param}' must be a string, a list of strings or token ids", param)
    if truncate_prompt_tokens is not None and truncate_prompt_tokens < -1:
        raise _bad("truncate_prompt_tokens must be >= -1", "truncate_prompt_tokens")
    if truncate_prompt_tokens is not None and truncate_prompt_tokens > limits.max_model_len:
        raise _bad(
            f"truncate_prompt_tokens ({truncate_prompt_tokens}) is more than the model's "
            f"context ({limits.max_model_len})",
            "truncate_prompt_tokens",
        )
    check_count(len(items), limits, param)
    vocab = tok.vocab_size
    out: list[list[int]] = []
    total = 0
    for i, item in enumerate(items):
        where = f"{param}[{i}]" if len(items) > 1 or raw is not item else param
        if isinstance(item, str):
            if not item:
                raise _bad(f"{where} must not be empty", param)
            # Refused before it is encoded whole when it cannot fit (a lower bound from its
            # length: nothing that could fit is refused).
            lower = tok.min_tokens(item, limits.max_model_len)
            if truncate_prompt_tokens is None and lower > limits.max_model_len:
                raise too_long(where, f"at least {lower}", limits, param)
            if total + lower > limits.max_tokens:
                raise too_many(limits, param)
            ids = tok.encode(item, add_special_tokens=add_special_tokens)
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise _bad(f"{where} holds {bad}, not a token id in [0, {vocab})", param)
            ids = list(item)
        else:
            raise _bad(f"{where} must be a non-empty string or list of token ids", param)
        if not ids:
            raise _bad(f"{where} encodes to no tokens", param)
        ids = truncate_ids(ids, truncate_prompt_tokens, truncation_side, limits.max_model_len)
        if len(ids) > limits.max_model_len:
            raise too_long(where, str(len(ids)), limits, param)
        total += len(ids)
        if total > limits.max_tokens:
            raise too_many(limits, param)
        out.append(ids)
    return out


class TextInput(Protocol):
    """A request's ``input`` and the fields that say how it is tokenized."""

    @property
    def input(self) -> Any: ...

    @property
    def truncate_prompt_tokens(self) -> int | None: ...

    @property
    def truncation_side(self) -> Literal["left", "right"] | None: ...

    @property
    def add_special_tokens(self) -> bool: ...


def tokenize_input(body: TextInput, tok: Tokenizer, limits: PoolingLimits) -> list[list[int]]:
    """``tokenize_items`` of ``body.input`` as its own fields ask (truncation from the right
    unless told)."""
    return tokenize_items(
        body.input,
        tok,
        limits,
        param="input",
        truncate_prompt_tokens=body.truncate_prompt_tokens,
        truncation_side=body.truncation_side or "right",
        add_special_tokens=body.add_special_tokens,
    )


def encode_vector(vec: Vector, encoding_format: str) -> list[float] | str:
    """``float``: a JSON list; ``base64``: the little-endian float32 bytes, base64 (OpenAI's
    and vLLM's default ``embed_dtype``)."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vec, dtype="<f4").tobytes()).decode()
    out: list[float] = vec.astype(np.float64).tolist()
    return out


async def _receive(stream: RequestStream) -> list[EngineOutput]:
    try:
        outputs = await stream.receive_some()
    except RequestStreamClosed:
        if stream.aborted:  # retired because its client is gone
            raise EngineRequestFailed(
                "the client went away", "client_disconnected", status=499
            ) from None
        raise EngineRequestFailed(
            "the engine ended the request without finishing it", "engine_aborted"
        ) from None
    if not outputs:
        raise EngineRequestFailed("the engine stream ended without a finish", "engine_aborted")
    return outputs


async def _pool_one(
    client: EngineClient, request: GenerateRequest, out: list[Vector], i: int
) -> None:
    """Run one item to its pooled output; leaving early ABORTs it (``client.generate``)."""
    async with client.generate(request) as stream:
        while True:
            for o in await _receive(stream):
                if o.finish_reason is None:
                    continue
                if o.finish_reason != "stop" or o.pooling is None:
                    if o.finish_reason == "error":
                        raise engine_failure(o.error)
                    raise EngineRequestFailed(
                        f"the engine ended pooling request {request.request_id} "
                        f"({o.finish_reason}) without a pooled output",
                        "engine_aborted",
                    )
                out[i] = o.pooling
                return


async def run_pooling(
    client: EngineClient, plan: PoolingPlan, engine_id: str, arrival_time: float
) -> list[Vector]:
    """One engine request per item (``{engine_id}-{i}``), all in one nursery: the first
    failure (or a cancellation: the client went away) ends and ABORTs the others. Returns
    the pooled vectors in item order."""
    requests = [
        GenerateRequest(
            request_id=f"{engine_id}-{i}",
            prompt_token_ids=ids,
            sampling=_NO_SAMPLING,
            pooling=plan.options if plan.item_options is None else plan.item_options[i],
            arrival_time=arrival_time,
            priority=plan.priority,
        )
        for i, ids in enumerate(plan.items)
    ]
    out: list[Vector] = [np.empty(0, dtype=np.float32)] * len(requests)
    try:
        async with trio.open_nursery() as nursery:
            for i, request in enumerate(requests):
                nursery.start_soon(_pool_one, client, request, out, i)
    except BaseExceptionGroup as group:
        raise first_failure(group) from None
    return out
