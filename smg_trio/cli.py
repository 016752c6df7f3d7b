"""``python -m smg_trio``: serve, launch, mock-engine, conformance and version subcommands."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import logging
import math
import os
import signal
import sys
import tomllib
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, NoReturn

import trio

from smg_trio import __version__
from smg_trio.connector.client import ENGINE_SILENCE_DEATH_TIMEOUT_S
from smg_trio.exc_groups import leaves
from smg_trio.gateway.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_N,
    DEFAULT_MAX_SEQUENCES_PER_REQUEST,
    DEFAULT_PORT,
    DEFAULT_QUEUE_SIZE,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_RESPONSES_STORE_SIZE,
    DEFAULT_WRITE_TIMEOUT_S,
    REQUEST_TOKENS_CONTEXTS,
)
from smg_trio.logfmt import setup_logging
from smg_trio.parsers.reasoning import reasoning_parser_names
from smg_trio.transport.handshake import READY_TIMEOUT_S
from smg_trio.transport.tcp import DEFAULT_HEARTBEAT_IVL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from smg_trio.worker.jobs import DEFAULT_JOB_TTL_S, DEFAULT_MAX_FINISHED_JOBS
from smg_trio.worker.manager import WORKER_WAIT_TIMEOUT_S
from smg_trio.worker.policies import DEFAULT_POLICY, POLICY_NAMES

__all__ = ["main"]

log = logging.getLogger("smg_trio")

_ENV_PREFIX = "SMG_TRIO_"


def _default_backend() -> str:
    for name in ("vllm", "tokenspeed"):
        if importlib.util.find_spec(name) is not None:
            return name
    return "mock"


def _api_server_count(text: str) -> int | str:
    """An argparse type: ``--api-server-count`` (a positive integer or ``auto``)."""
    from smg_trio.serve.frontends import parse_api_server_count

    try:
        return parse_api_server_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_api_server_count(args: argparse.Namespace) -> int:
    """Resolve ``--api-server-count`` (``auto`` is printed) and exit 2 if the backend cannot
    have that many frontends."""
    from smg_trio.serve.frontends import AUTO, api_server_count_problem, resolve_api_server_count

    count = resolve_api_server_count(args.api_server_count)
    if args.api_server_count == AUTO:
        print(f"smg_trio: --api-server-count auto: {count} (usable cores)", flush=True)
    backend = args.backend
    if args.command == "serve" and backend is None:
        backend = _default_backend()
    problem = api_server_count_problem(count, backend)
    if problem is not None:
        _usage_error(problem)
    return count


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _float_range(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high or value != value or value == float("inf"):
            bound = f"at least {low}" if high == float("inf") else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    return parse


def _seconds(*, allow_zero: bool, allow_inf: bool = False) -> Callable[[str], float]:
    """An argparse type: a duration in seconds (positive, or also 0; finite unless inf is
    allowed)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if math.isnan(value) or (math.isinf(value) and not allow_inf):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
        if value < 0 or (value == 0 and not allow_zero):
            kind = "non-negative" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text}")
        return value

    return parse


def _stall_timeout(text: str) -> float:
    """An argparse type: ``--frontend-stall-timeout-secs`` (0 or inf: off; else at least
    1 s: below that, a long busy stretch of a healthy loop could read as a stall)."""
    value = _seconds(allow_zero=True, allow_inf=True)(text)
    if 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or at least 1 second, got {text}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    # serve/__init__ (the HTTP app) is heavy; the mock-engine and conformance paths skip it
    from smg_trio.serve.config import (
        DEFAULT_FRONTEND_STALL_TIMEOUT_S,
        DEFAULT_SHUTDOWN_GRACE_PERIOD_S,
    )

    g = p.add_argument_group("gateway")
    g.add_argument("--host", default=DEFAULT_HOST, help="HTTP bind host (default %(default)s)")
    g.add_argument(
        "--api-server-count",
        type=_api_server_count,
        default=1,
        metavar="N|auto",
        help="frontend processes serving HTTP on the same engines (vLLM's flag); auto: one per "
        "core this process may use (default %(default)s)",
    )
    g.add_argument(
        "--frontend-stall-timeout-secs",
        type=_stall_timeout,
        default=DEFAULT_FRONTEND_STALL_TIMEOUT_S,
        help="with --api-server-count above 1: kill and restart a frontend whose event loop "
        "has not run for this long (alive but serving nothing); 0 or inf: never "
        "(default %(default)s)",
    )
    g.add_argument(
        "--port",
        type=_int_at_least(0, 65535),
        default=DEFAULT_PORT,
        help="HTTP port; 0 picks a free one (default %(default)s)",
    )
    g.add_argument(
        "--served-model-name",
        help="model id clients send (default: the model path, or the Hugging Face id)",
    )
    g.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        choices=POLICY_NAMES,
        help="load-balancing policy across the engines of a model (default %(default)s: the "
        "engine holding the longest cached prefix of the prompt, from the engines' KV events "
        "or, for engines without them, the prompts routed there; see docs/routing.md)",
    )
    g.add_argument(
        "--cache-threshold",
        type=_float_range(0.0, 1.0),
        default=0.3,
        help="cache_aware: the least share of a prompt's blocks cached on an engine for the "
        "cache to choose it (default %(default)s)",
    )
    g.add_argument(
        "--balance-abs-threshold",
        type=_float_range(0.0, float("inf")),
        default=64,
        help="cache_aware: load goes before the cache once the most and least loaded engines "
        "differ by more than this many requests... (default %(default)s)",
    )
    g.add_argument(
        "--balance-rel-threshold",
        type=_float_range(1.0, float("inf")),
        default=1.5,
        help="...and the most loaded carries more than this many times the least "
        "(default %(default)s)",
    )
    g.add_argument(
        "--block-size",
        type=_int_at_least(1, 1 << 20),
        default=16,
        help="cache_aware: tokens per block of the approximate index for an engine whose "
        "registration names no block size (default %(default)s)",
    )
    g.add_argument(
        "--max-tree-size",
        type=_int_at_least(1, 1 << 40),
        default=1 << 26,
        help="cache_aware: blocks kept per engine in the approximate index of routed prompts "
        "(also bounded by the engine's num_gpu_blocks; default %(default)s)",
    )
    g.add_argument(
        "--eviction-interval-secs",
        type=_float_range(0.001, float("inf")),
        default=120.0,
        help="cache_aware: how often the approximate index forgets blocks not routed to in "
        "the last 5 intervals (default %(default)s)",
    )
    g.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on inference endpoints (default: "
        "$VLLM_API_KEY, else none). One key; vLLM's takes several: give more with "
        "--api-keys-file or --tenant-api-key",
    )
    g.add_argument(
        "--admin-api-key",
        help="require this bearer key on the admin routes: /workers, /get_loads and the "
        "engine control routes (/sleep, /reset_prefix_cache, ...; docs/admin.md) (default: "
        "the --api-key)",
    )
    g.add_argument(
        "--api-keys-file",
        metavar="PATH",
        help="tenants: a JSON or TOML file of named API keys, each with its own "
        "max_concurrent_requests and tokens_per_minute; read once at start "
        "(docs/security.md#tenants)",
    )
    g.add_argument(
        "--tenant-api-key",
        action="extend",
        nargs="+",
        metavar="NAME:KEY",
        help="a tenant's API key, no limits (smg's tenant:key; repeatable). A key on the "
        "command line shows in ps: prefer --api-keys-file",
    )
    g.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="export a span per inference request over OTLP to URL (vLLM's flag; gRPC, or "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); needs the otel extra, "
        "pip install -e '.[otel]' (docs/observability.md)",
    )
    g.add_argument(
        "--enable-http2",
        action="store_true",
        help="also serve cleartext HTTP/2 (prior knowledge, Upgrade: h2c); off by default: "
        "a client that never opens its HTTP/2 flow-control window is not dropped by "
        "--write-timeout-secs (docs/security.md)",
    )
    g.add_argument(
        "--disable-fast-http1",
        action="store_true",
        help="serve every HTTP/1.1 request through hypercorn and h11, not the fast path for "
        "plain requests (docs/architecture.md)",
    )
    g.add_argument(
        "--allow-insecure-admin",
        action="store_true",
        help="without --admin-api-key/--api-key, let anyone who can reach the port add and "
        "remove workers and put engines to sleep (single-user development only; default: the "
        "admin routes' POST and DELETE get 403)",
    )
    g.add_argument(
        "--allowed-socket-dirs",
        nargs="+",
        metavar="DIR",
        help="more directories worker ipc:// URLs may live under (default: only the socket "
        "dir, and for launch the directories of --worker-urls)",
    )
    g.add_argument(
        "--allowed-engine-hosts",
        nargs="+",
        metavar="HOST",
        help="non-loopback hosts a worker's zmq_handshake_address or tcp:// URL may bind, and "
        "the only non-loopback addresses a tcp:// worker's engines may connect from (IPs; "
        "default: none)",
    )
    g.add_argument(
        "--allowed-engine-uids",
        nargs="+",
        metavar="UID",
        help="the uids a tcp:// worker's engines on this host may connect as (the owner of "
        "their socket; default: root and the gateway's own uid)",
    )
    g.add_argument(
        "--zmq-advertise-host",
        metavar="HOST",
        default=None,
        help="the host a tcp:// worker's engines are told to dial for its input and output "
        "sockets (default: the worker URL's host; required when that is 0.0.0.0 or ::)",
    )
    g.add_argument(
        "--zmq-heartbeat-interval-secs",
        type=_seconds(allow_zero=False),
        default=DEFAULT_HEARTBEAT_IVL_S,
        help="ZMTP heartbeat (PING) interval on a tcp:// worker's sockets (default %(default)s)",
    )
    g.add_argument(
        "--zmq-heartbeat-timeout-secs",
        type=_seconds(allow_zero=False),
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        help="a tcp:// worker's engine connection with no traffic this long after a PING is "
        "closed, and the engine is then dead after the disconnect grace (default %(default)s)",
    )
    g.add_argument(
        "--allowed-model-dirs",
        nargs="+",
        metavar="DIR",
        help="directories model_path (and every model file) must resolve inside, besides the "
        "startup model directory (default: the Hugging Face hub cache)",
    )
    g.add_argument(
        "--revision",
        help="with a Hugging Face model id: the branch, tag or commit to use (default: main); "
        "the engine is given the commit it resolves to",
    )
    g.add_argument(
        "--tokenizer-revision",
        help="with a Hugging Face model id: the revision of the tokenizer (default: --revision)",
    )
    g.add_argument(
        "--reasoning-parser",
        choices=reasoning_parser_names(),
        metavar="NAME",
        help="split the model's reasoning out into the message's reasoning field: "
        f"{', '.join(reasoning_parser_names())} (docs/reasoning.md; default: no split)",
    )
    g.add_argument(
        "--tool-call-parser",
        metavar="NAME",
        help="the models' tool-call format, parsed into tool_calls (docs/tools.md lists the "
        "names); tool_choice 'required' and named functions need no parser",
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="parse tool calls for tool_choice 'auto' (needs --tool-call-parser); without it, "
        "a request with tools and tool_choice 'auto' (the default with tools) is a 400, as in "
        "vLLM",
    )
    g.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report the prompt tokens the engine found in its prefix cache: "
        "usage.prompt_tokens_details.cached_tokens (chat, completions) and "
        "cache_read_input_tokens (Messages), as vLLM's flag of that name does; the Responses "
        "API always reports input_tokens_details.cached_tokens",
    )
    g.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEMPLATE",
        help="the chat template the gateway renders (it tokenizes; the engine never sees "
        "one): a Jinja file, or the template inline, as vLLM reads it; replaces the model's",
    )
    g.add_argument(
        "--chat-template-content-format",
        choices=("auto", "string", "openai"),
        default="auto",
        help="message content as the template sees it: a string, or OpenAI's list of parts; "
        "auto detects it from the template (vLLM's flag; default %(default)s)",
    )
    g.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a request's own chat_template (sandboxed like the model's); without it "
        "such a request is a 400, as in vLLM",
    )
    g.add_argument(
        "--default-chat-template-kwargs",
        type=_json_object,
        metavar="JSON",
        help="chat template variables every chat request renders with, under its own "
        "chat_template_kwargs (vLLM's flag), e.g. '{\"enable_thinking\": false}'",
    )
    g.add_argument(
        "--response-role",
        default="assistant",
        metavar="ROLE",
        help="the reply's role when add_generation_prompt is true (vLLM's flag; default "
        "%(default)s)",
    )
    g.add_argument(
        "--max-n",
        type=_int_at_least(1),
        default=DEFAULT_MAX_N,
        help="largest n accepted (default %(default)s)",
    )
    g.add_argument(
        "--responses-store-size",
        type=_int_at_least(0),
        default=DEFAULT_RESPONSES_STORE_SIZE,
        help="responses kept for GET /v1/responses/{id} and previous_response_id, least "
        "recently used evicted first; per process; 0 stores none (default %(default)s)",
    )
    g.add_argument(
        "--max-sequences-per-request",
        type=_int_at_least(1),
        default=DEFAULT_MAX_SEQUENCES_PER_REQUEST,
        help="most sequences (prompts x n) one request may start (default %(default)s)",
    )
    g.add_argument(
        "--max-tokens-per-request",
        type=_int_at_least(1),
        default=None,
        help="most completion tokens one request may ask for across its sequences (max_tokens, "
        f"or the rest of the context when unset) (default: {REQUEST_TOKENS_CONTEXTS} x the "
        "model's context length)",
    )
    g.add_argument(
        "--max-concurrent-requests",
        type=_int_at_least(1),
        default=DEFAULT_MAX_CONCURRENT_REQUESTS,
        help="inference requests served at once; more wait in a queue (default %(default)s)",
    )
    g.add_argument(
        "--queue-size",
        type=_int_at_least(0),
        default=DEFAULT_QUEUE_SIZE,
        help="requests that may wait for a slot; more get 429 at once (default %(default)s)",
    )
    g.add_argument(
        "--queue-timeout-secs",
        type=_seconds(allow_zero=True, allow_inf=True),
        default=DEFAULT_QUEUE_TIMEOUT_S,
        help="how long a request waits for a slot before its 429 (default %(default)s)",
    )
    g.add_argument(
        "--write-timeout-secs",
        type=_seconds(allow_zero=False, allow_inf=True),
        default=DEFAULT_WRITE_TIMEOUT_S,
        help="drop a client whose response write has been blocked this long; its engine "
        "requests are aborted (default %(default)s)",
    )
    g.add_argument(
        "--worker-startup-timeout-secs",
        type=_seconds(allow_zero=False),
        default=READY_TIMEOUT_S,
        help="per-stage engine handshake deadline in seconds (default %(default)s)",
    )
    g.add_argument(
        "--max-finished-jobs",
        type=_int_at_least(0),
        default=DEFAULT_MAX_FINISHED_JOBS,
        help="finished registration jobs kept for GET /workers/jobs/{id}; older ones expire "
        "(default %(default)s)",
    )
    g.add_argument(
        "--job-ttl-secs",
        type=_seconds(allow_zero=True, allow_inf=True),
        default=DEFAULT_JOB_TTL_S,
        help="how long a finished registration job stays readable; inf keeps it until "
        "--max-finished-jobs newer ones finished (default %(default)s)",
    )
    g.add_argument(
        "--engine-silence-timeout-secs",
        type=_seconds(allow_zero=False, allow_inf=True),
        default=ENGINE_SILENCE_DEATH_TIMEOUT_S,
        help="fail in-flight requests after this long without engine output (default %(default)s)",
    )
    g.add_argument(
        "--worker-wait-timeout-secs",
        type=_seconds(allow_zero=True),
        default=WORKER_WAIT_TIMEOUT_S,
        help="how long a request for a known model with no ready worker (a rolling update, a "
        "restarting engine) waits for one before its 503 with Retry-After (default %(default)s)",
    )
    g.add_argument(
        "--discovery-file",
        metavar="FILE",
        help="a JSON or TOML list of worker specs (the POST /workers fields), watched: added "
        "entries register, removed ones drain, changed ones are replaced",
    )
    g.add_argument(
        "--discovery-provider",
        choices=["file"],
        help="service discovery source; only 'file' (with --discovery-file), as smg spells it",
    )
    g.add_argument(
        "--shutdown-grace-period-secs",
        type=_seconds(allow_zero=True),
        default=DEFAULT_SHUTDOWN_GRACE_PERIOD_S,
        help="on SIGINT/SIGTERM, how long in-flight requests may finish (default %(default)s)",
    )
    g.add_argument(
        "--enable-log-requests",
        action="store_true",
        help="log each inference request (id, endpoint, model, prompt tokens, body) at INFO, "
        "as vLLM's flag does",
    )
    g.add_argument(
        "--max-log-len",
        type=_int_at_least(0),
        default=None,
        help="with --enable-log-requests: the most body characters logged (default: all)",
    )
    g.add_argument(
        "--disable-access-log",
        "--disable-uvicorn-access-log",
        dest="disable_access_log",
        action="store_true",
        help="accepted for vLLM's command lines: smg_trio writes no per-request access log "
        "(its metrics count requests; --enable-log-requests logs them)",
    )
    for flag, default, what in (
        ("--allowed-origins", [], "origins a browser may call from ('*': any; default none)"),
        ("--allowed-methods", ["*"], "methods allowed cross-origin (default '*')"),
        ("--allowed-headers", ["*"], "request headers allowed cross-origin (default '*')"),
    ):
        g.add_argument(flag, nargs="+", type=_cors_item, default=default, metavar="ITEM",
                       help=f"CORS, as vLLM's flag: {what}")  # fmt: skip
    g.add_argument(
        "--allow-credentials",
        action="store_true",
        help="CORS: allow credentials (cookies, auth) cross-origin, as vLLM's flag",
    )
    g.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the gateway's log level (as vLLM's --uvicorn-log-level; the engines': "
        "--engine-log-level) (default %(default)s)",
    )
    g.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line (default %(default)s)",
    )
    g.add_argument("--config", help="a TOML or JSON file of flag values (flag names with _)")


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
        choices=["debug", "info", "warning", "error"],
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


def _apply_env_and_file(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> None:
    """Precedence: command line > SMG_TRIO_<FLAG> env > --config file > defaults.

    A flag with aliases (``--dp-size``/``--data-parallel-size``) reads the variable and the file
    key of each of its names, its first name first. ``SMG_TRIO_CONFIG`` names the file when
    ``--config`` does not. The command line's flags are whole names (``allow_abbrev=False``),
    so the flags it names are exactly those argparse set."""
    file_values: dict[str, Any] = {}
    config = getattr(args, "config", None)
    if config is None and hasattr(args, "config"):
        config = args.config = os.environ.get(_ENV_PREFIX + "CONFIG")
    if config:
        path = Path(config)
        text = path.read_text()
        file_values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    subparser = sub.choices[args.command]
    for action in subparser._actions:
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        if any(o in given for o in action.option_strings):
            continue
        found = _env_or_file(action, file_values)
        if found is None:
            continue
        source, raw = found
        if isinstance(action, argparse._StoreTrueAction):
            raw = _flag_bool(subparser, action, raw, source)
        elif action.nargs == "+" and isinstance(raw, str):
            raw = raw.split(",")
        elif action.type is not None and isinstance(raw, (str, int, float)):
            try:
                raw = action.type(str(raw))  # type: ignore[operator,unused-ignore]
            except (argparse.ArgumentTypeError, ValueError) as exc:
                subparser.error(
                    f"argument {'/'.join(action.option_strings)}: {exc} (from {source})"
                )
        if action.choices is not None and raw not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            subparser.error(
                f"argument {'/'.join(action.option_strings)}: invalid choice: {raw!r} "
                f"(from {source}; choose from {choices})"
            )
        setattr(args, action.dest, raw)


def _json_object(text: str) -> dict[str, Any]:
    """A flag's JSON object (``--default-chat-template-kwargs``), else a usage error."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


def _template_defaults(value: Any) -> dict[str, Any] | None:
    """``--default-chat-template-kwargs`` from any source (a config file's table too)."""
    if value is None or isinstance(value, dict):
        return value
    _usage_error(f"--default-chat-template-kwargs: a JSON object is needed, got {value!r}")


def _uids(values: list[str | int] | None) -> tuple[int, ...] | None:
    """``--allowed-engine-uids`` as numbers (a usage error for anything else)."""
    if values is None:
        return None
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        _usage_error(f"--allowed-engine-uids: uids are numbers, got {values!r}")


def _env_or_file(action: argparse.Action, file_values: dict[str, Any]) -> tuple[str, Any] | None:
    """``(where, value)`` of a flag not on the command line: its SMG_TRIO_<NAME> variable, else
    its config-file key, trying each of the flag's names in order; None when neither is set."""
    names = dict.fromkeys(
        [action.dest, *(o.lstrip("-").replace("-", "_") for o in action.option_strings)]
    )
    for name in names:
        env = os.environ.get(_ENV_PREFIX + name.upper())
        if env is not None:
            return _ENV_PREFIX + name.upper(), env
    for name in names:
        if file_values.get(name) is not None:
            return f"--config key {name!r}", file_values[name]
    return None


def _flag_bool(
    parser: argparse.ArgumentParser, action: argparse.Action, raw: Any, source: str
) -> bool:
    """An on/off flag's env or config-file value: a bool, or 1/0, true/false, yes/no, on/off."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    parser.error(
        f"argument {'/'.join(action.option_strings)}: expected true or false, got {raw!r} "
        f"(from {source})"
    )


def _check_model_dir(path: str, flag: str) -> None:
    """Exit with a usage error unless ``path`` is a local model directory the gateway can
    tokenize with (checked before any engine is launched)."""
    p = Path(path)
    if not p.is_dir():
        raise SystemExit(
            f"smg_trio: error: {flag} {path}: not a local directory, nor a Hugging Face "
            "model id (org/name); pass the directory holding config.json and tokenizer.json, "
            "or the model's id"
        )
    if not (p / "tokenizer.json").is_file():
        if (p / "tokenizer.model").is_file():
            raise SystemExit(
                f"smg_trio: error: {flag} {path}: the model ships only a SentencePiece "
                "tokenizer.model, no tokenizer.json; the gateway tokenizes with a fast "
                "tokenizer.json. Make one once: download the model into a directory "
                '(`hf download ORG/NAME --local-dir DIR`), run `python -c "from transformers '
                "import AutoTokenizer as T; T.from_pretrained('DIR').save_pretrained('DIR')\"` "
                "(needs transformers and sentencepiece), then pass --model DIR (docs/models.md)"
            )
        raise SystemExit(
            f"smg_trio: error: {flag} {path}: no tokenizer.json there (the gateway tokenizes "
            "with a fast tokenizer.json)"
        )


def _resolve_model(ref: str, flag: str, revision: str | None) -> Any:
    """``ref`` as given when it is a local directory (or not spelled like a hub id: the model
    dir check reports it), else its :class:`~smg_trio.tokenizer.hub.HubModel`: the snapshot in
    the HF cache, fetched (tokenizer and config files only) when missing and allowed. A usage
    error names the id and how to fetch it."""
    from smg_trio.tokenizer.hub import HubModelError, is_hub_id, resolve_hub_model

    if os.path.isdir(ref) or not is_hub_id(ref):
        return None
    try:
        hub = resolve_hub_model(ref, revision, progress=lambda line: log.info("%s", line))
    except HubModelError as exc:
        _usage_error(f"{flag} {ref}: {exc}")
    log.info("%s %s: Hugging Face snapshot %s (%s)", flag, ref, hub.commit, hub.path)
    return hub


def _usage_error(message: str) -> NoReturn:
    """Exit 2 (argparse's usage-error status) with ``smg_trio: error: MESSAGE``."""
    print(f"smg_trio: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _check_mock_script(path: str, tok: Any) -> None:
    """A usage error (exit 2) naming the file and the rule unless the mock script compiles."""
    from smg_trio.mock.script import MockScriptError, load_script

    try:
        load_script(path, tok)
    except MockScriptError as exc:
        _usage_error(str(exc))


def _scheduling_policy_args(policy: str | None, backend: str, engine_args: list[str]) -> list[str]:
    """``--scheduling-policy`` for the engine command: vLLM's flag, unless the engine
    arguments after '--' already set it (theirs wins); TokenSpeed has no such policy."""
    if policy is None:
        return []
    if backend == "tokenspeed":
        _usage_error("--scheduling-policy is vLLM's; TokenSpeed has no request priority")
    if backend != "vllm" or any(
        a == "--scheduling-policy" or a.startswith("--scheduling-policy=") for a in engine_args
    ):
        return []  # the mock steps every request at once; given after '--': as given
    return ["--scheduling-policy", policy]


def _so_backend(engine_args: list[str]) -> str:
    """The launched engines' structured-output backend, read from their own flag."""
    from smg_trio.serve.so_backend import engine_structured_backend

    try:
        return engine_structured_backend(engine_args) or "auto"
    except ValueError as exc:
        _usage_error(str(exc))


def _cors_item(text: str) -> list[str]:
    """One CORS flag value: a name, or a JSON list of names (older vLLM's spelling)."""
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a JSON list: {text!r}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r}")
        return items
    return [text]


def _flatten(values: list[Any]) -> list[str]:
    out: list[str] = []
    for v in values:
        out.extend(v if isinstance(v, list) else [v])
    return out


def _chat_template(args: argparse.Namespace) -> str | None:
    """``--chat-template``'s Jinja source (read and compiled once, here); a usage error."""
    if args.chat_template is None:
        return None
    from smg_trio.tokenizer.template_arg import load_chat_template_arg

    try:
        return load_chat_template_arg(args.chat_template, args.chat_template_content_format)
    except ValueError as exc:
        _usage_error(str(exc))


def _lora_modules(items: list[str], *, tok_revision: str | None) -> tuple[Any, ...]:
    """``--lora-modules`` in vLLM's two forms; a path spelled like a hub id that is no local
    folder is resolved to its snapshot in the hub cache (never fetched: a usage error says how).
    """
    import attrs

    from smg_trio.lora import parse_lora_module
    from smg_trio.tokenizer.hub import HubModelError, is_hub_id, resolve_hub_model

    out = []
    for item in items:
        try:
            module = parse_lora_module(item)
        except ValueError as exc:
            _usage_error(str(exc))
        if not os.path.isdir(module.path) and is_hub_id(module.path):
            try:
                hub = resolve_hub_model(module.path, tok_revision, allow_download=False)
            except HubModelError as exc:
                _usage_error(f"--lora-modules {module.name}: {exc}")
            module = attrs.evolve(module, path=hub.path)
        out.append(module)
    return tuple(out)


def _lora_args(
    args: argparse.Namespace, backend: str, adapters: int, engine_args: list[str]
) -> tuple[list[str], int | None]:
    """The LoRA flags of the engine command (see ``serve/lora_setup.py``) and the rank limit
    the gateway checks loads against; TokenSpeed carries no adapters (a usage error)."""
    from smg_trio.serve.lora_setup import engine_lora_args

    wanted = adapters or args.enable_lora or args.max_loras or args.max_lora_rank
    if wanted and backend == "tokenspeed":
        _usage_error("LoRA adapters are vLLM's: TokenSpeed's wire carries none")
    if args.max_loras is not None and args.max_loras < 1:
        _usage_error("--max-loras must be at least 1")
    flags, rank = engine_lora_args(
        enable=bool(args.enable_lora),
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        adapters=adapters,
        engine_args=engine_args,
    )
    return (flags if backend in ("vllm", "mock") else []), rank


def _api_key(flag_value: str | None) -> str | None:
    """``--api-key`` (command line, ``SMG_TRIO_API_KEY``, config file), else vLLM's
    ``VLLM_API_KEY``: a server moved from ``vllm serve`` keeps its key instead of opening up."""
    if flag_value is not None:
        return flag_value
    vllm_key = os.environ.get("VLLM_API_KEY") or None
    if vllm_key is not None:
        log.info("--api-key: taken from VLLM_API_KEY (vLLM's variable)")
    return vllm_key


#: vLLM API-server flags with a gateway flag of the same meaning: after '--' the headless
#: engine would ignore them (or refuse them), so the user meant the gateway's.
_GATEWAY_OWNED_FLAGS: Final = (
    "--host", "--port", "--api-key", "--served-model-name", "--api-server-count",
    "--enable-prompt-tokens-details", "--tool-call-parser", "--enable-auto-tool-choice",
    "--chat-template", "--chat-template-content-format", "--allowed-origins",
    "--allowed-methods", "--allowed-headers", "--allow-credentials", "--enable-log-requests",
    "--max-log-len", "--lora-modules",
)  # fmt: skip
#: vLLM API-server flags smg_trio has no equivalent of: a headless engine ignores them.
_FRONTEND_ONLY_FLAGS: Final = (
    "--response-role", "--generation-config", "--uvicorn-log-level", "--root-path",
    "--ssl-keyfile", "--ssl-certfile", "--return-tokens-as-token-ids",
    "--enable-force-include-usage",
)  # fmt: skip


def _check_frontend_flags(engine_args: Sequence[str]) -> None:
    """Flags of vLLM's API server given after '--': the engine runs headless, smg_trio is
    its frontend. One the gateway has is a usage error (give it before '--'); one it lacks is
    a warning, since the engine starts anyway and the flag does nothing."""
    for arg in engine_args:
        flag = arg.split("=", 1)[0]
        if flag in _GATEWAY_OWNED_FLAGS:
            _usage_error(
                f"give {flag} before '--': it is the gateway's flag (smg_trio is the API "
                "server; the engine after '--' runs headless)"
            )
        if flag in _FRONTEND_ONLY_FLAGS:
            log.warning(
                "%s after '--' does nothing: it is a flag of vLLM's API server, which smg_trio "
                "replaces (the engine runs headless), and smg_trio has no such flag",
                flag,
            )


def _config_from_args(args: argparse.Namespace, engine_args: list[str]) -> Any:
    from smg_trio.serve.config import EngineLaunchConfig, GatewayConfig

    common: dict[str, Any] = {
        "api_server_count": args.api_server_count if isinstance(args.api_server_count, int) else 1,
        "host": args.host,
        "port": args.port,
        "served_model_name": args.served_model_name,
        "policy": args.policy,
        "cache_threshold": args.cache_threshold,
        "balance_abs_threshold": args.balance_abs_threshold,
        "balance_rel_threshold": args.balance_rel_threshold,
        "block_size": args.block_size,
        "max_tree_size": args.max_tree_size,
        "eviction_interval_s": args.eviction_interval_secs,
        "api_key": _api_key(args.api_key),
        "admin_api_key": args.admin_api_key,
        "otlp_traces_endpoint": args.otlp_traces_endpoint,
        "api_keys_file": args.api_keys_file,
        "tenant_api_keys": tuple(args.tenant_api_key or ()),
        "reasoning_parser": args.reasoning_parser,
        "tool_call_parser": args.tool_call_parser,
        "enable_auto_tool_choice": args.enable_auto_tool_choice,
        "enable_prompt_tokens_details": args.enable_prompt_tokens_details,
        "chat_template": _chat_template(args),
        "chat_template_content_format": args.chat_template_content_format,
        "trust_request_chat_template": args.trust_request_chat_template,
        "default_chat_template_kwargs": _template_defaults(args.default_chat_template_kwargs),
        "response_role": args.response_role,
        "enable_log_requests": args.enable_log_requests,
        "allowed_origins": tuple(_flatten(args.allowed_origins)),
        "allowed_methods": tuple(_flatten(args.allowed_methods)),
        "allowed_headers": tuple(_flatten(args.allowed_headers)),
        "allow_credentials": args.allow_credentials,
        "structured_outputs_backend": _so_backend(engine_args),
        "max_log_len": args.max_log_len,
        "max_n": args.max_n,
        "responses_store_size": args.responses_store_size,
        "max_sequences_per_request": args.max_sequences_per_request,
        "max_tokens_per_request": args.max_tokens_per_request,
        "max_concurrent_requests": args.max_concurrent_requests,
        "queue_size": args.queue_size,
        "queue_timeout_s": args.queue_timeout_secs,
        "write_timeout_s": args.write_timeout_secs,
        "worker_startup_timeout_s": args.worker_startup_timeout_secs,
        "engine_silence_timeout_s": args.engine_silence_timeout_secs,
        "max_finished_jobs": args.max_finished_jobs,
        "job_ttl_s": args.job_ttl_secs,
        "worker_wait_timeout_s": args.worker_wait_timeout_secs,
        "discovery_file": args.discovery_file,
        "shutdown_grace_period_s": args.shutdown_grace_period_secs,
        "frontend_stall_timeout_s": args.frontend_stall_timeout_secs,
        "allow_insecure_admin": args.allow_insecure_admin,
        "enable_http2": args.enable_http2,
        "fast_http1": not args.disable_fast_http1,
        "allowed_socket_dirs": tuple(args.allowed_socket_dirs or ()),
        "allowed_engine_hosts": tuple(args.allowed_engine_hosts or ()),
        "allowed_engine_uids": _uids(args.allowed_engine_uids),
        "zmq_advertise_host": args.zmq_advertise_host,
        "zmq_heartbeat_interval_s": args.zmq_heartbeat_interval_secs,
        "zmq_heartbeat_timeout_s": args.zmq_heartbeat_timeout_secs,
        "allowed_model_dirs": (
            tuple(args.allowed_model_dirs) if args.allowed_model_dirs is not None else None
        ),
    }
    if args.tool_call_parser is not None:
        from smg_trio.parsers.tools import tool_parser_names

        if args.tool_call_parser not in tool_parser_names():
            _usage_error(
                f"--tool-call-parser: unknown tool call parser {args.tool_call_parser!r}; "
                f"valid names: {', '.join(tool_parser_names())}"
            )
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        _usage_error("--enable-auto-tool-choice needs --tool-call-parser NAME")
    if args.api_keys_file is not None or args.tenant_api_key:
        from smg_trio.gateway.http.tenants import TenantsError, load_tenants

        try:
            load_tenants(args.api_keys_file, args.tenant_api_key or ())
        except TenantsError as exc:
            _usage_error(str(exc))
    tracing = args.otlp_traces_endpoint is not None
    if tracing and importlib.util.find_spec("opentelemetry.sdk") is None:
        from smg_trio.gateway.http.tracing import OTEL_MISSING_MESSAGE

        _usage_error(OTEL_MISSING_MESSAGE)
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    if tracing and protocol not in ("grpc", "http/protobuf"):
        _usage_error(
            f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r} is not supported with "
            "--otlp-traces-endpoint (use 'grpc' or 'http/protobuf')"
        )
    for owned in ("--revision", "--tokenizer-revision"):
        if any(a == owned or a.startswith(owned + "=") for a in engine_args):
            _usage_error(
                f"give {owned} before '--': the gateway resolves it for its tokenizer and "
                "passes the engine the same commit"
            )
    if args.command == "serve" and (args.backend or _default_backend()) != "tokenspeed":
        _check_frontend_flags(engine_args)
    tok_revision = args.tokenizer_revision or args.revision
    if args.discovery_provider == "file" and not args.discovery_file:
        _usage_error("--discovery-provider file needs --discovery-file FILE")
    if args.command == "serve":
        tag = getattr(args, "model_tag", None)
        if tag is not None:  # vLLM's positional `serve MODEL`
            if args.model is not None and args.model != tag:
                _usage_error(f"the model is given twice: {tag!r} and --model {args.model!r}")
            args.model = tag
        if args.worker_base_port + args.dp_size - 1 > 65535:
            raise SystemExit(
                f"smg_trio: error: --worker-base-port {args.worker_base_port} with --dp-size "
                f"{args.dp_size} runs past port 65535"
            )
        backend = args.backend or _default_backend()
        model = args.model
        extra = list(engine_args)
        hub = _resolve_model(model, "--model", tok_revision) if model else None
        engine_model = model
        if hub is not None:
            model = hub.path  # the gateway's tokenizer; the engine gets the id and the commit
            if args.served_model_name is None:
                common["served_model_name"] = hub.repo_id
            if backend == "mock":
                engine_model = hub.path
            elif args.tokenizer_revision is None:
                extra += ["--revision", hub.commit]
            else:
                extra += ["--revision", args.revision] if args.revision else []
                extra += ["--tokenizer-revision", hub.commit] if backend == "vllm" else []
        if backend == "mock":
            from smg_trio.mock.tiny_model import default_tiny_model_dir
            from smg_trio.tokenizer.core import Tokenizer

            model = model or str(default_tiny_model_dir())
            engine_model = engine_model or model
            _check_model_dir(model, "--model")
            tok = Tokenizer.from_dir(model)
            if args.mock_script is not None:
                _check_mock_script(args.mock_script, tok)
            if tok.eos_token_id is not None and "--eos-token-id" not in extra:
                extra += ["--eos-token-id", str(tok.eos_token_id)]
            log.warning(
                "backend 'mock': the built-in mock engine produces SYNTHETIC text, not a model's output"
            )
        elif args.mock_script is not None:
            _usage_error(f"--mock-script needs --backend mock, not {backend}")
        extra += _scheduling_policy_args(args.scheduling_policy, backend, extra)
        lora_modules = _lora_modules(args.lora_modules or [], tok_revision=None)
        lora_args, max_lora_rank = _lora_args(args, backend, len(lora_modules), extra)
        extra += lora_args
        if model is None:
            raise SystemExit(f"serve --backend {backend} needs --model DIR")
        _check_model_dir(model, "--model")
        if args.served_model_name is None and backend == "mock":
            common["served_model_name"] = "mock-tiny"
        return GatewayConfig(
            model_path=model,
            engines=EngineLaunchConfig(
                backend=backend,
                model=engine_model,
                dp_size=args.dp_size,
                worker_base_port=args.worker_base_port,
                engine_args=tuple(extra),
                socket_dir=args.socket_dir,
                python=args.engine_python,
                mock_script=args.mock_script,
                engine_log_level=args.engine_log_level,
            ),
            lora_modules=lora_modules,
            max_lora_rank=max_lora_rank,
            **common,
        )
    # Without --worker-urls the gateway starts empty; workers come from POST /workers or
    # --discovery-file, each with its own model_path (or this one's).
    if args.worker_urls and not args.model_path:
        _usage_error("launch --worker-urls needs --model-path DIR (the gateway tokenizes)")
    model_path = args.model_path
    if model_path:
        hub = _resolve_model(model_path, "--model-path", tok_revision)
        if hub is not None:
            model_path = hub.path
            if args.served_model_name is None:
                common["served_model_name"] = hub.repo_id
        _check_model_dir(model_path, "--model-path")
    return GatewayConfig(
        worker_urls=tuple(args.worker_urls or ()),
        backend=args.backend,
        model_path=model_path,
        zmq_engine_count=args.zmq_engine_count,
        zmq_handshake_address=args.zmq_handshake_address,
        **common,
    )


#: After a second SIGINT/SIGTERM, how long serve may take to return before the process exits.
FORCED_EXIT_AFTER_S = 15.0


async def _run_gateway(config: Any) -> None:
    from smg_trio.serve import ServeHandle, serve
    from smg_trio.serve.heap import settle_heap

    handle: ServeHandle | None = None
    force_stop = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # The signal watcher outlives serve's own stop (engines get up to 10 s to exit), so a
        # second signal is still heard while engines stop.
        async with trio.open_nursery() as watcher:
            async with trio.open_nursery() as nursery:

                async def drain_then_stop(drain_scope: trio.CancelScope) -> None:
                    with drain_scope:
                        if handle is not None:
                            await handle.drain(config.shutdown_grace_period_s)
                    nursery.cancel_scope.cancel()

                async def on_signal() -> None:
                    # Watched from the start: a signal during a slow engine startup stops at
                    # once. The first SIGINT/SIGTERM drains; another one stops now: it skips
                    # what is left of the drain and SIGKILLs the engines without their grace.
                    drain_scope: trio.CancelScope | None = None
                    async for signum in signals:
                        name = signal.Signals(signum).name
                        if drain_scope is None:
                            log.info("received %s: draining (send it again to stop now)", name)
                            drain_scope = trio.CancelScope()
                            nursery.start_soon(drain_then_stop, drain_scope)
                        elif not force_stop.is_set():
                            log.info("received %s again: stopping now", name)
                            drain_scope.cancel()
                            force_stop.set()
                            watcher.start_soon(exit_if_stuck)

                async def exit_if_stuck() -> None:
                    # The last resort of a second signal: the engines are SIGKILLed at once,
                    # so serve returns within moments; if something still holds it (a
                    # connection the server cannot close), the process exits anyway.
                    await trio.sleep(FORCED_EXIT_AFTER_S)
                    log.error(
                        "still stopping %g s after the second signal; exiting now",
                        FORCED_EXIT_AFTER_S,
                    )
                    logging.shutdown()
                    os._exit(1)

                watcher.start_soon(on_signal)
                handle = await nursery.start(partial(serve, config, force_stop=force_stop))
                # Everything built at startup lives as long as the process: frozen, a full
                # collection scans only what requests create. Measured under the abort storm
                # (bench/abort_storm.py): unfrozen, full collections of 25-110 ms stalled the
                # event loop and with it every ABORT of their round.
                settle_heap()
                models = ", ".join(m.model_id for m in handle.manager.list_models())
                print(f"smg_trio ready on {handle.base_url} (models: {models or 'none yet'})",
                      flush=True)  # fmt: skip
            watcher.cancel_scope.cancel()  # serve has stopped


def _is_prefix_of_a_flag(parser: argparse.ArgumentParser, arg: str) -> bool:
    """Whether ``arg`` abbreviates one of the subcommands' own flags (a typo for it, not an
    engine argument: abbreviations are refused)."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for sub in getattr(action, "choices", {}).values():
            if any(opt.startswith(arg) for opt in sub._option_string_actions):
                return True
    return False


def _subcommand_with_flag(parser: argparse.ArgumentParser, flag: str, command: str) -> str | None:
    """The other subcommand (``serve``, ``launch``) that has exactly ``flag``, if one has."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in getattr(action, "choices", {}).items():
            if (
                name != command
                and name in ("serve", "launch")
                and flag in sub._option_string_actions
            ):
                return str(name)
    return None


def _unknown_hint(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], unknown: list[str]
) -> str:
    """What to write instead of arguments the subcommand does not know: a model given
    positionally (``vllm serve MODEL``) is ``--model``/``--model-path``; another stray value
    follows a flag that takes one value (vLLM's ``--api-key K1 K2``); a flag of the engine's
    goes after ``--``."""
    first = unknown[0]
    if not first.startswith("-"):
        if argv.index(first) == 1 and args.command in ("serve", "launch"):
            flag = "--model" if args.command == "serve" else "--model-path"
            return f" (the model is a flag here, not positional as in 'vllm serve MODEL': {flag} {first})"
        return (
            f" ({first!r} follows a flag that takes one value; several only where --help shows"
            " 'X [X ...]'; engine arguments go after '--')"
        )
    flag = first.split("=", 1)[0]
    model_flag = {"serve": "--model", "launch": "--model-path"}
    if flag in ("--model", "--model-path") and args.command in model_flag:
        return f" ({args.command} names its model with {model_flag[args.command]})"
    other = _subcommand_with_flag(parser, flag, args.command)
    if other is not None:
        return f" ({flag} is a flag of '{other}', not of '{args.command}')"
    if args.command == "serve" and not any(
        u.startswith("--") and _is_prefix_of_a_flag(parser, u.split("=", 1)[0]) for u in unknown
    ):
        return f" (engine arguments go after '--': serve ... -- {' '.join(unknown)})"
    return ""


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
