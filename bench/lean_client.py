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
import json
import sys
import time
from typing import Any

from aio_client import Conn, measured, open_conns, ready_then_go, run_loop
from http1 import HttpError


class LeanConn(Conn):
    """One keep-alive connection sending copies of one raw request."""

    async def request(self, raw: bytes, stream: bool) -> tuple[float | None, int, int]:
        """(TTFT s or None, completion tokens, content chunks) of one request."""
        t0 = time.perf_counter()
        self.writer.write(raw)
        resp = await self._answer(t0, stream)
        return resp.ttft_s, resp.completion_tokens, resp.content_chunks


async def run(args: argparse.Namespace, raw: bytes) -> dict[str, Any]:
    conns = await open_conns(LeanConn, args.port, args.connections, limit=1 << 20)
    await ready_then_go()
    out: dict[str, Any] = {
        "requests": 0,
        "errors": 0,
        "completion_tokens": 0,
        "content_chunks": 0,
        "ttfts_s": [],
        "first_error": None,
    }
    remaining = iter(range(args.requests))

    async def worker(conn: LeanConn) -> None:
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

    await measured(out, [worker(c) for c in conns], conns)
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
    result = run_loop(run(args, raw))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
