"""A lean HTTP/1.1 load-generator process: raw keep-alive requests on asyncio (uvloop if it is
installed), reporting its own CPU, so that a benchmark can drive load from K such processes.

Standard library only (plus optional uvloop): it imports nothing of smg_trio, so its cost is
the cost of the client alone. One process opens ``--connections`` keep-alive connections, then
prints ``ready`` and waits for a line on stdin (the coordinator reads the gateway's CPU
counters in between), sends ``--requests`` copies of the request in ``--request-file`` back
to back over them, and prints one JSON line: requests, errors, completion tokens, content
chunks, TTFTs, its wall time and its own CPU time (``time.process_time``).

Per streamed request, TTFT, completion tokens and content chunks are read as
``bench/http1.py`` says, as in ``bench/loadgen.py``.

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

from http1 import Http1Reader, HttpError


class Conn(Http1Reader):
    """One keep-alive HTTP/1.1 connection (the reader is :mod:`http1`'s)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self.reader = reader
        self.writer = writer

    async def _receive(self) -> bytes:
        return await self.reader.read(65536)

    async def request(self, raw: bytes, stream: bool) -> tuple[float | None, int, int]:
        """(TTFT s or None, completion tokens, content chunks) of one request."""
        t0 = time.perf_counter()
        self.writer.write(raw)
        resp = await self._answer(t0, stream)
        return resp.ttft_s, resp.completion_tokens, resp.content_chunks


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
