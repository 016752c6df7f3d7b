"""vLLM 0.32's chat options (issue 29): ``reasoning_effort`` as a template variable (with
``enable_thinking``, ``build_chat_params``), ``--default-chat-template-kwargs`` under the
request's (``ChatParams.with_defaults``), ``--response-role`` (``get_chat_request_role``) and
``include_reasoning: false`` (the reasoning, logprobs and token ids left out, as
``chat_completion/serving.py`` does)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.template_kwargs import merge_template_kwargs
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

TEMPLATE = "{{ reasoning_effort }}|{{ enable_thinking }}|{{ x }}"


@pytest.mark.parametrize(
    ("fields", "defaults", "rendered"),
    [
        ({"reasoning_effort": "high"}, None, "high|True|"),
        ({"reasoning_effort": "none"}, None, "none|False|"),
        (
            {
                "reasoning_effort": "low",
                "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "max"},
            },
            None,
            "low|False|",
        ),
        ({"chat_template_kwargs": {"reasoning_effort": "medium"}}, None, "medium||"),
        ({"chat_template_kwargs": {"x": "r"}}, {"x": "d", "enable_thinking": False}, "|False|r"),
        ({"chat_template_kwargs": {"x": None}}, {"x": "d"}, "||d"),
        ({"reasoning_effort": "high"}, {"enable_thinking": False}, "high|True|"),
    ],
)
async def test_template_variables_merge_as_vllm(
    harness: HarnessFactory,
    tok: Tokenizer,
    fields: dict[str, Any],
    defaults: dict[str, Any] | None,
    rendered: str,
) -> None:
    config = GatewayHttpConfig(
        trust_request_chat_template=True, default_chat_template_kwargs=defaults
    )
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok"), config=config) as h:
            resp = await h.chat(max_tokens=2, chat_template=TEMPLATE, **fields)
            assert resp.status_code == 200, resp.text
            assert h.engine.requests[-1].prompt_token_ids == tok.encode(rendered)


async def test_bad_reasoning_effort_is_a_400(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.chat(max_tokens=2, reasoning_effort="huge")
            assert resp.status_code == 400, resp.text
            assert "reasoning_effort" in (resp.json()["error"]["param"] or "")
            assert h.engine.requests == []


def test_merge_keeps_no_kwargs_as_none() -> None:
    assert merge_template_kwargs(None) is None
    assert merge_template_kwargs(None, defaults={"a": 1}) == {"a": 1}


async def test_tokenize_renders_with_the_default_kwargs(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    real = tok.apply_chat_template

    def spy(*args: Any, **kw: Any) -> str:
        seen.append(kw.get("chat_template_kwargs"))
        return real(*args, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", spy)
    config = GatewayHttpConfig(default_chat_template_kwargs={"enable_thinking": False})
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            resp = await h.http.post(
                "/tokenize", json={"model": "M", "messages": [{"role": "user", "content": "hi"}]}
            )
            assert resp.status_code == 200, resp.text
    assert seen == [{"enable_thinking": False}]


async def test_responses_reasoning_effort_sets_enable_thinking(
    harness: HarnessFactory, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's Responses ``to_chat_params``: ``reasoning.effort`` as chat's ``reasoning_effort``."""
    seen: list[Any] = []
    real = tok.apply_chat_template

    def spy(*args: Any, **kw: Any) -> str:
        seen.append(kw.get("chat_template_kwargs"))
        return real(*args, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", spy)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok")) as h:
            body = {"model": "M", "input": "hi", "reasoning": {"effort": "none"}}
            resp = await h.http.post("/v1/responses", json=body)
            assert resp.status_code == 200, resp.text
    assert seen == [{"reasoning_effort": "none", "enable_thinking": False}]


async def test_response_role(harness: HarnessFactory, tok: Tokenizer) -> None:
    config = GatewayHttpConfig(response_role="bot")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok"), config=config) as h:
            whole = (await h.chat(max_tokens=2)).json()
            assert whole["choices"][0]["message"]["role"] == "bot"
            res, events = await h.stream(
                "/v1/chat/completions",
                {"model": "M", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            )
            assert res.status_code == 200
            assert events[0]["choices"][0]["delta"]["role"] == "bot"
            cont = (await h.chat(max_tokens=2, add_generation_prompt=False)).json()
            assert cont["choices"][0]["message"]["role"] == "user"


async def test_include_reasoning_false_leaves_the_reasoning_out(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    plan = lambda r: steps_of(tok, "<think>", "hmm", "</think>", "Hi")  # noqa: E731
    body: dict[str, Any] = {
        "model": "M",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 20,
        "logprobs": True,
        "return_token_ids": True,
    }
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan, reasoning_parser="qwen3") as h:
            shown = (await h.http.post("/v1/chat/completions", json=body)).json()["choices"][0]
            assert shown["message"]["reasoning"] == "hmm"
            assert shown["logprobs"] is not None
            assert shown["token_ids"]
            hidden_body = {**body, "include_reasoning": False}
            resp = await h.http.post("/v1/chat/completions", json=hidden_body)
            hidden = resp.json()["choices"][0]
            assert hidden["message"]["content"] == shown["message"]["content"]
            assert hidden["message"].get("reasoning") is None
            assert hidden["logprobs"] is None
            assert hidden.get("token_ids") is None
            res, events = await h.stream("/v1/chat/completions", {**hidden_body, "stream": True})
            assert res.status_code == 200
            chunks = [c for ev in events[:-1] for c in ev["choices"]]
            assert not any(c["delta"].get("reasoning") for c in chunks)
            assert not any(c.get("logprobs") or c.get("token_ids") for c in chunks)
            text = "".join(c["delta"].get("content") or "" for c in chunks)
            assert text == shown["message"]["content"]


async def test_responses_include_reasoning_false(harness: HarnessFactory, tok: Tokenizer) -> None:
    """vLLM's Responses ``include_reasoning: false``: no reasoning item, whole or streamed;
    the reasoning tokens are still counted."""
    plan = lambda r: steps_of(tok, "<think>", "hmm", "</think>", "Hi")  # noqa: E731
    body: dict[str, Any] = {"model": "M", "input": "hi", "include_reasoning": False}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan, reasoning_parser="qwen3") as h:
            shown = await h.http.post("/v1/responses", json={**body, "include_reasoning": True})
            assert [i["type"] for i in shown.json()["output"]] == ["reasoning", "message"]
            whole = (await h.http.post("/v1/responses", json=body)).json()
            assert [i["type"] for i in whole["output"]] == ["message"]
            assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
            res, events = await h.stream("/v1/responses", body)
            assert res.status_code == 200
            kinds = {e["type"] for e in events if isinstance(e, dict)}
            assert not any(k.startswith("response.reasoning") for k in kinds)
            done = next(e for e in events if e["type"] == "response.completed")
            assert [i["type"] for i in done["response"]["output"]] == ["message"]
