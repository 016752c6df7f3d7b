"""LoRA adapters on a REAL vLLM 0.32.0 CPU engine behind ``serve --backend vllm``: one engine,
started once with ``--lora-modules`` (serve adds ``--enable-lora --max-loras 3
--max-lora-rank 16``), shared by every test here. The adapters are built locally for the tiny
model (random nonzero lora_A/lora_B on q/v/o_proj, ``smg_trio/mock/tiny_lora.py``); at
temperature 0 an adapter's answer differs from the base model's and is the same every time."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from peers.tools import peer_paths, vllm_engine_env, vllm_missing_reason
from smg_trio.mock.tiny_lora import build_tiny_lora
from tests.helpers.e2e import ENGINE_STARTUP_S, log_tail, require_e2e, wait_http
from tests.helpers.ports import free_port
from tests.helpers.procs import alive, descendants

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny"


@dataclass
class LoraServe:
    base: str
    adapters: Path
    log_path: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=120.0)

    def answer(self, model: str, prompt: str = "Hello there") -> str:
        with self.client() as c:
            r = c.post(
                "/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
            )
        assert r.status_code == 200, (r.text, log_tail(self.log_path))
        body: dict[str, Any] = r.json()
        assert body["model"] == model
        return str(body["choices"][0]["message"]["content"])


@pytest.fixture(scope="module")
def lora_serve(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoraServe]:
    require_e2e(vllm_missing_reason())
    root = tmp_path_factory.mktemp("lora")
    adapters = root / "adapters"
    static = build_tiny_lora(adapters / "static", base_model=MODEL, seed=11)
    log_path = root / "serve.log"
    port = free_port()
    env = vllm_engine_env()
    env["SMG_ZMQ_SOCKET_DIR"] = tempfile.mkdtemp(prefix="smg-")
    argv = [
        sys.executable, "-m", "smg_trio", "serve",
        "--backend", "vllm", "--model", str(tiny_model),
        "--engine-python", str(peer_paths().vllm_python),
        "--served-model-name", MODEL, "--port", str(port),
        "--worker-base-port", str(random.randint(40000, 60000)),
        "--worker-startup-timeout-secs", str(int(ENGINE_STARTUP_S)),
        "--lora-modules", f"static={static}", "--max-loras", "3",
        "--allowed-model-dirs", str(adapters), "--allow-insecure-admin",
        "--", "--dtype", "float32", "--max-model-len", "512",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    children: set[int] = set()
    try:
        wait_http(f"{base}/readiness", proc, log_path, timeout=ENGINE_STARTUP_S, what="serve")
        children = descendants(proc.pid)
        assert "--enable-lora --max-loras 3 --max-lora-rank 16" in log_tail(log_path, 200_000)
        yield LoraServe(base, adapters, log_path)
    finally:
        children |= descendants(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_static_adapter_answers_differ_from_base_and_are_stable(lora_serve: LoraServe) -> None:
    with lora_serve.client() as c:
        cards = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert cards["static"]["parent"] == MODEL
    assert cards[MODEL]["parent"] is None
    base = lora_serve.answer(MODEL)
    adapted = lora_serve.answer("static")
    assert adapted != base
    assert lora_serve.answer("static") == adapted
    assert lora_serve.answer(MODEL) == base


def test_load_use_unload_then_404(lora_serve: LoraServe) -> None:
    path = build_tiny_lora(lora_serve.adapters / "dyn", base_model=MODEL, seed=12)
    with lora_serve.client() as c:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "dyn", "lora_path": str(path)})
        assert r.status_code == 200, r.text
    answer = lora_serve.answer("dyn")
    assert answer not in (lora_serve.answer(MODEL), lora_serve.answer("static"))
    assert lora_serve.answer("dyn") == answer
    with lora_serve.client() as c:
        metrics = c.get("/metrics").text
        assert 'vllm:lora_requests_info{max_lora="3"' in metrics
        r = c.post("/v1/unload_lora_adapter", json={"lora_name": "dyn"})
        assert r.status_code == 200, r.text
        r = c.post(
            "/v1/chat/completions",
            json={"model": "dyn", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found"


def test_two_adapters_interleaved(lora_serve: LoraServe) -> None:
    path = build_tiny_lora(lora_serve.adapters / "other", base_model=MODEL, seed=13)
    with lora_serve.client() as c:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": str(path)})
        assert r.status_code == 200, r.text
    try:
        seen: dict[str, set[str]] = {"static": set(), "other": set()}
        for model in ("static", "other", "static", "other"):
            seen[model].add(lora_serve.answer(model, "1, 2, 3,"))
        assert all(len(s) == 1 for s in seen.values()), seen
        assert seen["static"] != seen["other"]
    finally:
        with lora_serve.client() as c:
            c.post("/v1/unload_lora_adapter", json={"lora_name": "other"})


def test_bad_adapters_are_refused(lora_serve: LoraServe) -> None:
    big = build_tiny_lora(lora_serve.adapters / "big", base_model=MODEL, rank=32)
    alien = build_tiny_lora(lora_serve.adapters / "alien", base_model="org/another-model")
    with lora_serve.client() as c:
        for name, path, code in (
            ("big", big, "lora_rank_too_large"),
            ("alien", alien, "base_model_mismatch"),
            ("static", big, "lora_adapter_exists"),
        ):
            r = c.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == code
        ids = {m["id"] for m in c.get("/v1/models").json()["data"]}
    assert ids == {MODEL, "static"}
