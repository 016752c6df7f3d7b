"""What a long prompt does to the streams already running: their inter-token gap while one
8k- or 32k-token prompt is rendered and tokenized (issue 12: at most +5 ms on the p99).

Not a test. Starts smg_trio (``launch``, its own process group) with a mock engine stepping
every 1 ms, opens ``--streams`` streaming chats, then, one at a time, sends non-streamed chats
whose prompt has about ``--tokens`` tokens (``max_tokens`` 1). Each stream records the arrival
time of every content event; a gap is the time between two events of the same stream. The
p50/p99/max of the gaps is reported for the windows with no long prompt in flight (baseline)
and for the windows from sending a long prompt until its answer arrived, per prompt size::

    python bench/long_prompt.py                       # 1k, 8k and 32k tokens, 5 prompts each
    python bench/long_prompt.py --tokens 8192 --prompts 10

Prompts under ``TOKENIZE_OFFLOAD_BYTES`` of body (``gateway/http/call.py``) are rendered and
tokenized on the event loop, larger ones in a worker thread; the table says which.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gateway import quantile, start_gateway  # noqa: E402
from loadgen import HttpConnection, build_request, chat_body  # noqa: E402

from smg_trio.gateway.http.call import TOKENIZE_OFFLOAD_BYTES  # noqa: E402
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.tokenizer import Tokenizer  # noqa: E402

_CONTENT = b'"delta":{"content":"'
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "12345", "lighthouse")


def prompt_of(tokenizer: Tokenizer, tokens: int) -> str:
    """A text of about ``tokens`` tokens (scaled from a sample's tokens per character)."""
    sample = " ".join(_WORDS[i % len(_WORDS)] for i in range(2000))
    per_char = len(tokenizer.encode(sample)) / len(sample)
    chars = int(tokens / per_char)
    return (sample * (chars // len(sample) + 1))[:chars]


async def stream_forever(port: int, raw: bytes, arrivals: list[float]) -> None:
    """One streaming chat after another on one connection; every content event's arrival."""
    conn = await HttpConnection.connect(port)
    try:
        while True:
            await conn.stream.send_all(raw)
            await conn._head()
            pending = b""
            while chunk := await conn._chunk():
                pending += chunk
                if b"\n\n" not in pending:
                    continue
                *events, pending = pending.split(b"\n\n")
                now = time.perf_counter()
                for ev in events:
                    if _CONTENT in ev:
                        arrivals.append(now)
    finally:
        conn.stream.socket.close()


def gaps_in(arrivals: list[list[float]], windows: list[tuple[float, float]]) -> list[float]:
    """Gaps (ms) between consecutive events of a stream whose later event is in a window."""
    out = []
    for times in arrivals:
        for a, b in itertools.pairwise(times):
            if any(lo <= b <= hi for lo, hi in windows):
                out.append((b - a) * 1e3)
    return out


def summary(gaps: list[float]) -> dict[str, float]:
    return {
        "gaps": len(gaps),
        "p50_ms": quantile(gaps, 0.5),
        "p99_ms": quantile(gaps, 0.99),
        "max_ms": max(gaps, default=float("nan")),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = default_tiny_model_dir()
    tokenizer = Tokenizer.from_dir(model_dir)
    results: dict[str, Any] = {"streams": args.streams, "offload_bytes": TOKENIZE_OFFLOAD_BYTES}
    with contextlib.ExitStack() as stack:
        gw = await start_gateway("smg_trio", model_dir, 1.0, stack)
        stream_raw = build_request(
            gw.port, chat_body(gw.model, "Tell me a story.", args.stream_tokens, stream=True)
        )
        arrivals: list[list[float]] = [[] for _ in range(args.streams)]
        async with trio.open_nursery() as nursery:
            for times in arrivals:
                nursery.start_soon(stream_forever, gw.port, stream_raw, times)
            await trio.sleep(1.0)  # every stream is running
            quiet: list[tuple[float, float]] = []
            per_size: dict[int, list[tuple[float, float]]] = {}
            conn = await HttpConnection.connect(gw.port)
            for tokens in args.tokens:
                body = chat_body(gw.model, prompt_of(tokenizer, tokens), 1, stream=False)
                raw = build_request(gw.port, body)
                body_bytes = len(json.dumps(body, separators=(",", ":")).encode())
                results.setdefault("prompts", {})[str(tokens)] = {
                    "body_bytes": body_bytes,
                    "offloaded": body_bytes >= TOKENIZE_OFFLOAD_BYTES,
                }
                for _ in range(args.prompts):
                    t0 = time.perf_counter()
                    await trio.sleep(args.gap_s)
                    quiet.append((t0, time.perf_counter()))
                    t1 = time.perf_counter()
                    await conn.request(raw, stream=False)
                    # the window ends one step after the answer: the stall shows in the next gap
                    per_size.setdefault(tokens, []).append((t1, time.perf_counter() + 0.005))
            await trio.sleep(args.gap_s)
            nursery.cancel_scope.cancel()
        results["baseline"] = summary(gaps_in(arrivals, quiet))
        for tokens, windows in per_size.items():
            s = summary(gaps_in(arrivals, windows))
            s["added_p99_ms"] = s["p99_ms"] - results["baseline"]["p99_ms"]
            s["prompt_ms"] = sorted((hi - 0.005 - lo) * 1e3 for lo, hi in windows)[
                len(windows) // 2
            ]
            results["prompts"][str(tokens)].update(s)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--tokens", type=int, nargs="*", default=[1024, 8192, 32768])
    p.add_argument("--prompts", type=int, default=5, help="long prompts per size")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--stream-tokens", type=int, default=512, help="max_tokens of each stream")
    p.add_argument("--gap-s", type=float, default=0.5, help="quiet time between long prompts")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    res = trio.run(run, args)
    b = res["baseline"]
    print(
        f"{res['streams']} streams; baseline gaps p50 {b['p50_ms']:.2f} ms, "
        f"p99 {b['p99_ms']:.2f} ms, max {b['max_ms']:.2f} ms ({b['gaps']} gaps)"
    )
    print(
        f"{'prompt':>8} {'body':>9} {'where':>7} {'answer ms':>9} {'p50':>6} {'p99':>7} "
        f"{'max':>7} {'+p99 ms':>8}"
    )
    for tokens, s in res["prompts"].items():
        where = "thread" if s["offloaded"] else "loop"
        print(
            f"{tokens:>8} {s['body_bytes']:>9} {where:>7} {s['prompt_ms']:>9.1f} "
            f"{s['p50_ms']:>6.2f} {s['p99_ms']:>7.2f} {s['max_ms']:>7.2f} {s['added_p99_ms']:>8.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
