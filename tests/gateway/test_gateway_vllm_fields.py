"""Request fields as vLLM 0.32's server takes them (issue 29, item 3), each compared with
vLLM's own code: the seed range (``completion/protocol.py``: any int64), ``logit_bias``
(``SamplingParams.from_optional``: values clamped, every bad key named), ``prompt_logprobs``
``null`` when not requested (responses are ``model_dump()``ed with their ``None`` fields)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of


async def test_any_int64_seed_reaches_the_engine(harness: HarnessFactory, tok: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.chat(max_tokens=2, seed=-5, n=2)
            assert res.status_code == 200, res.text
            seeds = sorted(r.raw.sampling_params["seed"] for r in h.engine.requests)
            assert seeds == [-5, -4]
            res = await h.chat(max_tokens=2, seed=-(2**63))
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].raw.sampling_params["seed"] == -(2**63)
        async with harness(protocol="tokenspeed") as h:  # its seeds are u64: still a 400
            res = await h.chat(max_tokens=2, seed=-1)
            assert res.status_code == 400
            assert res.json()["error"]["param"] == "seed"


async def test_logit_bias_clamps_values_and_names_every_bad_key(
    harness: HarnessFactory, tok: Any
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            res = await h.chat(max_tokens=2, logit_bias={"5": 250, "7": -1000})
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].raw.sampling_params["logit_bias"] == {5: 100.0, 7: -100.0}
            bad = await h.chat(max_tokens=2, logit_bias={"a": 1, "5": 1, "b": 2})
            assert bad.status_code == 400
            err = bad.json()["error"]
            assert err["param"] == "logit_bias"
            assert "['a', 'b']" in err["message"]
            outside = await h.chat(max_tokens=2, logit_bias={"99999": 1, "5": 1, "-3": 1})
            assert outside.status_code == 400
            assert "[99999, -3]" in outside.json()["error"]["message"]
            assert len(h.engine.requests) == 1


async def test_prompt_logprobs_is_null_when_not_requested(
    harness: HarnessFactory, tok: Any
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            chat = (await h.chat(max_tokens=2)).json()
            assert "prompt_logprobs" in chat
            assert chat["prompt_logprobs"] is None
            cmpl = (await h.complete(max_tokens=2, prompt=["a", "b"])).json()
            assert [c.get("prompt_logprobs", "absent") for c in cmpl["choices"]] == [None, None]


async def test_kv_transfer_params_reach_the_engine_and_come_back(
    harness: HarnessFactory, tok: Any
) -> None:
    """vLLM puts a request's ``kv_transfer_params`` in ``extra_args`` and answers the engine's
    (its KV connector's) at the top of the response: prefill/decode clients depend on both."""
    params = {"do_remote_decode": True, "remote_engine_id": None}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x")) as h:
            chat = await h.chat(max_tokens=2, kv_transfer_params=params)
            assert chat.status_code == 200, chat.text
            sent = h.engine.requests[-1].raw.sampling_params["extra_args"]
            assert sent == {"kv_transfer_params": params}
            assert chat.json()["kv_transfer_params"] == params
            cmpl = await h.complete(max_tokens=2, kv_transfer_params=params)
            assert cmpl.json()["kv_transfer_params"] == params
            plain = (await h.chat(max_tokens=2)).json()
            assert "kv_transfer_params" in plain
            assert plain["kv_transfer_params"] is None
            assert "extra_args" not in h.engine.requests[-1].raw.sampling_params
        async with harness(protocol="tokenspeed") as h:  # its wire has no KV connector
            res = await h.chat(max_tokens=2, kv_transfer_params=params)
            assert res.status_code == 400
            assert res.json()["error"]["param"] == "kv_transfer_params"


async def test_custom_roles_reach_the_template(harness: HarnessFactory, tok: Any) -> None:
    """vLLM 0.32's ``CustomChatCompletionMessageParam``: any string role reaches the
    template (whose own rules then apply: the tiny model's refuses unknown roles, a 400)."""
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    config = GatewayHttpConfig(trust_request_chat_template=True)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x"), config=config) as h:
            msgs = [{"role": "critic", "content": "meh"}]
            res = await h.chat(max_tokens=2, messages=msgs, chat_template=template)
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].prompt_token_ids == tok.encode("<critic>meh")
            refused = await h.chat(max_tokens=2, messages=msgs)
            assert refused.status_code == 400
            assert "Unknown message role" in refused.json()["error"]["message"]


async def test_truncate_prompt_tokens_keeps_the_chosen_side(
    harness: HarnessFactory, tok: Any
) -> None:
    """vLLM 0.32's renderer: keep ``truncate_prompt_tokens`` tokens, the last ones by default
    (``truncation_side: left``, vLLM's for generation), the first with ``right``; ``-1`` is
    the context less one token, so an over-long prompt is cut instead of refused."""
    words = " ".join(f"w{i}" for i in range(120))
    ids = tok.encode(words)
    assert len(ids) > 64
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x"), max_model_len=64) as h:
            assert (await h.complete(max_tokens=1, prompt=words)).status_code == 400
            res = await h.complete(
                max_tokens=1, prompt=[words, "a b c d e"], truncate_prompt_tokens=3
            )
            assert res.status_code == 200, res.text
            got = [r.prompt_token_ids for r in h.engine.requests[-2:]]
            assert sorted(got) == sorted([ids[-3:], tok.encode("a b c d e")[-3:]])
            res = await h.complete(
                max_tokens=1, prompt=words, truncate_prompt_tokens=4, truncation_side="right"
            )
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].prompt_token_ids == ids[:4]
            res = await h.complete(max_tokens=1, prompt=words, truncate_prompt_tokens=-1)
            assert res.status_code == 200, res.text
            assert h.engine.requests[-1].prompt_token_ids == ids[-63:]
            chat = await h.chat(max_tokens=1, truncate_prompt_tokens=2)
            assert chat.status_code == 200, chat.text
            assert len(h.engine.requests[-1].prompt_token_ids) == 2
            assert chat.json()["usage"]["prompt_tokens"] == 2


async def test_bad_constraints_are_400s_before_the_engine(
    harness: HarnessFactory, tok: Any
) -> None:
    """vLLM 0.32 checks a constraint with its guidance backend (llguidance) before any engine
    work: an invalid regex, JSON schema or grammar is a 400, not a 200 with empty text."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            for extra, param in (
                ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex"),
                ({"guided_regex": "a(b"}, "guided_regex"),
                ({"guided_json": {"type": "nope"}}, "guided_json"),
                ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs.grammar"),
                (
                    {
                        "response_format": {
                            "type": "json_schema",
                            "json_schema": {"name": "x", "schema": {"type": "nope"}},
                        }
                    },
                    "response_format",
                ),
            ):
                res = await h.chat(max_tokens=2, **extra)
                assert res.status_code == 400, (extra, res.text)
                err = res.json()["error"]
                assert err["param"] == param, err
                cmpl = await h.complete(max_tokens=2, **extra)
                assert cmpl.status_code == 400, (extra, cmpl.text)
            assert h.engine.requests == []
            for extra in (
                {"structured_outputs": {"regex": "a+"}},
                {"structured_outputs": {"choice": ["a", "b"]}},
                {"structured_outputs": {"grammar": 'start: "a"'}},
                {"guided_json": {"type": "object"}},
            ):
                ok = await h.chat(max_tokens=2, **extra)
                assert ok.status_code == 200, (extra, ok.text)


async def test_enable_log_requests_logs_each_request(
    harness: HarnessFactory, tok: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config = GatewayHttpConfig(enable_log_requests=True, max_log_len=40)
    caplog.set_level(logging.INFO, logger="smg_trio.requests")
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "x"), config=config) as h:
            body = {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            res = await h.post("/v1/chat/completions", body, headers={"x-request-id": "req-42"})
            assert res.status_code == 200, res.text
    lines = [r.getMessage() for r in caplog.records if r.name == "smg_trio.requests"]
    assert len(lines) == 1
    assert lines[0].startswith("Received request req-42: endpoint chat, model 'M', body {")
    assert lines[0].endswith("...")


async def test_return_token_ids(harness: HarnessFactory, tok: Any) -> None:
    """vLLM 0.32's ``return_token_ids``: each choice's ``token_ids`` and the prompt's
    ``prompt_token_ids`` (chat: at the top, on the first chunk when streamed; completions: on
    each choice, on its first chunk when streamed); ``null`` when not asked."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hel", "lo")) as h:
            gen = [*tok.encode("Hel"), *tok.encode("lo")]
            chat = (await h.chat(max_tokens=5, return_token_ids=True)).json()
            prompt = h.engine.requests[-1].prompt_token_ids
            assert chat["prompt_token_ids"] == prompt
            assert chat["choices"][0]["token_ids"][: len(gen)] == gen
            _, events = await h.stream(
                "/v1/chat/completions",
                {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                 "return_token_ids": True},
            )  # fmt: skip
            chunks = [e for e in events if isinstance(e, dict)]
            assert chunks[0]["prompt_token_ids"] == prompt
            streamed = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
            assert streamed == chat["choices"][0]["token_ids"]
            cmpl = (
                await h.complete(max_tokens=5, prompt=["a", "b c"], return_token_ids=True)
            ).json()
            for choice, text in zip(cmpl["choices"], ["a", "b c"], strict=True):
                assert choice["prompt_token_ids"] == tok.encode(text, add_special_tokens=True)
                assert choice["token_ids"][: len(gen)] == gen
            _, events = await h.stream(
                "/v1/completions",
                {"model": "M", "prompt": "a", "max_tokens": 5, "return_token_ids": True},
            )
            chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
            assert chunks[0]["choices"][0]["prompt_token_ids"] == tok.encode(
                "a", add_special_tokens=True
            )
            assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
            plain = (await h.chat(max_tokens=5)).json()
            assert plain["prompt_token_ids"] is None
            assert plain["choices"][0]["token_ids"] is None


async def test_chat_echo_continues_the_final_message(harness: HarnessFactory, tok: Any) -> None:
    """vLLM 0.32's chat ``echo``: with ``continue_final_message`` (no generation prompt) the
    reply's role is the last message's and its text leads the reply, whole and streamed (a
    chunk after the role's); with a generation prompt only an assistant last turn is echoed."""
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    body = {"model": "M", "messages": msgs, "max_tokens": 5, "echo": True,
            "continue_final_message": True, "add_generation_prompt": False}  # fmt: skip
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "lo")) as h:
            whole = (await h.post("/v1/chat/completions", body)).json()
            message = whole["choices"][0]["message"]
            assert (message["role"], message["content"]) == ("assistant", "Hello")
            _, events = await h.stream("/v1/chat/completions", body)
            deltas = [e["choices"][0]["delta"] for e in events if isinstance(e, dict)]
            assert deltas[0] == {"role": "assistant", "content": ""}
            assert deltas[1] == {"content": "Hel"}
            assert "".join(d.get("content") or "" for d in deltas) == "Hello"
            user_last = {**body, "messages": msgs[:1], "continue_final_message": False,
                         "add_generation_prompt": True}  # fmt: skip
            plain = (await h.post("/v1/chat/completions", user_last)).json()
            assert plain["choices"][0]["message"]["content"] == "lo"


async def test_the_engines_structured_backend_is_asked_for(
    harness: HarnessFactory, tok: Any
) -> None:
    """The engine's configured backend (vLLM's ``--structured-outputs-config.backend``) goes
    in ``_backend``; ``auto`` asks for guidance (xgrammar for structural tags), as before."""
    so = {"structured_outputs": {"regex": "a+"}}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "a")) as h:
            assert (await h.chat(max_tokens=2, **so)).status_code == 200
            assert (
                h.engine.requests[-1].raw.sampling_params["structured_outputs"]["_backend"]
                == "guidance"
            )
        config = GatewayHttpConfig(structured_outputs_backend="xgrammar")
        async with harness(plan=lambda r: steps_of(tok, "a"), config=config) as h:
            assert (await h.chat(max_tokens=2, **so)).status_code == 200
            sent = h.engine.requests[-1].raw.sampling_params["structured_outputs"]
            assert sent == {"regex": "a+", "_backend": "xgrammar"}
            bad = await h.chat(max_tokens=2, structured_outputs={"regex": "a(b"})
            assert bad.status_code == 400  # still checked before the engine


def test_a_repeated_schema_is_validated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """llguidance's validation of a large schema costs seconds of CPU: a schema seen before
    (clients repeat theirs) is answered from the bounded cache, valid or not."""
    from smg_trio.gateway.openai import grammar_check
    from smg_trio.protocol.types import StructuredOutputs

    calls: list[str] = []
    real = grammar_check.llguidance.LLMatcher.validate_grammar

    def counting(grammar: str) -> Any:
        calls.append(grammar)
        return real(grammar)

    monkeypatch.setattr(grammar_check.llguidance.LLMatcher, "validate_grammar", counting)
    monkeypatch.setattr(grammar_check, "_validated", grammar_check.OrderedDict())
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    for _ in range(3):
        grammar_check.check_grammar(StructuredOutputs(json=schema), "response_format")
    for _ in range(2):
        with pytest.raises(grammar_check.ValidationError):
            grammar_check.check_grammar(StructuredOutputs(regex="(unclosed"), "regex")
    assert len(calls) == 2
