"""``vllm bench serve`` (vLLM's own benchmark client) against smg_trio and smg on the lean engine.

Issue 31's outside check: the figures of ``bench/gateway.py`` come from our own load client;
this runs the client that vLLM users quote. For each gateway (``smg_trio``, ``smg_trio_n2``
= ``--api-server-count 2``, and the Rust ``smg`` 1.13.0), one at a time: start it in front of
one ``bench/lean_engine.py`` (1 ms step; ``gateway.start_gateway``), run ``vllm bench serve``
from the vLLM peer venv against it, stop both. The workload: the ``random`` dataset, 32 input
-> 64 output tokens (``--ignore-eos``; the lean engine always answers ``max_tokens``), at most
256 requests in flight, all sent at once (``--request-rate inf``), on the ``openai`` backend:
streamed ``POST /v1/completions`` with ``stream_options.include_usage``, which both gateways
serve the same way (no chat template, so the prompt is the dataset's 32 tokens). The model,
tokenizer and served model name are the tiny model's directory (what the gateways serve).

Reports, per gateway (median over ``--reps``; the gateways alternate order between reps):
requests/s, output tokens/s, TTFT p50/p99, TPOT and ITL p50/p99 (vLLM's own figures, from its
``--save-result`` JSON), the ratios to smg, the bench client's CPU from its main run to its
exit (a client near 1.0 core is the bottleneck, not the gateway), the gateway's CPU over the
same span, and the lean engine's own stats (``--stats-file``).

    python bench/vllm_bench.py [--num-prompts 2048 | --quick] [--reps 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):  # bench helpers; peers/ (repo-only tooling)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gateway  # noqa: E402

from peers.tools import (  # noqa: E402
    VLLM_SPEC,
    peer_paths,
    smg_missing_reason,
    stop_process_group,
    vllm_engine_env,
    vllm_missing_reason,
)
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402

GATEWAYS = ("smg_trio", "smg_trio_n2", "smg")
BACKEND = "openai"
ENDPOINT = "/v1/completions"
INPUT_LEN = 32
OUTPUT_LEN = 64
MAX_CONCURRENCY = 256
NUM_PROMPTS = 2048
QUICK_NUM_PROMPTS = 512
NUM_WARMUPS = 64
STEP_MS = 1.0
#: What ``vllm bench serve`` prints once its ready check and warm-up are over.
MAIN_RUN_MARK = b"Starting main benchmark run"
#: ... and once every request has been answered and its metrics computed.
RESULT_MARK = b" Serving Benchmark Result "
#: How long one ``vllm bench serve`` may take (its start-up alone is ~15 s on 2 busy cores).
RUN_TIMEOUT_S = 900.0
#: The keys of vLLM's result JSON kept per run.
KEEP = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrent_requests",
    "mean_ttft_ms",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "p50_e2el_ms",
    "p99_e2el_ms",
    "max_ttft_ms",
    "ttfts_over_1s",
)
#: The figures compared with smg (a ratio above 1 is more of it than smg).
RATIOS = ("request_throughput", "output_throughput", "p50_ttft_ms", "p99_ttft_ms")


def bench_command(port: int, model: str, num_prompts: int, result_dir: Path) -> list[str]:
    """The ``vllm bench serve`` command line (the peer venv's interpreter)."""
    cmd = [str(peer_paths().vllm_python), "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    cmd += ["--backend", BACKEND, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--endpoint", ENDPOINT, "--model", model, "--tokenizer", model]
    cmd += ["--served-model-name", model, "--dataset-name", "random"]
    cmd += ["--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)]
    cmd += ["--num-prompts", str(num_prompts), "--max-concurrency", str(MAX_CONCURRENCY)]
    cmd += ["--request-rate", "inf", "--ignore-eos", "--num-warmups", str(NUM_WARMUPS)]
    cmd += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    cmd += ["--seed", "0", "--disable-tqdm", "--save-result", "--save-detailed"]
    return [*cmd, "--result-dir", str(result_dir), "--result-filename", "result.json"]


async def run_client(gw: gateway.Gateway, cmd: list[str], log: Path) -> dict[str, Any]:
    """Run ``cmd`` (``vllm bench serve``) to its end; the CPU of the client and of the gateway
    from the client's "Starting main benchmark run" line (ready check and warm-up done) to its
    result table (every request answered and its metrics computed)."""
    marks: dict[str, float] = {}
    out = bytearray()
    proc = await trio.lowlevel.open_process(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=vllm_engine_env()
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(RUN_TIMEOUT_S):
            while data := await proc.stdout.receive_some(65536):
                out += data
                for mark, key in ((MAIN_RUN_MARK, "0"), (RESULT_MARK, "1")):
                    if f"client{key}" not in marks and mark in out:
                        marks[f"client{key}"] = gateway.cpu_seconds([proc.pid])
                        marks[f"gw{key}"] = gw.cpu()
            await proc.wait()
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
        log.write_bytes(bytes(out))  # noqa: ASYNC240 (a small file, once per run)
    if proc.returncode != 0 or len(marks) != 4:
        tail = bytes(out[-3000:]).decode(errors="replace")
        raise RuntimeError(f"vllm bench serve against {gw.name} exited {proc.returncode}:\n{tail}")
    return {
        "client_cpu_s": marks["client1"] - marks["client0"],
        "gateway_cpu_s": marks["gw1"] - marks["gw0"],
    }


def _record(result: dict[str, Any], cpu: dict[str, float]) -> dict[str, Any]:
    rec: dict[str, Any] = {k: result.get(k) for k in KEEP}
    lens = [n for n in result.get("output_lens", []) if n is not None]
    rec["output_len_min"] = min(lens, default=None)
    rec["output_len_max"] = max(lens, default=None)
    rec["first_error"] = next((e for e in result.get("errors", []) if e), "")
    ttfts = sorted(t for t in result.get("ttfts", []) if isinstance(t, int | float) and t > 0)
    rec["max_ttft_ms"] = ttfts[-1] * 1e3 if ttfts else None
    # a tail of whole seconds is a TCP connect retried (a SYN dropped), not queueing
    rec["ttfts_over_1s"] = sum(t > 1.0 for t in ttfts)
    rec.update(cpu)
    duration = result.get("duration") or float("nan")
    tokens = max(result.get("total_output_tokens") or 0, 1)
    rec["client_cpu_cores"] = cpu["client_cpu_s"] / duration
    rec["gateway_cpu_cores"] = cpu["gateway_cpu_s"] / duration
    rec["gateway_cpu_us_per_token"] = cpu["gateway_cpu_s"] / tokens * 1e6
    return rec


async def run_one(name: str, num_prompts: int) -> dict[str, Any]:
    """Start ``name`` with a lean engine, run ``vllm bench serve`` against it, stop both."""
    model_dir = default_tiny_model_dir()
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="smg-vb-"))
        stack.callback(gateway._remove_tree, work)
        stats = work / "engine.json"
        gw = await gateway.start_gateway(
            name, model_dir, STEP_MS, stack, engine_args=("--stats-file", str(stats))
        )
        cmd = bench_command(gw.port, str(model_dir), num_prompts, work)
        cpu = await run_client(gw, cmd, work / "client.log")
        result = json.loads((work / "result.json").read_text())
        stop_process_group(gw.mock)  # the lean engine writes its stats on SIGTERM
        rec = _record(result, cpu)
        with contextlib.suppress(OSError, ValueError):
            rec["engine_stats"] = json.loads(stats.read_text())
        return rec


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Median per gateway of every numeric figure; failed requests summed."""
    out: dict[str, dict[str, Any]] = {}
    for name, recs in runs.items():
        if not recs:
            continue
        s: dict[str, Any] = {"reps": len(recs), "failed": sum(r["failed"] or 0 for r in recs)}
        for key in (*KEEP, "client_cpu_cores", "gateway_cpu_cores", "gateway_cpu_us_per_token"):
            vals = [r[key] for r in recs if isinstance(r.get(key), int | float)]
            if key != "failed" and vals:
                s[key] = statistics.median(vals)
        s["output_len_min"] = min((r["output_len_min"] or 0) for r in recs)
        s["output_len_max"] = max((r["output_len_max"] or 0) for r in recs)
        out[name] = s
    ref = out.get("smg")
    for s in out.values():
        s["ratio_to_smg"] = {
            k: (s[k] / ref[k] if ref and ref.get(k) and s.get(k) is not None else None)
            for k in RATIOS
        }
    return out


def _cell(x: Any, fmt: str) -> str:
    return "-" if not isinstance(x, int | float) else format(x, fmt)


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The figures of :func:`summarize` as a text table."""
    cols = (
        ("done", "completed", ".0f", 5),
        ("fail", "failed", "d", 4),
        ("req/s", "request_throughput", ".1f", 7),
        ("out tok/s", "output_throughput", ".0f", 9),
        ("TTFT p50", "p50_ttft_ms", ".1f", 8),
        ("TTFT p99", "p99_ttft_ms", ".1f", 8),
        ("TPOT p50", "p50_tpot_ms", ".2f", 8),
        ("ITL p99", "p99_itl_ms", ".2f", 7),
        ("client", "client_cpu_cores", ".2f", 6),
        ("gw µs/tok", "gateway_cpu_us_per_token", ".1f", 9),
    )
    header = f"{'gateway':<12} " + " ".join(f"{c[0]:>{c[3]}}" for c in cols)
    header += f" {'req/s /smg':>10} {'p99 /smg':>8}"
    lines = [header, "-" * len(header)]
    for name, s in summary.items():
        r = s["ratio_to_smg"]
        row = f"{name:<12} " + " ".join(f"{_cell(s.get(k), fmt):>{w}}" for _, k, fmt, w in cols)
        row += f" {_cell(r['request_throughput'], '.2f'):>10} {_cell(r['p99_ttft_ms'], '.2f'):>8}"
        lines.append(row)
    lines.append("(TTFT/TPOT/ITL in ms; client: the bench client's CPU in cores during its run)")
    return "\n".join(lines)


def available(wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """The gateways of ``wanted`` that can run here, and why each other one cannot."""
    names: list[str] = []
    skipped: dict[str, str] = {}
    for name in wanted:
        reason = None
        if name == "smg":
            reason = smg_missing_reason()
        elif name == "smg_trio_n2" and not gateway.multi_frontend_supported():
            reason = "`launch` has no --api-server-count"
        if reason is None:
            names.append(name)
        else:
            skipped[name] = reason
            print(f"{name} skipped: {reason}", file=sys.stderr)
    return names, skipped


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    gateway.ENGINE_SCRIPT = "lean_engine.py"
    names, skipped = available(args.gateways)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            try:
                rec = await run_one(name, args.num_prompts)
            except RuntimeError as exc:
                if name != "smg_trio_n2":
                    raise
                skipped[name] = f"it did not start or its run failed: {str(exc)[-300:]}"
                print(f"  smg_trio_n2 skipped: {skipped[name]}", flush=True)
                continue
            runs[name].append(rec)
            print(
                f"  rep {rep + 1} {name:<12} {_cell(rec['request_throughput'], '7.1f')} req/s"
                f" {_cell(rec['output_throughput'], '8.0f')} tok/s TTFT p50/p99"
                f" {_cell(rec['p50_ttft_ms'], '.1f')}/{_cell(rec['p99_ttft_ms'], '.1f')} ms,"
                f" {rec['completed']} done, {rec['failed']} failed,"
                f" client {_cell(rec['client_cpu_cores'], '.2f')} cores",
                flush=True,
            )
            if rec["failed"]:
                print(f"    first error: {rec['first_error'][-500:]}", flush=True)
    summary = summarize(runs)
    return {
        "config": {
            "client": f"vllm bench serve ({VLLM_SPEC.split('==')[0]} {VLLM_SPEC.split('==')[1]})",
            "backend": BACKEND,
            "endpoint": ENDPOINT,
            "dataset": "random",
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "max_concurrency": MAX_CONCURRENCY,
            "num_prompts": args.num_prompts,
            "num_warmups": NUM_WARMUPS,
            "reps": args.reps,
            "engine": f"bench/lean_engine.py, {STEP_MS:g} ms step",
            "command": "vllm "
            + " ".join(bench_command(0, "MODEL", args.num_prompts, Path("DIR"))[3:]).replace(
                "--port 0", "--port PORT"
            ),
        },
        "load_avg_start": list(load0),
        "load_avg_end": list(os.getloadavg()),
        "elapsed_s": time.perf_counter() - t0,
        "skipped": skipped,
        "summary": summary,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--num-prompts", type=int, default=None, help=f"default {NUM_PROMPTS}")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_NUM_PROMPTS} prompts")
    p.add_argument("--reps", type=int, default=1, help="repetitions (gateways alternate)")
    p.add_argument("--gateways", nargs="+", choices=GATEWAYS, default=list(GATEWAYS))
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    if args.num_prompts is None:
        args.num_prompts = QUICK_NUM_PROMPTS if args.quick else NUM_PROMPTS
    reason = vllm_missing_reason()
    if reason is not None:
        print(f"vllm bench serve skipped: {reason}", file=sys.stderr)
        return 2
    print(
        f"vllm bench serve: {args.num_prompts} prompts {INPUT_LEN} -> {OUTPUT_LEN} tokens,"
        f" max concurrency {MAX_CONCURRENCY}, {BACKEND} {ENDPOINT}, lean engine;"
        f" load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    result = trio.run(gateway.until_sigterm, bench, args)
    if result is None:
        return 128 + signal.SIGTERM
    print(table(result["summary"]))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
