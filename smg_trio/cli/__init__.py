"""``python -m smg_trio``: serve, launch, mock-engine, conformance and version subcommands."""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Sequence

import trio

from smg_trio import __version__
from smg_trio.cli.env_config import _apply_env_and_file as _apply_env_and_file
from smg_trio.cli.gateway_config import _check_api_server_count as _check_api_server_count
from smg_trio.cli.gateway_config import _config_from_args as _config_from_args
from smg_trio.cli.hints import _unknown_hint as _unknown_hint
from smg_trio.cli.parser import _parser as _parser
from smg_trio.cli.run import FORCED_EXIT_AFTER_S as FORCED_EXIT_AFTER_S
from smg_trio.cli.run import _run_gateway as _run_gateway
from smg_trio.exc_groups import leaves
from smg_trio.logfmt import setup_logging

__all__ = ["main"]

log = logging.getLogger("smg_trio")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["mock-engine"]:
        from smg_trio.mock.engine import main as mock_main

        return mock_main(argv[1:])
    if argv[:1] == ["conformance"]:
        from conformance import main as conformance_main

        return conformance_main(argv[1:])
    engine_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, engine_args = argv[:i], argv[i + 1 :]
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)}{_unknown_hint(parser, args, argv, unknown)}"
        )
    if args.command == "version":
        print(__version__)
        return 0
    _apply_env_and_file(parser, args, argv)
    setup_logging(args.log_level, args.log_format)
    args.api_server_count = _check_api_server_count(args)
    config = _config_from_args(args, engine_args)
    try:
        trio.run(_run_gateway, config)
        log.info("smg_trio stopped; engines and sockets are shut down")
    except BaseException as exc:  # report every leaf of an exception group, then exit non-zero
        if isinstance(exc, KeyboardInterrupt):
            return 130
        for leaf in leaves(exc):
            if isinstance(leaf, (trio.Cancelled, KeyboardInterrupt)):
                continue
            if isinstance(leaf, OSError) and leaf.errno == errno.EADDRINUSE:
                leaf = OSError(
                    f"cannot listen on {config.host}:{config.port}: address already in use "
                    "(another server there? pick another --port)"
                )
            print(f"smg_trio: error: {leaf}", file=sys.stderr)
        return 1
    return 0
