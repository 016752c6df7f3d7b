"""Fault F2: the engine is SIGKILLed under ``launch`` (no sentinel, no process to watch).

Starts ``python -m smg_trio launch`` and a mock engine, each its own process (group), opens
``--streams`` streaming and ``--plain`` non-streaming chat requests that would run for
seconds, SIGKILLs the engine's process group once every stream has its first token, and
reports how long after the SIGKILL the last request ended, and how each ended (the target:
every one with an error, 503 or an SSE error event, the last within 1 s).

    python bench/fault_engine_kill.py [--streams 8] [--plain 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):  # bench helpers; peers/ (repo-only tooling)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gateway import start_gateway  # noqa: E402
from loadgen import HttpConnection, HttpError, build_request, chat_body  # noqa: E402

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402

#: Long enough that nothing finishes on its own before the kill (5 ms steps).
MAX_TOKENS = 900
STEP_MS = 5.0
#: How long the bench waits for the requests to end after the kill before it calls it a hang.
HANG_S = 30.0


async def _stream_first_token(conn: HttpConnection, raw: bytes, started: trio.Event) -> bytes:
    """Send a streaming request, set ``started`` at its first content event, and return how
    the stream ended (its last bytes)."""
    await conn.stream.send_all(raw)
    tail = b""
    while True:
        data = await conn.stream.receive_some(65536)
        if not data:
            return tail + b"<EOF>"
        if not started.is_set() and b'"content":"' in data:
            started.set()
        tail = (tail + data)[-400:]
        if b"data: [DONE]" in tail:
            return tail


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        gw = await start_gateway("smg_trio", default_tiny_model_dir(), STEP_MS, stack)
        ends: dict[str, tuple[float, str]] = {}
        stream_raw = build_request(gw.port, chat_body(gw.model, "hi", MAX_TOKENS, stream=True))
        plain_raw = build_request(gw.port, chat_body(gw.model, "hi", MAX_TOKENS, stream=False))

        async def streaming(i: int, started: trio.Event) -> None:
            conn = await HttpConnection.connect(gw.port)
            try:
                tail = await _stream_first_token(conn, stream_raw, started)
                kind = "sse-error+[DONE]" if b'"error"' in tail else f"ended: {tail[-80:]!r}"
            except OSError as exc:
                kind = f"connection error: {exc}"
            finally:
                await conn.aclose()
            ends[f"s{i}"] = (time.perf_counter(), kind)

        async def plain(i: int) -> None:
            conn = await HttpConnection.connect(gw.port)
            try:
                await conn.request(plain_raw, stream=False)
                kind = "200 (finished?)"
            except HttpError as exc:
                kind = str(exc).split(":")[0]
            except OSError as exc:
                kind = f"connection error: {exc}"
            finally:
                await conn.aclose()
            ends[f"p{i}"] = (time.perf_counter(), kind)

        with trio.fail_after(HANG_S + 60):
            async with trio.open_nursery() as nursery:
                for i in range(args.plain):
                    nursery.start_soon(plain, i)
                for i in range(args.streams):
                    started = trio.Event()
                    nursery.start_soon(streaming, i, started)
                    await started.wait()
                await trio.sleep(0.2)  # the plain requests are generating too by now
                os.killpg(gw.mock.pid, signal.SIGKILL)
                killed = time.perf_counter()
        delays = sorted(t - killed for t, _ in ends.values())
        kinds: dict[str, int] = {}
        for _, kind in ends.values():
            kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "requests": len(ends),
            "last_end_after_kill_s": delays[-1],
            "first_end_after_kill_s": delays[0],
            "outcomes": kinds,
            "target_s": 1.0,
            "pass": delays[-1] < 1.0 and all("200" not in k for k in kinds),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--plain", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = trio.run(bench, args)
    print(
        f"F2 engine SIGKILL under launch: {result['requests']} requests; last ended"
        f" {result['last_end_after_kill_s'] * 1000:.0f} ms after SIGKILL (first"
        f" {result['first_end_after_kill_s'] * 1000:.0f} ms); target < 1000 ms:"
        f" {'PASS' if result['pass'] else 'FAIL'}"
    )
    for kind, n in sorted(result["outcomes"].items()):
        print(f"  {n:3d} x {kind}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
