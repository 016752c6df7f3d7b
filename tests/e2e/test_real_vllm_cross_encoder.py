"""Cross-encoder scoring against a REAL vLLM 0.32.0 CPU engine: the tiny model with a one-label
classifier head (``score.weight`` added, ``id2label`` of one label) run as
``--runner pooling --convert classify`` behind ``python -m smg_trio launch``. ``/score``,
``/v1/score`` and ``/rerank`` equal vLLM's own ``LLM.score`` on the same model (the pair
tokenized as vLLM does, one ``classify`` request per pair, the sigmoid of the one logit), and
``/pooling`` without a task runs the model's own task (``classify``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from peers.tools import vllm_missing_reason
from tests.helpers.e2e import (
    launched_with_vllm,
    require_e2e,
    vllm_reference,
)
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "tiny-cross"
POOLING_ARGS = ("--runner", "pooling", "--convert", "classify")
QUERY = "The capital of France"
DOCS = ["Paris is in France", "1, 2, 3", "Bonjour", "cats and dogs"]

#: vLLM's own answer: ``LLM.score`` of QUERY against each of DOCS, same runner and dtype.
REFERENCE_SCRIPT = """
import json, sys
from vllm import LLM
llm = LLM(model=sys.argv[1], runner="pooling", convert="classify", dtype="float32",
          max_model_len=1024, enforce_eager=True)
args = json.loads(sys.argv[2])
outs = llm.score(args["query"], args["docs"])
with open(sys.argv[3], "w") as f:
    json.dump([o.outputs.score for o in outs], f)
"""


@pytest.fixture(scope="module")
def cross_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a one-label classifier head: a cross-encoder once converted."""
    from safetensors.numpy import load_file, save_file

    out = tmp_path_factory.mktemp("cross") / "model"
    shutil.copytree(tiny_model, out)
    weights = load_file(str(out / "model.safetensors"))
    hidden = weights["model.embed_tokens.weight"].shape[1]
    rng = np.random.default_rng(7)
    weights["score.weight"] = (rng.standard_normal((1, hidden)) * 0.1).astype(np.float32)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def cross_gateway(cross_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One cross-encoder engine and its gateway, shared by this module's tests."""
    require_e2e(vllm_missing_reason())
    logs = tmp_path_factory.mktemp("cross-gateway")
    port = free_port()
    with launched_with_vllm(
        cross_model,
        MODEL,
        port=port,
        logs=logs,
        engine_args=POOLING_ARGS,
        engine_what="vLLM cross-encoder",
    ) as (base, _gw, _eng):
        yield base


@pytest.fixture(scope="module")
def reference(cross_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """vLLM's ``LLM.score`` of QUERY against DOCS (a subprocess of the vLLM venv)."""
    require_e2e(vllm_missing_reason())
    out = tmp_path_factory.mktemp("reference") / "scores.json"
    scores: list[float] = vllm_reference(
        REFERENCE_SCRIPT, cross_model, {"query": QUERY, "docs": DOCS}, out
    )
    return scores


def _post(base: str, path: str, body: dict[str, object]) -> dict[str, object]:
    resp = httpx.post(f"{base}{path}", json={"model": MODEL, **body}, timeout=60)
    assert resp.status_code == 200, resp.text
    out: dict[str, object] = resp.json()
    return out


def test_score_equals_vllms(cross_gateway: str, reference: list[float]) -> None:
    assert len(set(np.round(reference, 6))) == len(DOCS)  # the head tells the pairs apart
    for path in ("/score", "/v1/score"):
        out = _post(cross_gateway, path, {"text_1": QUERY, "text_2": DOCS})
        got = [d["score"] for d in out["data"]]  # type: ignore[attr-defined]
        np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)
    pairwise = _post(cross_gateway, "/score", {"text_1": [QUERY] * 2, "text_2": DOCS[:2]})
    got = [d["score"] for d in pairwise["data"]]  # type: ignore[attr-defined]
    np.testing.assert_allclose(got, reference[:2], rtol=1e-4, atol=1e-5)


def test_rerank_orders_by_vllms_scores(cross_gateway: str, reference: list[float]) -> None:
    for path in ("/rerank", "/v2/rerank"):
        out = _post(cross_gateway, path, {"query": QUERY, "documents": DOCS, "top_n": 3})
        results = out["results"]
        order = sorted(range(len(DOCS)), key=lambda i: -reference[i])[:3]
        assert [r["index"] for r in results] == order  # type: ignore[attr-defined]
        for r in results:  # type: ignore[attr-defined]
            assert r["relevance_score"] == pytest.approx(reference[r["index"]], abs=1e-4)


def test_pooling_without_a_task_classifies(cross_gateway: str) -> None:
    out = _post(cross_gateway, "/pooling", {"input": DOCS[0]})
    data = out["data"][0]["data"]  # type: ignore[index]
    assert len(data) == 1
    assert 0.0 < data[0] < 1.0
    embed = httpx.post(
        f"{cross_gateway}/v1/embeddings", json={"model": MODEL, "input": "x"}, timeout=60
    )
    assert embed.status_code == 400
    assert embed.json()["error"]["code"] == "unsupported_task"
