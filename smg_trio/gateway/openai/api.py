"""The seam between the HTTP handler skeleton and an API module: an ``InferenceApi`` checks a
decoded body into a ``Draft``, which tokenizes and builds a ``Job`` to submit and render."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import attrs
import msgspec

from smg_trio.backend import ServedModel
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.fanout import SubRequest
from smg_trio.gateway.openai.framing import StreamRenderer
from smg_trio.gateway.openai.schemas import SamplingRequest
from smg_trio.gateway.openai.textgen import ChoiceCollector

__all__ = ["Draft", "InferenceApi", "Job", "ResponseIds"]

T = TypeVar("T")
B = TypeVar("B", bound=SamplingRequest)


@attrs.frozen
class ResponseIds:
    """The ids of one response: its ``id`` and ``created``, and the engine request id base
    (the response id plus a gateway-unique suffix)."""

    response_id: str
    created: int
    engine_id: str


class Draft(Protocol[T]):
    """A checked request, before its prompt is tokenized."""

    def tokenize(self) -> T:
        """Render and encode the prompt (may run in a worker thread: touches nothing else)."""

    def build(self, tokens: T, ids: ResponseIds) -> Job:
        """The sub-requests of the tokenized prompt; raises a 400 error for one that cannot
        be served (context length, token budget, what the engine's wire cannot carry)."""


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

    def check(self, body: B, served: ServedModel, config: GatewayHttpConfig) -> Draft[Any]:
        """Validate ``body`` for ``served`` (all that needs no tokenizing); raises
        ``ValidationError``/``UnsupportedField`` (a 400) for what cannot be served."""
