"""``conformance wire``: check smg_trio's vLLM and TokenSpeed wire codecs against pinned byte
vectors, a captured real session, and (when available) the engines' own codecs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from conformance import (
    wire_cases_handshake,
    wire_cases_reference,
    wire_cases_tokenspeed,
    wire_cases_vllm,
)
from conformance.case import Case, CaseResult, Result, execute_all
from conformance.report import (
    SUITE_WIRE,
    summary_line,
    table_header,
    table_row,
    write_json,
    write_junit,
)
from conformance.runner import select_cases
from conformance.wire_context import REFERENCE_PYTHON_ENV, REFERENCE_TIMEOUT_S, WireContext

__all__ = ["build_parser", "main", "run_wire_cases", "wire_cases"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def wire_cases() -> list[Case]:
    """Every wire case, in run order (pinned first, reference round trips last)."""
    return [
        *wire_cases_vllm.CASES,
        *wire_cases_handshake.CASES,
        *wire_cases_tokenspeed.CASES,
        *wire_cases_reference.CASES,
    ]


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for ``conformance wire``."""
    parser = argparse.ArgumentParser(
        prog="python -m conformance wire",
        description="Check smg_trio's vLLM EngineCore and TokenSpeed wire codecs against pinned "
        "byte vectors, a captured vLLM 0.32.0 session, and the engines' own codecs. "
        "Exit status: 0 all passed or skipped, 1 a case failed, 2 usage error.",
    )
    parser.add_argument(
        "--reference-python",
        metavar="PATH",
        default=os.environ.get(REFERENCE_PYTHON_ENV) or None,
        help="interpreter with vllm / tokenspeed installed, for the reference_* cases when "
        f"they are not importable here (default: ${REFERENCE_PYTHON_ENV}; else they skip)",
    )
    parser.add_argument(
        "--reference-timeout-s",
        type=float,
        default=REFERENCE_TIMEOUT_S,
        help=f"limit for each reference run (default {REFERENCE_TIMEOUT_S:.0f})",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT.json", help="write a JSON summary")
    parser.add_argument("--junit", dest="junit_out", metavar="OUT.xml", help="write JUnit XML")
    parser.add_argument(
        "--only", metavar="NAME,...", help="comma-separated case names to run (see --list)"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    return parser


def run_wire_cases(
    ctx: WireContext,
    cases: Sequence[Case],
    *,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` in order; never raises for a failing case."""
    return execute_all(ctx, cases, on_result=on_result)


def _list_cases() -> int:
    for case in wire_cases():
        print(f"{case.name}\n    {case.behaviour}\n    why: {case.why}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``conformance wire``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.list:
        return _list_cases()
    try:
        cases = select_cases(wire_cases(), args.only.split(",") if args.only else None)
    except ValueError as exc:
        print(f"error: {exc} (see --list)", file=sys.stderr)
        return EXIT_USAGE
    ctx = WireContext(reference_python=args.reference_python, timeout_s=args.reference_timeout_s)
    sources = {e: ctx.reference_source(e) or "none (skip)" for e in ("vllm", "tokenspeed")}
    target = {"reference_vllm": sources["vllm"], "reference_tokenspeed": sources["tokenspeed"]}
    print(f"conformance wire: {len(cases)} case(s); reference: {sources}\n")
    print(table_header(), flush=True)
    results = run_wire_cases(ctx, cases, on_result=lambda r: print(table_row(r), flush=True))
    print(f"\n{summary_line(results)}")
    if args.json_out:
        write_json(args.json_out, results, target, suite=SUITE_WIRE)
    if args.junit_out:
        write_junit(args.junit_out, results, target, suite=SUITE_WIRE)
    return EXIT_FAILED if any(r.result is Result.FAIL for r in results) else EXIT_OK
