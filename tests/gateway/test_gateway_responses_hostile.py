"""Hostile Responses bodies: a ``text.format`` that is not an object is a 400 (not a 500),
and ``metadata`` (echoed and kept in the store with every response) is held to OpenAI's
bounds, so stored responses cannot be used to fill the gateway's memory."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.helpers.gateway import DEADLINE_S, HarnessFactory


@pytest.mark.parametrize("fmt", ["json", 5, ["json_object"], True])
async def test_text_format_not_an_object_is_a_400(harness: HarnessFactory, fmt: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            body = {"model": "M", "input": "hi", "text": {"format": fmt}}
            resp = await h.post("/v1/responses", body)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == "text.format"
            assert not h.engine.requests


@pytest.mark.parametrize(
    "metadata",
    [
        {"k": "x" * 513},  # a value over 512 characters
        {"k" * 65: "v"},  # a key over 64 characters
        {f"k{i}": "v" for i in range(17)},  # more than 16 pairs
        {"k": {"nested": ["x"]}},  # not a string
    ],
)
async def test_metadata_over_openais_bounds_is_a_400_and_not_stored(
    harness: HarnessFactory, metadata: dict[str, Any]
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            body = {"model": "M", "input": "hi", "max_output_tokens": 1, "metadata": metadata}
            resp = await h.post("/v1/responses", body)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == "metadata"
            assert not h.engine.requests


async def test_metadata_within_the_bounds_is_echoed(harness: HarnessFactory) -> None:
    metadata = {f"k{i}": "v" * 512 for i in range(16)}
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            body = {"model": "M", "input": "hi", "max_output_tokens": 1, "metadata": metadata}
            resp = await h.post("/v1/responses", body)
            assert resp.status_code == 200, resp.text
            stored = await h.http.get(f"/v1/responses/{resp.json()['id']}")
            assert stored.json()["metadata"] == metadata
