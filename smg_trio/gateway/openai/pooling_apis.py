"""The pooling route table: ``POST`` path -> the pooling API served there (vLLM 0.32's paths),
with its OpenAPI operation id, summary and response schema."""

from __future__ import annotations

from typing import Any

import attrs

from smg_trio.gateway.openai.classify import (
    CLASSIFY,
    POOLING,
    ClassificationResponse,
    PoolingResponse,
)
from smg_trio.gateway.openai.embeddings import (
    EMBED_V2,
    EMBEDDINGS,
    CohereEmbedResponse,
    EmbeddingResponse,
)
from smg_trio.gateway.openai.pooling import PoolingApi
from smg_trio.gateway.openai.score import RERANK, RERANK_V2, SCORE, RerankResponse, ScoreResponse

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
    PoolingRoute(
        "/pooling",
        POOLING,
        "pooling",
        "The raw pooled output (vLLM's shape; the model's own task unless given)",
        PoolingResponse,
    ),
    PoolingRoute(
        "/classify",
        CLASSIFY,
        "classify",
        "Class probabilities and labels (config.json id2label); needs a classify model",
        ClassificationResponse,
    ),
    PoolingRoute(
        "/score",
        SCORE,
        "score",
        "Pair scores: a cross-encoder's, or the cosine of a bi-encoder's embeddings (vLLM's shape)",
        ScoreResponse,
    ),
    PoolingRoute("/v1/score", SCORE, "scoreV1", "Pair scores (as /score)", ScoreResponse),
    PoolingRoute(
        "/rerank",
        RERANK,
        "rerank",
        "Documents by relevance to a query (Jina's shape; cross- or bi-encoders), top_n",
        RerankResponse,
    ),
    PoolingRoute("/v1/rerank", RERANK, "rerankV1", "As /rerank", RerankResponse),
    PoolingRoute(
        "/v2/rerank", RERANK_V2, "rerankV2", "As /rerank (Cohere's v2 path)", RerankResponse
    ),
)
