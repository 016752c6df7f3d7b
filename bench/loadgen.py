"""A lean HTTP/1.1 load generator for OpenAI chat completions, on trio sockets.

It shares a 2-core machine with the gateway under test, so it does as little as it can: one
keep-alive connection per worker, one pre-built request, a minimal response-head parser, a
chunked-transfer decoder, and SSE events split on blank lines. Only the events before the
first token and the final usage event are JSON-decoded; the others are counted by substring.

Per streamed request it records:

* TTFT: from just before the request is written to the arrival of the first event whose
  ``delta.content`` is non-empty (the role-only first chunk does not count);
* completion tokens: ``usage.completion_tokens`` of the final event
  (``stream_options.include_usage``), and the content chunks, for tokens per chunk.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from http1 import Http1Reader, HttpError, Response

__all__ = ["HttpConnection", "HttpError", "LoadResult", "build_request", "chat_body", "run_load"]


def chat_body(model: str, prompt: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def build_request(port: int, body: dict[str, Any], path: str = "/v1/chat/completions") -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nAccept: */*\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


class HttpConnection(Http1Reader):
    """One keep-alive HTTP/1.1 connection; :meth:`request` sends one request and reads the
    whole answer (SSE or JSON)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__()
        self.stream = stream

    @classmethod
    async def connect(cls, port: int) -> HttpConnection:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def _receive(self) -> bytes:
        return await self.stream.receive_some(65536)

    async def request(self, raw: bytes, *, stream: bool) -> Response:
        t0 = time.perf_counter()
        await self.stream.send_all(raw)
        return await self._answer(t0, stream)


@dataclass
class LoadResult:
    requests: int = 0
    errors: int = 0
    completion_tokens: int = 0
    content_chunks: int = 0
    ttfts_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    loadgen_cpu_s: float = 0.0
    first_error: str | None = None


async def run_load(
    port: int,
    raw: bytes,
    *,
    stream: bool,
    concurrency: int,
    total: int,
    expect_tokens: int,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> LoadResult:
    """``concurrency`` workers, each on its own connection, send ``raw`` back to back until
    ``total`` requests finished. Connections are opened before the window starts and closed
    after it ends; ``on_start``/``on_end`` are called at its edges (to read the gateway's CPU
    counters)."""
    conns = []
    try:
        for _ in range(concurrency):
            conns.append(await HttpConnection.connect(port))
        result = LoadResult()
        remaining = iter(range(total))

        async def worker(conn: HttpConnection) -> None:
            for _ in remaining:
                try:
                    resp = await conn.request(raw, stream=stream)
                except HttpError as exc:
                    result.errors += 1
                    result.first_error = result.first_error or str(exc)
                    return
                result.requests += 1
                if stream:
                    result.completion_tokens += resp.completion_tokens
                    result.content_chunks += resp.content_chunks
                    if resp.ttft_s is not None:
                        result.ttfts_s.append(resp.ttft_s)
                else:
                    result.completion_tokens += expect_tokens

        if on_start is not None:
            on_start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(worker, conn)
        result.wall_s = time.perf_counter() - wall0
        result.loadgen_cpu_s = time.process_time() - cpu0
        if on_end is not None:
            on_end()
        return result
    finally:
        for conn in conns:  # synchronous: also runs to the end when cancelled
            conn.stream.socket.close()
