"""Stored objects get ids the server makes (issue 28 item 4): a Responses id was ``resp_``
plus the client's ``x-request-id``, so a second client sending the same header replaced the
first one's stored conversation, and the first client's next ``previous_response_id``
continued the second one's. The client's request id stays in the engine ids and the
``x-request-id`` response header."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of

SERVER_ID = re.compile(r"resp_[0-9a-f]{50}")


def _text(doc: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in doc["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


@pytest.mark.parametrize("rid", ["shared-id", "resp_shared"])
@pytest.mark.parametrize("stream", [False, True])
async def test_two_clients_with_one_request_id_get_two_stored_responses(
    harness: HarnessFactory, tok: Tokenizer, rid: str, stream: bool
) -> None:
    answers = iter(["Alice's secret", "Mallory's text", "Alice again"])

    def plan(request: Any) -> Any:
        return steps_of(tok, next(answers))

    headers = {"x-request-id": rid}
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=plan) as h:
            first = await h.http.post(
                "/v1/responses",
                json={"model": "M", "input": "my secret is 42", "max_output_tokens": 32},
                headers=headers,
            )
            second = await h.http.post(
                "/v1/responses",
                json={"model": "M", "input": "mallory here", "max_output_tokens": 32},
                headers=headers,
            )
            assert first.status_code == second.status_code == 200
            a, b = first.json()["id"], second.json()["id"]
            assert a != b
            assert SERVER_ID.fullmatch(a), a
            assert SERVER_ID.fullmatch(b), b
            assert first.headers["x-request-id"] == rid  # the client's id, for its logs
            # the engine ids still carry the client's request id (correlation)
            assert all(rid in r.request_id for r in h.engine.requests)

            # each stored response is its own; the first client continues its own
            got_a = (await h.http.get(f"/v1/responses/{a}")).json()
            got_b = (await h.http.get(f"/v1/responses/{b}")).json()
            assert _text(got_a) == "Alice's secret"
            assert _text(got_b) == "Mallory's text"
            nxt = await h.http.post(
                "/v1/responses",
                json={
                    "model": "M",
                    "input": "and?",
                    "previous_response_id": a,
                    "max_output_tokens": 32,
                    "stream": stream,
                },
                headers=headers,
            )
            assert nxt.status_code == 200
            prompt = tok.decode(h.engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
            assert "my secret is 42" in prompt
            assert "mallory here" not in prompt
            # the client-chosen id names nothing stored
            for guess in {f"resp_{rid}", rid}:
                assert (await h.http.get(f"/v1/responses/{guess}")).status_code == 404
