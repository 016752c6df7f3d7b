"""vLLM 0.33 request errors (issue 15, item 7): ``validation_error`` is a 400 with the engine's
message, a retryable error is retried once on another ready worker when nothing was produced
yet and is otherwise a 503 with ``Retry-After``, anything else a 500 ``engine_error``."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from smg_trio.backend import ServedModel, StaticBackend
from smg_trio.connector.client import open_engine_client
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.mock.engine import MockEngine, MockEngineConfig, MockRequest
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.protocol.vllm import RequestError, VllmProtocol
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of
from tests.helpers.ipc import free_handshake_address
from tests.helpers.sse import sse_events

PAUSED = RequestError("engine_paused", "Generation is paused. Please retry after it resumes.", True)
CHAT = {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

ErrorFinish = Callable[[MockRequest], "bool | RequestError"]


async def test_validation_error_is_a_400_with_the_engines_message(
    harness: HarnessFactory, tok: Any
) -> None:
    bad = RequestError("validation_error", "prompt token 7 is out of vocabulary")
    with trio.fail_after(DEADLINE_S):
        async with harness(error_finish=lambda r: bad) as h:
            r = await h.chat(max_tokens=2)
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["message"] == "prompt token 7 is out of vocabulary"
            assert (err["type"], err["code"]) == ("invalid_request_error", "validation_error")
            r, events = await h.stream("/v1/chat/completions", CHAT)
            assert events[-2]["error"]["message"] == bad.message
            assert events[-1] == "[DONE]"
            assert h.client.inflight_count == 0


async def test_other_engine_errors_are_500_with_the_message(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(error_finish=lambda r: RequestError("kv_oom", "out of KV blocks")) as h:
            r = await h.chat(max_tokens=2)
            assert r.status_code == 500
            assert r.json()["error"]["message"] == "out of KV blocks"
            assert r.json()["error"]["code"] == "engine_error"


async def test_retryable_error_with_no_other_worker_is_a_503_with_retry_after(
    harness: HarnessFactory,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(error_finish=lambda r: PAUSED) as h:
            r = await h.chat(max_tokens=2)
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["message"] == PAUSED.message
            assert r.json()["error"]["code"] == "engine_paused"
            assert len(h.engine.requests) == 1  # the same worker is not asked twice


@asynccontextmanager
async def two_workers(
    tok: Tokenizer, first: ErrorFinish, second: ErrorFinish
) -> AsyncIterator[tuple[httpx.AsyncClient, list[MockEngine]]]:
    """Two mock vLLM engines behind one model (a round-robin static backend)."""
    proto = VllmProtocol()
    engines: list[MockEngine] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        clients = []
        for i, error_finish in enumerate((first, second)):
            addresses = worker_addresses(
                f"ipc://{tempfile.mkdtemp(prefix='smg-')}/w{i}", free_handshake_address()
            )
            cfg = MockEngineConfig(
                step_s=0.001,
                vocab_size=tok.vocab_size,
                plan=lambda r: steps_of(tok, "o", "k"),
                error_finish=error_finish,
            )
            engine = MockEngine(addresses.handshake, cfg)
            engines.append(engine)
            nursery.start_soon(engine.run)
            clients.append(await stack.enter_async_context(open_engine_client(proto, addresses)))
        served = ServedModel("M", tok, proto, clients[0].max_model_len)
        app = create_app(StaticBackend([(served, clients)]), None)
        binds = await nursery.start(partial(serve_http, app, "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=binds[0], timeout=30.0) as http:
            yield http, engines
        nursery.cancel_scope.cancel()


async def test_retryable_error_is_retried_once_on_another_worker(
    tok: Tokenizer, tiny_model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with two_workers(tok, lambda r: PAUSED, lambda r: False) as (http, engines):
            for n in (1, 2):
                for _ in range(2):  # whichever worker the round robin picks first
                    r = await http.post("/v1/chat/completions", json={**CHAT, "n": n})
                    assert r.status_code == 200, r.text
                    assert [c["message"]["content"] for c in r.json()["choices"]] == ["ok"] * n
            paused, healthy = engines
            assert len(healthy.requests) == 2 + 4
            assert paused.requests  # it was tried, and refused
            assert not paused.active
            assert not healthy.active


async def test_a_second_retryable_error_is_not_retried_again(
    tok: Tokenizer, tiny_model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with two_workers(tok, lambda r: PAUSED, lambda r: PAUSED) as (http, engines):
            r = await http.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert [len(e.requests) for e in engines] == [1, 1]


async def test_streamed_retryable_error_is_an_sse_error_event(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(error_finish=lambda r: PAUSED) as h:
            r = await h.http.post("/v1/chat/completions", json={**CHAT, "stream": True})
            events = sse_events(r.text)
            assert events[-2]["error"]["code"] == "engine_paused"
            assert events[-1] == "[DONE]"
