"""The HTTP/1.1 answer reader the bench clients share (standard library only, so that
``bench/lean_client.py`` stays free of smg_trio and trio): a head, a chunked or sized body,
and a streamed chat answer's TTFT, completion tokens and content chunks.

Per streamed request: TTFT is the time from writing the request to the first event whose
``delta.content`` is non-empty; completion tokens come from the final usage event; a content
chunk is an event with non-empty content.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

__all__ = ["HttpError", "Http1Reader", "Response"]

_CONTENT = b'"delta":{"content":"'
_EMPTY_CONTENT = b'"delta":{"content":""'


class HttpError(Exception):
    """A non-200 answer, an error event, or a broken response."""


@dataclass
class Response:
    status: int = 0
    ttft_s: float | None = None
    completion_tokens: int = 0
    content_chunks: int = 0
    body: bytes = b""


class Http1Reader:
    """The reading half of one keep-alive HTTP/1.1 connection: a subclass gives
    :meth:`_receive` (its transport's read) and sends the requests."""

    def __init__(self) -> None:
        self.buf = bytearray()

    async def _receive(self) -> bytes:
        raise NotImplementedError

    async def _fill(self) -> None:
        data = await self._receive()
        if not data:
            raise HttpError("connection closed by the server")
        self.buf += data

    async def _head(self) -> tuple[int, bool, int]:
        """(status, chunked, content-length or -1)."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            await self._fill()
        head = bytes(self.buf[:end]).lower()
        del self.buf[: end + 4]
        status = int(head[9:12])
        chunked = b"transfer-encoding: chunked" in head
        length = -1
        if not chunked:
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
        return status, chunked, length

    async def _chunk(self) -> bytes:
        """The next chunk's payload of a chunked body; b"" for the last (0-size) chunk."""
        while (eol := self.buf.find(b"\r\n")) < 0:
            await self._fill()
        size = int(self.buf[:eol].split(b";", 1)[0], 16)
        need = eol + 2 + size + 2
        while len(self.buf) < need:
            await self._fill()
        data = bytes(self.buf[eol + 2 : eol + 2 + size])
        del self.buf[:need]
        return data

    async def _body(self, chunked: bool, length: int) -> bytes:
        if chunked:
            parts = []
            while chunk := await self._chunk():
                parts.append(chunk)
            return b"".join(parts)
        if length < 0:
            raise HttpError("response without length")
        while len(self.buf) < length:
            await self._fill()
        data = bytes(self.buf[:length])
        del self.buf[:length]
        return data

    async def _answer(self, t0: float, stream: bool) -> Response:
        """The whole answer to the request written at ``t0`` (``time.perf_counter``)."""
        status, chunked, length = await self._head()
        resp = Response(status=status)
        if status != 200 or not stream:
            resp.body = await self._body(chunked, length)
            if status != 200:
                raise HttpError(f"HTTP {status}: {resp.body[:300]!r}")
            return resp
        if not chunked:
            raise HttpError("a streamed answer must be chunked")
        pending = b""
        done = False
        while not done:
            chunk = await self._chunk()
            if not chunk:
                break
            pending += chunk
            if b"\n\n" not in pending:
                continue
            *events, pending = pending.split(b"\n\n")
            for ev in events:
                if not ev.startswith(b"data: "):
                    continue
                if ev == b"data: [DONE]":
                    done = True
                    continue
                if _CONTENT in ev and _EMPTY_CONTENT not in ev:
                    resp.content_chunks += 1
                    if resp.ttft_s is None:
                        resp.ttft_s = time.perf_counter() - t0
                elif b'"completion_tokens"' in ev:
                    usage = json.loads(ev[6:]).get("usage") or {}
                    resp.completion_tokens = int(usage.get("completion_tokens", 0))
                elif b'"error"' in ev:
                    raise HttpError(f"error event: {ev[:300]!r}")
        if done:
            while await self._chunk():  # the terminating 0-size chunk
                pass
        return resp
