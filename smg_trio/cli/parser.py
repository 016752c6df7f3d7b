"""The argument parser: the subcommands and the flags of ``serve`` and ``launch``."""

from __future__ import annotations

import argparse

from smg_trio import __version__
from smg_trio.cli.argtypes import _int_at_least
from smg_trio.cli.gateway_flags import LOG_LEVELS, _common


def _parser() -> argparse.ArgumentParser:
    """The argument parser. Every parser and subparser takes ``allow_abbrev=False``: a flag is
    only its full name (as in smg's clap parser), so an abbreviation can neither slip past the
    env and config layers (they skip the flags the command line names) nor change its meaning
    when a flag is added."""
    from smg_trio.serve.config import DEFAULT_WORKER_BASE_PORT

    p = argparse.ArgumentParser(
        prog="python -m smg_trio",
        allow_abbrev=False,
        description="An OpenAI-compatible gateway that drives vLLM and TokenSpeed engines over ZMQ.",
    )
    p.add_argument("--version", action="version", version=__version__, help="print the version")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="launch headless engines and the gateway",
        description="Launch --dp-size headless engines as child processes and serve them. "
        "Engine arguments go after '--'. Every flag also reads SMG_TRIO_<FLAG> from the environment.",
    )
    s.add_argument(
        "--backend",
        choices=["vllm", "tokenspeed", "mock"],
        default=None,
        help="engine to launch (default: vllm or tokenspeed if installed, else the built-in mock)",
    )
    s.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="the model, as vLLM's positional `vllm serve MODEL` (the same as --model)",
    )
    s.add_argument(
        "--model",
        help="local model directory, or a Hugging Face model id (org/name) resolved in the "
        "HF cache, which fetches its tokenizer and config when missing unless HF_HUB_OFFLINE "
        "is set (default for mock: a generated tiny model)",
    )
    s.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=_int_at_least(1), default=1,
                   help="independent engine workers (default %(default)s)")  # fmt: skip
    s.add_argument(
        "--worker-base-port",
        type=_int_at_least(1, 65535),
        default=DEFAULT_WORKER_BASE_PORT,
        help="first worker port (default %(default)s)",
    )
    s.add_argument(
        "--socket-dir", help="ipc socket dir (default $SMG_ZMQ_SOCKET_DIR or /tmp/smg-zmq-<uid>)"
    )
    s.add_argument(
        "--engine-python",
        help="python interpreter that runs the engines, e.g. a separate vLLM virtualenv's "
        "bin/python (default: this interpreter)",
    )
    s.add_argument(
        "--engine-log-level",
        default="info",
        choices=LOG_LEVELS,
        help="forward the engines' log lines from this level on, each at the engine's own "
        "level and with its [engine-PORT] prefix (default %(default)s)",
    )
    s.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default=None,
        help="vLLM's scheduling policy, passed to the vLLM engines (unless given after '--'): "
        "'priority' serves requests by their 'priority' field, lower first (default: vLLM's, "
        "fcfs). The gateway's admission queue orders by priority either way",
    )
    s.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        metavar="NAME=PATH",
        help="vLLM's: LoRA adapters served by name, 'name=path' or JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\'; a path is a folder inside '
        "--allowed-model-dirs or a Hugging Face id in the hub cache. The vLLM engines are "
        "launched with --enable-lora and matching --max-loras/--max-lora-rank (docs/lora.md)",
    )
    s.add_argument(
        "--enable-lora",
        action="store_true",
        help="vLLM's: launch the vLLM engines with LoRA support, for adapters loaded at run "
        "time (/v1/load_lora_adapter); implied by --lora-modules",
    )
    s.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help="vLLM's: adapters an engine holds at once (default: the --lora-modules count, "
        "at least 1)",
    )
    s.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        choices=(1, 8, 16, 32, 64, 128, 256, 320, 512),
        help="vLLM's: the largest adapter rank (default 16)",
    )
    s.add_argument(
        "--mock-script",
        metavar="FILE",
        help="with --backend mock: a JSON or TOML file of rules that answer matching prompts "
        "with scripted text or token ids (docs/mock.md; default: random tokens)",
    )
    _common(s)

    la = sub.add_parser(
        "launch",
        allow_abbrev=False,
        help="run only the gateway, for engines started elsewhere",
        description="Bind each worker's sockets and wait for its engines to dial in. Without "
        "--worker-urls the gateway starts empty and takes workers from POST /workers or "
        "--discovery-file.",
    )
    la.add_argument(
        "--worker-urls",
        nargs="+",
        required=False,
        default=None,
        help="ipc:// worker URLs, or tcp://HOST:PORT for remote engines (vLLM --headless "
        "--data-parallel-address HOST --data-parallel-rpc-port PORT), registered at startup "
        "(default: none)",
    )
    la.add_argument(
        "--backend",
        choices=["vllm", "tokenspeed"],
        default="vllm",
        help="engine wire (default %(default)s)",
    )
    la.add_argument(
        "--model-path",
        help="local model directory or Hugging Face model id (tokenizer, chat template, EOS "
        "ids) of the --worker-urls, and the default of workers added later",
    )
    la.add_argument(
        "--zmq-engine-count",
        type=_int_at_least(1),
        default=1,
        help="engines (DP ranks) per worker URL: the engines' --data-parallel-size "
        "(default %(default)s)",
    )
    la.add_argument(
        "--zmq-handshake-address",
        metavar="tcp://HOST:PORT",
        help="the handshake address engines dial (their --data-parallel-address and "
        "--data-parallel-rpc-port), instead of the one derived from the worker URL (a single "
        "worker only)",
    )
    _common(la)

    sub.add_parser(
        "mock-engine", help="run the mock engine (see --help)", add_help=False, allow_abbrev=False
    )
    sub.add_parser(
        "conformance",
        help="run the conformance runner (see --help)",
        add_help=False,
        allow_abbrev=False,
    )
    sub.add_parser("version", help="print the version", allow_abbrev=False)
    return p
