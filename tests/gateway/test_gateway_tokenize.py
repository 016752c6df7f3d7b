"""/tokenize, /detokenize and /version in vLLM's shapes; unknown paths (404 listing the served
endpoints) and known-but-unserved ones (501)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from smg_trio import __version__
from smg_trio.gateway.config import GatewayHttpConfig
from tests.helpers.gateway import DEADLINE_S, HarnessFactory

MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
async def test_tokenize_prompt(harness: HarnessFactory, path: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post(path, {"model": "M", "prompt": "hello world"})
            assert resp.status_code == 200, resp.text
            body = resp.json()
            ids = h.tok.encode("hello world", add_special_tokens=True)
            assert body == {
                "count": len(ids),
                "max_model_len": h.served.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
            plain = await h.post(
                path,
                {"prompt": "hello world", "add_special_tokens": False, "return_token_strs": True},
            )
            body = plain.json()
            assert body["tokens"] == h.tok.encode("hello world")
            assert body["token_strs"] == [h.tok.id_to_token(i) for i in body["tokens"]]


async def test_tokenize_messages_uses_the_chat_template(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            with_prompt = (await h.post("/v1/tokenize", {"messages": MESSAGES})).json()
            rendered = h.tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
            assert with_prompt["tokens"] == h.tok.encode(rendered)
            without = (
                await h.post("/v1/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
            ).json()
            assert without["count"] < with_prompt["count"]
            both = await h.post("/v1/tokenize", {"messages": MESSAGES, "prompt": "x"})
            assert both.status_code == 400
            assert both.json()["error"]["type"] == "invalid_request_error"


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        (
            {"messages": [{"role": "user", "content": "hi", "tool_call_id": "c1"}]},
            "messages[0].tool_call_id",
        ),
    ],
)
async def test_tokenize_messages_runs_chats_checks(
    harness: HarnessFactory, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "M", "messages": MESSAGES, **extra}
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            chat = await h.post("/v1/chat/completions", {**body, "tool_choice": "none"})
            assert chat.status_code == 400, chat.text
            assert chat.json()["error"]["param"] == param
            tokenized = await h.post("/v1/tokenize", body)
            assert tokenized.status_code == 400, tokenized.text
            assert tokenized.json()["error"]["param"] == param


@pytest.mark.parametrize("path", ["/detokenize", "/v1/detokenize"])
async def test_detokenize_round_trip_and_out_of_vocab(harness: HarnessFactory, path: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            ids = h.tok.encode("hello world")
            resp = await h.post(path, {"model": "M", "tokens": ids})
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"prompt": "hello world"}
            bad = await h.post(path, {"tokens": [ids[0], h.tok.vocab_size]})
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "tokens[1]"
            negative = await h.post(path, {"tokens": [-1]})
            assert negative.status_code == 400


async def test_tokenize_needs_the_api_key(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key="k")) as h:
            assert (await h.post("/v1/tokenize", {"prompt": "x"})).status_code == 401
            ok = await h.post(
                "/v1/tokenize", {"prompt": "x"}, headers={"authorization": "Bearer k"}
            )
            assert ok.status_code == 200


async def test_version(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.http.get("/version")
            assert resp.status_code == 200
            assert resp.json() == {"version": __version__}


async def test_unknown_path_lists_the_served_endpoints(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post("/v1/chat/completion", {})  # a typo
            assert resp.status_code == 404
            err = resp.json()["error"]
            assert err["code"] == "not_found"
            assert "POST /v1/chat/completions" in err["message"]
            assert "POST /v1/tokenize" in err["message"]


@pytest.mark.parametrize(
    "path", ["/v1/moderations", "/v1/audio/transcriptions", "/v1/images/generations"]
)
async def test_known_unserved_endpoint_is_501(harness: HarnessFactory, path: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post(path, {"model": "M", "input": "x"})
            assert resp.status_code == 501
            err = resp.json()["error"]
            assert err["code"] == "not_implemented"
            assert "not served" in err["message"]
