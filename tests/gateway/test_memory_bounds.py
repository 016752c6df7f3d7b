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
    """60 responses with 0.28 MiB ``text.format`` schemas (10 000 properties: larger ones are
    a 400 from the grammar check, as vLLM's guidance backend refuses them) against a 12 MiB
    store: the store holds at most its budget of bytes, so after a warm-up (the allocator's
    arenas grow to the working size of such a request, whatever the store does) the RSS
    grows by less than the budget plus 32 MiB of allocator slack. Holding the decoded
    objects, as the store did, made it grow by about 80 MiB here (the budget counted the
    JSON length; each entry held 6-7 times that). The SQLite store shared by ``--api-server-count``
    frontends holds its entries on disk: the same bound holds for a process using it."""
    budget = 12 * MIB
    config: dict[str, Any] = {"responses_store_max_bytes": budget}
    if shared:
        config["responses_store_path"] = str(tmp_path / "responses.sqlite3")
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": _big_schema(10_000)}}
    body = {"model": "M", "input": "hi", "max_output_tokens": 1, "text": fmt}
    with rss_gateway(tiny_model_dir, **config) as gw:
        with httpx.Client(base_url=gw.base_url, timeout=_TIMEOUT_S) as http:
            for _ in range(4):  # warm up: the allocator's arenas grow to their working size
                first = http.post("/v1/responses", json=body)
                assert first.status_code == 200, first.text
            base = gw.rss()
            ids = []
            for _ in range(60):
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


def _bodies(size: int) -> list[tuple[str, dict[str, Any]]]:
    """About ``size``-byte bodies for each route whose work grows with its input. Engine-free:
    prose and a one-character run as a prompt, as chat messages, as Messages blocks, token
    ids, and empty objects (which take about 25 times their JSON decoded). Inference: chat
    tool schemas, Responses input items and Messages blocks (rendered into the prompt, which
    cannot fit), and a structured-output schema (not in the prompt: sent to the engine)."""
    prose = ("hello world, " * (size // 13 + 1))[:size]
    user = [{"role": "user", "content": prose}]
    blocks = [{"role": "user", "content": [{"type": "text", "text": prose}]}]
    piece = prose[: 10 * 1024]
    pieces = size // len(piece)
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "description": piece}}
        for i in range(pieces)
    ]
    items = [{"role": "user", "content": piece}] * pieces
    parts = [{"type": "text", "text": piece}] * pieces
    schema = {"type": "object", "description": prose}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    hi = [{"role": "user", "content": "hi"}]
    return [
        ("/v1/tokenize", {"model": "M", "prompt": prose}),
        ("/v1/tokenize", {"model": "M", "prompt": "a" * size}),
        ("/tokenize", {"model": "M", "messages": user}),
        ("/v1/messages/count_tokens", {"model": "M", "messages": blocks}),
        ("/v1/detokenize", {"model": "M", "tokens": [1000] * (size // 5)}),
        ("/v1/tokenize", {"model": "M", "messages": [{}] * (size // 3)}),
        (
            "/v1/chat/completions",
            {"model": "M", "messages": hi, "tools": tools, "tool_choice": "none"},
        ),
        ("/v1/responses", {"model": "M", "input": items}),
        (
            "/v1/messages",
            {"model": "M", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]},
        ),
        (
            "/v1/chat/completions",
            {"model": "M", "messages": hi, "max_tokens": 2, "response_format": fmt},
        ),
    ]


def _is_envelope(path: str, body: Any) -> bool:
    if path.startswith("/v1/messages"):
        return bool(body["type"] == "error" and body["error"]["type"] and body["error"]["message"])
    return bool(body["error"]["type"] and body["error"]["message"])


async def _post_all(base_url: str, path: str, body: dict[str, Any], n: int) -> list[Any]:
    import trio

    results: list[Any] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=_TIMEOUT_S) as http:

        async def one() -> None:
            resp = await http.post(path, json=body)
            results.append((resp.status_code, resp.json()))

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
    return results


_ROUTES = [
    "tokenize_prose",
    "tokenize_run",
    "tokenize_messages",
    "count_tokens",
    "detokenize",
    "empty_objects",
    "chat_tools",
    "responses_items",
    "messages_blocks",
    "chat_schema",
]
#: The one case whose input is not rendered into the prompt: it fits and is served.
_SERVED = {"chat_schema"}


# a 429 may come before the whole body is sent (its reservation grows as it arrives): httpx
# then drops its unfinished upload generator, which trio reports as an unraisable warning
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("route", range(len(_ROUTES)), ids=_ROUTES)
def test_routes_bound_the_memory_of_large_bodies(tiny_model_dir: Path, route: int) -> None:
    """Six concurrent 6 MiB bodies on a route (each in a gateway of its own: the allocator
    keeps freed memory resident, which would blur one route into the next): every one is
    answered with a 4xx in its API's envelope (400
    ``context_length_exceeded``; 413 for a body whose decoded form alone would take more than
    the budget of bodies in flight; 429 when that budget is full), the
    gateway lives, and its peak RSS grows by less than that budget (128 MiB here: bodies and
    the estimate of their decoded form) plus 96 MiB: prompts are refused from a bounded
    prefix (8 x 4096 characters) or from their length, before a full encode, and the server
    copies a body once as it reads it. Before, each body was encoded whole: about 120 bytes
    of memory per body byte, 4 GiB for these."""
    import trio

    budget = 128 * MIB
    path, body = _bodies(6 * MIB)[route]
    with rss_gateway(tiny_model_dir, max_body_bytes_in_flight=budget) as gw:
        with httpx.Client(base_url=gw.base_url, timeout=_TIMEOUT_S) as http:
            ok = http.post("/v1/tokenize", json={"model": "M", "prompt": "hello"})
            assert ok.status_code == 200, ok.text
        base = gw.rss()
        gw.reset_peak()
        results = trio.run(_post_all, gw.base_url, path, body, 6)
        assert gw.alive()
        grown = gw.peak() - base
        assert grown < budget + 96 * MIB, f"{path}: peak RSS grew {grown / MIB:.0f} MiB"
        served = _ROUTES[route] in _SERVED
        for status, payload in results:
            if served and status == 200:
                continue
            assert status in (400, 413, 429), (path, status, payload)
            assert _is_envelope(path, payload), (path, payload)
        assert any(status in ((200,) if served else (400, 413)) for status, _ in results)
        with httpx.Client(base_url=gw.base_url, timeout=_TIMEOUT_S) as http:
            ok = http.post("/v1/tokenize", json={"model": "M", "prompt": "hello"})
            assert ok.status_code == 200, ok.text
