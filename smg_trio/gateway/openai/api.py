"""The seam between the HTTP handler skeleton and an API module: ``InferenceApi`` plans a
decoded body into a ``Job``, asking the request only what ``RequestScope`` offers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import msgspec

from smg_trio.backend import ServedModel
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.fanout import SubRequest
from smg_trio.gateway.openai.framing import StreamRenderer
from smg_trio.gateway.openai.schemas import SamplingRequest
from smg_trio.gateway.openai.textgen import ChoiceCollector

__all__ = ["InferenceApi", "Job", "RequestScope"]

T = TypeVar("T")
B = TypeVar("B", bound=SamplingRequest)


class RequestScope(Protocol):
    """What a planner may ask of the request it plans (``RequestCall`` is one)."""

    @property
    def response_id(self) -> str:
        """The response's ``id`` (``chatcmpl-...``)."""

    @property
    def created(self) -> int:
        """The response's ``created`` (Unix seconds)."""

    @property
    def config(self) -> GatewayHttpConfig:
        """The gateway's limits."""

    async def tokenize(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (template rendering, encoding) inline or in a worker thread."""

    def reserve_engine_id(self) -> str:
        """The engine request id base, unique whatever the client sent."""


class Job(Protocol):
    """One planned request: the sub-requests of its choices, ready to submit, and how to
    render what they produce (a stream of chunks, or one result)."""

    @property
    def subs(self) -> Sequence[SubRequest]:
        """One sub-request per choice, in choice order."""

    @property
    def prompt_tokens(self) -> int:
        """``usage.prompt_tokens``."""

    @property
    def stream(self) -> bool:
        """Whether the client asked for server-sent events."""

    @property
    def data_parallel_rank(self) -> int | None:
        """The DP rank the client pinned (checked against the leased worker's ranks)."""

    @property
    def answered(self) -> bool:
        """Every choice finished without the engine (completions' echo with max_tokens=0):
        the renderer's ``start`` and ``end`` are the whole stream."""

    def renderer(self) -> StreamRenderer:
        """The chunk renderer of the stream."""

    def result(self, collected: ChoiceCollector | None) -> msgspec.Struct:
        """The non-streaming response (``collected``: ``None`` when ``answered``)."""


class InferenceApi(Protocol[B]):
    """One inference API (chat completions, completions, ...): its body type, its metrics
    name and response id prefix, and its planner."""

    @property
    def name(self) -> str:
        """The ``endpoint`` label of its metrics."""

    @property
    def id_prefix(self) -> str:
        """Put before the request id to make the response id."""

    @property
    def body_type(self) -> type[B]:
        """The request body's schema."""

    async def plan(self, body: B, served: ServedModel, scope: RequestScope) -> Job:
        """Validate ``body`` for ``served``, tokenize its prompt and build its sub-requests;
        raises ``ValidationError``/``UnsupportedField`` (a 400) for what cannot be served."""
