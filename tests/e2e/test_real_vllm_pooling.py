"""Pooling against a REAL vLLM 0.32.0 CPU engine running the tiny model as an embedding model
(``--runner pooling --convert embed``) behind ``python -m smg_trio launch``: the official
``openai`` client's ``embeddings.create`` (float and base64) equals vLLM's own ``LLM.embed``
for the same model and prompts, a batch of 64 inputs, rerank orders by the model's cosine
scores, generation is refused (400) on the pooling worker, and a client that goes away
mid-batch leaves nothing running on the engine."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import trio

from peers.tools import vllm_missing_reason
from tests.helpers.e2e import (
    launched_with_vllm,
    require_e2e,
    vllm_reference,
)
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny-embed"
POOLING_ARGS = ("--runner", "pooling", "--convert", "embed")
PROMPTS = ["Hello there", "The capital of France is Paris.", "1, 2, 3, 4,", "Écris une phrase."]

#: vLLM's own answer: ``LLM.embed`` on the same model directory, same runner and dtype.
REFERENCE_SCRIPT = """
import json, sys
from vllm import LLM
llm = LLM(model=sys.argv[1], runner="pooling", convert="embed", dtype="float32",
          max_model_len=1024, enforce_eager=True)
outs = llm.embed(json.loads(sys.argv[2]))
with open(sys.argv[3], "w") as f:
    json.dump([o.outputs.embedding for o in outs], f)
"""


@pytest.fixture(scope="module")
def pooling_gateway(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One pooling engine and its gateway, shared by this module's tests."""
    require_e2e(vllm_missing_reason())
    logs = tmp_path_factory.mktemp("pooling-gateway")
    port = free_port()
    with launched_with_vllm(
        tiny_model,
        MODEL,
        port=port,
        logs=logs,
        engine_args=POOLING_ARGS,
        engine_what="vLLM pooling engine",
    ) as (base, _gw, _eng):
        yield base


@pytest.fixture(scope="module")
def reference(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[float]]:
    """vLLM's ``LLM.embed`` vectors of :data:`PROMPTS` (a subprocess of the vLLM venv)."""
    require_e2e(vllm_missing_reason())
    out = tmp_path_factory.mktemp("reference") / "embeddings.json"
    vectors: list[list[float]] = vllm_reference(REFERENCE_SCRIPT, tiny_model, PROMPTS, out)
    return vectors


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_openai_client_embeddings_equal_vllms(
    pooling_gateway: str, reference: list[list[float]]
) -> None:
    client = _client(pooling_gateway)
    floats = client.embeddings.create(model=MODEL, input=PROMPTS, encoding_format="float")
    assert [d.index for d in floats.data] == list(range(len(PROMPTS)))
    for d, ref in zip(floats.data, reference, strict=True):
        np.testing.assert_allclose(d.embedding, ref, rtol=1e-4, atol=1e-5)
    assert floats.usage.prompt_tokens > len(PROMPTS)
    raw = client.embeddings.create(model=MODEL, input=PROMPTS, encoding_format="base64")
    for d, ref in zip(raw.data, reference, strict=True):
        vec = np.frombuffer(base64.b64decode(str(d.embedding)), dtype="<f4")
        np.testing.assert_allclose(vec, ref, rtol=1e-4, atol=1e-5)
    # the client's default: it asks for base64 and decodes it itself
    default = client.embeddings.create(model=MODEL, input=PROMPTS[0])
    np.testing.assert_allclose(default.data[0].embedding, reference[0], rtol=1e-4, atol=1e-5)


def test_a_batch_of_64(pooling_gateway: str) -> None:
    client = _client(pooling_gateway)
    inputs = [f"input number {i}: {'word ' * (i % 7)}" for i in range(64)]
    out = client.embeddings.create(model=MODEL, input=inputs, encoding_format="float")
    assert [d.index for d in out.data] == list(range(64))
    one = client.embeddings.create(model=MODEL, input=inputs[37], encoding_format="float")
    np.testing.assert_allclose(out.data[37].embedding, one.data[0].embedding, atol=1e-5)


def test_rerank_orders_by_the_models_scores(pooling_gateway: str) -> None:
    client = _client(pooling_gateway)
    query, docs = "The capital of France", ["Paris is in France", "1, 2, 3", "Bonjour", "cats"]
    vecs = [
        np.asarray(d.embedding)
        for d in client.embeddings.create(
            model=MODEL, input=[query, *docs], encoding_format="float"
        ).data
    ]
    scores = [float(vecs[0] @ v / (np.linalg.norm(vecs[0]) * np.linalg.norm(v))) for v in vecs[1:]]
    resp = httpx.post(
        f"{pooling_gateway}/rerank",
        json={"model": MODEL, "query": query, "documents": docs, "top_n": 3},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["index"] for r in results] == sorted(range(4), key=lambda i: -scores[i])[:3]
    for r in results:
        assert r["relevance_score"] == pytest.approx(scores[r["index"]], abs=1e-4)


def test_generation_is_refused_on_the_pooling_worker(pooling_gateway: str) -> None:
    resp = httpx.post(
        f"{pooling_gateway}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "unsupported_task"


def _metric(text: str, name: str, **labels: str) -> float:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(sel) + r"\}" if sel else r"(\{[^}]*\})?")
    total = 0.0
    for m in re.finditer(r"^" + pattern + r" (\S+)$", text, re.M):
        total += float(m.group(m.lastindex or 0))
    return total


def _busy(text: str) -> float:
    """Requests on the engine (running or waiting), as the gateway's metrics report them."""
    return _metric(text, "vllm:num_requests_running") + _metric(text, "vllm:num_requests_waiting")


async def test_a_disconnect_mid_batch_aborts_every_item(pooling_gateway: str) -> None:
    inputs = ["word " * 400 + str(i) for i in range(256)]  # long: the batch takes a while
    async with httpx.AsyncClient(base_url=pooling_gateway, timeout=120) as http:
        text = ""
        with trio.fail_after(120):
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    body = {"model": MODEL, "input": inputs}
                    nursery.start_soon(partial(http.post, "/v1/embeddings", json=body))
                    # another process's state: polled, there is no event to wait on
                    while _busy(text := (await http.get("/metrics")).text) == 0:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                    scope.cancel()  # the client goes away mid-batch
            while True:
                text = (await http.get("/metrics")).text
                gone = _metric(
                    text, "smg_router_requests_total", endpoint="embeddings", status="499"
                )
                idle = _metric(text, "smg_router_requests_in_flight") == 0 and _busy(text) == 0
                if gone >= 1 and idle:
                    break
                await trio.sleep(0.2)
