"""Hostile Responses bodies: a ``text.format`` that is not an object is a 400 (not a 500)."""

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
