"""Worker specs: what ``POST /workers`` or ``--worker-urls`` asks for, their validation
against the confinement, and Hugging Face ids resolved to their cached snapshots."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Literal

import attrs

from smg_trio.errors import ValidationError
from smg_trio.parsers.reasoning import get_reasoning_format
from smg_trio.parsers.tools import tool_parser_names
from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.tokenizer.hub import HubModelError, is_hub_id, is_revision, resolve_hub_model
from smg_trio.transport.tcp import TcpOptions, is_wildcard_host
from smg_trio.worker.confine import (
    WorkerConfinement,
    escape,
    is_loopback_host,
    require_printable,
)

__all__ = [
    "MAX_DP_SIZE",
    "PROTOCOLS",
    "Runtime",
    "WorkerSpec",
    "model_id_for",
    "resolve_hub_spec",
    "validate_spec",
    "warn_remote_tcp",
]

log = logging.getLogger(__name__)

Runtime = Literal["vllm", "tokenspeed"]
#: The largest ``dp_size`` a worker spec may ask for (engines dialing one socket set).
MAX_DP_SIZE = 1024

#: The engine wire of each ``runtime_type``.
PROTOCOLS: dict[str, type[VllmProtocol] | type[TokenSpeedProtocol]] = {
    "vllm": VllmProtocol,
    "tokenspeed": TokenSpeedProtocol,
}


@attrs.frozen
class WorkerSpec:
    """What ``POST /workers`` or ``--worker-urls`` asks for. ``dp_size`` is the number of
    engines (DP ranks) that dial this worker's one socket set."""

    url: str
    model_path: str | None = None
    model_id: str | None = None
    runtime_type: str | None = None
    zmq_handshake_address: str | None = None
    dp_size: int = 1
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    #: With a Hugging Face id: the branch, tag or commit of its snapshot (default ``main``).
    revision: str | None = None


def model_id_for(spec: WorkerSpec) -> str:
    """The model a spec serves: its ``model_id``, else its ``model_path``."""
    if spec.model_id:
        return spec.model_id
    if spec.model_path:
        return spec.model_path
    raise ValidationError("a worker needs model_path or model_id", param="model_path")


def resolve_hub_spec(spec: WorkerSpec) -> WorkerSpec:
    """``spec`` with a Hugging Face id (``model_path``, else ``model_id``; a local directory
    of that name wins) replaced by its snapshot in the hub cache, the id becoming the
    default ``model_id``. Cache only: a request never makes the gateway fetch a repo.
    Blocking I/O: run it in a thread. Raises ``ValidationError``."""
    param, ref = ("model_path", spec.model_path) if spec.model_path else ("model_id", spec.model_id)
    if spec.revision is not None and not is_revision(spec.revision):
        raise ValidationError(
            f"revision {spec.revision!r} is not a branch, tag or commit name", param="revision"
        )
    if ref is None or not is_hub_id(ref) or os.path.isdir(ref):
        if spec.revision is not None:
            raise ValidationError(
                f"revision applies to a Hugging Face id, and {param} {ref!r} is not one (or is "
                "a local directory)",
                param="revision",
            )
        return spec
    try:
        hub = resolve_hub_model(ref, spec.revision, allow_download=False)
    except HubModelError as exc:
        # the hub cache's path goes to the log, not to the client (issue 28, item 8)
        log.warning("worker %r: %s", spec.url, escape(str(exc)))
        raise ValidationError(exc.public, param=param) from exc
    log.info(
        "worker %r: %s %s at %s is Hugging Face snapshot %s (%s)",
        spec.url,
        param,
        ref,
        spec.revision or "main",
        hub.commit,
        hub.path,
    )
    # the snapshot's directory names its commit: the revision is spent
    return attrs.evolve(
        spec, model_path=hub.path, model_id=spec.model_id or hub.repo_id, revision=None
    )


def warn_remote_tcp(url: str) -> None:
    """A ``tcp://`` worker bound off loopback carries prompts and tokens over the network,
    unencrypted, with engines admitted by peer address only (as vLLM's own DP traffic):
    say so once per worker (docs/security.md, "Engine sockets")."""
    host = url.removeprefix("tcp://").rpartition(":")[0]
    if is_loopback_host(host):
        return
    log.warning(
        "worker %r: its engine traffic (prompts, tokens) crosses the network unencrypted, and "
        "engines are admitted by their address (--allowed-engine-hosts): use a trusted, "
        "private network (docs/security.md)",
        url,
    )


def _check_launched(
    spec: WorkerSpec, addrs: WorkerAddresses, launched: WorkerSpec, client_count: int
) -> None:
    """Refuse a spec at a launched engine's URL that the engine cannot serve: another
    engine count, wire, handshake address or model than it was started with (its
    registration would wait for engines or a handshake that never come)."""
    fixed = worker_addresses(
        launched.url, launched.zmq_handshake_address, client_count=client_count
    )
    same_model = spec.model_path is None or (
        launched.model_path is not None
        and os.path.realpath(spec.model_path) == os.path.realpath(launched.model_path)
    )
    for param, same, what in (
        ("dp_size", spec.dp_size == launched.dp_size, f"dp_size {launched.dp_size}"),
        (
            "runtime_type",
            (spec.runtime_type or "vllm") == (launched.runtime_type or "vllm"),
            f"runtime_type {launched.runtime_type or 'vllm'}",
        ),
        (
            "zmq_handshake_address",
            addrs.handshake == fixed.handshake,
            f"its handshake at {fixed.handshake}",
        ),
        ("model_path", same_model, f"model_path {launched.model_path}"),
    ):
        if not same:
            raise ValidationError(
                f"{spec.url} is an engine that serve launched with {what}; a worker added at "
                "its URL is served by that engine, so it must keep it",
                param=param,
            )


def validate_spec(
    spec: WorkerSpec,
    *,
    confinement: WorkerConfinement,
    tcp: TcpOptions,
    client_count: int,
    launched: WorkerSpec | None,
    get_model: Callable[[str], object | None],
) -> tuple[Runtime, WorkerAddresses]:
    """Step 1 and 2 of registration, synchronously (so ``POST /workers`` can 400 at once):
    the fields, and the ``confinement`` rules that need no I/O. ``launched`` is the spec of
    the engine that ``serve`` launched at this URL, if any; ``get_model`` the served model of
    an id, if any. Nothing is logged, created or bound before the whole spec passed.

    Raises ``ValidationError`` naming the field, or the conflicting worker's URL.
    """
    confinement.check_url(spec.url)
    runtime = spec.runtime_type or "vllm"
    if runtime not in PROTOCOLS:
        raise ValidationError(
            f"runtime_type must be vllm or tokenspeed (the ZMQ wires), got {runtime!r}",
            param="runtime_type",
        )
    if not 1 <= spec.dp_size <= MAX_DP_SIZE:
        raise ValidationError(f"dp_size must be in 1..{MAX_DP_SIZE}", param="dp_size")
    if spec.zmq_handshake_address is not None:
        confinement.check_handshake(spec.zmq_handshake_address)
    if spec.model_path is not None:
        confinement.check_model_path(spec.model_path)
    for name in ("model_id", "reasoning_parser", "tool_call_parser"):
        value = getattr(spec, name)
        if value is not None:
            require_printable(value, name)
    if spec.reasoning_parser is not None:
        try:
            get_reasoning_format(spec.reasoning_parser)
        except ValueError as exc:
            raise ValidationError(str(exc), param="reasoning_parser") from None
    if spec.tool_call_parser is not None and spec.tool_call_parser not in tool_parser_names():
        raise ValidationError(
            f"unknown tool call parser {spec.tool_call_parser!r}; valid names: "
            f"{', '.join(tool_parser_names())}",
            param="tool_call_parser",
        )
    try:
        addrs = worker_addresses(spec.url, spec.zmq_handshake_address, client_count=client_count)
    except ValueError as exc:
        raise ValidationError(
            str(exc), param="url" if "URL" in str(exc) else "zmq_handshake_address"
        ) from exc
    if addrs.is_tcp and tcp.advertise_host is None:
        host = spec.url.removeprefix("tcp://").rpartition(":")[0]
        if is_wildcard_host(host):
            raise ValidationError(
                f"url {spec.url!r} binds every interface, which engines cannot dial; "
                "set --zmq-advertise-host to the address they should use",
                param="url",
            )
    if launched is not None:
        _check_launched(spec, addrs, launched, client_count)
    if runtime == "tokenspeed" and client_count > 1:
        raise ValidationError(
            "runtime_type tokenspeed serves one frontend client, and this gateway runs "
            "several (--api-server-count above 1)",
            param="runtime_type",
        )
    model_id = model_id_for(spec)
    if spec.model_path is None and get_model(model_id) is None:
        raise ValidationError(
            f"model_path is required: the gateway tokenizes, so it loads the tokenizer from "
            f"the model directory (model_id alone joins a model already served, and "
            f"{model_id!r} is not)",
            param="model_path",
        )
    return runtime, addrs  # type: ignore[return-value]
