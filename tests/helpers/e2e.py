"""Shared plumbing for the real-peer (e2e) lane: the lane's gate (:func:`require_e2e`), ipc
worker addresses, process groups stopped whole, readiness waits, and chat requests.

Processes are started in their own session (process group) and stopped by group (SIGTERM,
then SIGKILL) when the block ends, so nothing outlives a test, even a failing one. Everything
listens on 127.0.0.1; ipc paths live in short ``/tmp/smg-*`` directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from peers.tools import (
    peer_paths,
    repo_root,
    start_process_group,
    stop_process_group,
    vllm_engine_command,
    vllm_engine_env,
)
from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses
from tests.helpers.sse import sse_chunks

__all__ = [
    "E2E_ENV",
    "ENGINE_STARTUP_S",
    "HTTP_READY_S",
    "INSTALL_HINT",
    "assert_alive",
    "chat",
    "handshake_port",
    "http_client",
    "ipc_worker",
    "log_tail",
    "gateway_with_vllm",
    "process_group",
    "smg_trio_with_vllm",
    "launch_command",
    "launched_with_vllm",
    "require_e2e",
    "stream_chat",
    "vllm_reference",
    "wait_http",
]

E2E_ENV = "SMG_TRIO_E2E"
INSTALL_HINT = "install the peers with: bash scripts/setup_peers.sh"
#: A vLLM engine registers 40-100 s after launch on a 2-core machine.
ENGINE_STARTUP_S = 240.0
#: Once up, everything answers within seconds.
HTTP_READY_S = 60.0


def require_e2e(*reasons: str | None) -> None:
    """Skip the calling test/fixture unless ``SMG_TRIO_E2E=1`` and every reason is None."""
    if os.environ.get(E2E_ENV) != "1":
        pytest.skip(f"real-peer lane is off: set {E2E_ENV}=1 ({INSTALL_HINT})")
    for reason in reasons:
        if reason:
            pytest.skip(f"real peer missing: {reason}; {INSTALL_HINT}")


@contextlib.contextmanager
def ipc_worker(name: str = "engine-1") -> Iterator[WorkerAddresses]:
    """A short ``ipc:///tmp/smg-XXXX/<name>`` worker URL and its derived addresses."""
    directory = tempfile.mkdtemp(prefix="smg-")
    try:
        yield worker_addresses(f"ipc://{directory}/{name}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def handshake_port(addresses: WorkerAddresses) -> int:
    return int(addresses.handshake.rsplit(":", 1)[1])


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no log>"


@contextlib.contextmanager
def process_group(
    cmd: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own process group for the block; always stop the whole group."""
    proc = start_process_group(cmd, env=env, log_path=log_path, cwd=cwd)
    try:
        yield proc
    finally:
        stop_process_group(proc)


@contextlib.contextmanager
def gateway_with_vllm(
    gateway_cmd: Sequence[str],
    engine_cmd: Sequence[str],
    *,
    port: int,
    logs: Path,
    gateway: str = "smg_trio",
    ready_path: str = "/readiness",
    ready: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
    engine_what: str = "vLLM engine",
) -> Iterator[tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """A gateway (``gateway_cmd``, listening on ``port``; its log ``logs/<gateway>.log``) and
    a real vLLM engine (``engine_cmd``), each in its own process group, for the block, once
    ``ready_path`` answers ``ready``: yields the base URL and both processes."""
    gw_log = logs / f"{gateway}.log"
    with (
        process_group(gateway_cmd, log_path=gw_log, cwd=repo_root()) as gw,
        process_group(engine_cmd, log_path=logs / "vllm.log", env=vllm_engine_env()) as eng,
    ):
        base = f"http://127.0.0.1:{port}"
        wait_http(
            f"{base}{ready_path}",
            gw,
            gw_log,
            timeout=ENGINE_STARTUP_S,
            what=f"{gateway} gateway",
            ok=ready,
            also=lambda: assert_alive(eng, logs / "vllm.log", engine_what),
        )
        yield base, gw, eng


def smg_trio_with_vllm(
    gateway_cmd: Sequence[str],
    engine_cmd: Sequence[str],
    *,
    port: int,
    logs: Path,
    engine_what: str = "vLLM engine",
) -> contextlib.AbstractContextManager[
    tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]]
]:
    """:func:`gateway_with_vllm` for smg_trio: ready once ``/readiness`` answers 200."""
    return gateway_with_vllm(gateway_cmd, engine_cmd, port=port, logs=logs, engine_what=engine_what)


def launch_command(
    worker_url: str, model_path: Path, served_model_name: str, *, port: int, log_level: str
) -> list[str]:
    """``python -m smg_trio launch`` of one vLLM worker at ``worker_url`` on 127.0.0.1."""
    return [
        sys.executable, "-m", "smg_trio", "launch",
        "--worker-urls", worker_url,
        "--backend", "vllm",
        "--model-path", str(model_path),
        "--served-model-name", served_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--log-level", log_level,
    ]  # fmt: skip


@contextlib.contextmanager
def launched_with_vllm(
    model_path: Path,
    served_model_name: str,
    *,
    port: int,
    logs: Path,
    log_level: str = "info",
    engine_args: Sequence[str] = (),
    engine_what: str = "vLLM engine",
) -> Iterator[tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """One real vLLM engine (``engine_args`` added to its command) on an ipc worker and
    ``smg_trio launch`` in front of it, for the block (:func:`smg_trio_with_vllm`)."""
    with ipc_worker() as addresses:
        engine_cmd = vllm_engine_command(
            model_path, handshake_port(addresses), extra_args=engine_args
        )
        gateway_cmd = launch_command(
            addresses.url, model_path, served_model_name, port=port, log_level=log_level
        )
        with smg_trio_with_vllm(
            gateway_cmd, engine_cmd, port=port, logs=logs, engine_what=engine_what
        ) as started:
            yield started


def vllm_reference(script: str, model_path: Path, args: Any, out: Path) -> Any:
    """vLLM's own answer: ``script`` run in the vLLM venv as ``-c script MODEL ARGS_JSON OUT``
    (its output beside ``out``, ``.log``); the JSON it wrote to ``out``."""
    log = out.with_suffix(".log")
    with log.open("wb") as sink:
        proc = subprocess.run(
            [
                str(peer_paths().vllm_python),
                "-c",
                script,
                str(model_path),
                json.dumps(args),
                str(out),
            ],
            env=vllm_engine_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=ENGINE_STARTUP_S,
            check=False,
        )
    # vLLM's CPU build can abort in C++ teardown at interpreter exit ("terminate called without
    # an active exception", SIGABRT) after the script wrote its answer and every engine process
    # exited; a complete JSON answer is the script's result, whatever the teardown did.
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        raise AssertionError(
            f"vLLM reference script exited with {proc.returncode} and no complete answer:\n"
            f"{log_tail(log)}"
        ) from None


def assert_alive(proc: subprocess.Popen[bytes], log_path: Path, what: str) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"{what} exited with {proc.returncode}:\n{log_tail(log_path)}")


def wait_http(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    *,
    timeout: float,
    what: str,
    ok: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
    also: Callable[[], None] = lambda: None,
) -> None:
    """Poll ``url`` (sync) until ``ok``; fail early, with the log, if ``proc`` dies (``also``
    runs each round too, e.g. to check the engine process)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        assert_alive(proc, log_path, what)
        also()
        try:
            r = httpx.get(url, timeout=5.0)
            if ok(r):
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(1.0)
    raise AssertionError(
        f"{what} not ready at {url} after {timeout}s ({last}):\n{log_tail(log_path)}"
    )


async def chat(
    client: httpx.AsyncClient, model: str, content: str = "Hello there", **extra: Any
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return await client.post("/v1/chat/completions", json=body)


async def stream_chat(
    client: httpx.AsyncClient, model: str, content: str = "Hello there", **extra: Any
) -> list[dict[str, Any]]:
    """POST a streaming chat completion and return its parsed SSE chunks (without [DONE])."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        **extra,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, (await resp.aread()).decode(errors="replace")
        return sse_chunks(await resp.aread())


@contextlib.asynccontextmanager
async def http_client(base_url: str, timeout: float = 60.0) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        yield client
