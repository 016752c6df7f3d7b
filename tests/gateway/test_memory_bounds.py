"""The gateway's memory stays bounded under hostile input (docs/security.md, "Memory"): a
gateway in a process of its own (:mod:`tests.helpers.rss_gateway`) is sent large bodies and
its resident set size is read from ``/proc``. Each bound is the budget the gateway enforces
plus a justified allowance, far below what the unbounded behaviour took."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.rss_gateway import MIB, rss_gateway

#: Requests here take seconds (multi-MiB bodies on a shared machine); each one's bound.
_TIMEOUT_S = 120.0


def _big_schema(properties: int) -> dict[str, Any]:
    """A JSON schema of many small objects: about 25 bytes of JSON per property, which
    decoded to Python dicts take 10-20 times that."""
    props = {f"p{i}": {"type": "string"} for i in range(properties)}
    return {"type": "object", "properties": props}


@pytest.mark.parametrize("shared", [False, True], ids=["in_memory", "sqlite"])
def test_the_responses_store_holds_what_it_counts(
    tiny_model_dir: Path, tmp_path: Path, shared: bool
) -> None:
    """20 responses with 1.3 MiB ``text.format`` schemas against a 12 MiB store: the store
    holds at most its budget of bytes, so after a warm-up (the allocator's arenas grow to
    the working size of one such request, about 60 MiB, whatever the store does) the RSS
    grows by less than the budget plus 32 MiB of allocator slack. Holding the decoded
    objects, as the store did, made it grow by about 80 MiB here (the budget counted the
    JSON length; each entry held 6-7 times that). The SQLite store shared by ``--api-server-count``
    frontends holds its entries on disk: the same bound holds for a process using it."""
    budget = 12 * MIB
    config: dict[str, Any] = {"responses_store_max_bytes": budget}
    if shared:
        config["responses_store_path"] = str(tmp_path / "responses.sqlite3")
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": _big_schema(60_000)}}
    body = {"model": "M", "input": "hi", "max_output_tokens": 1, "text": fmt}
    with rss_gateway(tiny_model_dir, **config) as gw:
        with httpx.Client(base_url=gw.base_url, timeout=_TIMEOUT_S) as http:
            for _ in range(4):  # warm up: the allocator's arenas grow to their working size
                first = http.post("/v1/responses", json=body)
                assert first.status_code == 200, first.text
            base = gw.rss()
            ids = []
            for _ in range(20):
                resp = http.post("/v1/responses", json=body)
                assert resp.status_code == 200, resp.text
                ids.append(resp.json()["id"])
            grown = gw.rss() - base
            # The newest ones are kept, readable, and their schema comes back whole.
            got = http.get(f"/v1/responses/{ids[-1]}")
            assert got.status_code == 200
            assert got.json()["text"] == fmt
        assert gw.alive()
    assert grown < budget + 32 * MIB, f"RSS grew {grown / MIB:.0f} MiB"
