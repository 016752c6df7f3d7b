"""The benchmark entry point: run the gateway benchmark, then refresh the docs from it.

One session: smg_trio and the Rust smg 1.13.0 (and, with ``--vllm``, vLLM's own API server)
against the same mock engine; req/s, CPU µs per streamed token and per request, added TTFT
p50/p99 at concurrency 1, 32 and 256, RSS with 1000 concurrent streams. Writes
``docs/perf/gateway.json``, draws ``docs/perf/gateway.png`` and regenerates the figures
section of ``docs/performance.md``. Prints a table. Not a timed test.

    python bench/run.py            # full run, ~6 min on 2 cores
    python bench/run.py --quick    # ~3 min smoke check: one repetition, fewer requests, no vLLM
    python bench/run.py --render   # only redraw the chart and the docs from the JSON

Any other option is passed to ``bench/gateway.py`` (see ``python bench/gateway.py --help``).
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import gateway  # noqa: E402
import report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(__doc__)
        gateway.parser().print_help()
        return 0
    json_path = report.DEFAULT_JSON
    if "--render" not in args:
        if "--json" not in args:
            args += ["--json", str(json_path)]
        else:
            json_path = Path(args[args.index("--json") + 1])
        gateway.run_bench(args)
    report.render(json_path)
    print(f"wrote {json_path}, {report.DEFAULT_PNG} and {report.DEFAULT_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
