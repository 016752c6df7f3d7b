"""Gateway test harness: tiny model + mock engine over real ZMQ + the app over real HTTP."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import h11
import httpx
import pytest
import trio
from quart_trio import QuartTrio

from smg_trio.backend import ServedModel, StaticBackend
from smg_trio.connector.client import EngineClient, open_engine_client
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.mock.engine import MockEngine, MockEngineConfig, Plan
from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import EngineProtocol
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.tokenizer import Tokenizer, resolve_eos
from tests.helpers.ipc import free_handshake_address

#: Deadline for one ordinary gateway test (seconds); each test wraps itself in fail_after.
DEADLINE_S = 10.0


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gw-tiny") / "model")


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


def parse_sse(raw: str) -> list[Any]:
    """Split an SSE body into events: parsed JSON objects, or the string ``"[DONE]"``.
    Asserts the framing (``data: ...`` blocks separated by blank lines)."""
    assert raw.endswith("\n\n"), raw[-200:]
    events: list[Any] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


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
        return resp, parse_sse(resp.text)

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
    reasoning_parser: str | None = None,
    step_s: float = 0.001,
    max_model_len: int = 4096,
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
            app = create_app(backend, config)
            binds = await nursery.start(partial(serve_http, app, "127.0.0.1", 0))
            async with httpx.AsyncClient(base_url=binds[0], timeout=30.0, verify=False) as http:
                yield Harness(binds[0], http, engine, client, served, backend, app, tok)
            nursery.cancel_scope.cancel()


@pytest.fixture
def harness(tok: Tokenizer, tiny_model_dir: Path) -> HarnessFactory:
    """``async with harness(plan=..., protocol=..., config=...) as h:``"""
    return partial(open_harness, tok, tiny_model_dir)


class RawSSE:
    """A bare HTTP/1.1 client on one trio socket (h11), for tests that must drop the
    connection mid-stream: :meth:`aclose` is a real TCP close, with no client library
    generators left behind."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._conn = h11.Connection(h11.CLIENT)
        self._buf = ""
        self.status: int | None = None
        self.ended = False

    @classmethod
    async def post(
        cls,
        base_url: str,
        path: str,
        body: Any,
        headers: dict[str, str] | None = None,
        *,
        rcvbuf: int | None = None,
    ) -> RawSSE:
        """``rcvbuf`` sets the client socket's ``SO_RCVBUF`` before it connects (a small one
        makes the server's writes block once the client stops reading)."""
        url = httpx.URL(base_url)
        assert url.host is not None
        assert url.port is not None
        if rcvbuf is None:
            stream = await trio.open_tcp_stream(url.host, url.port)
        else:
            sock = trio.socket.socket()
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, rcvbuf)
            await sock.connect((url.host, url.port))
            stream = trio.SocketStream(sock)
        self = cls(stream)
        payload = json.dumps(body).encode()
        hdrs = [
            ("host", f"{url.host}:{url.port}"),
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
            *(headers or {}).items(),
        ]
        c = self._conn
        out = c.send(h11.Request(method="POST", target=path, headers=hdrs))
        out += c.send(h11.Data(data=payload)) + c.send(h11.EndOfMessage())
        await self._stream.send_all(out)
        return self

    async def events(self) -> list[Any]:
        """Wait for at least one complete SSE event (or the end); return those complete."""
        while True:
            if "\n\n" in self._buf or self.ended:
                head, sep, self._buf = self._buf.rpartition("\n\n")
                return parse_sse(head + sep) if sep else []
            ev = self._conn.next_event()
            if ev is h11.NEED_DATA:
                self._conn.receive_data(await self._stream.receive_some(65536))
            elif isinstance(ev, h11.Response):
                self.status = ev.status_code
            elif isinstance(ev, h11.Data):
                self._buf += bytes(ev.data).decode()
            elif isinstance(ev, h11.EndOfMessage):
                self.ended = True

    async def until(self, pred: Callable[[list[Any]], bool]) -> list[Any]:
        """Read events until ``pred(all events so far)`` holds; returns them all."""
        seen: list[Any] = []
        while not pred(seen):
            if self.ended:
                raise AssertionError(f"stream ended early: {seen}")
            seen += await self.events()
        return seen

    async def rest(self) -> list[Any]:
        """Every remaining event, to the end of the response."""
        seen: list[Any] = []
        while not self.ended:
            seen += await self.events()
        return seen

    async def aclose(self) -> None:
        await self._stream.aclose()


def content_indices(events: list[Any]) -> set[int]:
    """Choice indices that received content so far."""
    return {
        c["index"]
        for ev in events
        if isinstance(ev, dict)
        for c in ev.get("choices", [])
        if c.get("delta", {}).get("content") or c.get("text")
    }
