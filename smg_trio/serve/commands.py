"""Engine command lines for ``serve``, built as smg's launcher builds them (smg 1.13.0 ``serve.py``)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence

import attrs

from smg_trio.protocol.addresses import derive_handshake_port, worker_addresses
from smg_trio.transport.sockdir import default_socket_dir

__all__ = [
    "EngineLaunch",
    "build_engine_command",
    "default_socket_dir",
    "filter_owned_flags",
    "kv_events_config",
    "reject_handshake_collisions",
    "tokenspeed_dist_port",
    "worker_url",
]

log = logging.getLogger(__name__)

#: TokenSpeed derives its control-plane ports from ``--port`` (``ZMQ_TCP_PORT_DELTA``).
_TS_PORT_DELTA = 233
_VLLM_OWNED = (
    "--model",
    "--headless",
    "--data-parallel-size",
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
)
_TS_OWNED = (
    "--model",
    "--headless",
    "--port",
    "--dist-init-addr",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--zmq-engine-index",
)


def worker_url(port: int, socket_dir: str | None = None) -> str:
    """``ipc://<socket dir>/engine-<port>``."""
    return f"ipc://{socket_dir or default_socket_dir()}/engine-{port}"


def kv_events_config(url: str) -> str:
    """The ``--kv-events-config`` ``serve`` gives the engine of worker ``url``: vLLM's zmq
    publisher on ``<url>-kv.sock`` beside the worker's data-plane sockets (the engine binds an
    ``ipc://`` endpoint; subscribers connect), no replay socket."""
    return json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"{url}-kv.sock"},
        separators=(",", ":"),
    )


def tokenspeed_dist_port(port: int) -> int:
    """TokenSpeed's ``--dist-init-addr`` port: ``port + 233`` (or ``- 233`` above 65535),
    moved out of the 20000..29999 handshake band."""
    dist = port + _TS_PORT_DELTA if port + _TS_PORT_DELTA <= 65535 else port - _TS_PORT_DELTA
    if 20000 <= dist <= 29999:
        dist += 10000
    return dist


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _wants_kv_events(engine_args: Sequence[str]) -> bool:
    """Whether serve gives the engine its KV events config: not when the operator passed
    their own, nor with prefix caching off (nothing to publish; vLLM warns)."""
    return not (
        _has_flag(engine_args, "--kv-events-config")
        or _has_flag(engine_args, "--no-enable-prefix-caching")
    )


def filter_owned_flags(args: Sequence[str], owned: Sequence[str]) -> list[str]:
    """Drop launcher-owned flags (``--flag v`` and ``--flag=v`` forms). A following token is
    consumed only when it does not start with ``-``."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in owned:
            if "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("-"):
                skip = True
            continue
        out.append(a)
    return out


def reject_handshake_collisions(urls: Sequence[str]) -> None:
    """Raise ``ValueError`` naming both URLs when two workers derive the same handshake port."""
    seen: dict[int, str] = {}
    for url in urls:
        port = derive_handshake_port(url)
        if port in seen:
            raise ValueError(
                f"handshake port collision: {seen[port]} and {url} both derive "
                f"tcp://127.0.0.1:{port}; adjust --worker-base-port"
            )
        seen[port] = url


@attrs.frozen
class EngineLaunch:
    """One engine process to start for one worker. Its log lines below ``log_level`` are not
    forwarded."""

    worker_url: str
    argv: list[str]
    engine_count: int
    env: dict[str, str]
    log_level: int = logging.INFO


def build_engine_command(
    backend: str,
    model: str,
    *,
    port: int,
    socket_dir: str | None = None,
    engine_args: Sequence[str] = (),
    python: str | None = None,
    mock_script: str | None = None,
) -> EngineLaunch:
    """The engine command for one worker on ``port``.

    ``backend`` is ``vllm`` (``vllm serve --headless`` dialing the derived handshake port),
    with KV cache events published on ``<url>-kv.sock`` (:func:`kv_events_config`) unless
    ``engine_args`` has its own ``--kv-events-config`` or ``--no-enable-prefix-caching``, or
    the engine has several DP ranks,
    ``tokenspeed`` (``tokenspeed.cli serve --headless``) or ``mock`` (our mock engine over the
    vLLM wire; ``mock_script`` becomes its ``--script``, with ``model`` as the tokenizer).
    Raises ``ValueError`` for a backend without a ZMQ wire, or a ``mock_script`` for another
    backend.
    """
    if mock_script is not None and backend != "mock":
        raise ValueError(f"a mock script needs backend 'mock', not {backend!r}")
    py = python or sys.executable
    url = worker_url(port, socket_dir)
    addrs = worker_addresses(url)
    hs_port = addrs.handshake.rsplit(":", 1)[1]
    env = {"PYTHONUNBUFFERED": "1"}
    if backend == "vllm":
        n = int(_flag_value(engine_args, "--data-parallel-size") or 1)
        argv = [
            py, "-m", "vllm.entrypoints.cli.main", "serve", model, "--headless",
            "--data-parallel-size", str(n), "--data-parallel-size-local", str(n),
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", hs_port,
            *filter_owned_flags(engine_args, _VLLM_OWNED),
        ]  # fmt: skip
        if _wants_kv_events(engine_args):
            if n == 1:
                argv += ["--kv-events-config", kv_events_config(url)]
            else:
                # vLLM offsets the endpoint by DP rank, which it refuses for ipc://; a
                # loopback tcp endpoint would make each rank CONNECT (vLLM binds only a
                # wildcard), and a wildcard would listen on every interface.
                log.info(
                    "KV cache events stay off for %s: vLLM cannot give each of its %d DP "
                    "ranks an ipc:// endpoint (pass --kv-events-config after -- to choose one)",
                    url,
                    n,
                )
        return EngineLaunch(url, argv, n, env)
    if backend == "tokenspeed":
        n = int(_flag_value(engine_args, "--data-parallel-size") or 1)
        rest = filter_owned_flags(engine_args, _TS_OWNED)
        argv = [
            py, "-m", "tokenspeed.cli", "serve", "--headless", "--model", model,
            "--port", str(port), "--dist-init-addr", f"127.0.0.1:{tokenspeed_dist_port(port)}",
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", hs_port,
            "--zmq-engine-index", "0",
        ]  # fmt: skip
        if not _has_flag(rest, "--grammar-backend"):
            argv += ["--grammar-backend", "xgrammar"]
        if not _has_flag(rest, "--enable-output-logprobs"):
            argv.append("--enable-output-logprobs")
        return EngineLaunch(url, argv + rest, n, env)
    if backend == "mock":
        argv = [
            py, "-m", "smg_trio.mock.engine", "--handshake", addrs.handshake,
            *engine_args,
        ]  # fmt: skip
        if _wants_kv_events(engine_args):
            argv += ["--kv-events-config", kv_events_config(url)]
        if mock_script is not None:
            argv += ["--script", os.path.abspath(mock_script), "--model", model]
        return EngineLaunch(url, argv, 1, env)
    raise ValueError(f"backend {backend!r} has no ZMQ wire; use vllm, tokenspeed or mock")
