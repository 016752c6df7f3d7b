"""vLLM 0.32's extra routes: SageMaker's ``/ping`` and ``/invocations``
(vllm/entrypoints/serve/sagemaker/api_router.py), and known-but-unserved routes answered 404
with the served list, never a 5xx (the official clients retry every 5xx)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of


async def test_ping_answers_as_health(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            health = await h.http.get("/health")
            for resp in (await h.http.get("/ping"), await h.http.post("/ping")):
                assert (resp.status_code, resp.content) == (health.status_code, health.content)
                assert resp.status_code == 200


async def test_invocations_serves_chat_and_completions(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hi", " there")) as h:
            chat = await h.post(
                "/invocations", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
            )
            assert chat.status_code == 200, chat.text
            body = chat.json()
            assert body["object"] == "chat.completion"
            assert body["id"].startswith("chatcmpl-")
            assert body["choices"][0]["message"]["content"] == "Hi there"
            cmpl = await h.post("/invocations", {"prompt": "x", "max_tokens": 5, "n": 2})
            assert cmpl.status_code == 200, cmpl.text
            body = cmpl.json()
            assert body["object"] == "text_completion"
            assert body["id"].startswith("cmpl-")
            assert [c["text"] for c in body["choices"]] == ["Hi there"] * 2


async def test_invocations_bad_bodies_are_400s(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            neither = await h.post("/invocations", {"model": "M", "max_tokens": 3})
            assert neither.status_code == 400
            assert "ChatCompletionRequest" in neither.json()["error"]["message"]
            bad = await h.post("/invocations", {"prompt": "x", "max_tokens": "many"})
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "max_tokens"
            bad = await h.post("/invocations", {"messages": [], "max_tokens": 3})
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "messages"
            assert h.engine.requests == []


@pytest.mark.parametrize(
    "path",
    [
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/images/generations",
        "/v1/moderations",
    ],
)
async def test_known_unserved_endpoint_is_404_with_the_served_list(
    harness: HarnessFactory, path: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post(path, {"model": "M", "input": "x"})
            assert resp.status_code == 404
            err = resp.json()["error"]
            assert err["code"] == "not_found"
            assert "not served" in err["message"]
            assert "POST /v1/chat/completions" in err["message"]
            assert "POST /invocations" in err["message"]


async def test_chat_completions_batch(harness: HarnessFactory, tok: Any) -> None:
    """vLLM 0.32's ``/v1/chat/completions/batch``: one choice per conversation (index = the
    conversation's), usage summed; streaming, tools and n > 1 are 400s naming the field."""
    convs = [
        [{"role": "user", "content": "first"}],
        [{"role": "user", "content": "second one"}],
    ]
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok")) as h:
            res = await h.post(
                "/v1/chat/completions/batch", {"model": "M", "messages": convs, "max_tokens": 3}
            )
            assert res.status_code == 200, res.text
            body = res.json()
            assert body["object"] == "chat.completion"
            assert [c["index"] for c in body["choices"]] == [0, 1]
            assert [c["message"]["content"] for c in body["choices"]] == ["ok", "ok"]
            prompts = [r.prompt_token_ids for r in h.engine.requests]
            assert len(prompts) == 2
            assert len(set(map(tuple, prompts))) == 2
            assert body["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)
            assert body["usage"]["completion_tokens"] == 2 * len(tok.encode("ok"))
            for extra, param in (
                ({"stream": True}, "stream"),
                ({"n": 2}, "n"),
                ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                ({"messages": [convs[0], [{"role": "", "content": "x"}]]}, "messages[1][0].role"),
            ):
                bad = await h.post(
                    "/v1/chat/completions/batch",
                    {"model": "M", "messages": convs, "max_tokens": 3, **extra},
                )
                assert bad.status_code == 400, (extra, bad.text)
                assert bad.json()["error"]["param"] == param
            assert len(h.engine.requests) == 2
