"""POST /v1/responses through the official openai SDK and raw HTTP: output items, usage, the
event stream with sequence numbers, the store (GET, DELETE, previous_response_id, LRU bound),
background responses, and the 400s for built-in tools and unknown items."""

from __future__ import annotations

import gc
from typing import Any

import openai
import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]

#: vLLM's rule: tools under tool_choice auto need a parser and --enable-auto-tool-choice.
HERMES = GatewayHttpConfig(tool_call_parser="hermes", enable_auto_tool_choice=True)


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_openai_sdk_create_and_stream(harness: HarnessFactory, tok: Tokenizer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world", "!")) as h:
            client = _client(h.base_url)
            try:
                res = await client.responses.create(
                    model="M", input="hi", instructions="Be brief.", max_output_tokens=8
                )
                assert res.id.startswith("resp_")
                assert res.status == "completed"
                assert res.output_text == "Hello world!"
                assert [item.type for item in res.output] == ["message"]
                assert res.usage is not None
                assert res.usage.output_tokens == 4
                assert res.usage.output_tokens_details.reasoning_tokens == 0
                prompt = tok.decode(
                    h.engine.requests[-1].prompt_token_ids, skip_special_tokens=False
                )
                assert "Be brief." in prompt

                async with client.responses.stream(
                    model="M", input="hi", max_output_tokens=8
                ) as stream:
                    kinds, seqs, deltas = [], [], []
                    async for event in stream:
                        kinds.append(event.type)
                        seqs.append(event.sequence_number)
                        if event.type == "response.output_text.delta":
                            deltas.append(event.delta)
                    final = await stream.get_final_response()
                assert "".join(deltas) == "Hello world!"
                assert final.output_text == "Hello world!"
                assert seqs == list(range(len(seqs)))
                assert kinds[:4] == [
                    "response.created",
                    "response.in_progress",
                    "response.output_item.added",
                    "response.content_part.added",
                ]
                assert kinds[-4:] == [
                    "response.output_text.done",
                    "response.content_part.done",
                    "response.output_item.done",
                    "response.completed",
                ]
            finally:
                await client.close()
                gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_function_call_output_round_trip_and_previous_response_id(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "It is sunny."), config=HERMES) as h:
            client = _client(h.base_url)
            try:
                first = await client.responses.create(
                    model="M", input="weather in Paris?", tools=TOOLS, max_output_tokens=8
                )
                # the client ran the tool the model asked for
                second = await client.responses.create(
                    model="M",
                    previous_response_id=first.id,
                    tools=TOOLS,
                    max_output_tokens=8,
                    input=[
                        {
                            "type": "function_call",
                            "call_id": "call_1",
                            "name": "get_weather",
                            "arguments": '{"city": "Paris"}',
                        },
                        {
                            "type": "function_call_output",
                            "call_id": "call_1",
                            "output": "SUNNY-21C",
                        },
                    ],
                )
                assert second.output_text == "It is sunny."
                prompt = tok.decode(
                    h.engine.requests[-1].prompt_token_ids, skip_special_tokens=False
                )
                assert "weather in Paris?" in prompt  # the stored turn came back
                assert "SUNNY-21C" in prompt
                assert "get_weather" in prompt
                got = await client.responses.retrieve(second.id)
                assert got.output_text == "It is sunny."
                await client.responses.delete(second.id)
                with pytest.raises(openai.NotFoundError):
                    await client.responses.retrieve(second.id)
            finally:
                await client.close()
                gc.collect()


async def test_store_false_and_lru_bound(harness: HarnessFactory) -> None:
    config = GatewayHttpConfig(responses_store_size=2)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            body = {"model": "M", "input": "hi", "max_output_tokens": 2}
            unstored = (await h.post("/v1/responses", {**body, "store": False})).json()
            assert unstored["store"] is False
            assert (await h.http.get(f"/v1/responses/{unstored['id']}")).status_code == 404
            ids = [(await h.post("/v1/responses", body)).json()["id"] for _ in range(3)]
            assert (await h.http.get(f"/v1/responses/{ids[0]}")).status_code == 404  # evicted
            assert (await h.http.get(f"/v1/responses/{ids[2]}")).status_code == 200
            chained = await h.post("/v1/responses", {**body, "previous_response_id": ids[0]})
            assert chained.status_code == 400
            assert chained.json()["error"]["param"] == "previous_response_id"


async def test_max_output_tokens_is_incomplete(harness: HarnessFactory, tok: Tokenizer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world", "!")) as h:
            out = (await h.post("/v1/responses", {"input": "hi", "max_output_tokens": 1})).json()
            assert out["status"] == "incomplete"
            assert out["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize(
    ("extra", "param", "word"),
    [
        ({"n": 3}, "n", "n is not supported"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "web_search"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", "code_interpreter"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "item_reference"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
            "input_image",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
            "text is required",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "reasoning"),
    ],
)
async def test_unsupported_is_a_400_naming_it(
    harness: HarnessFactory, extra: dict[str, Any], param: str, word: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.post("/v1/responses", {"model": "M", "input": "hi", **extra})
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert err["param"] == param
            assert word in err["message"]
            assert not h.engine.requests


async def test_tools_without_the_parser_flags_are_a_clear_400(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    body = {"model": "M", "input": "hi", "tools": TOOLS, "max_output_tokens": 8}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok")) as h:  # no parser flags
            for extra in ({}, {"tool_choice": "auto"}, {"stream": True}):
                resp = await h.post("/v1/responses", {**body, **extra})
                assert resp.status_code == 400, resp.text
                err = resp.json()["error"]
                assert err["type"] == "invalid_request_error"
                assert err["param"] == "tool_choice"
                assert "--enable-auto-tool-choice" in err["message"]
                assert "--tool-call-parser" in err["message"]
                assert '"required"' in err["message"]  # what works without them
            assert h.engine.requests == []
            resp = await h.post("/v1/responses", {**body, "tool_choice": "none"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["output"][0]["content"][0]["text"] == "ok"


def _structured(raw: Any) -> Any:
    sp = raw.sampling_params if hasattr(raw, "sampling_params") else raw["sampling_params"]
    so = getattr(sp, "structured_outputs", None)
    return so if so is not None else sp.get("structured_outputs")


@pytest.mark.parametrize("stream", [False, True])
async def test_required_and_named_constrain_the_engine_and_answer_function_calls(
    harness: HarnessFactory, tok: Tokenizer, stream: bool
) -> None:
    replies = {
        "required": '[{"name": "get_weather", "parameters": {"city": "Rome"}}]',
        "named": '{"city": "Lyon"}',
    }

    def plan(r: Any) -> list[list[int]]:
        schema = _structured(r.raw)["json"]
        return steps_of(tok, replies["required" if schema.get("type") == "array" else "named"])

    base = {"model": "M", "input": "hi", "tools": TOOLS, "max_output_tokens": 40}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            choices: list[tuple[Any, str]] = [
                ("required", '{"city": "Rome"}'),
                ({"type": "function", "name": "get_weather"}, '{"city": "Lyon"}'),
            ]
            for choice, args in choices:
                body = {**base, "tool_choice": choice, "parallel_tool_calls": False}
                if stream:
                    _, events = await h.stream("/v1/responses", body)
                    assert events[-1]["type"] == "response.completed"
                    deltas = "".join(
                        e["delta"]
                        for e in events
                        if e["type"] == "response.function_call_arguments.delta"
                    )
                    done = next(
                        e for e in events if e["type"] == "response.function_call_arguments.done"
                    )
                    assert done["arguments"] == deltas
                    out = events[-1]["response"]
                else:
                    resp = await h.post("/v1/responses", body)
                    assert resp.status_code == 200, resp.text
                    out = resp.json()
                items = [(i["type"], i["name"], i["arguments"]) for i in out["output"]]
                assert items == [("function_call", "get_weather", args)]
                assert out["output"][0]["call_id"].startswith("call_")
            required = _structured(h.engine.requests[0].raw)["json"]
            assert required["type"] == "array"
            assert required["maxItems"] == 1
            assert _structured(h.engine.requests[1].raw)["json"] == TOOLS[0]["parameters"]


async def test_include_output_text_logprobs(harness: HarnessFactory, tok: Tokenizer) -> None:
    """vLLM 0.32: ``include: ["message.output_text.logprobs"]`` asks the engine for
    ``top_logprobs`` candidates and answers them on the ``output_text`` part (token, logprob,
    bytes, top_logprobs), streamed on each ``output_text.delta`` and again on ``.done``."""
    body = {
        "model": "M",
        "input": "hi",
        "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
        "top_logprobs": 2,
    }
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world")) as h:
            whole = await h.post("/v1/responses", body)
            assert whole.status_code == 200, whole.text
            assert h.engine.requests[-1].logprobs == 2
            part = whole.json()["output"][0]["content"][0]
            n = len(tok.encode("Hello world"))
            assert len(part["logprobs"]) == n
            assert all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])
            assert "".join(e["token"] for e in part["logprobs"]) == "Hello world"
            _, events = await h.stream("/v1/responses", body)
            deltas = [e for e in events if e.get("type") == "response.output_text.delta"]
            streamed = [x for d in deltas for x in d["logprobs"]]
            assert [e["token"] for e in streamed] == [e["token"] for e in part["logprobs"]]
            done = next(e for e in events if e.get("type") == "response.output_text.done")
            assert done["logprobs"] == streamed
            plain = (await h.post("/v1/responses", {"model": "M", "input": "hi"})).json()
            assert plain["output"][0]["content"][0]["logprobs"] == []
            assert h.engine.requests[-1].logprobs is None
            bad = await h.post("/v1/responses", {**body, "include": ["everything"]})
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "include[0]"


async def _poll(h: Any, rid: str, until: set[str]) -> dict[str, Any]:
    """GET the response until its status is one of ``until`` (as a client polls)."""
    while True:
        got = (await h.http.get(f"/v1/responses/{rid}")).json()
        if got["status"] in until:
            return got  # type: ignore[no-any-return]
        await trio.sleep(0.01)


async def test_background_response_is_polled_to_completion(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    """vLLM 0.32: ``background: true`` answers ``queued`` at once; ``GET`` polls it to its
    final state, stored with its output."""
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world")) as h:
            res = await h.post("/v1/responses", {"model": "M", "input": "hi", "background": True})
            assert res.status_code == 200, res.text
            queued = res.json()
            assert queued["status"] == "queued"
            assert queued["output"] == []
            assert queued["background"] is True
            done = await _poll(h, queued["id"], {"completed", "failed"})
            assert done["status"] == "completed"
            assert done["output"][0]["content"][0]["text"] == "Hello world"
            again = await h.post(f"/v1/responses/{queued['id']}/cancel", {})
            assert again.status_code == 400
            assert again.json()["error"]["message"] == "Cannot cancel a synchronous response."
            bad = await h.post(
                "/v1/responses", {"model": "M", "input": "hi", "background": True, "store": False}
            )
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "background"
            missing = await h.post("/v1/responses/resp_nope/cancel", {})
            assert missing.status_code == 404


async def test_background_response_is_cancelled(harness: HarnessFactory, tok: Tokenizer) -> None:
    """``POST /v1/responses/{id}/cancel`` stops a running background response: the engine is
    told ABORT, the stored state is ``cancelled``, nothing stays in flight."""
    slow = [tok.encode("x")] * 1000
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: slow, step_s=0.01) as h:
            body = {"model": "M", "input": "hi", "background": True, "max_output_tokens": 1000}
            rid = (await h.post("/v1/responses", body)).json()["id"]
            while not h.engine.requests:  # noqa: ASYNC110 - the engine got the ADD
                await trio.sleep(0.01)
            res = await h.post(f"/v1/responses/{rid}/cancel", {})
            assert res.status_code == 200, res.text
            assert res.json()["status"] == "cancelled"
            await h.wait_aborted([h.engine.requests[-1].request_id])
            assert (await h.http.get(f"/v1/responses/{rid}")).json()["status"] == "cancelled"
