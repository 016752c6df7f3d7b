"""Measure chat-template rendering and tokenization cost by prompt size (docs/performance.md).

Usage: ``python bench/measure_tokenize.py [--deepseek DIR] [--rss-mib 30]``

For each tokenizer (the tiny test model's, and the DeepSeek vocabulary when ``--deepseek``
names a directory holding its ``tokenizer.json``) and each size, prints the time to render a
one-message chat and encode it, the longest token in characters (the early-refusal bound),
and how long the event loop's thread is held when the encode runs in a worker thread (whether
HF ``tokenizers`` releases the GIL). ``--rss-mib`` then measures peak RSS of encoding one
prompt of that size, inline (the old path), in a fresh subprocess per case.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.tokenizer import Tokenizer

SIZES = (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "12345", "naïve", "東京")


def text_of(size: int) -> str:
    out: list[str] = []
    n = 0
    i = 0
    while n < size:
        w = _WORDS[i % len(_WORDS)] + " "
        out.append(w)
        n += len(w)
        i += 1
    return "".join(out)[:size]


def render_encode(tok: Tokenizer, text: str) -> int:
    messages = [{"role": "user", "content": text}]
    if tok.has_chat_template:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    else:
        prompt = text
    return len(tok.encode(prompt))


def longest_gap_while(fn: Callable[[], object]) -> float:
    """Run ``fn`` in a worker thread (``trio.to_thread``, as the gateway does); the longest
    a 1 ms ticker on the event loop overslept meanwhile (what other requests would see)."""
    worst = 0.0

    async def run() -> None:
        nonlocal worst
        async with trio.open_nursery() as nursery:

            async def tick() -> None:
                nonlocal worst
                while True:
                    t0 = time.perf_counter()
                    await trio.sleep(0.001)
                    worst = max(worst, time.perf_counter() - t0 - 0.001)

            nursery.start_soon(tick)
            await trio.to_thread.run_sync(fn)
            nursery.cancel_scope.cancel()

    trio.run(run)
    return worst


def measure(name: str, tok: Tokenizer) -> None:
    bound = tok.max_token_chars
    print(f"\n## {name}: vocab {tok.vocab_size}, longest token {bound} chars")
    print("| prompt | render+encode | tokens | loop held (thread) |")
    print("|---|---|---|---|")
    for size in SIZES:
        text = text_of(size)
        t0 = time.perf_counter()
        n = render_encode(tok, text)
        dt = time.perf_counter() - t0
        gap = longest_gap_while(lambda text=text: render_encode(tok, text))
        print(f"| {size >> 10} KiB | {dt * 1e3:.2f} ms | {n} | {gap * 1e3:.2f} ms |")


def _rss_child(model_dir: str, mib: int) -> None:
    tok = Tokenizer.from_dir(model_dir)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    text = text_of(mib << 20)
    t0 = time.perf_counter()
    n = len(tok.encode(text))
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"{mib} MiB prompt: {n} tokens in {dt:.1f} s; peak RSS {before // 1024} -> {peak // 1024} MB"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepseek", help="directory with the DeepSeek tokenizer.json")
    ap.add_argument("--rss-mib", type=int, default=0)
    ap.add_argument("--rss-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child[0], int(args.rss_child[1]))
        return
    tiny = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    dirs = [("tiny", tiny)]
    if args.deepseek:
        dirs.append(("deepseek", Path(args.deepseek)))
    for name, d in dirs:
        measure(name, Tokenizer.from_dir(d))
    if args.rss_mib:
        for name, d in dirs:
            print(f"{name}: ", end="", flush=True)
            subprocess.run(
                [sys.executable, __file__, "--rss-child", str(d), str(args.rss_mib)], check=True
            )


if __name__ == "__main__":
    main()
