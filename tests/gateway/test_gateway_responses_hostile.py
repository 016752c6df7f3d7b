"""Hostile Responses bodies: a ``text.format`` that is not an object is a 400 (not a 500),
the store is bounded in bytes as well as entries,
and ``metadata`` (echoed and kept in the store with every response) is held to OpenAI's
bounds, so stored responses cannot be used to fill the gateway's memory."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import gateway_of
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


def _schema_format(pad: int) -> dict[str, Any]:
    schema = {"type": "object", "description": "x" * pad}
    return {"format": {"type": "json_schema", "name": "n", "schema": schema}}


async def test_the_store_is_bounded_in_bytes(harness: HarnessFactory) -> None:
    """A ``text.format`` schema is echoed and stored with the response and is not bounded by
    the context: the store keeps at most ``responses_store_max_bytes`` of entries (oldest
    evicted first; one larger than the budget is not kept), however few entries that is."""
    config = GatewayHttpConfig(responses_store_max_bytes=250_000)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=config) as h:
            store = gateway_of(h.app).responses
            body = {"model": "M", "input": "hi", "max_output_tokens": 1}
            ids = []
            for _ in range(3):
                resp = await h.post("/v1/responses", {**body, "text": _schema_format(100_000)})
                assert resp.status_code == 200, resp.text
                ids.append(resp.json()["id"])
            assert store.nbytes <= 250_000
            assert (await h.http.get(f"/v1/responses/{ids[0]}")).status_code == 404  # evicted
            assert (await h.http.get(f"/v1/responses/{ids[2]}")).status_code == 200
            huge = await h.post("/v1/responses", {**body, "text": _schema_format(300_000)})
            assert huge.status_code == 200
            assert (await h.http.get(f"/v1/responses/{huge.json()['id']}")).status_code == 404
            assert (await h.http.get(f"/v1/responses/{ids[2]}")).status_code == 200
            assert (await h.http.delete(f"/v1/responses/{ids[2]}")).status_code == 200
            assert (await h.http.delete(f"/v1/responses/{ids[1]}")).status_code == 200
            assert store.nbytes == 0
