"""Pooling by the model's own task, against the mock's pooler: cross-encoder scoring (a
one-label ``classify`` model reads each (query, document) pair, the score its sigmoid),
``/pooling`` without a task, and the first item's tokens as the routing hint."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio

from smg_trio.mock.cli import pooler_of
from smg_trio.mock.pooling import MockPooler
from smg_trio.routing.cache_aware import RouteRequest
from smg_trio.tokenizer.pooling_info import PoolingInfo
from tests.helpers.gateway import DEADLINE_S, Harness, HarnessFactory

#: A cross-encoder: sequence classification with one label, no embed task.
CROSS = MockPooler(labels=("score",), embed=False)


def pair_score(h: Harness, query: str, doc: str) -> float:
    ids, _ = h.tok.encode_pair(query, doc)
    out = CROSS.pool(ids, [True, None, None, None, "classify"])
    assert out.shape == (1,)
    return float(out[0])


def _error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    return err


def test_the_mock_cross_encoder_is_a_sigmoid_of_one_logit() -> None:
    assert CROSS.tasks == ("classify",)
    raw = CROSS.pool([5, 6, 7], [False, None, None, None, "classify"])
    act = CROSS.pool([5, 6, 7], [True, None, None, None, "classify"])
    assert act[0] == pytest.approx(1 / (1 + np.exp(-raw[0])), rel=1e-6)


async def test_score_on_a_cross_encoder_scores_each_pair(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=CROSS) as h:
            docs = ["up", "down", "what is up"]
            for path in ("/score", "/v1/score", "/score"):  # the first plans again, then not
                resp = await h.post(path, {"model": "M", "text_1": "what is up", "text_2": docs})
                assert resp.status_code == 200, resp.text
                out = resp.json()
                want = [pair_score(h, "what is up", d) for d in docs]
                assert [d["score"] for d in out["data"]] == pytest.approx(want, rel=1e-5)
                assert [d["index"] for d in out["data"]] == [0, 1, 2]
            # The engine saw one classify request per pair, the pair's tokens.
            last = sorted(h.engine.requests[-3:], key=lambda r: r.request_id)
            assert [r.prompt_token_ids for r in last] == [
                h.tok.encode_pair("what is up", d)[0] for d in docs
            ]
            assert all(r.pooling[4] == "classify" for r in last)
            # Pairwise: text_1[i] with text_2[i].
            resp = await h.post(
                "/score", {"model": "M", "text_1": ["a", "b"], "text_2": ["c", "d"]}
            )
            got = [d["score"] for d in resp.json()["data"]]
            assert got == pytest.approx([pair_score(h, "a", "c"), pair_score(h, "b", "d")])
            assert resp.json()["usage"]["prompt_tokens"] == sum(
                len(h.tok.encode_pair(q, d)[0]) for q, d in (("a", "c"), ("b", "d"))
            )


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_on_a_cross_encoder_orders_by_pair_score(
    harness: HarnessFactory, path: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=CROSS) as h:
            docs = ["the cat sat", "a dog ran", "the cat sat on the mat", "zebra"]
            body = {"model": "M", "query": "the cat", "documents": docs, "top_n": 3}
            out = (await h.post(path, body)).json()
            scores = [pair_score(h, "the cat", d) for d in docs]
            order = sorted(range(len(docs)), key=lambda i: -scores[i])[:3]
            assert [r["index"] for r in out["results"]] == order
            assert [r["relevance_score"] for r in out["results"]] == pytest.approx(
                [scores[i] for i in order], rel=1e-5
            )
            assert out["results"][0]["document"]["text"] == docs[order[0]]


async def test_cross_encoder_bad_input(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=CROSS, max_model_len=16) as h:
            await h.post("/score", {"model": "M", "text_1": "a", "text_2": "b"})  # learn the task
            n = len(h.engine.requests)
            long = " ".join(["word"] * 40)
            err = _error(await h.post("/score", {"model": "M", "text_1": "a", "text_2": long}), 400)
            assert err["code"] == "context_length_exceeded"
            body = {"model": "M", "text_1": "a", "text_2": long, "truncate_prompt_tokens": 8}
            ok = await h.post("/score", body)
            assert ok.status_code == 200, ok.text
            assert h.engine.requests[-1].prompt_token_ids == h.tok.encode_pair("a", long)[0][:8]
            err = _error(
                await h.post("/rerank", {"model": "M", "query": "a", "documents": [""]}), 400
            )
            assert err["param"] == "documents"
            assert len(h.engine.requests) == n + 1


async def test_a_classifier_with_several_labels_does_not_score(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=MockPooler(labels=("neg", "pos"), embed=False)) as h:
            h.served.pooling = PoolingInfo(labels=("neg", "pos"))
            for _ in range(2):
                err = _error(
                    await h.post("/score", {"model": "M", "text_1": "a", "text_2": "b"}), 400
                )
                assert err["code"] == "unsupported_task"
                assert "num_labels" in err["message"]


async def test_pooling_without_a_task_runs_the_models_own(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=MockPooler(labels=("neg", "pos"), embed=False)) as h:
            for _ in range(2):
                resp = await h.post("/pooling", {"model": "M", "input": "hello there"})
                assert resp.status_code == 200, resp.text
                probs = resp.json()["data"][0]["data"]
                assert len(probs) == 2
                assert sum(probs) == pytest.approx(1.0)
                assert h.engine.requests[-1].pooling[4] == "classify"
        async with harness(pooler=MockPooler(labels=("neg", "pos"))) as h:  # embed first
            resp = await h.post("/pooling", {"model": "M", "input": "hello there"})
            assert len(resp.json()["data"][0]["data"]) == 32


async def test_pooling_leases_with_the_first_items_tokens(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(pooler=MockPooler(labels=("neg", "pos"))) as h:
            routes: list[RouteRequest | None] = []
            lease = h.backend.lease

            def spy(model_id: str, exclude: Any = (), route: RouteRequest | None = None) -> Any:
                routes.append(route)
                return lease(model_id, exclude, route)

            monkeypatch.setattr(h.backend, "lease", spy)
            body = {"model": "M", "input": ["first text", "second"], "user": "u1"}
            assert (await h.post("/v1/embeddings", body)).status_code == 200
            assert routes[-1] is not None
            assert list(routes[-1].prompt_token_ids) == h.tok.encode(
                "first text", add_special_tokens=True
            )
            assert routes[-1].session_key == "u1"
            resp = await h.post(
                "/rerank",
                {"model": "M", "query": "q", "documents": ["d"]},
                headers={"x-session-id": "s"},
            )
            assert resp.status_code == 200
            assert routes[-1] is not None
            assert routes[-1].session_key == "s"


def test_mock_cli_convert_classify_makes_a_cross_encoder() -> None:
    assert pooler_of("pooling", "score", "classify") == CROSS
    assert pooler_of("pooling", "neg,pos", "embed") == MockPooler(labels=("neg", "pos"))
    with pytest.raises(ValueError, match="needs --labels"):
        pooler_of("pooling", "", "classify")
