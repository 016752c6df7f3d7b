"""The engine check: is the engine side what caps a gateway's saturation throughput?

Runs the saturation workload (``stream_c256``: streaming, 64 tokens, c=256) against one
gateway (default: smg) three ways, alternating, median of ``--reps``:

* ``mock``: one ``bench/mock.py`` engine (the product's trio mock; what ``bench/gateway.py``
  used until round 3);
* ``lean``: one ``bench/lean_engine.py`` engine (a plain pyzmq loop, pre-encoded outputs);
* ``lean x2``: two lean engines behind the gateway (``--worker-urls`` of both,
  ``--policy round_robin``): twice the engine side's capacity.

The benchmark measures the gateway when doubling the engine side (``lean`` -> ``lean x2``)
raises the gateway's tokens/s by at most 5%. Reports each engine process's own CPU per
busy step and per token (its ``--stats-file`` at exit), and the gateway's CPU per token.
Machine load matters: quote the load average with the figures (printed).

    python bench/engine_check.py [--gateway smg] [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gateway import (  # noqa: E402
    TOKEN_RANGE,
    WORKLOADS,
    Gateway,
    _free_port,
    _remove_tree,
    gateway_launch,
    gateway_run,
    group_pids,
    tree_pids,
    wait_ready,
)

from peers.tools import start_process_group, stop_process_group  # noqa: E402
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.protocol.addresses import worker_addresses  # noqa: E402

MAX_GAIN = 0.05
SETUPS = (("mock", 1), ("lean", 1), ("lean", 2))


def _engine_cmd(kind: str, handshake: str, stats: Path) -> list[str]:
    script = "mock.py" if kind == "mock" else "lean_engine.py"
    cmd = [sys.executable, str(BENCH_DIR / script), "--handshake", handshake, "--step-ms", "1"]
    cmd += ["--token-range", str(TOKEN_RANGE[0]), str(TOKEN_RANGE[1])]
    return cmd + (["--stats-file", str(stats)] if kind == "lean" else [])


async def run_setup(
    gateway: str, kind: str, engines: int, reps: int, total: int
) -> list[dict[str, Any]]:
    w = next(w for w in WORKLOADS if w.name == "stream_c256")
    with contextlib.ExitStack() as stack:
        directory = Path(tempfile.mkdtemp(prefix="smg-"))
        stack.callback(_remove_tree, directory)
        urls = [f"ipc://{directory}/engine-{i}" for i in range(engines)]
        port = _free_port()
        model_dir = default_tiny_model_dir()
        launch = gateway_launch(gateway, urls[0], model_dir, port)
        cmd = list(launch.cmd)
        at = cmd.index("--worker-urls") + 2
        cmd[at:at] = urls[1:]
        cmd += ["--policy", "round_robin"]
        proc = start_process_group(cmd, env=launch.env, log_path=directory / "gateway.log")
        stack.callback(stop_process_group, proc)
        mocks = []
        for i, url in enumerate(urls):
            stats = directory / f"engine-{i}.json"
            mock = start_process_group(
                _engine_cmd(kind, worker_addresses(url).handshake, stats),
                log_path=directory / f"engine-{i}.log",
            )
            stack.callback(stop_process_group, mock)
            mocks.append((mock, stats))
        gw = Gateway(gateway, port, str(model_dir), proc, mocks[0][0], directory / "gateway.log")
        await wait_ready(gw)
        await trio.sleep(1.0)
        gw.pids = sorted(set(group_pids(proc.pid)) | set(tree_pids(proc.pid)))
        recs = []
        for _ in range(reps):
            rec = await gateway_run(gw, w, total)
            recs.append(rec)
        for mock, _ in mocks:
            stop_process_group(mock)
        engine_stats = []
        for _, stats in mocks:
            with contextlib.suppress(OSError):
                engine_stats.append(json.loads(stats.read_text()))
        for rec in recs:
            rec["engine_stats"] = engine_stats
        return recs


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"gateway": args.gateway, "load_avg_start": os.getloadavg()}
    runs: dict[str, list[dict[str, Any]]] = {}
    for kind, engines in SETUPS:
        name = f"{kind} x{engines}"
        runs[name] = await run_setup(args.gateway, kind, engines, args.reps, args.total)
        tps = statistics.median(r["tokens_per_s"] for r in runs[name])
        cpu = statistics.median(r["cpu_us_per_token"] for r in runs[name])
        estats = runs[name][0]["engine_stats"]
        eng = ", ".join(
            f"engine CPU {s['cpu_us_per_busy_step']:.0f} us/busy step,"
            f" {s['cpu_us_per_token']:.1f} us/token"
            for s in estats
        )
        print(
            f"  {args.gateway} with {name}: {tps:.0f} tokens/s"
            f" ({[round(r['tokens_per_s']) for r in runs[name]]}),"
            f" gateway CPU {cpu:.1f} us/token; {eng or 'engine stats: n/a (trio mock)'}",
            flush=True,
        )
        out[name] = {
            "tokens_per_s": tps,
            "runs_tokens_per_s": [r["tokens_per_s"] for r in runs[name]],
            "gateway_cpu_us_per_token": cpu,
            "engine_stats": estats,
        }
    base, doubled = out["lean x1"]["tokens_per_s"], out["lean x2"]["tokens_per_s"]
    out["gain"] = doubled / base - 1
    out["max_gain"] = MAX_GAIN
    out["ok"] = out["gain"] <= MAX_GAIN
    out["load_avg_end"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", default="smg", choices=("smg", "smg_trio", "smg_trio_n2"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--total", type=int, default=768, help="requests per run")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    res = trio.run(bench, args)
    print(
        f"engine check ({args.gateway}, stream_c256): lean x1 {res['lean x1']['tokens_per_s']:.0f}"
        f" -> lean x2 {res['lean x2']['tokens_per_s']:.0f} tokens/s: {res['gain'] * 100:+.1f}%"
        f" ({'OK' if res['ok'] else 'FAILED'}: at most {MAX_GAIN * 100:+.0f}%); trio mock x1"
        f" {res['mock x1']['tokens_per_s']:.0f} tokens/s; load average"
        f" {res['load_avg_start'][0]:.1f} -> {res['load_avg_end'][0]:.1f};"
        f" {time.perf_counter() - t0:.0f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
