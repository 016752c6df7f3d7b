"""What ``cache_aware`` costs a request, by prompt length (issue 25: "lookup cost grows with
blocks, not tokens squared"), beside what tokenizing the same prompt costs.

For prompts of 1k to 32k tokens, with four engines whose indexes hold many other prompts and
this prompt's first half on one of them (the warm case of a multi-turn conversation), it times
``CacheAwareRouter.choose`` (key chain + index lookup + choice; the approximate index also
records the prompt) with 16-token blocks, both with the engines' KV events and with the
approximate index, and the tiny model's ``Tokenizer.encode`` of the prompt's text. CPU time per
call (``time.process_time``), median of ``--reps``.

    .venv/bin/python bench/routing_lookup.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.routing.blocks import block_keys
from smg_trio.routing.cache_aware import CacheAwareRouter, EngineCandidate, RouteRequest
from smg_trio.tokenizer import Tokenizer

BLOCK = 16
ENGINES = [(f"w{i}", 0) for i in range(4)]


def _cpu(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _router(events: bool, prompt: list[int], rng: random.Random) -> CacheAwareRouter:
    router = CacheAwareRouter()
    for e in ENGINES:
        router.add_engine(e, block_size=BLOCK, num_gpu_blocks=100_000, events=events)
    index = router.events if events else router.approx
    # other conversations on every engine, and this prompt's first half on the first one
    for n, e in enumerate(ENGINES):
        for _ in range(20):
            other = [rng.randrange(100, 30000) for _ in range(2048)]
            keys = block_keys(other, BLOCK)
            if events:
                hashes = [f"{e[0]}-{n}-{k}" for k in keys]
                index.stored(e, hashes, None, other[: len(keys) * BLOCK], BLOCK)
            else:
                index.record(e, keys, 0.0)
    half = prompt[: len(prompt) // 2 // BLOCK * BLOCK]
    keys = block_keys(half, BLOCK)
    if events:
        index.stored(ENGINES[0], [f"mine-{k}" for k in keys], None, half, BLOCK)
    else:
        index.record(ENGINES[0], keys, 0.0)
    return router


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    rng = random.Random(1)
    tok = Tokenizer.from_dir(str(default_tiny_model_dir()))
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "box",
    ]
    cands = [EngineCandidate(e, 0.0) for e in ENGINES]
    print("| prompt tokens | blocks | tokenize (ms) | cache_aware, events (ms) | "
          "cache_aware, approximate (ms) | events µs per block |")  # fmt: skip
    print("|--:|--:|--:|--:|--:|--:|")
    for target in (1024, 4096, 16384, 32768):
        text = " ".join(rng.choice(words) for _ in range(target))
        ids = tok.encode(text)[:target]
        while len(ids) < target:
            ids += ids[: target - len(ids)]
        enc = _cpu(lambda text=text: tok.encode(text), args.reps)
        ev = _router(True, ids, rng)
        ap_ = _router(False, ids, rng)
        req = RouteRequest(ids)
        with_events = _cpu(lambda ev=ev, req=req: ev.choose(req, cands, 0.0), args.reps)
        approx = _cpu(lambda ap_=ap_, req=req: ap_.choose(req, cands, 0.0), args.reps)
        blocks = len(ids) // BLOCK
        print(f"| {len(ids)} | {blocks} | {enc * 1e3:.2f} | {with_events * 1e3:.2f} | "
              f"{approx * 1e3:.2f} | {with_events / blocks * 1e6:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
