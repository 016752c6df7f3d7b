"""The benchmark entry point: run the gateway benchmark, then refresh the docs from it.

One session: smg_trio and the Rust smg 1.13.0 (and, with ``--vllm``, vLLM's own API server)
against the same mock engine; req/s, CPU µs per streamed token and per request, added TTFT
p50/p99 at concurrency 1, 32 and 256, RSS with 1000 concurrent streams; then
``bench/long_prompt.py`` (the inter-token gaps of 32 streams while 1k-, 8k- and 32k-token
prompts arrive); then the F5 disconnect soak (``bench/abort_storm.py``, smg_trio and smg: ABORT
delays and RSS over 50 rounds), the engine check (``bench/engine_check.py``: does doubling
the engine side raise smg's c=256 throughput?) and, when the vLLM peer is installed (not in
``--quick`` unless ``--with-vllm``), ``bench/vllm_bench.py``: vLLM's own ``vllm bench serve``
against smg_trio N=1, N=2 and smg on the lean engine (3 repetitions, ~25 s each, most of it
the client's start-up). Writes ``docs/perf/gateway.json``, draws ``docs/perf/gateway.png``
and regenerates the figures section of ``docs/performance.md``. Prints a table. Not a timed
test.

    python bench/run.py            # full run
    python bench/run.py --quick    # ~3 min smoke check: one repetition, fewer requests, no vLLM
    python bench/run.py --render [--json FILE]   # only redraw the chart and the docs

Any other option is passed to ``bench/gateway.py`` (see ``python bench/gateway.py --help``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):  # bench helpers; peers/ (repo-only tooling)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gateway  # noqa: E402
import report  # noqa: E402

from peers.tools import vllm_missing_reason  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(__doc__)
        gateway.parser().print_help()
        return 0
    json_path = report.DEFAULT_JSON
    if "--json" in args:
        json_path = Path(args[args.index("--json") + 1])
    if "--render" not in args:
        if "--json" not in args:
            args += ["--json", str(json_path)]
        quick = "--quick" in args
        gateway.run_bench(args)
        add_long_prompt(json_path, prompts=3 if quick else 10)
        add_abort_soak(json_path, rounds=10 if quick else 50)
        add_engine_check(json_path, reps=1 if quick else 3)
        if quick and "--with-vllm" not in args:
            print(
                "vllm bench serve skipped in --quick (the vLLM client starts slowly; --with-vllm)"
            )
        elif (reason := vllm_missing_reason()) is not None:
            print(f"vllm bench serve skipped: {reason}")
        else:
            add_vllm_bench(json_path, quick=quick, reps=1 if quick else 3)
    report.render(json_path)
    print(f"wrote {json_path}, {report.DEFAULT_PNG} and {report.DEFAULT_MD}")
    return 0


def add_long_prompt(json_path: Path, *, prompts: int) -> None:
    """Run ``bench/long_prompt.py`` (its own gateway and mock, after the others stopped) and
    keep its figures in the run's JSON under ``long_prompt``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "long_prompt.json"
        cmd = [sys.executable, str(BENCH_DIR / "long_prompt.py"), "--prompts", str(prompts)]
        subprocess.run([*cmd, "--json", str(out)], check=True)
        figures = json.loads(out.read_text())
    data = json.loads(json_path.read_text())
    data["long_prompt"] = {"argv": ["--prompts", str(prompts)], **figures}
    json_path.write_text(json.dumps(data, indent=1) + "\n")


def _run_json(script: str, *argv: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(BENCH_DIR / script), *argv, "--json", str(out)]
        subprocess.run(cmd, check=True)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def add_abort_soak(json_path: Path, *, rounds: int) -> None:
    """Run the F5 disconnect soak (``bench/abort_storm.py``: 64 clients vanish mid-stream,
    ``rounds`` times; ABORT delays and RSS per round) on smg_trio and on smg, one after the
    other, and keep both under ``abort_soak``."""
    soak = {}
    for name in ("smg_trio", "smg"):
        soak[name] = _run_json("abort_storm.py", "--rounds", str(rounds), "--gateway", name)
    data = json.loads(json_path.read_text())
    data["abort_soak"] = soak
    json_path.write_text(json.dumps(data, indent=1) + "\n")


def add_engine_check(json_path: Path, *, reps: int) -> None:
    """Run ``bench/engine_check.py`` (smg's c=256 tokens/s with the trio mock, the lean
    engine and two lean engines) and keep it under ``engine_check``."""
    figures = _run_json("engine_check.py", "--reps", str(reps))
    data = json.loads(json_path.read_text())
    data["engine_check"] = figures
    json_path.write_text(json.dumps(data, indent=1) + "\n")


def add_vllm_bench(json_path: Path, *, quick: bool, reps: int) -> None:
    """Run ``bench/vllm_bench.py`` (``vllm bench serve`` against smg_trio N=1, N=2 and smg, each
    in front of the lean engine) and keep its figures under ``vllm_bench``."""
    figures = _run_json("vllm_bench.py", "--reps", str(reps), *(["--quick"] if quick else []))
    data = json.loads(json_path.read_text())
    data["vllm_bench"] = figures
    json_path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
