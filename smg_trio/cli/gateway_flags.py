"""The gateway flag group that ``serve`` and ``launch`` share."""

from __future__ import annotations

import argparse

from smg_trio.cli.argtypes import (
    _api_server_count,
    _cors_item,
    _float_range,
    _int_at_least,
    _json_object,
    _seconds,
    _stall_timeout,
)
from smg_trio.connector.client import ENGINE_SILENCE_DEATH_TIMEOUT_S
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
from smg_trio.parsers.reasoning import reasoning_parser_names
from smg_trio.transport.handshake import READY_TIMEOUT_S
from smg_trio.transport.tcp import DEFAULT_HEARTBEAT_IVL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from smg_trio.worker.jobs import DEFAULT_JOB_TTL_S, DEFAULT_MAX_FINISHED_JOBS
from smg_trio.worker.manager import WORKER_WAIT_TIMEOUT_S
from smg_trio.worker.policies import DEFAULT_POLICY, POLICY_NAMES

#: The choices of ``--log-level`` and ``serve``'s ``--engine-log-level``.
LOG_LEVELS = ("debug", "info", "warning", "error")


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
        choices=LOG_LEVELS,
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
