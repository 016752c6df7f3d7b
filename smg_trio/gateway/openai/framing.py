"""Server-sent event bytes: chunk framing, the error event, ``[DONE]``, and the renderer seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from smg_trio.gateway.openai.errors import ErrorBody, to_api_error
from smg_trio.gateway.openai.fanout import SubRequest, usage_of
from smg_trio.gateway.openai.schemas import Usage
from smg_trio.gateway.openai.textgen import TextDelta

__all__ = [
    "DONE",
    "ChunkFramer",
    "StreamRenderer",
    "StreamUsage",
    "UsageJob",
    "error_event",
    "stream_done",
    "stream_error",
]

#: The stream terminator, sent exactly once, last.
DONE = b"data: [DONE]\n\n"

_encode = msgspec.json.encode


def error_event(exc: BaseException) -> bytes:
    """``data: {"error": {...}}`` for an error after the 200 was sent."""
    return b"data: " + _encode(ErrorBody(to_api_error(exc).detail)) + b"\n\n"


class ChunkFramer:
    """Frames chunks of one stream: the constant ``id``/``object``/``created``/``model`` head
    is encoded once; per chunk only the choice is encoded."""

    __slots__ = ("_head",)

    def __init__(self, stream_id: str, kind: str, created: int, model: str) -> None:
        self._head = b"".join(
            (
                b'data: {"id":',
                _encode(stream_id),
                b',"object":"',
                kind.encode(),
                b'","created":',
                str(created).encode(),
                b',"model":',
                _encode(model),
                b',"choices":[',
            )
        )

    def frame(self, choice: msgspec.Struct, usage: Usage | None = None) -> bytes:
        """One ``data:`` event holding ``choice`` (and a running ``usage`` if given)."""
        if usage is None:
            return self._head + _encode(choice) + b"]}\n\n"
        return self._head + _encode(choice) + b'],"usage":' + _encode(usage) + b"}\n\n"

    def usage_frame(self, usage: Usage) -> bytes:
        """The final usage chunk (``choices: []``)."""
        return self._head + b'],"usage":' + _encode(usage) + b"}\n\n"


class UsageJob(Protocol):
    """What :class:`StreamUsage` reads of a job (chat's, completions')."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def subs(self) -> Sequence[SubRequest]: ...

    @property
    def include_usage(self) -> bool: ...

    @property
    def continuous_usage(self) -> bool: ...

    @property
    def prompt_tokens_details(self) -> bool: ...

    @property
    def choices_per_prompt(self) -> int: ...


class StreamUsage:
    """A stream's ``stream_options`` usage: the running ``usage`` of each chunk with
    ``continuous_usage_stats``, the final usage chunk with ``include_usage``."""

    __slots__ = ("_continuous", "_framer", "_include", "_job")

    def __init__(self, framer: ChunkFramer, job: UsageJob) -> None:
        self._framer = framer
        self._job = job
        self._include = job.include_usage
        self._continuous = job.continuous_usage

    def running(self) -> Usage | None:
        """The ``usage`` to put on a chunk now (``None``: none asked)."""
        return self._usage() if self._continuous else None

    def _usage(self) -> Usage:
        job = self._job
        return usage_of(
            job.prompt_tokens,
            job.subs,
            details=job.prompt_tokens_details,
            per_prompt=job.choices_per_prompt,
        )

    def final(self) -> bytes:
        """The usage chunk that ends the stream before ``[DONE]``, or nothing."""
        if not self._include:
            return b""
        return self._framer.usage_frame(self._usage())


class StreamRenderer(Protocol):
    """Endpoint-specific chunk rendering."""

    def start(self) -> bytes:
        """Frames sent before any engine output (chat: one role chunk per choice)."""

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        """Frames for one choice's delta; a delta with ``finish_reason`` ends that choice."""

    def end(self) -> bytes:
        """Frames after every choice finished (the usage chunk, if asked), before ``[DONE]``."""


def stream_done(renderer: StreamRenderer) -> bytes:
    """What ends ``renderer``'s stream: its ``done`` bytes when it has them (Anthropic's and
    the Responses API's streams end with their last event), else ``[DONE]``."""
    done = getattr(renderer, "done", DONE)
    assert isinstance(done, bytes)
    return done


def stream_error(renderer: StreamRenderer, exc: BaseException) -> bytes:
    """The error event of ``renderer``'s API for ``exc`` after the 200 was sent (its
    ``error_event`` method when it has one, else OpenAI's ``data: {"error": ...}``)."""
    own = getattr(renderer, "error_event", None)
    data = error_event(exc) if own is None else own(exc)
    assert isinstance(data, bytes)
    return data
