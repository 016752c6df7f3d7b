"""Command line: ``python -m conformance http ...`` and the ``wire`` hook."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from conformance.case import CaseResult, Result
from conformance.client import Context
from conformance.report import summary_line, table_header, table_row, write_json, write_junit
from conformance.runner import http_cases, run_cases, select_cases

__all__ = ["build_parser", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for ``python -m conformance``."""
    parser = argparse.ArgumentParser(
        prog="python -m conformance",
        description="Black-box conformance checks for OpenAI-compatible gateways.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{http,wire}")
    http = sub.add_parser(
        "http",
        help="run the HTTP cases against a running gateway",
        description="Run the HTTP cases against a running OpenAI-compatible gateway. "
        "Exit status: 0 all passed or skipped, 1 a case failed, 2 usage error.",
    )
    http.add_argument(
        "--base-url",
        help="gateway root, e.g. http://127.0.0.1:30000 (a trailing /v1 is accepted)",
    )
    http.add_argument("--model", help="served model name to send requests for")
    http.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    http.add_argument("--json", dest="json_out", metavar="OUT.json", help="write a JSON summary")
    http.add_argument("--junit", dest="junit_out", metavar="OUT.xml", help="write JUnit XML")
    http.add_argument(
        "--only", metavar="NAME,...", help="comma-separated case names to run (see --list)"
    )
    http.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="limit for each request, connect to last byte (default 60)",
    )
    http.add_argument(
        "--abandon-after-s",
        type=float,
        default=0.3,
        help="when disconnect_nonstream gives up on its request (default 0.3)",
    )
    http.add_argument("--list", action="store_true", help="list the cases and exit")
    sub.add_parser(
        "wire",
        help="check the vLLM / TokenSpeed wire codecs against pinned vectors and the engines' "
        "own codecs (see: wire --help)",
        add_help=False,
    )
    return parser


def run_wire(args: Sequence[str]) -> int:
    """Delegate to ``conformance.wire.main(args)`` when that module exists."""
    if importlib.util.find_spec("conformance.wire") is None:
        print("conformance wire is not available (no conformance.wire module)", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module("conformance.wire")
    return int(module.main(list(args)))


def _list_cases() -> int:
    for case in http_cases():
        print(f"{case.name}\n    {case.behaviour}\n    why: {case.why}")
    return EXIT_OK


def run_http(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the ``http`` subcommand."""
    if args.list:
        return _list_cases()
    if not args.base_url or not args.model:
        parser.error("http: --base-url and --model are required")
    try:
        cases = select_cases(http_cases(), args.only.split(",") if args.only else None)
    except ValueError as exc:
        print(f"error: {exc} (see --list)", file=sys.stderr)
        return EXIT_USAGE
    ctx = Context(
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key,
        timeout_s=args.timeout_s,
        abandon_after_s=args.abandon_after_s,
    )
    target = {"base_url": ctx.base_url, "model": ctx.model}
    print(f"conformance http: {ctx.base_url} model={ctx.model!r}, {len(cases)} case(s)\n")
    print(table_header(), flush=True)

    def show(res: CaseResult) -> None:
        print(table_row(res), flush=True)

    results = run_cases(ctx, cases, on_result=show)
    print(f"\n{summary_line(results)}")
    if args.json_out:
        write_json(args.json_out, results, target)
    if args.junit_out:
        write_junit(args.junit_out, results, target)
    return EXIT_FAILED if any(r.result is Result.FAIL for r in results) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (``python -m smg_trio conformance`` reuses it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["wire"]:
        return run_wire(args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
        if args.command == "http":
            return run_http(args, parser)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    parser.print_usage(sys.stderr)
    return EXIT_USAGE
