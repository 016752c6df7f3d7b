"""SSE bodies for tests, read with the conformance runner's strict parser (``conformance.sse``):
whole bodies, bodies fed as they arrive, and httpx response streams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from conformance.sse import DONE, SseDecoder

__all__ = ["DONE", "SseEvents", "sse_chunks", "sse_events", "sse_payloads"]


def _event(payload: str) -> Any:
    return payload if payload == DONE else json.loads(payload)


class SseEvents:
    """A body fed as it arrives: :meth:`feed` returns the events of the frames it completed
    (parsed JSON objects, or the string ``"[DONE]"``) and asserts the framing so far."""

    def __init__(self) -> None:
        # OpenAI's frames are one data line; a stream whose first frame names its event
        # (Anthropic's, the Responses API's) must name every one.
        self._decoder = SseDecoder(named=None)

    def feed(self, data: bytes) -> list[Any]:
        payloads = self._decoder.feed(data)
        assert not self._decoder.problems, self._decoder.problems
        return [_event(p) for p in payloads]

    def close(self) -> None:
        """The body ended: asserts nothing was left unterminated."""
        self._decoder.close()
        assert not self._decoder.problems, self._decoder.problems


def sse_events(raw: str | bytes) -> list[Any]:
    """Split a whole SSE body into events: parsed JSON objects, or the string ``"[DONE]"``.
    Asserts the framing (``data: ...`` frames, each ended by a blank line)."""
    events = SseEvents()
    out = events.feed(raw.encode() if isinstance(raw, str) else raw)
    events.close()
    return out


def sse_chunks(raw: str | bytes) -> list[dict[str, Any]]:
    """The JSON chunks of a whole stream, which must end with exactly one ``[DONE]`` (left out)."""
    events = sse_events(raw)
    done = events.count(DONE)
    assert done == 1, f"expected one [DONE], got {done}"
    assert events[-1] == DONE, "data after [DONE]"
    return events[:-1]


async def sse_payloads(resp: httpx.Response) -> AsyncIterator[str]:
    """The payloads (JSON text, or ``"[DONE]"``) of a streamed response, each as soon as its
    frame is complete; asserts the framing. Consume it to the end."""
    decoder = SseDecoder()
    async for chunk in resp.aiter_bytes():
        for payload in decoder.feed(chunk):
            yield payload
        assert not decoder.problems, decoder.problems
    decoder.close()
    assert not decoder.problems, decoder.problems
