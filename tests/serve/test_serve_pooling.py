"""``serve --backend mock --api-server-count 2`` with the mock as a pooling model (vLLM's
``--runner pooling`` after ``--``, as a vLLM engine would take it): every frontend learns the
engine's tasks and serves pooling the same (embeddings; a cross-encoder's scores), and refuses
generation."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.helpers.frontends import find_run_dir, frontend_client, single_frontend
from tests.helpers.ports import free_port, random_worker_base_port
from tests.helpers.procs import read_until_ready, spawned

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]

MODEL = "mock-tiny"


@asynccontextmanager
async def serve_pooling(sock_dir: str, tmp_path: Path, *mock_args: str) -> AsyncIterator[str]:
    """``serve --backend mock --api-server-count 2 -- MOCK_ARGS``; yields the run directory
    (its ``frontend-{i}.sock`` serve one frontend each)."""
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "serve", "--backend", "mock",
        "--port", str(free_port()), "--worker-base-port", str(random_worker_base_port()),
        "--api-server-count", "2", "--", *mock_args,
    ]  # fmt: skip
    async with spawned(argv, stderr_path=tmp_path / "serve.stderr", env=env) as proc:
        assert proc.stdout is not None
        with trio.fail_after(120):
            await read_until_ready(proc.stdout)
        yield find_run_dir(sock_dir)


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def test_frontends_serve_embeddings_from_a_pooling_mock(
    sock_dir: str, tmp_path: Path
) -> None:
    async with serve_pooling(
        sock_dir, tmp_path, "--runner", "pooling", "--labels", "neg,pos"
    ) as run:
        answers = []
        for i in (1, 2):
            async with frontend_client(run, i) as c:
                resp = await c.post("/v1/embeddings", json={"model": MODEL, "input": ["a b", "c"]})
                assert resp.status_code == 200, resp.text
                answers.append([d["embedding"] for d in resp.json()["data"]])
                label = await c.post("/classify", json={"model": MODEL, "input": "a b"})
                assert label.status_code == 200, label.text
                assert len(label.json()["data"][0]["probs"]) == 2
                chat = await c.post("/v1/chat/completions", json=CHAT)
                assert chat.status_code == 400, chat.text
                assert chat.json()["error"]["code"] == "unsupported_task"
        assert answers[0] == answers[1]
        assert len(answers[0][0]) == 32


async def test_frontends_score_with_a_cross_encoder_mock(sock_dir: str, tmp_path: Path) -> None:
    mock = ("--runner", "pooling", "--labels", "score", "--convert", "classify")
    async with serve_pooling(sock_dir, tmp_path, *mock) as run:
        answers = []
        for i in (1, 2):
            async with frontend_client(run, i) as c:
                body = {"model": MODEL, "text_1": "what is up", "text_2": ["up", "down"]}
                resp = await c.post("/score", json=body)
                assert resp.status_code == 200, resp.text
                scores = [d["score"] for d in resp.json()["data"]]
                assert all(0.0 < s < 1.0 for s in scores)
                answers.append(scores)
                pooled = await c.post("/pooling", json={"model": MODEL, "input": "up"})
                assert pooled.status_code == 200, pooled.text
                assert len(pooled.json()["data"][0]["data"]) == 1  # the model's own: classify
                embed = await c.post("/v1/embeddings", json={"model": MODEL, "input": "up"})
                assert embed.status_code == 400, embed.text
        assert answers[0] == answers[1]
