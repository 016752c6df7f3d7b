"""A lean HTTP/1.1 load-generator process: raw keep-alive requests on asyncio (uvloop if it is
installed), reporting its own CPU, so that a benchmark can drive load from K such processes.

Standard library only (plus optional uvloop): it imports nothing of smg_trio, so its cost is
the cost of the client alone. One process opens ``--connections`` keep-alive connections, then
prints ``ready`` and waits for a line on stdin (the coordinator reads the gateway's CPU
counters in between), sends ``--requests`` copies of the request in ``--request-file`` back
to back over them, and prints one JSON line: requests, errors, completion tokens, content
chunks, TTFTs, its wall time and its own CPU time (``time.process_time``).

Per streamed request, as ``bench/loadgen.py``: TTFT is the time from writing the request to
the first event whose ``delta.content`` is non-empty; completion tokens come from the final
usage event; a content chunk is an event with non-empty content.

    python bench/lean_client.py --port 8080 --connections 64 --requests 640 --stream \\
        --request-file req.bin

``bench/gateway.py`` (:func:`gateway.run_clients`) is the coordinator.
"""

from __future__ import annotations

import argparse
import asyncio  # noqa: TID251 (a separate client process, not smg_trio: uvloop is the lean choice)
import json
import sys
import time
from typing import Any

_CONTENT = b'"delta":{"content":"'
_EMPTY_CONTENT = b'"delta":{"content":""'


class HttpError(Exception):
    """A non-200 answer, an error event, or a broken response."""


class Conn:
    """One keep-alive HTTP/1.1 connection with a minimal response parser."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()

    async def _fill(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise HttpError("connection closed by the server")
        self.buf += data

    async def _head(self) -> tuple[int, bool, int]:
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
        while len(self.buf) < length:
            await self._fill()
        data = bytes(self.buf[:length])
        del self.buf[:length]
        return data

    async def request(self, raw: bytes, stream: bool) -> tuple[float | None, int, int]:
        """(TTFT s or None, completion tokens, content chunks) of one request."""
        t0 = time.perf_counter()
        self.writer.write(raw)
        status, chunked, length = await self._head()
        if status != 200 or not stream:
            body = await self._body(chunked, length)
            if status != 200:
                raise HttpError(f"HTTP {status}: {body[:300]!r}")
            return None, 0, 0
        ttft: float | None = None
        tokens = chunks = 0
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
                if ev == b"data: [DONE]":
                    done = True
                elif _CONTENT in ev and _EMPTY_CONTENT not in ev:
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                elif b'"completion_tokens"' in ev:
                    usage = json.loads(ev[6:]).get("usage") or {}
                    tokens = int(usage.get("completion_tokens", 0))
                elif b'"error"' in ev:
                    raise HttpError(f"error event: {ev[:300]!r}")
        if done:
            while await self._chunk():
                pass
        return ttft, tokens, chunks


async def run(args: argparse.Namespace, raw: bytes) -> dict[str, Any]:
    conns = []
    for _ in range(args.connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", args.port, limit=1 << 20)
        conns.append(Conn(reader, writer))
    loop = asyncio.get_running_loop()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"
    out: dict[str, Any] = {
        "requests": 0,
        "errors": 0,
        "completion_tokens": 0,
        "content_chunks": 0,
        "ttfts_s": [],
        "first_error": None,
    }
    remaining = iter(range(args.requests))

    async def worker(conn: Conn) -> None:
        for _ in remaining:
            try:
                ttft, tokens, chunks = await conn.request(raw, args.stream)
            except (HttpError, OSError, ValueError) as exc:
                out["errors"] += 1
                out["first_error"] = out["first_error"] or str(exc)[:300]
                return
            out["requests"] += 1
            out["completion_tokens"] += tokens if args.stream else args.max_tokens
            out["content_chunks"] += chunks
            if ttft is not None:
                out["ttfts_s"].append(ttft)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    out["wall_s"] = time.perf_counter() - wall0
    out["cpu_s"] = time.process_time() - cpu0
    for c in conns:
        c.writer.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--request-file", required=True, help="the raw HTTP/1.1 request bytes")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--max-tokens", type=int, default=0, help="tokens per non-streamed request")
    args = p.parse_args()
    with open(args.request_file, "rb") as f:
        raw = f.read()
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        result = asyncio.run(run(args, raw))
    else:
        result = uvloop.run(run(args, raw))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
