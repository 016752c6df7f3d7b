"""``/v1/embeddings`` (OpenAI's shape, with vLLM's extra fields) and ``/v2/embed`` (Cohere's,
as vLLM serves it): inputs checked and tokenized into a pooling plan, vectors rendered."""

from __future__ import annotations

import builtins
from typing import Any, Literal

import msgspec
import numpy as np

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.pooling import (
    ListResponse,
    PoolingLimits,
    PoolingPlan,
    Vector,
    encode_vector,
    tokenize_input,
    tokenize_items,
)
from smg_trio.protocol.types import PoolingOptions

__all__ = [
    "EMBED_V2",
    "EMBEDDINGS",
    "CohereEmbedRequest",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "check_dimensions",
]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``EmbeddingCompletionRequest``: OpenAI's fields and vLLM's extras."""

    input: Any
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True
    use_activation: bool | None = None
    priority: int = 0


class EmbeddingData(msgspec.Struct):
    """One input's vector (a list of floats, or base64 of little-endian float32)."""

    index: int
    object: str
    embedding: list[float] | str


class EmbeddingResponse(ListResponse[EmbeddingData]):
    """OpenAI's ``CreateEmbeddingResponse`` with vLLM's ``id`` and ``created``."""


def check_dimensions(dimensions: int | None, served: ServedModel, param: str) -> None:
    """400 naming ``param`` for ``dimensions`` the model cannot give (vLLM's rules: the model
    must be Matryoshka, the value in ``[1, hidden_size]`` and among its listed dimensions)."""
    if dimensions is None:
        return
    info, name = served.pooling, served.model_id
    if not info.matryoshka:
        raise ValidationError(
            f"Model {name!r} does not support Matryoshka embeddings; dimensions must be unset "
            f"(received dimensions={dimensions}).",
            param=param,
            code="invalid_value",
        )
    top = info.hidden_size
    if dimensions < 1 or (top is not None and dimensions > top):
        raise ValidationError(
            f"Model {name!r} only supports dimensions in range [1, {top}], got {dimensions}.",
            param=param,
            code="invalid_value",
        )
    mds = info.matryoshka_dimensions
    if mds is not None and dimensions not in mds:
        raise ValidationError(
            f"Model {name!r} only supports Matryoshka dimensions {list(mds)}, got {dimensions}.",
            param=param,
            code="invalid_value",
        )


class EmbeddingsApi:
    """``/v1/embeddings``."""

    name = "embeddings"
    id_prefix = "embd-"
    body_type = EmbeddingRequest

    def plan(
        self,
        body: EmbeddingRequest,
        served: ServedModel,
        limits: PoolingLimits,
        model_task: str | None = None,
    ) -> PoolingPlan:
        check_dimensions(body.dimensions, served, "dimensions")
        items = tokenize_input(body, served.tokenizer, limits)
        fmt = body.encoding_format
        tokens = sum(len(i) for i in items)

        def render(vectors: list[Vector], response_id: str, created: int) -> EmbeddingResponse:
            data = [
                EmbeddingData(i, "embedding", encode_vector(v, fmt)) for i, v in enumerate(vectors)
            ]
            return EmbeddingResponse.of(data, response_id, created, served.model_id, tokens)

        options = PoolingOptions(
            task="embed", dimensions=body.dimensions, use_activation=body.use_activation
        )
        return PoolingPlan(items, options, render, body.priority)


EMBEDDINGS = EmbeddingsApi()


class CohereEmbedRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``CohereEmbedRequest`` (text inputs: ``texts``)."""

    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[Any] | None = None
    model: str | None = None
    input_type: str | None = None
    output_dimension: int | None = None
    embedding_types: list[Literal["float", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = None
    priority: int = 0


class CohereEmbeddings(msgspec.Struct, omit_defaults=True):
    """``embeddings_by_type``: one list per asked type."""

    float: list[list[builtins.float]] | None = None  # the field shadows the builtin
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereEmbedResponse(msgspec.Struct, kw_only=True):
    """vLLM's ``CohereEmbedResponse``."""

    id: str
    embeddings: CohereEmbeddings
    texts: list[str] | None = None
    meta: dict[str, Any] | None = None
    response_type: str = "embeddings_by_type"


def _packed(vectors: list[Vector], signed: bool) -> list[list[int]]:
    """Bits MSB-first, positive -> 1 (Cohere's ``binary``: shifted to int8)."""
    out = []
    for v in vectors:
        packed = np.packbits(np.asarray(v) > 0).astype(np.int64)
        out.append((packed - 128 if signed else packed).tolist())
    return out


class CohereEmbedApi:
    """``/v2/embed`` (text only: ``images`` and ``inputs`` are a 400)."""

    name = "embed_v2"
    id_prefix = "embd-"
    body_type = CohereEmbedRequest

    def plan(
        self,
        body: CohereEmbedRequest,
        served: ServedModel,
        limits: PoolingLimits,
        model_task: str | None = None,
    ) -> PoolingPlan:
        if body.images is not None or body.inputs is not None:
            raise ValidationError(
                "only 'texts' inputs are served (no images)", param="texts", code="invalid_value"
            )
        if body.texts is None:
            raise ValidationError(
                "Exactly one of texts, images, or inputs must be provided, and it must be "
                "non-empty",
                param="texts",
                code="invalid_value",
            )
        if body.input_type is not None:
            raise ValidationError(
                f"Unsupported input_type {body.input_type!r}. This model does not define any "
                "input_type task instructions.",
                param="input_type",
                code="invalid_value",
            )
        check_dimensions(body.output_dimension, served, "output_dimension")
        if body.truncate == "NONE":
            truncate, side = None, "right"
        else:
            truncate = -1 if body.max_tokens is None else body.max_tokens
            side = "left" if body.truncate == "START" else "right"
        items = tokenize_items(
            list(body.texts),
            served.tokenizer,
            limits,
            param="texts",
            truncate_prompt_tokens=truncate,
            truncation_side=side,  # type: ignore[arg-type]
        )
        if body.truncate == "NONE" and body.max_tokens is not None:
            for i, ids in enumerate(items):
                if len(ids) > body.max_tokens:
                    raise ValidationError(
                        f"texts[{i}] has {len(ids)} tokens, more than max_tokens "
                        f"({body.max_tokens}) with truncate=NONE. Set truncate to END or "
                        "START to truncate it.",
                        param="max_tokens",
                        code="invalid_value",
                    )
        types = body.embedding_types or ["float"]
        tokens = sum(len(i) for i in items)
        texts = list(body.texts)

        def render(vectors: list[Vector], response_id: str, created: int) -> CohereEmbedResponse:
            out = CohereEmbeddings()
            for t in dict.fromkeys(types):
                if t == "float":
                    out.float = [v.astype(np.float64).tolist() for v in vectors]
                elif t == "base64":
                    out.base64 = [str(encode_vector(v, "base64")) for v in vectors]
                elif t == "binary":
                    out.binary = _packed(vectors, signed=True)
                else:
                    out.ubinary = _packed(vectors, signed=False)
            meta = {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}
            return CohereEmbedResponse(id=response_id, embeddings=out, texts=texts, meta=meta)

        options = PoolingOptions(task="embed", dimensions=body.output_dimension)
        return PoolingPlan(items, options, render, body.priority)


EMBED_V2 = CohereEmbedApi()
