"""``/classify`` (labels from the model's ``config.json``) and ``/pooling`` (the raw pooled
output) in vLLM 0.32's shapes."""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec
import numpy as np

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.embeddings import check_dimensions
from smg_trio.gateway.openai.pooling import (
    ListResponse,
    PoolingLimits,
    PoolingPlan,
    Vector,
    encode_vector,
    tokenize_input,
)
from smg_trio.protocol.types import PoolingOptions, PoolingTask

__all__ = [
    "CLASSIFY",
    "POOLING",
    "ClassificationResponse",
    "ClassifyRequest",
    "PoolingRequest",
    "PoolingResponse",
]


class ClassifyRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``ClassificationCompletionRequest``."""

    input: Any
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True
    use_activation: bool | None = None
    priority: int = 0


class ClassificationData(msgspec.Struct):
    """One input's class probabilities and its most likely label."""

    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(ListResponse[ClassificationData]):
    """vLLM's ``ClassificationResponse``."""


class ClassifyApi:
    """``/classify``."""

    name = "classify"
    id_prefix = "classify-"
    body_type = ClassifyRequest

    def plan(
        self,
        body: ClassifyRequest,
        served: ServedModel,
        limits: PoolingLimits,
        model_task: str | None = None,
    ) -> PoolingPlan:
        items = tokenize_input(body, served.tokenizer, limits)
        tokens = sum(len(i) for i in items)
        info = served.pooling

        def render(vectors: list[Vector], response_id: str, created: int) -> ClassificationResponse:
            data = []
            for i, v in enumerate(vectors):
                probs: list[float] = np.asarray(v, dtype=np.float64).reshape(-1).tolist()
                label = info.label(int(np.argmax(v))) if probs else None
                data.append(ClassificationData(i, label, probs, len(probs)))
            return ClassificationResponse.of(data, response_id, created, served.model_id, tokens)

        options = PoolingOptions(task="classify", use_activation=body.use_activation)
        return PoolingPlan(items, options, render, body.priority)


CLASSIFY = ClassifyApi()


class PoolingRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``PoolingCompletionRequest`` (``task``: the model's own unless given)."""

    input: Any
    model: str | None = None
    task: Literal["embed", "classify", "token_embed", "token_classify"] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True
    use_activation: bool | None = None
    priority: int = 0


class PoolingData(msgspec.Struct):
    """One input's pooled output: nested lists (its shape) or base64 of float32 bytes."""

    index: int
    object: str
    data: Any


class PoolingResponse(ListResponse[PoolingData]):
    """vLLM's ``PoolingResponse``."""


class PoolingRawApi:
    """``/pooling``."""

    name = "pooling"
    id_prefix = "pool-"
    body_type = PoolingRequest

    def plan(
        self,
        body: PoolingRequest,
        served: ServedModel,
        limits: PoolingLimits,
        model_task: str | None = None,
    ) -> PoolingPlan:
        # Without a task, the model's own (vLLM's get_pooling_task), "embed" until known.
        assumed = None if body.task else (model_task or "embed")
        task = body.task or (assumed if assumed in get_args(PoolingTask) else "embed")
        if body.dimensions is not None and task not in ("embed", "token_embed"):
            raise ValidationError(
                f"dimensions is not a parameter of the {task!r} task",
                param="dimensions",
                code="invalid_value",
            )
        check_dimensions(body.dimensions, served, "dimensions")
        items = tokenize_input(body, served.tokenizer, limits)
        tokens = sum(len(i) for i in items)
        fmt = body.encoding_format

        def render(vectors: list[Vector], response_id: str, created: int) -> PoolingResponse:
            data = [
                PoolingData(
                    i,
                    "pooling",
                    encode_vector(v, "base64")
                    if fmt == "base64"
                    else np.asarray(v, dtype=np.float64).tolist(),
                )
                for i, v in enumerate(vectors)
            ]
            return PoolingResponse.of(data, response_id, created, served.model_id, tokens)

        options = PoolingOptions(
            task=task,  # type: ignore[arg-type]
            dimensions=body.dimensions,
            use_activation=body.use_activation,
        )
        return PoolingPlan(items, options, render, body.priority, model_task=assumed)


POOLING = PoolingRawApi()
