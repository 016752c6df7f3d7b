"""Profile a gateway under one benchmark workload: py-spy samples of its processes, summarised.

Starts ``--gateway`` (``smg_trio``, ``smg_trio_n2`` or ``smg_trio_base``: another checkout
named by ``SMG_BENCH_BASE_TREE``) on the lean engine (``bench/lean_engine.py``), warms it up,
then runs ``--workload`` back to back for ``--seconds`` while ``py-spy record`` samples every
process of the gateway (``--subprocesses``, ``--nonblocking``, 250 Hz). Writes the collapsed
stacks (``<out>/<gateway>-<workload>.txt``, for flame graphs) and prints the top functions by
own samples and by inclusive samples, with the CPU per token of the runs (py-spy adds a few
percent). Not a timed test.

    python bench/profile.py --gateway smg_trio --workload chat_c32 --seconds 20 --out /tmp/prof
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gateway  # noqa: E402
from gateway import WORKLOADS, gateway_run, start_gateway  # noqa: E402

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402


def summarise(collapsed: Path, top: int) -> str:
    """The ``top`` functions by own and by inclusive share of the samples in ``collapsed``."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():  # a frame's text that went on past a newline
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        total += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    lines = [f"{total} samples"]
    for title, counter in (("own", own), ("inclusive", incl)):
        lines.append(f"-- top {top} by {title} samples")
        for name, n in counter.most_common(top):
            lines.append(f"{100 * n / max(total, 1):5.1f}%  {name}")
    return "\n".join(lines)


async def main(args: argparse.Namespace, py_spy: str, collapsed: Path) -> None:
    gateway.ENGINE_SCRIPT = "lean_engine.py"
    w = next(w for w in WORKLOADS if w.name == args.workload)
    with contextlib.ExitStack() as stack:
        gw = await start_gateway(args.gateway, default_tiny_model_dir(), w.step_ms, stack)
        await gateway_run(gw, w, w.total)  # warm-up
        cmd = [py_spy, "record", "-p", str(gw.proc.pid), "-r", "250", "--nonblocking"]
        cmd += ["--subprocesses", "-f", "raw", "-o", str(collapsed)]
        cmd += ["-d", str(int(args.seconds))]
        spy = await trio.lowlevel.open_process(cmd, stdout=subprocess.DEVNULL)
        per_token: list[float] = []
        with trio.move_on_after(args.seconds):
            while True:
                rec = await gateway_run(gw, w, w.total)
                per_token.append(rec["cpu_us_per_token" if w.stream else "cpu_us_per_request"])
        if await spy.wait():
            sys.exit("py-spy failed (its message is above)")
    unit = "µs/token" if w.stream else "µs/request"
    runs = ", ".join(f"{x:.1f}" for x in per_token)
    print(f"{args.gateway} {w.name}: {len(per_token)} runs, CPU {unit}: {runs}")
    print(f"load {os.getloadavg()[0]:.1f}; stacks in {collapsed}")
    print(summarise(collapsed, args.top))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", default="smg_trio")
    p.add_argument("--workload", default="stream64_c32")
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default="bench-profiles")
    a = p.parse_args()
    spy_path = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy_path).exists():
        sys.exit("py-spy is not installed: pip install py-spy")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    trio.run(main, a, spy_path, Path(a.out) / f"{a.gateway}-{a.workload}.txt")
