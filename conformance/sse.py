"""Strict parser for OpenAI-style SSE bodies: ``data: <json>\\n\\n`` frames ending in ``[DONE]``."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DONE", "SseDecoder", "SseStream", "parse_sse"]

DONE = "[DONE]"


@dataclass
class SseStream:
    """The decoded events of one SSE body, plus every framing problem found."""

    events: list[dict[str, Any]] = field(default_factory=list)
    """JSON payloads of the ``data:`` frames, in order (``[DONE]`` and errors excluded)."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """In-stream error payloads (``{"error": ...}``)."""
    done_count: int = 0
    problems: list[str] = field(default_factory=list)


def _payloads(
    frames: Sequence[str], problems: list[str], first: int = 0, named: bool = False
) -> Iterator[tuple[int, str]]:
    """Each frame's position (counted from ``first``) and ``data: `` payload, comment-only
    frames skipped; framing problems go to ``problems`` as each frame is read. ``named``:
    each frame is an ``event: `` line then one ``data: `` line (Anthropic's and the
    Responses API's streams)."""
    for pos, frame in enumerate(frames, first):
        lines = [ln for ln in frame.split("\n") if not ln.startswith(":")]
        if not lines:
            continue  # comment-only frame (keep-alive)
        if "\r" in frame:
            problems.append(f"frame {pos} contains a carriage return: {frame[:80]!r}")
        if named:
            if not lines[0].startswith("event: "):
                problems.append(
                    f"frame {pos} does not start with an 'event: ' line: {frame[:120]!r}"
                )
            lines = lines[1:]
        data_lines = [ln for ln in lines if ln.startswith("data: ")]
        if len(lines) != 1 or len(data_lines) != 1:
            problems.append(f"frame {pos} is not a single 'data: ' line: {frame[:120]!r}")
            if not data_lines:
                continue
        yield pos, data_lines[0][len("data: ") :]


def parse_sse(body: bytes) -> SseStream:
    """Parse ``body`` and record anything that is not OpenAI's SSE shape.

    Rules: frames are separated by a blank line (``\\n\\n``) and the body ends with one; each
    frame is one ``data: `` line (``:`` comment lines are allowed, as SSE keep-alives); the
    payload is a JSON object or ``[DONE]``; ``[DONE]`` appears exactly once, as the last frame.
    """
    out = SseStream()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        out.problems.append(f"SSE body is not UTF-8: {exc}")
        return out
    if not text:
        out.problems.append("SSE body is empty")
        return out
    pieces = text.split("\n\n")
    if pieces[-1] != "":
        out.problems.append(f"SSE body does not end with a blank line: tail {pieces[-1][-80:]!r}")
    frames = pieces[:-1] + ([pieces[-1]] if pieces[-1] else [])
    seen_done = False
    for pos, payload in _payloads(frames, out.problems):
        if payload == DONE:
            out.done_count += 1
            seen_done = True
            continue
        if seen_done:
            out.problems.append(f"frame {pos} arrives after data: [DONE]: {payload[:80]!r}")
        try:
            value = json.loads(payload)
        except ValueError:
            out.problems.append(f"frame {pos} payload is not JSON: {payload[:120]!r}")
            continue
        if not isinstance(value, dict):
            out.problems.append(f"frame {pos} payload is not a JSON object: {payload[:120]!r}")
            continue
        if "error" in value:
            out.errors.append(value)
            out.problems.append(f"in-stream error event: {payload[:200]}")
            continue
        out.events.append(value)
    if out.done_count == 0:
        out.problems.append("no data: [DONE] frame")
    elif out.done_count > 1:
        out.problems.append(f"data: [DONE] sent {out.done_count} times")
    return out


class SseDecoder:
    """:func:`parse_sse`'s framing, incrementally: :meth:`feed` the body's bytes as they
    arrive and get the payloads (JSON text, or ``[DONE]``) of the frames completed so far.
    Framing problems collect in :attr:`problems`; call :meth:`close` at the end. Payloads
    are not interpreted (the caller decides what a stream must hold)."""

    def __init__(self, named: bool | None = False) -> None:
        self.problems: list[str] = []
        self._buf = b""
        self._frames = 0
        #: Frames carry an ``event: `` line (``None``: decided by the first frame).
        self.named = named

    def feed(self, data: bytes) -> list[str]:
        """Take the next bytes of the body; return the payloads of newly completed frames."""
        head, sep, self._buf = (self._buf + data).rpartition(b"\n\n")
        if not sep:
            return []
        try:
            frames = head.decode("utf-8").split("\n\n")
        except UnicodeDecodeError as exc:
            self.problems.append(f"SSE body is not UTF-8: {exc}")
            return []
        first, self._frames = self._frames, self._frames + len(frames)
        if self.named is None:
            self.named = frames[0].startswith("event: ")
        named = self.named
        return [payload for _, payload in _payloads(frames, self.problems, first, named)]

    def close(self) -> list[str]:
        """The body ended: an unterminated tail is a problem, and is read as a last frame (as
        :func:`parse_sse` does); returns its payload, if any."""
        if not self._buf:
            return []
        self.problems.append(f"SSE body does not end with a blank line: tail {self._buf[-80:]!r}")
        tail, self._buf = self._buf, b""
        return self.feed(tail + b"\n\n")
