"""Real-peer lane: the gateway in front of a real headless vLLM 0.32 EngineCore on CPU.

One test (the engine takes 60-100 s to register) runs the chat, stream, n=2, logprobs, echo
and rejection cases. Skipped with the reason when the peers are not installed
(``scripts/setup_peers.sh``). Select it with ``-m e2e``; the fast lane runs ``-m "not e2e"``.
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from peers.tools import (
    start_process_group,
    stop_process_group,
    vllm_engine_command,
    vllm_engine_env,
    vllm_missing_reason,
)
from smg_trio.backend import ServedModel, StaticBackend
from smg_trio.connector.client import open_engine_client
from smg_trio.gateway.config import DEFAULT_MAX_N
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.tokenizer import Tokenizer, resolve_eos
from tests.gateway.test_gateway_chat import assert_stream_shape
from tests.helpers.gateway import content_indices
from tests.helpers.ipc import free_handshake_address
from tests.helpers.raw_sse import RawSSE
from tests.helpers.sse import sse_events

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HI = [{"role": "user", "content": "Hello, how are you?"}]
#: Engine registration (60-100 s on 2 cores, torch.compile cached) plus the cases.
E2E_DEADLINE_S = 400.0


async def _cases(http: httpx.AsyncClient, tok: Tokenizer, base_url: str, client: Any) -> None:
    prompt_len = len(tok.encode(tok.apply_chat_template(HI, add_generation_prompt=True)))
    # chat, greedy: the streamed text equals the non-streamed text
    body = {"model": "M", "messages": HI, "max_tokens": 12, "temperature": 0}
    res = await http.post("/v1/chat/completions", json=body)
    assert res.status_code == 200, res.text
    full = res.json()
    usage = full["usage"]
    assert usage["prompt_tokens"] == prompt_len
    assert 1 <= usage["completion_tokens"] <= 12
    assert full["choices"][0]["finish_reason"] in ("stop", "length")
    res = await http.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = sse_events(res.text)
    texts = assert_stream_shape(events, 1, usage=True)
    assert texts[0] == full["choices"][0]["message"]["content"]
    assert events[-2]["usage"] == usage

    # n=2, seeded: two choices in index order, the same on a repeat
    body = {"model": "M", "messages": HI, "max_tokens": 8, "n": 2, "seed": 7, "temperature": 1.0}
    first = (await http.post("/v1/chat/completions", json=body)).json()
    again = (await http.post("/v1/chat/completions", json=body)).json()
    assert [c["index"] for c in first["choices"]] == [0, 1]
    assert [c["message"] for c in first["choices"]] == [c["message"] for c in again["choices"]]
    res = await http.post("/v1/chat/completions", json={**body, "stream": True})
    assert_stream_shape(sse_events(res.text), 2)

    # logprobs: chat top-k, completions legacy shape, echo with real prompt logprobs
    res = await http.post(
        "/v1/chat/completions",
        json={"model": "M", "messages": HI, "max_tokens": 5, "logprobs": True, "top_logprobs": 2},
    )
    choice = res.json()["choices"][0]
    entries = choice["logprobs"]["content"]
    assert len(entries) == res.json()["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    res = await http.post(
        "/v1/completions",
        json={
            "model": "M",
            "prompt": "The quick brown fox",
            "max_tokens": 4,
            "logprobs": 2,
            "echo": True,
        },
    )
    lp = res.json()["choices"][0]["logprobs"]
    n_prompt = len(tok.encode("The quick brown fox", add_special_tokens=True))
    assert len(lp["tokens"]) == n_prompt + res.json()["usage"]["completion_tokens"]
    assert lp["token_logprobs"][0] is None
    assert all(x is not None and x <= 0 for x in lp["token_logprobs"][1:])
    assert res.json()["choices"][0]["text"].startswith("The quick brown fox")

    # rejections never reach the engine (400s), and a disconnect frees the engine requests
    for bad in ({"max_tokens": 0}, {"top_logprobs": 3}, {"n": DEFAULT_MAX_N + 1}, {"seed": 2**63}):
        res = await http.post("/v1/chat/completions", json={"model": "M", "messages": HI, **bad})
        assert res.status_code == 400, (bad, res.text)
    assert (
        await http.post("/v1/chat/completions", json={"model": "x", "messages": HI})
    ).status_code == 404
    sse = await RawSSE.post(
        base_url,
        "/v1/chat/completions",
        {
            "model": "M",
            "messages": HI,
            "n": 2,
            "max_tokens": 500,
            "ignore_eos": True,
            "stream": True,
        },
    )
    await sse.until(lambda evs: content_indices(evs) == {0, 1})
    await sse.aclose()
    with trio.fail_after(1.0):  # each GET is a checkpoint; the stream's exit ends the call
        while "smg_router_requests_in_flight 0.0" not in (await http.get("/metrics")).text:
            pass
    assert client.inflight_count == 0
    assert (
        await http.post(
            "/v1/chat/completions", json={"model": "M", "messages": HI, "max_tokens": 2}
        )
    ).status_code == 200


# a marker, not pytest.skip() inside the trio test: that loses its reason in the summary
@pytest.mark.skipif(vllm_missing_reason() is not None, reason=f"{vllm_missing_reason()}")
async def test_gateway_against_real_vllm(tmp_path: Path) -> None:
    from smg_trio.mock.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model")
    tok = Tokenizer.from_dir(model_dir)
    eos, extra = resolve_eos(model_dir, tok)
    handshake = free_handshake_address()
    port = int(handshake.rsplit(":", 1)[1])
    addresses = worker_addresses(f"ipc://{tempfile.mkdtemp(prefix='smg-')}/w0", handshake)
    proc = start_process_group(
        vllm_engine_command(model_dir, port), env=vllm_engine_env(), log_path=tmp_path / "vllm.log"
    )
    try:
        with trio.fail_after(E2E_DEADLINE_S):
            async with (
                trio.open_nursery() as nursery,
                open_engine_client(VllmProtocol(), addresses) as client,
            ):
                served = ServedModel("M", tok, VllmProtocol(), client.max_model_len, eos, extra)
                app = create_app(StaticBackend([(served, [client])]))
                binds = await nursery.start(partial(serve_http, app, "127.0.0.1", 0))
                async with httpx.AsyncClient(base_url=binds[0], timeout=120, verify=False) as http:
                    await _cases(http, tok, binds[0], client)
                nursery.cancel_scope.cancel()
    finally:
        stop_process_group(proc)
