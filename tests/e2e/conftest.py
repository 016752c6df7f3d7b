"""Fixtures of the real-peer (e2e) lane: the tiny model it serves.

Every test here is marked ``e2e`` and skips, with the reason and the install command, unless
``SMG_TRIO_E2E=1`` and the peers it needs are installed (``bash scripts/setup_peers.sh``).
The lane's plumbing (process groups, readiness waits, chat requests) is in
:mod:`tests.helpers.e2e`; :func:`vllm_pair` is the lane's one shared pair of real vLLM engines
behind ``serve``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest

from peers.tools import peer_paths, repo_root, vllm_engine_env, vllm_missing_reason
from smg_trio.mock.tiny_model import build_tiny_model
from tests.helpers.e2e import (
    E2E_ENV,
    ENGINE_STARTUP_S,
    INSTALL_HINT,
    process_group,
    require_e2e,
    wait_http,
)
from tests.helpers.ports import free_port, random_worker_base_port


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama (byte-level BPE, ChatML template) the lane serves."""
    if os.environ.get(E2E_ENV) != "1":
        pytest.skip(f"real-peer lane is off: set {E2E_ENV}=1 ({INSTALL_HINT})")
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@attrs.frozen
class VllmPair:
    """``serve --backend vllm --dp-size 2``: two real vLLM CPU engines (prefix caching on, as
    vLLM's default; KV events on, as serve sets them) behind smg_trio, with
    ``--enable-prompt-tokens-details``. ``kv_endpoints`` are the engines' KV event PUB
    endpoints (ipc, in ``sock_dir``)."""

    base_url: str
    model: str
    sock_dir: str
    kv_endpoints: tuple[str, ...]
    log: Path


@pytest.fixture(scope="session")
def vllm_pair(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmPair]:
    """One pair of real vLLM engines for the whole lane (each takes a minute to start)."""
    require_e2e(vllm_missing_reason())
    logs = tmp_path_factory.mktemp("vllm-pair")
    sock_dir = tempfile.mkdtemp(prefix="smg-")
    port, base_port = free_port(), random_worker_base_port()
    env = vllm_engine_env()
    env["SMG_ZMQ_SOCKET_DIR"] = sock_dir
    argv = [
        sys.executable, "-m", "smg_trio", "serve",
        "--backend", "vllm", "--model", str(tiny_model), "--dp-size", "2",
        "--engine-python", str(peer_paths().vllm_python),
        "--served-model-name", "tiny-pair", "--port", str(port),
        "--worker-base-port", str(base_port), "--enable-prompt-tokens-details",
        "--worker-startup-timeout-secs", str(int(ENGINE_STARTUP_S)),
        "--", "--dtype", "float32", "--max-model-len", "1024",
    ]  # fmt: skip
    log = logs / "serve.log"
    base = f"http://127.0.0.1:{port}"
    with process_group(argv, log_path=log, env=env, cwd=repo_root()) as proc:

        def both_ready(r: httpx.Response) -> bool:
            workers = r.json().get("workers", []) if r.status_code == 200 else []
            return sum(w.get("status") == "ready" for w in workers) == 2

        wait_http(
            f"{base}/workers", proc, log, timeout=2 * ENGINE_STARTUP_S, what="serve", ok=both_ready
        )
        endpoints = tuple(f"ipc://{sock_dir}/engine-{base_port + i}-kv.sock" for i in range(2))
        yield VllmPair(base, "tiny-pair", sock_dir, endpoints, log)
    shutil.rmtree(sock_dir, ignore_errors=True)
