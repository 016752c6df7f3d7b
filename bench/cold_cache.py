"""What a cold CPU cache does to the per-request path: the same calls, hot and after eviction.

A gateway at c=1 runs each request's code after the engine, the client and the kernel have
used the cache since its last request (and after its own per-token wake-ups). This times the
per-request steps a chat request takes (the body decode, the chat template, the encode), each
back to back (hot) and each after copying ``MB`` megabytes (which evicts the 2 MiB L2 of this
VM's cores and part of the L3), and prints medians. It is the microbenchmark behind the c=1
paragraph of docs/performance.md. Not a timed test.

    python bench/cold_cache.py [--evict 1 2 4 8] [--n 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

from smg_trio.gateway.openai.schemas import ChatCompletionRequest  # noqa: E402
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.tokenizer.core import Tokenizer  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."  # bench/gateway.py's


def timed(fn: Callable[[], object], n: int, evict_bytes: int, scratch: bytearray) -> float:
    """Median µs of ``fn``, each call after copying ``evict_bytes`` of ``scratch``."""
    samples = []
    for _ in range(n):
        if evict_bytes:
            bytes(scratch[:evict_bytes])
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    return statistics.median(samples) / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--evict", type=int, nargs="*", default=[1, 2, 4, 8], metavar="MB")
    p.add_argument("--n", type=int, default=400)
    args = p.parse_args()
    tok = Tokenizer.from_dir(default_tiny_model_dir())
    messages = [{"role": "user", "content": PROMPT}]
    body = msgspec.json.encode(
        {"model": "m", "messages": messages, "max_tokens": 16, "stream": True}
    )
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    steps: dict[str, Callable[[], object]] = {
        "body decode": lambda: msgspec.json.decode(body, type=ChatCompletionRequest),
        "chat template": lambda: tok.apply_chat_template(messages, add_generation_prompt=True),
        "encode": lambda: tok.encode(prompt),
    }
    scratch = bytearray(max(args.evict, default=0) << 20)
    cols = [0, *args.evict]
    print(f"{'step':<14}" + "".join(f"{'hot' if mb == 0 else f'{mb} MB':>10}" for mb in cols))
    for name, fn in steps.items():
        for _ in range(50):
            fn()
        row = [timed(fn, args.n, mb << 20, scratch) for mb in cols]
        print(f"{name:<14}" + "".join(f"{v:>10.1f}" for v in row))
    print("(median µs per call; each column after copying that much memory first)")


if __name__ == "__main__":
    main()
