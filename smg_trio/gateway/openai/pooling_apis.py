"""The pooling route table: ``POST`` path -> the pooling API served there (vLLM 0.32's paths),
with its OpenAPI operation id, summary and response schema."""

from __future__ import annotations

from typing import Any

import attrs

from smg_trio.gateway.openai.embeddings import (
    EMBED_V2,
    EMBEDDINGS,
    CohereEmbedResponse,
    EmbeddingResponse,
)
from smg_trio.gateway.openai.pooling import PoolingApi

__all__ = ["POOLING_APIS", "PoolingRoute"]


@attrs.frozen
class PoolingRoute:
    """One row: the path, its API, and what ``/openapi.json`` says of it."""

    path: str
    api: PoolingApi[Any]
    operation_id: str
    summary: str
    response: type


#: A new pooling API is a module with a ``PoolingApi`` and a row here.
POOLING_APIS: tuple[PoolingRoute, ...] = (
    PoolingRoute(
        "/v1/embeddings",
        EMBEDDINGS,
        "createEmbedding",
        "Embeddings (OpenAI's shape, vLLM's extra fields); needs a pooling model",
        EmbeddingResponse,
    ),
    PoolingRoute(
        "/v2/embed",
        EMBED_V2,
        "embedV2",
        "Embeddings in Cohere's v2 shape (as vLLM serves it); needs a pooling model",
        CohereEmbedResponse,
    ),
)
