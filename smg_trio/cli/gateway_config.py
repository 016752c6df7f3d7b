"""The parsed flags checked and turned into the gateway's ``GatewayConfig``."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
from typing import Any

from smg_trio.cli.engine_args import (
    _check_frontend_flags,
    _lora_args,
    _lora_modules,
    _scheduling_policy_args,
    _so_backend,
)
from smg_trio.cli.model_checks import _check_mock_script, _check_model_dir, _resolve_model
from smg_trio.cli.usage import _usage_error

log = logging.getLogger("smg_trio")


def _default_backend() -> str:
    for name in ("vllm", "tokenspeed"):
        if importlib.util.find_spec(name) is not None:
            return name
    return "mock"


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


def _api_key(flag_value: str | None) -> str | None:
    """``--api-key`` (command line, ``SMG_TRIO_API_KEY``, config file), else vLLM's
    ``VLLM_API_KEY``: a server moved from ``vllm serve`` keeps its key instead of opening up."""
    if flag_value is not None:
        return flag_value
    vllm_key = os.environ.get("VLLM_API_KEY") or None
    if vllm_key is not None:
        log.info("--api-key: taken from VLLM_API_KEY (vLLM's variable)")
    return vllm_key


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
