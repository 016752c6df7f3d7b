"""The inference routes served ahead of Quart (``smg_trio.gateway.http.fastroute``): request body
limits and timeouts, a client that leaves mid-body, the Quart views as the fallback, and a
stream body that is never started."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import gateway_of
from smg_trio.gateway.http.fastroute import InferenceRoutes
from tests.gateway.test_gateway_early_reject import _Reader, _request_head
from tests.gateway.test_gateway_rejections import assert_envelope
from tests.helpers.gateway import DEADLINE_S, HarnessFactory

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
BODY = json.dumps(
    {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
).encode()


async def _open(base_url: str) -> trio.SocketStream:
    host, _, port = base_url.removeprefix("http://").rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


async def test_chunked_body_over_the_limit_is_a_413(harness: HarnessFactory) -> None:
    """No Content-Length to check up front: the limit applies while the body streams in."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "M", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 100
        yield b'"}]}'

    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(max_body_bytes=300)) as h:
            resp = await h.http.post(CHAT, content=chunks(), headers=JSON)
            assert "content-length" not in resp.request.headers
            assert assert_envelope(resp, 413)["code"] == "request_too_large"
            assert h.engine.requests == []
            # The unread body means the server closes that connection; a new one is served.
            async with httpx.AsyncClient(base_url=h.base_url) as fresh:
                resp = await fresh.post(CHAT, content=BODY, headers=JSON)
                assert resp.status_code == 200


async def test_slow_body_is_a_408(harness: HarnessFactory) -> None:
    """A body that stops arriving is answered 408 after ``body_timeout_s``, and nothing
    reaches the engine."""
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(body_timeout_s=0.2)) as h:
            stream = await _open(h.base_url)
            head = _request_head(CHAT, "x", len(BODY), [("content-type", "application/json")])
            await stream.send_all(head + BODY[:10])  # and never the rest
            assert await _Reader(stream).status() == 408
            await stream.aclose()
            assert h.engine.requests == []


async def test_client_leaving_mid_body_costs_nothing(harness: HarnessFactory) -> None:
    """The client sends half a body and closes: no engine request, no request left in
    flight, and the next request is served."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            registry = gateway_of(h.app).metrics.registry
            stream = await _open(h.base_url)
            head = _request_head(CHAT, "x", len(BODY), [("content-type", "application/json")])
            await stream.send_all(head + BODY[:10])
            await stream.aclose()
            resp = await h.chat(max_tokens=2)
            assert resp.status_code == 200
            await trio.testing.wait_all_tasks_blocked()  # the abandoned request's cancel ran
            assert registry.get_sample_value("smg_router_requests_in_flight") == 0
            assert len(h.engine.requests) == 1  # only the second request


async def test_other_methods_and_paths_go_to_quart(harness: HarnessFactory) -> None:
    """Only POST on the two inference paths is taken; everything else is Quart's."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            assert_envelope(await h.http.get(CHAT), 405)
            assert_envelope(await h.http.post("/v1/chat/completions/x", json={}), 404)
            assert (await h.http.get("/v1/models")).status_code == 200


async def test_under_a_root_path_the_quart_views_serve(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request the middleware does not take (here: the app mounted under ``/x``, so the
    path is ``/x/v1/...``) is served by the Quart views with the same handlers and result."""
    taken: list[str] = []
    real_serve = InferenceRoutes._serve

    async def spy(self: InferenceRoutes, handler, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        taken.append(scope["path"])
        await real_serve(self, handler, scope, receive, send)

    monkeypatch.setattr(InferenceRoutes, "_serve", spy)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            fast = await h.chat(max_tokens=2)
            assert taken == [CHAT]
            real_call = InferenceRoutes.__call__

            async def rooted(self: InferenceRoutes, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
                rooted_scope = {**scope, "root_path": "/x", "path": "/x" + scope["path"]}
                await real_call(self, rooted_scope, receive, send)

            monkeypatch.setattr(InferenceRoutes, "__call__", rooted)
            slow = await h.chat(max_tokens=2)
            assert taken == [CHAT]  # not taken this time
            assert slow.status_code == fast.status_code == 200
            assert set(slow.json()) == set(fast.json())
