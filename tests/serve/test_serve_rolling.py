"""A gateway started empty, then rolling updates under load (issue 15 items 3 and 4): `serve`
with no startup workers, workers added and removed over ``/workers`` while a trio task group
sends a bounded stream of chat requests to mock engines over real ZMQ and HTTP."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import GatewayConfig, ServeHandle, serve
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ipc import IpcNamespace, free_handshake_address, wait_tcp_listener_gone

pytestmark = pytest.mark.slow

DEADLINE_S = 60.0
KEY = "admin-key"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
#: The load: this many requests, one every PACE_S seconds (20 req/s).
REQUESTS = 100
PACE_S = 0.05


@asynccontextmanager
async def empty_gateway(
    ns: IpcNamespace, **kw: Any
) -> AsyncIterator[tuple[ServeHandle, httpx.AsyncClient, trio.Nursery]]:
    """``serve`` with no startup worker (the ``launch`` of issue 15 item 3)."""
    config = GatewayConfig(
        port=0,
        admin_api_key=KEY,
        allowed_socket_dirs=(ns.directory,),
        allowed_model_dirs=(str(default_tiny_model_dir()),),
        **kw,
    )
    async with trio.open_nursery() as nursery:
        handle: ServeHandle = await nursery.start(serve, with_api_server_count(config))
        assert handle.workers == ()
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=handle.base_url, headers=headers, timeout=30) as http:
            yield handle, http, nursery
        nursery.cancel_scope.cancel()


def worker_body(ns: IpcNamespace, name: str) -> dict[str, Any]:
    return {
        "url": ns.worker_url(name),
        "model_path": str(default_tiny_model_dir()),
        "model_id": "m",
        "runtime_type": "vllm",
        "zmq_handshake_address": free_handshake_address(),
    }


async def add(http: httpx.AsyncClient, body: dict[str, Any]) -> str:
    resp = await http.post("/workers", json=body)
    assert resp.status_code == 202, resp.text
    worker_id: str = resp.json()["worker_id"]
    return worker_id


def start_engine(nursery: trio.Nursery, body: dict[str, Any]) -> MockEngine:
    engine = MockEngine(body["zmq_handshake_address"], MockEngineConfig(step_s=0.001))
    nursery.start_soon(engine.run)
    return engine


async def wait_ready(handle: ServeHandle, worker_id: str) -> None:
    worker = handle.manager.get_worker(worker_id)
    assert worker is not None
    while not worker.healthy:
        await trio.lowlevel.checkpoint()


class Load:
    """REQUESTS chat requests, one every PACE_S (streaming every third); ``sent(n)`` returns
    once n were sent, so the test acts at points of the load, not at times."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.results: list[tuple[int, str, dict[str, str]]] = []
        self.count = 0
        self._sent = trio.Event()

    async def sent(self, n: int) -> None:
        while self.count < n:
            await self._sent.wait()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for i in range(REQUESTS):
                nursery.start_soon(self._one, i)
                self.count += 1
                sent, self._sent = self._sent, trio.Event()
                sent.set()
                await trio.sleep(PACE_S)

    async def _one(self, i: int) -> None:
        stream = i % 3 == 0
        resp = await self.http.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        text = resp.text
        if resp.status_code == 200 and stream:
            assert text.endswith("data: [DONE]\n\n"), text
            assert '"error"' not in text, text
        self.results.append((resp.status_code, text, dict(resp.headers)))

    def statuses(self) -> list[int]:
        return [s for s, _, _ in self.results]


async def test_empty_gateway_answers_and_takes_a_worker_later(ns: IpcNamespace) -> None:
    """/health answers, /readiness is 503 "no workers", /v1/models is empty, an unknown model
    is a 404; while a registration is stuck in its handshake, the registry API, the probes and
    /v1/models answer and a request for the model waits; the engine dialling serves it."""
    with trio.fail_after(DEADLINE_S):
        async with empty_gateway(ns, worker_wait_timeout_s=DEADLINE_S) as (handle, http, nursery):
            assert (await http.get("/health")).status_code == 200
            ready = await http.get("/readiness")
            assert ready.status_code == 503
            assert ready.json()["reason"] == "no workers"
            assert (await http.get("/v1/models")).json()["data"] == []
            resp = await http.post("/v1/chat/completions", json=CHAT)
            assert resp.status_code == 404
            assert resp.json()["error"]["code"] == "model_not_found"

            body = worker_body(ns, "a")
            worker_id = await add(http, body)
            waiting: list[httpx.Response] = []

            async def request() -> None:
                waiting.append(await http.post("/v1/chat/completions", json=CHAT))

            nursery.start_soon(request)
            for _ in range(3):  # the registry API stays responsive meanwhile
                listing = (await http.get("/workers")).json()
                assert [w["status"] for w in listing["workers"]] == ["pending"]
                assert (await http.get(f"/workers/{worker_id}")).json()["status"] == "pending"
                assert (await http.get("/readiness")).status_code == 503
                assert (await http.get("/v1/models")).json()["data"] == []
            assert waiting == []  # still waiting for the worker
            assert handle.manager.workers[0].status == "pending"

            start_engine(nursery, body)
            while not waiting:
                await trio.lowlevel.checkpoint()
            assert waiting[0].status_code == 200, waiting[0].text
            # every frontend (N>1) takes the worker in within a second of the one that served
            # the request: poll (another connection may reach another frontend)
            with trio.fail_after(5):
                # polled over HTTP, as a client would (another process holds the state)
                while [m["id"] for m in (await http.get("/v1/models")).json()["data"]] != ["m"]:  # noqa: ASYNC110
                    await trio.sleep(PACE_S)
                while (await http.get("/readiness")).status_code != 200:  # noqa: ASYNC110
                    await trio.sleep(PACE_S)


async def test_rolling_update_under_load_fails_no_request(ns: IpcNamespace) -> None:
    """Add worker B (its engine dials only 40 requests, ~2 s, later) and delete worker A at
    once, under 20 req/s: every request succeeds (they wait for B instead of failing)."""
    with trio.fail_after(DEADLINE_S):
        async with empty_gateway(ns) as (handle, http, nursery):
            a = worker_body(ns, "a")
            a_id = await add(http, a)
            start_engine(nursery, a)
            await wait_ready(handle, a_id)
            load = Load(http)

            async def rollout() -> None:
                await load.sent(10)
                b = worker_body(ns, "b")
                b_id = await add(http, b)
                async with trio.open_nursery() as both:
                    both.start_soon(http.delete, f"/workers/{a_id}")
                    await load.sent(50)
                    assert handle.manager.get_worker(b_id) is not None
                    start_engine(nursery, b)

            async with trio.open_nursery() as run:
                run.start_soon(rollout)
                run.start_soon(load.run)
            assert len(load.results) == REQUESTS
            failed = [(s, t) for s, t, _ in load.results if s != 200]
            assert failed == []
            assert [w.url for w in handle.manager.workers] == [ns.worker_url("b")]


async def test_removing_every_worker_under_load_gives_only_bounded_503s(ns: IpcNamespace) -> None:
    """Remove the only worker under load, re-add one 40 requests later: only 503s with
    Retry-After in between (each after the bounded wait), no 404, no 500, no hang, and the
    service comes back."""
    with trio.fail_after(DEADLINE_S):
        async with empty_gateway(ns, worker_wait_timeout_s=0.5) as (handle, http, nursery):
            a = worker_body(ns, "a")
            a_id = await add(http, a)
            start_engine(nursery, a)
            await wait_ready(handle, a_id)
            load = Load(http)

            async def outage() -> None:
                await load.sent(10)
                assert (await http.delete(f"/workers/{a_id}")).status_code == 200
                await load.sent(50)
                c = worker_body(ns, "c")
                await add(http, c)
                start_engine(nursery, c)

            async with trio.open_nursery() as run:
                run.start_soon(outage)
                run.start_soon(load.run)
            statuses = load.statuses()
            assert len(statuses) == REQUESTS
            assert set(statuses) == {200, 503}, statuses
            for status, text, headers in load.results:
                if status == 503:
                    assert headers.get("retry-after") == "1", text
                    assert "service_unavailable" in text
            assert statuses[-10:] == [200] * 10  # back (results are in completion order)


async def test_admin_calls_racing_on_one_url_stay_consistent_and_leak_nothing(
    ns: IpcNamespace,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with empty_gateway(ns) as (handle, http, nursery):
            await trio.testing.wait_all_tasks_blocked()
            baseline = len(nursery.child_tasks)
            body = worker_body(ns, "a")
            codes: list[int] = []

            async def racer(delete: bool) -> None:
                resp = await http.post("/workers", json=body)
                codes.append(resp.status_code)
                if resp.status_code == 202 and delete:
                    gone = await http.delete(f"/workers/{resp.json()['worker_id']}")
                    codes.append(gone.status_code)

            async def deleter() -> None:
                for w in handle.manager.workers:
                    codes.append((await http.delete(f"/workers/{w.worker_id}")).status_code)

            for round_ in range(4):
                async with trio.open_nursery() as racers:
                    for i in range(6):
                        racers.start_soon(racer, i % 2 == 0)
                    racers.start_soon(deleter)
                workers = handle.manager.workers
                assert len(workers) <= 1, round_
                for w in workers:  # at most one registration of the URL survives
                    assert w.url == body["url"]
                    assert (await http.delete(f"/workers/{w.worker_id}")).status_code == 200
                assert (await http.get("/workers")).json()["total"] == 0
            assert set(codes) <= {200, 202, 404, 409}, codes
            assert 409 in codes
            assert 202 in codes
            for job in handle.manager.jobs.values():
                await job.done.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == baseline  # no registration or supervisor left
            assert os.listdir(ns.directory) == []  # no socket file left
            # the URL and its handshake address are free again (once the last listener has
            # closed: an engine it accepted would lose its HELLO)
            await wait_tcp_listener_gone(body["zmq_handshake_address"])
            worker_id = await add(http, body)
            start_engine(nursery, body)
            await wait_ready(handle, worker_id)
            resp = await http.post("/v1/chat/completions", json=CHAT)
            assert resp.status_code == 200, resp.text


async def test_delete_waits_for_the_requests_in_flight_on_the_worker(ns: IpcNamespace) -> None:
    """DELETE /workers/{id} answers once the worker's requests in flight have finished (up to
    the drain timeout), whichever process holds them: with frontend processes (the N=2 pass)
    the supervisor, which serves none itself, waits for the frontends' shared counts, and the
    frontends keep the draining worker attached for them. So "DELETE, then stop the engine"
    cuts no stream."""
    with trio.fail_after(DEADLINE_S):
        async with empty_gateway(ns) as (handle, http, nursery):
            body = worker_body(ns, "a")
            worker_id = await add(http, body)
            engine = MockEngine(body["zmq_handshake_address"], MockEngineConfig(step_s=0.005))
            nursery.start_soon(engine.run)
            await wait_ready(handle, worker_id)
            order: list[str] = []
            first = trio.Event()
            chat = {**CHAT, "stream": True, "max_tokens": 200, "ignore_eos": True}

            async def stream() -> None:
                text = ""
                async with http.stream("POST", "/v1/chat/completions", json=chat) as resp:
                    assert resp.status_code == 200
                    async for chunk in resp.aiter_text():
                        text += chunk
                        first.set()
                order.append("stream ended")
                assert text.endswith("data: [DONE]\n\n"), text[-300:]
                assert '"error"' not in text, text[-300:]
                assert '"finish_reason":"length"' in text, text[-300:]

            async with trio.open_nursery() as inner:
                inner.start_soon(stream)
                await first.wait()
                deleted = await http.delete(f"/workers/{worker_id}")
                order.append("deleted")
                assert deleted.status_code == 200, deleted.text
            assert order == ["stream ended", "deleted"]
            assert engine.aborts == []  # the engine finished it; nothing was cut
