"""The gateway test harness: the tiny model's tokenizer, a mock engine over real ZMQ, and the
app over real HTTP (:func:`open_harness`), plus small helpers of the gateway tests."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from quart_trio import QuartTrio

from smg_trio.backend import ServedModel, StaticBackend
from smg_trio.connector.client import EngineClient, open_engine_client
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.gateway.http.tenants import TenantGate
from smg_trio.gateway.http.tracing import Tracing
from smg_trio.mock.engine import MockEngine, MockEngineConfig, Plan
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import EngineProtocol
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.tokenizer import Tokenizer, resolve_eos
from tests.helpers.ipc import free_handshake_address
from tests.helpers.sse import sse_events

__all__ = [
    "DEADLINE_S",
    "Harness",
    "HarnessFactory",
    "content_indices",
    "open_harness",
    "steps_of",
]

#: Deadline for one ordinary gateway test (seconds); each test wraps itself in fail_after.
DEADLINE_S = 10.0


@attrs.define
class Harness:
    """One gateway under test: ``http`` talks to it, ``engine`` is the mock behind it."""

    base_url: str
    http: httpx.AsyncClient
    engine: MockEngine
    client: EngineClient
    served: ServedModel
    backend: StaticBackend
    app: QuartTrio
    tok: Tokenizer

    async def post(self, path: str, body: Any, **kw: Any) -> httpx.Response:
        return await self.http.post(path, json=body, **kw)

    async def chat(self, **body: Any) -> httpx.Response:
        body.setdefault("model", "M")
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        return await self.post("/v1/chat/completions", body)

    async def complete(self, **body: Any) -> httpx.Response:
        body.setdefault("model", "M")
        body.setdefault("prompt", "hello")
        return await self.post("/v1/completions", body)

    async def stream(self, path: str, body: Any, **kw: Any) -> tuple[httpx.Response, list[Any]]:
        """POST with ``stream: true``; returns the response and its parsed events."""
        resp = await self.http.post(path, json={**body, "stream": True}, **kw)
        if resp.status_code != 200:
            return resp, []
        assert resp.headers["content-type"].startswith("text/event-stream")
        return resp, sse_events(resp.text)

    async def wait_aborted(self, ids: Sequence[str]) -> None:
        """Wait (under the caller's deadline) until the engine saw ABORT for every id."""
        while not set(ids) <= set(self.engine.aborts):
            await self.engine.abort_event.wait()

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text)


def steps_of(tok: Tokenizer, *texts: str) -> list[list[int]]:
    """One engine step per text, holding that text's token ids."""
    return [tok.encode(t) for t in texts]


HarnessFactory = Callable[..., AbstractAsyncContextManager[Harness]]


@asynccontextmanager
async def open_harness(
    tok: Tokenizer,
    model_dir: Path,
    *,
    plan: Plan | None = None,
    protocol: str = "vllm",
    config: GatewayHttpConfig | None = None,
    fast_http1: bool = True,
    reasoning_parser: str | None = None,
    step_s: float = 0.001,
    max_model_len: int = 4096,
    tracing: Tracing | None = None,
    tenants: TenantGate | None = None,
    **mock_kw: Any,
) -> AsyncIterator[Harness]:
    eos, extra = resolve_eos(model_dir, tok)
    addresses = worker_addresses(
        f"ipc://{tempfile.mkdtemp(prefix='smg-')}/w0", free_handshake_address()
    )
    proto: EngineProtocol = VllmProtocol() if protocol == "vllm" else TokenSpeedProtocol()
    cfg = MockEngineConfig(
        protocol="vllm" if protocol == "vllm" else "tokenspeed",
        step_s=step_s,
        plan=plan,
        vocab_size=tok.vocab_size,
        max_model_len=max_model_len,
        eos_token_id=eos,
        **mock_kw,
    )
    engine = MockEngine(addresses.handshake, cfg)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run)
        async with open_engine_client(proto, addresses) as client:
            served = ServedModel(
                model_id="M",
                tokenizer=tok,
                protocol=proto,
                max_model_len=client.max_model_len,
                eos_token_id=eos,
                extra_eos_token_ids=extra,
                reasoning_parser=reasoning_parser,
            )
            backend = StaticBackend([(served, [client])])
            config = attrs.evolve(config or GatewayHttpConfig(), fast_http1=fast_http1)
            app = create_app(backend, config, tracing=tracing, tenants=tenants)
            binds = await nursery.start(partial(serve_http, app, "127.0.0.1", 0))
            async with httpx.AsyncClient(base_url=binds[0], timeout=30.0, verify=False) as http:
                yield Harness(binds[0], http, engine, client, served, backend, app, tok)
            nursery.cancel_scope.cancel()


def content_indices(events: list[Any]) -> set[int]:
    """Choice indices that received content so far."""
    return {
        c["index"]
        for ev in events
        if isinstance(ev, dict)
        for c in ev.get("choices", [])
        if c.get("delta", {}).get("content") or c.get("text")
    }


def hostport(base_url: str) -> tuple[str, int]:
    """The host and port of a harness's ``base_url``, for raw connections."""
    url = httpx.URL(base_url)
    assert url.host is not None
    assert url.port is not None
    return url.host, url.port


def steps_per_message(engine: Any, monkeypatch: pytest.MonkeyPatch, k: int | None) -> None:
    """Have the mock engine send ``k`` steps' outputs in each message (``None``: every step
    of a request up to its finish in one message), as a gateway that fell behind finds them
    waiting on its socket."""
    if k == 1:
        return
    send = engine._send_vllm
    held: list[Any] = []
    steps = [0]

    async def send_vllm(results: Any) -> None:
        if not results:
            await send(results)
            return
        held.extend(results)
        steps[0] += 1
        if steps[0] == k or any(reason is not None for _, _, reason, _ in results):
            out = list(held)
            held.clear()
            steps[0] = 0
            await send(out)

    monkeypatch.setattr(engine, "_send_vllm", send_vllm)
