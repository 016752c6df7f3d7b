"""Pooling over the wire against the mock's pooler: /v1/embeddings and /v2/embed shapes, the
supported-task checks both ways, the limits (before any engine request), engine faults (a
5xx naming the engine) and a disconnect mid-batch (every item ABORTed)."""

from __future__ import annotations

import base64
from typing import Any

import attrs
import numpy as np
import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.mock.cli import pooler_of
from smg_trio.mock.pooling import MockPooler
from smg_trio.tokenizer.pooling_info import PoolingInfo
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory

POOLER = MockPooler(hidden_size=32, labels=("neg", "pos"))


def expected(h: Harness, ids: list[int], **params: Any) -> list[float]:
    wire = [params.get("use_activation", True), params.get("dimensions"), None, None, "embed"]
    out: list[float] = POOLER.pool(ids, wire).astype(np.float64).tolist()
    return out


def _error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    return err


async def test_embeddings_of_every_input_form(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            a, b = h.ids("hello world"), h.ids("good bye")
            a_bos = h.tok.encode("hello world", add_special_tokens=True)
            b_bos = h.tok.encode("good bye", add_special_tokens=True)
            cases: list[tuple[Any, list[list[int]]]] = [
                ("hello world", [a_bos]),
                (["hello world", "good bye"], [a_bos, b_bos]),
                (a, [a]),
                ([a, b], [a, b]),
            ]
            for given, ids in cases:
                resp = await h.post("/v1/embeddings", {"model": "M", "input": given})
                assert resp.status_code == 200, resp.text
                body = resp.json()
                assert body["object"] == "list"
                assert body["model"] == "M"
                assert body["id"].startswith("embd-")
                assert [d["index"] for d in body["data"]] == list(range(len(ids)))
                assert all(d["object"] == "embedding" for d in body["data"])
                for d, item in zip(body["data"], ids, strict=True):
                    assert d["embedding"] == pytest.approx(expected(h, item), rel=1e-6)
                tokens = sum(len(i) for i in ids)
                assert body["usage"] == {
                    "prompt_tokens": tokens,
                    "completion_tokens": 0,
                    "total_tokens": tokens,
                }
            assert not h.engine.active


async def test_base64_equals_float(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            body = {"model": "M", "input": ["a b c", "d e"]}
            floats = (await h.post("/v1/embeddings", body)).json()["data"]
            b64 = (await h.post("/v1/embeddings", {**body, "encoding_format": "base64"})).json()
            for f, d in zip(floats, b64["data"], strict=True):
                vec = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                assert vec.tolist() == pytest.approx(f["embedding"], rel=1e-6)


async def test_dimensions_only_where_the_model_allows(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            body = {"model": "M", "input": "hello", "dimensions": 8}
            err = _error(await h.post("/v1/embeddings", body), 400)
            assert err["param"] == "dimensions"
            assert "Matryoshka" in err["message"]
            h.served.pooling = PoolingInfo(
                matryoshka=True, matryoshka_dimensions=(8, 16), hidden_size=32
            )
            ok = (await h.post("/v1/embeddings", body)).json()["data"][0]["embedding"]
            ids = h.tok.encode("hello", add_special_tokens=True)
            assert ok == pytest.approx(expected(h, ids, dimensions=8), rel=1e-6)
            assert len(ok) == 8
            for bad in (12, 0, 64):
                err = _error(await h.post("/v1/embeddings", {**body, "dimensions": bad}), 400)
                assert err["param"] == "dimensions"
            assert len(h.engine.requests) == 1  # the refused ones never reached the engine


async def test_truncate_prompt_tokens(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER, max_model_len=16) as h:
            ids = list(range(10, 40))
            body = {"model": "M", "input": ids}
            err = _error(await h.post("/v1/embeddings", body), 400)
            assert err["param"] == "input"
            assert err["code"] == "context_length_exceeded"
            resp = await h.post("/v1/embeddings", {**body, "truncate_prompt_tokens": 5})
            assert resp.json()["usage"]["prompt_tokens"] == 5
            assert h.engine.requests[-1].prompt_token_ids == ids[:5]
            resp = await h.post(
                "/v1/embeddings",
                {**body, "truncate_prompt_tokens": -1, "truncation_side": "left"},
            )
            assert h.engine.requests[-1].prompt_token_ids == ids[-16:]


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("", "invalid_value"),
        ([], "invalid_value"),
        ([[]], "invalid_value"),
        (["a", ""], "invalid_value"),
        ([1, 10**9], "invalid_value"),
        (["a"] * 5, "too_many_inputs"),
        ([list(range(3, 40))], "context_length_exceeded"),
        ([list(range(3, 30))] * 3, "too_many_tokens"),
        ({"x": 1}, "invalid_value"),
    ],
)
async def test_bad_input_is_a_400_before_the_engine(
    harness: HarnessFactory, given: Any, code: str
) -> None:
    config = GatewayHttpConfig(max_pooling_items=4, max_pooling_tokens=60)
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER, config=config, max_model_len=32) as h:
            err = _error(await h.post("/v1/embeddings", {"model": "M", "input": given}), 400)
            assert err["code"] == code
            assert err["param"] == "input"
            missing = _error(await h.post("/v1/embeddings", {"model": "M"}), 400)
            assert missing["param"] == "input"
            assert h.engine.requests == []


async def test_generation_only_engine_refuses_pooling(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            err = _error(await h.post("/v1/embeddings", {"model": "M", "input": "hi"}), 400)
            assert err["code"] == "unsupported_task"
            assert "generate" in err["message"]
            assert h.engine.requests == []
            assert (await h.chat()).status_code == 200


async def test_pooling_only_engine_refuses_generation(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            await h.client.tasks.ensure(h.client, DEADLINE_S, "w")
            for resp in (await h.chat(), await h.complete()):
                err = _error(resp, 400)
                assert err["code"] == "unsupported_task"
                assert "pooling model" in err["message"]
            assert h.engine.requests == []


async def test_tokenspeed_refuses_pooling(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(protocol="tokenspeed") as h:
            err = _error(await h.post("/v1/embeddings", {"model": "M", "input": "hi"}), 400)
            assert err["code"] == "unsupported_field"
            assert err["param"] == "pooling"


@pytest.mark.parametrize("fault", ["nan", "malformed"])
async def test_engine_fault_is_a_5xx_naming_the_engine(harness: HarnessFactory, fault: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=attrs.evolve(POOLER, fault=fault)) as h:
            body = {"model": "M", "input": ["a", "b", "c"]}
            err = _error(await h.post("/v1/embeddings", body), 500)
            assert err["code"] == "engine_error"
            assert err["message"].startswith("engine ")  # names the worker
            assert "pooling output" in err["message"]
            assert not h.engine.active


async def test_disconnect_mid_batch_aborts_every_item(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            h.engine.stall()
            inputs = [f"item {i}" for i in range(8)]
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(h.post, "/v1/embeddings", {"model": "M", "input": inputs})
                    while len(h.engine.requests) < len(inputs):
                        await h.engine.request_event.wait()
                    scope.cancel()
            await h.wait_aborted([r.request_id for r in h.engine.requests])
            h.engine.resume()


async def test_one_failed_item_aborts_the_others(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        bad = [5, 6, 7]
        async with harness(
            pooler=POOLER, error_finish=lambda req: req.prompt_token_ids == bad
        ) as h:
            h.engine.stall()
            async with trio.open_nursery() as nursery:

                async def post() -> None:
                    err = _error(
                        await h.post("/v1/embeddings", {"model": "M", "input": [bad, [8, 9]]}),
                        500,
                    )
                    assert err["code"] == "engine_error"

                nursery.start_soon(post)
                while len(h.engine.requests) < 2:
                    await h.engine.request_event.wait()
                h.engine.resume()
            assert not h.engine.active


async def test_cohere_v2_embed(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            body = {"model": "M", "texts": ["hello", "bye"], "embedding_types": ["float", "base64"]}
            resp = await h.post("/v2/embed", body)
            assert resp.status_code == 200, resp.text
            out = resp.json()
            assert out["response_type"] == "embeddings_by_type"
            assert out["texts"] == ["hello", "bye"]
            ids = h.tok.encode("hello", add_special_tokens=True)
            assert out["embeddings"]["float"][0] == pytest.approx(expected(h, ids), rel=1e-6)
            vec = np.frombuffer(base64.b64decode(out["embeddings"]["base64"][1]), dtype="<f4")
            assert vec.tolist() == pytest.approx(out["embeddings"]["float"][1], rel=1e-6)
            assert out["meta"]["billed_units"]["input_tokens"] > 0
            err = _error(await h.post("/v2/embed", {"model": "M", "texts": []}), 400)
            assert err["param"] == "texts"


def _cos(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


async def test_classify_labels_from_the_model_config(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            h.served.pooling = PoolingInfo(labels=("neg", "pos"))
            resp = await h.post("/classify", {"model": "M", "input": ["good", "bad"]})
            assert resp.status_code == 200, resp.text
            body = resp.json()
            for d, text in zip(body["data"], ["good", "bad"], strict=True):
                ids = h.tok.encode(text, add_special_tokens=True)
                probs = POOLER.pool(ids, [True, None, None, None, "classify"]).tolist()
                assert d["probs"] == pytest.approx(probs, rel=1e-6)
                assert d["num_classes"] == 2
                assert d["label"] == ("neg", "pos")[int(np.argmax(probs))]
            assert body["id"].startswith("classify-")


async def test_classify_needs_a_classify_engine(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=MockPooler()) as h:  # no labels: embed only
            err = _error(await h.post("/classify", {"model": "M", "input": "x"}), 400)
            assert err["code"] == "unsupported_task"
            assert "'classify'" in err["message"]


async def test_pooling_route_gives_the_raw_output(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            body = (await h.post("/pooling", {"model": "M", "input": [[5, 6]]})).json()
            assert body["data"][0]["object"] == "pooling"
            assert body["data"][0]["data"] == pytest.approx(expected(h, [5, 6]), rel=1e-6)


async def test_score_is_the_cosine_of_the_embeddings(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            for path in ("/score", "/v1/score"):
                resp = await h.post(
                    path, {"model": "M", "text_1": "what is up", "text_2": ["up", "down"]}
                )
                assert resp.status_code == 200, resp.text
                data = resp.json()["data"]
                q = expected(h, h.tok.encode("what is up", add_special_tokens=True))
                for d, doc in zip(data, ["up", "down"], strict=True):
                    v = expected(h, h.tok.encode(doc, add_special_tokens=True))
                    assert d["score"] == pytest.approx(_cos(q, v), rel=1e-5)
            err = _error(
                await h.post("/score", {"model": "M", "text_1": ["a", "b"], "text_2": ["c"]}),
                400,
            )
            assert err["param"] == "text_1"


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_orders_by_score(harness: HarnessFactory, path: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            docs = ["the cat sat", "a dog ran", "the cat sat on the mat", "zebra"]
            body = {"model": "M", "query": "the cat", "documents": docs}
            out = (await h.post(path, body)).json()
            q = expected(h, h.tok.encode("the cat", add_special_tokens=True))
            scores = [_cos(q, expected(h, h.tok.encode(d, add_special_tokens=True))) for d in docs]
            order = sorted(range(len(docs)), key=lambda i: -scores[i])
            assert [r["index"] for r in out["results"]] == order
            assert [r["document"]["text"] for r in out["results"]] == [docs[i] for i in order]
            assert out["results"][0]["relevance_score"] == pytest.approx(scores[order[0]], rel=1e-5)
            top = (await h.post(path, {**body, "top_n": 2, "return_documents": False})).json()
            assert [r["index"] for r in top["results"]] == order[:2]
            assert "document" not in top["results"][0]
            assert top["usage"]["prompt_tokens"] == top["usage"]["total_tokens"] > 0
            err = _error(await h.post(path, {**body, "documents": []}), 400)
            assert err["param"] == "documents"


async def test_pooling_requests_count_in_the_metrics_by_endpoint(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER) as h:
            await h.post("/v1/embeddings", {"model": "M", "input": ["a", "b"]})
            await h.post("/rerank", {"model": "M", "query": "a", "documents": ["b"]})
            await h.post("/v1/embeddings", {"model": "M", "input": ""})
            text = (await h.http.get("/metrics")).text
            assert 'smg_router_requests_total{endpoint="embeddings",status="200"} 1.0' in text
            assert 'smg_router_requests_total{endpoint="rerank",status="200"} 1.0' in text
            assert 'smg_router_requests_total{endpoint="embeddings",status="400"} 1.0' in text
            assert "smg_router_requests_in_flight 0.0" in text


async def test_a_text_that_cannot_fit_is_refused_before_it_is_encoded(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER, max_model_len=32) as h:
            encoded: list[str] = []
            real = h.tok.encode

            def spy(text: str, **kw: Any) -> list[int]:
                encoded.append(text)
                return real(text, **kw)

            monkeypatch.setattr(h.tok, "encode", spy)
            huge = "x" * 100_000
            err = _error(await h.post("/v1/embeddings", {"model": "M", "input": ["ok", huge]}), 400)
            assert err["code"] == "context_length_exceeded"
            assert huge not in encoded


def test_mock_cli_runner_pooling_makes_a_pooler() -> None:
    assert pooler_of("generate", "a,b") is None
    assert pooler_of("pooling", "") == MockPooler()
    pooler = pooler_of("pooling", "neg, pos")
    assert pooler is not None
    assert pooler.labels == ("neg", "pos")
    assert pooler.tasks == ("embed", "classify")


async def test_admission_and_body_limits_apply(harness: HarnessFactory) -> None:
    config = GatewayHttpConfig(max_concurrent_requests=1, queue_size=0, max_body_bytes=4096)
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=POOLER, config=config) as h:
            h.engine.stall()
            async with trio.open_nursery() as nursery:
                first: list[int] = []

                async def hold() -> None:
                    resp = await h.post("/v1/embeddings", {"model": "M", "input": "a"})
                    first.append(resp.status_code)

                nursery.start_soon(hold)
                while not h.engine.requests:
                    await h.engine.request_event.wait()
                busy = await h.post("/v1/embeddings", {"model": "M", "input": "b"})
                assert busy.status_code == 429, busy.text
                h.engine.resume()
            assert first == [200]
            big = await h.post("/v1/embeddings", {"model": "M", "input": "x" * 5000})
            assert big.status_code == 413
