"""The frontend tax: what a second frontend costs on the same work, per process.

Runs one workload (default ``stream64_c32``) against ``smg_trio`` (N=1), ``smg_trio_n2``
(N=2) and, with ``--smg``, smg, alternating, ``--reps`` times, with the lean engine
(``bench/lean_engine.py``). Per run: the gateway's CPU per token, the CPU of each of its
processes (the supervisor and each frontend), and the voluntary and involuntary context
switches of all its threads (``/proc/<pid>/task/*/status``): a voluntary switch is an event
loop that blocked and was woken again, a figure the machine's load hardly moves.

    python bench/frontend_tax.py [--workload stream64_c32] [--reps 3] [--smg]
    SMG_BENCH_BASE_TREE=../other python bench/frontend_tax.py --gateways smg_trio_n2,smg_trio_base_n2
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
from pathlib import Path

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gateway  # noqa: E402
from gateway import WORKLOADS, cpu_seconds, gateway_run, start_gateway, tree_pids  # noqa: E402

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402


def switches(pids: list[int]) -> tuple[int, int]:
    """Voluntary and involuntary context switches of every thread of ``pids``."""
    v = nv = 0
    for pid in pids:
        for path in glob.glob(f"/proc/{pid}/task/*/status"):
            with contextlib.suppress(OSError), open(path) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        v += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        nv += int(line.split()[1])
    return v, nv


async def main(args: argparse.Namespace) -> None:
    gateway.ENGINE_SCRIPT = "lean_engine.py"
    w = next(w for w in WORKLOADS if w.name == args.workload)
    names = args.gateways.split(",") if args.gateways else ["smg_trio", "smg_trio_n2"]
    names += ["smg"] if args.smg else []
    with contextlib.ExitStack() as stack:
        gws = {n: await start_gateway(n, default_tiny_model_dir(), 1.0, stack) for n in names}
        for gw in gws.values():
            await gateway_run(gw, w, 64)  # warm-up
        for rep in range(args.reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                gw = gws[name]
                pids = tree_pids(gw.proc.pid)
                v0, nv0 = switches(pids)
                cpu0 = {p: cpu_seconds([p]) for p in pids}
                rec = await gateway_run(gw, w, w.total)
                v1, nv1 = switches(pids)
                per = [round((cpu_seconds([p]) - cpu0[p]) * 1e3) for p in pids]
                ktok = max(rec["completion_tokens"], 1) / 1e3
                ttfts = sorted(rec["ttfts_ms"])
                p99 = f" TTFT p99 {ttfts[int(0.99 * (len(ttfts) - 1))]:.0f} ms;" if ttfts else ""
                print(
                    f"rep {rep + 1} {w.name} {name:<12} {rec['cpu_us_per_token']:5.1f} µs/token;{p99}"
                    f" CPU ms per process (root first) {per}; per 1000 tokens:"
                    f" {(v1 - v0) / ktok:.0f} voluntary, {(nv1 - nv0) / ktok:.0f} involuntary"
                    f" switches; load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="stream64_c32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smg", action="store_true")
    p.add_argument(
        "--gateways",
        help="comma-separated gateways instead of smg_trio,smg_trio_n2 (smg_trio_base and"
        " smg_trio_base_n2 run the checkout named by SMG_BENCH_BASE_TREE: an A/B)",
    )
    trio.run(main, p.parse_args())
