"""``/score`` and ``/v1/score``, ``/rerank``, ``/v1/rerank`` and ``/v2/rerank`` (Jina's and
Cohere's shape, as vLLM serves them). As vLLM decides from the model's own pooling task: an
``embed`` model (bi-encoder) has every text embedded (one engine request each) and scores the
cosine similarity of each pair's embeddings; a ``classify`` model (cross-encoder, one label)
reads each (query, document) pair as its tokenizer pairs them, one ``classify`` request per
pair, and the score is its one (activated) output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs
import msgspec
import numpy as np

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.pooling import (
    ListResponse,
    PoolingLimits,
    PoolingPlan,
    Vector,
    check_count,
    tokenize_items,
    too_long,
    too_many,
    truncate_ids,
)
from smg_trio.protocol.types import PoolingOptions

__all__ = [
    "RERANK",
    "RERANK_V2",
    "SCORE",
    "RerankRequest",
    "RerankResponse",
    "ScoreRequest",
    "ScoreResponse",
    "cosine",
]


def cosine(a: Vector, b: Vector) -> float:
    """Cosine similarity (0 for a zero vector)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(np.dot(x, y) / norm) if norm else 0.0


def _texts(raw: Any, param: str) -> list[str]:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        return list(raw)
    raise ValidationError(
        f"'{param}' must be a string or a list of strings (text inputs only)",
        param=param,
        code="invalid_value",
    )


def _embed_both(
    first: list[str],
    second: list[str],
    names: tuple[str, str],
    served: ServedModel,
    limits: PoolingLimits,
    truncate: int | None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of both sides, the item and token limits counted over both."""
    check_count(len(first), limits, names[0])
    check_count(len(second), limits, names[1])
    check_count(len(first) + len(second), limits, names[1])
    a = tokenize_items(
        first, served.tokenizer, limits, param=names[0], truncate_prompt_tokens=truncate
    )
    used = sum(len(i) for i in a)
    rest = attrs.evolve(limits, max_tokens=max(limits.max_tokens - used, 1))
    b = tokenize_items(
        second, served.tokenizer, rest, param=names[1], truncate_prompt_tokens=truncate
    )
    return a, b


def _cross_encoder(model_task: str | None) -> bool:
    """vLLM's score type: ``classify`` models are cross-encoders, the rest bi-encoders (a
    model not known yet is taken as ``embed``; the route plans again if it is not)."""
    return model_task == "classify"


def _check_one_label(served: ServedModel) -> None:
    """vLLM serves scores from a classifier only with ``num_labels == 1``."""
    labels = served.pooling.labels
    if len(labels) > 1:
        raise ValidationError(
            f"model {served.model_id!r} classifies into {len(labels)} labels: scoring a pair "
            "needs a cross-encoder with one label (num_labels == 1)",
            param="model",
            code="unsupported_task",
        )


@attrs.frozen
class _Pairs:
    """A cross-encoder's tokenized pairs and each pair's token-type start."""

    items: list[list[int]]
    options: list[PoolingOptions]

    @property
    def tokens(self) -> int:
        return sum(len(i) for i in self.items)


def _pair_items(
    first: list[str],
    second: list[str],
    names: tuple[str, str],
    served: ServedModel,
    limits: PoolingLimits,
    truncate: int | None,
    use_activation: bool | None,
) -> _Pairs:
    """One engine input per pair (``first``'s one text, or its i-th, with ``second``'s i-th),
    tokenized as vLLM's cross-encoder does (``tokenizer(text, text_pair)``) and truncated as a
    whole; the item and token limits as for single texts."""
    _check_one_label(served)
    check_count(len(second), limits, names[1])
    if truncate is not None and not -1 <= truncate <= limits.max_model_len:
        raise ValidationError(
            f"truncate_prompt_tokens must be in [-1, {limits.max_model_len}]",
            param="truncate_prompt_tokens",
            code="invalid_value",
        )
    tok = served.tokenizer
    items: list[list[int]] = []
    options: list[PoolingOptions] = []
    total = 0
    for i, doc in enumerate(second):
        query = first[0 if len(first) == 1 else i]
        for name, text in zip(names, (query, doc), strict=True):
            if not text:
                raise ValidationError(
                    f"{name} must not hold an empty text", param=name, code="invalid_value"
                )
        where = f"the pair {i}"
        lower = tok.min_tokens(query, limits.max_model_len) + tok.min_tokens(
            doc, limits.max_model_len
        )
        if truncate is None and lower > limits.max_model_len:
            raise too_long(where, f"at least {lower}", limits, names[1])
        if total + lower > limits.max_tokens:
            raise too_many(limits, names[1])
        ids, start = tok.encode_pair(query, doc)
        ids = truncate_ids(ids, truncate, "right", limits.max_model_len)
        if len(ids) > limits.max_model_len:
            raise too_long(where, str(len(ids)), limits, names[1])
        total += len(ids)
        if total > limits.max_tokens:
            raise too_many(limits, names[1])
        items.append(ids)
        options.append(
            PoolingOptions(
                task="classify",
                use_activation=use_activation,
                token_type_start=None if start is None else min(start, len(ids)),
            )
        )
    return _Pairs(items, options)


def _pair_score(vec: Vector) -> float:
    """A cross-encoder's score: its one output (vLLM's ``ScoringRequestOutput.score``)."""
    flat = np.asarray(vec, dtype=np.float64).reshape(-1)
    if flat.size != 1:
        raise ValidationError(
            f"the model's classifier gave {flat.size} outputs for a pair: scoring needs a "
            "cross-encoder with one label (num_labels == 1)",
            param="model",
            code="unsupported_task",
        )
    return float(flat[0])


#: The response from each pair's score, the prompt tokens, the response id and its time.
_Respond = Callable[[list[float], int, str, int], msgspec.Struct]


def _score_plan(
    first: list[str],
    second: list[str],
    names: tuple[str, str],
    body: ScoreRequest | RerankRequest,
    served: ServedModel,
    limits: PoolingLimits,
    model_task: str | None,
    respond: _Respond,
) -> PoolingPlan:
    """The plan that scores ``first``'s one text (or its i-th) against each of ``second``'s:
    one ``classify`` request per pair for a cross-encoder, else one ``embed`` request per text
    and the cosine of each pair's embeddings."""
    assumed = model_task or "embed"
    if _cross_encoder(assumed):
        pairs = _pair_items(
            first, second, names, served, limits, body.truncate_prompt_tokens, body.use_activation
        )

        def render_pairs(vectors: list[Vector], response_id: str, created: int) -> msgspec.Struct:
            return respond([_pair_score(v) for v in vectors], pairs.tokens, response_id, created)

        return PoolingPlan(
            pairs.items,
            pairs.options[0],
            render_pairs,
            body.priority,
            item_options=pairs.options,
            model_task=assumed,
        )
    a, b = _embed_both(first, second, names, served, limits, body.truncate_prompt_tokens)
    tokens = sum(len(i) for i in a) + sum(len(i) for i in b)
    split = len(a)

    def render(vectors: list[Vector], response_id: str, created: int) -> msgspec.Struct:
        left, right = vectors[:split], vectors[split:]
        scores = [cosine(left[0 if split == 1 else i], r) for i, r in enumerate(right)]
        return respond(scores, tokens, response_id, created)

    options = PoolingOptions(task="embed", use_activation=body.use_activation)
    return PoolingPlan(a + b, options, render, body.priority, model_task=assumed)


class ScoreRequest(msgspec.Struct, kw_only=True):
    """vLLM's score requests: one pair of ``text_1``/``text_2``, ``data_1``/``data_2``,
    ``queries``/``documents`` or ``queries``/``items``."""

    model: str | None = None
    text_1: Any = None
    text_2: Any = None
    data_1: Any = None
    data_2: Any = None
    queries: Any = None
    documents: Any = None
    items: Any = None
    truncate_prompt_tokens: int | None = None
    use_activation: bool | None = None
    priority: int = 0

    def pair(self) -> tuple[tuple[str, Any], tuple[str, Any]]:
        """The one pair of sides given, with their field names."""
        for a, b in (
            ("text_1", "text_2"),
            ("data_1", "data_2"),
            ("queries", "documents"),
            ("queries", "items"),
        ):
            first, second = getattr(self, a), getattr(self, b)
            if first is not None and second is not None:
                return (a, first), (b, second)
        raise ValidationError(
            "give text_1 and text_2 (or data_1/data_2, queries/documents, queries/items)",
            param="text_1",
            code="missing_required_parameter",
        )


class ScoreData(msgspec.Struct):
    """One pair's score."""

    index: int
    object: str
    score: float


class ScoreResponse(ListResponse[ScoreData]):
    """vLLM's ``ScoreResponse``."""


class ScoreApi:
    """``/score`` and ``/v1/score``: one side's single text against each of the other's, or
    the two sides pairwise (same length)."""

    name = "score"
    id_prefix = "score-"
    body_type = ScoreRequest

    def plan(
        self,
        body: ScoreRequest,
        served: ServedModel,
        limits: PoolingLimits,
        model_task: str | None = None,
    ) -> PoolingPlan:
        (n1, raw1), (n2, raw2) = body.pair()
        t1, t2 = _texts(raw1, n1), _texts(raw2, n2)
        if len(t1) != 1 and len(t1) != len(t2):
            raise ValidationError(
                f"{n1} has {len(t1)} inputs and {n2} {len(t2)}: give one, or as many as {n2}",
                param=n1,
                code="invalid_value",
            )

        def respond(
            scores: list[float], tokens: int, response_id: str, created: int
        ) -> ScoreResponse:
            data = [ScoreData(i, "score", score) for i, score in enumerate(scores)]
            return ScoreResponse.of(data, response_id, created, served.model_id, tokens)

        return _score_plan(t1, t2, (n1, n2), body, served, limits, model_task, respond)


SCORE = ScoreApi()


class RerankRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``RerankRequest`` (Jina and Cohere): ``top_n`` 0 returns every document;
    ``return_documents`` (Cohere's field; vLLM always returns them) false leaves them out."""

    query: Any
    documents: Any
    model: str | None = None
    top_n: int = 0
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None
    use_activation: bool | None = None
    priority: int = 0


class RerankDocument(msgspec.Struct, omit_defaults=True):
    """The document's text."""

    text: str | None = None


class RerankResult(msgspec.Struct, omit_defaults=True):
    """One document's place: its index in the request and its relevance score."""

    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(msgspec.Struct):
    """Rerank's usage (no completion tokens)."""

    prompt_tokens: int
    total_tokens: int


class RerankResponse(msgspec.Struct, kw_only=True):
    """vLLM's ``RerankResponse``: results by descending relevance."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


@attrs.frozen
class RerankApi:
    """``/rerank``, ``/v1/rerank`` (Jina) and ``/v2/rerank`` (Cohere): one shape."""

    name: Literal["rerank", "rerank_v2"] = "rerank"
    id_prefix: str = "rerank-"
    body_type: type[RerankRequest] = RerankRequest

    def plan(
        self,
        body: RerankRequest,
        served: ServedModel,
        limits: PoolingLimits,
        model_task: str | None = None,
    ) -> PoolingPlan:
        if not isinstance(body.query, str) or not body.query:
            raise ValidationError(
                "'query' must be a non-empty string", param="query", code="invalid_value"
            )
        if body.top_n < 0:
            raise ValidationError("top_n must be >= 0", param="top_n", code="invalid_value")
        docs = _texts(body.documents, "documents")
        top_n, keep = body.top_n, body.return_documents

        def ranked(
            scores: list[float], tokens: int, response_id: str, created: int
        ) -> RerankResponse:
            results = [
                RerankResult(i, score, RerankDocument(docs[i]) if keep else None)
                for i, score in enumerate(scores)
            ]
            results.sort(key=lambda r: r.relevance_score, reverse=True)
            if top_n:
                results = results[:top_n]
            return RerankResponse(
                id=response_id,
                model=served.model_id,
                usage=RerankUsage(tokens, tokens),
                results=results,
            )

        names = ("query", "documents")
        return _score_plan([body.query], docs, names, body, served, limits, model_task, ranked)


RERANK = RerankApi()
RERANK_V2 = RerankApi(name="rerank_v2")
