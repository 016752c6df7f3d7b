"""The launched engines' arguments: scheduling policy, structured outputs, LoRA, vLLM API flags."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any, Final

from smg_trio.cli.usage import _usage_error

log = logging.getLogger("smg_trio")


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
