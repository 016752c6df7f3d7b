"""Engine control routes (``/sleep``, ``/wake_up``, ``/pause``, ``/reset_prefix_cache``...) over
real HTTP in front of a WorkerManager driving in-process mock engines over real ZMQ: utility
calls to every DP rank, the held worker out of routing (503 with Retry-After) until woken,
a never-answering engine (504 naming it), refusals (4xx naming the worker), auth."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.serve.admin import admin_blueprint
from smg_trio.serve.engine_control import add_engine_control_routes
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager, WorkerSpec, WorkerState
from tests.helpers.ipc import IpcNamespace, free_handshake_address

DEADLINE_S = 15.0
KEY = "admin-secret"
#: The control calls' bound in these tests: only the never-answering engine waits it out.
BOUND_S = 0.5


def _control_calls(engine: Any) -> list[tuple[str, list[Any]]]:
    """The utility calls an engine got, less the supported-tasks lookup of its registration."""
    return [c for c in engine.utility.calls if c[0] != "get_supported_tasks"]


@attrs.define
class Control:
    http: httpx.AsyncClient
    manager: WorkerManager
    engines: list[MockEngine]
    worker: WorkerState
    nursery: trio.Nursery

    async def chat(self, **kw: Any) -> httpx.Response:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return await self.http.post("/v1/chat/completions", json={**body, **kw})


@asynccontextmanager
async def control_server(
    ns: IpcNamespace, model_dir: Path, *, dp: int = 1, runtime: str = "vllm"
) -> AsyncIterator[Control]:
    tmp = tempfile.gettempdir()
    confinement = WorkerConfinement(socket_dirs=(tmp,), model_dirs=(str(model_dir), tmp))
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(
            nursery, ready_timeout_s=5.0, confinement=confinement, worker_wait_timeout_s=5.0
        )
        app = create_app(manager, GatewayHttpConfig())
        admin = admin_blueprint(manager, admin_api_key=KEY)
        add_engine_control_routes(admin, manager, bound_s=BOUND_S)
        app.register_blueprint(admin)
        handshake = free_handshake_address()
        engines = [
            MockEngine(
                handshake,
                MockEngineConfig(protocol=runtime, engine_index=i, data_parallel_size=dp),  # type: ignore[arg-type]
            )
            for i in range(dp)
        ]
        for engine in engines:
            nursery.start_soon(engine.run)
        worker = await manager.register(
            WorkerSpec(
                url=ns.worker_url("w"),
                model_path=str(model_dir),
                model_id="m",
                runtime_type=runtime,
                zmq_handshake_address=handshake,
                dp_size=dp,
            )
        )
        shutdown = trio.Event()
        binds = await nursery.start(
            lambda task_status: serve_http(
                app, shutdown_trigger=shutdown.wait, task_status=task_status
            )
        )
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=binds[0], headers=headers) as http:
            yield Control(http, manager, engines, worker, nursery)
        shutdown.set()
        nursery.cancel_scope.cancel()


def assert_error(resp: httpx.Response, status: int, *needles: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    for needle in needles:
        assert needle in err["message"], err
    return dict(err)


async def test_reset_prefix_cache_reaches_every_rank(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir, dp=2) as c:
            resp = await c.http.post("/reset_prefix_cache", params={"reset_external": "true"})
            assert resp.status_code == 200, resp.text
            doc = resp.json()
            assert doc["success"] is True
            assert sorted(e["dp_rank"] for e in doc["engines"]) == [0, 1]
            for engine in c.engines:
                assert _control_calls(engine) == [("reset_prefix_cache", [False, True])]
            assert all(w.engine_client.utility_pending == 0 for w in c.manager.workers)  # type: ignore[union-attr]


async def test_sleeping_worker_gets_503_then_serves_after_wake_up(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            assert (await c.chat()).status_code == 200
            resp = await c.http.post("/sleep", params={"level": "1"})
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"status": "sleeping", "level": 1}
            assert c.engines[0].utility.sleeping_tags
            assert c.worker.held == "sleeping"
            assert (await c.http.get("/is_sleeping")).json()["is_sleeping"] is True

            resp = await c.chat()
            err = assert_error(resp, 503, "sleeping")
            assert err["code"] == "service_unavailable"
            assert resp.headers["retry-after"] == "1"
            resp = await c.http.get("/readiness")
            assert resp.status_code == 503
            assert "held sleeping: POST /wake_up" in resp.json()["reason"]
            assert (await c.http.get("/workers")).json()["workers"][0]["held"] == "sleeping"

            resp = await c.http.post("/wake_up", params=[("tags", "weights"), ("tags", "kv_cache")])
            assert resp.json() == {"status": "awake", "tags": ["weights", "kv_cache"]}
            assert c.worker.held is None
            assert (await c.http.get("/is_sleeping")).json()["is_sleeping"] is False
            assert (await c.chat()).status_code == 200
            assert (await c.http.get("/readiness")).status_code == 200


async def test_partial_wake_up_keeps_the_worker_asleep(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            assert (await c.http.post("/sleep")).status_code == 200
            resp = await c.http.post("/wake_up", params={"tags": "weights"})
            assert resp.json() == {"status": "sleeping", "tags": ["weights"]}
            assert c.worker.held == "sleeping"
            assert (await c.chat()).status_code == 503


async def test_pause_and_resume(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            resp = await c.http.post("/pause", params={"mode": "keep", "clear_cache": "false"})
            assert resp.json() == {"status": "paused"}
            assert c.engines[0].utility.calls[-1] == ("pause_scheduler", ["keep", False])
            assert (await c.http.get("/is_paused")).json()["is_paused"] is True
            assert_error(await c.chat(), 503, "paused")
            assert "held paused" in (await c.http.get("/readiness")).json()["reason"]
            assert (await c.http.post("/resume")).json() == {"status": "resumed"}
            assert (await c.http.get("/is_paused")).json()["is_paused"] is False
            assert (await c.chat()).status_code == 200


async def test_is_sleeping_takes_the_engines_word(ns: IpcNamespace, model_dir: Path) -> None:
    """The engine is the source of truth: an engine found awake (woken elsewhere, restarted)
    puts its worker back in routing at the next read."""
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            assert (await c.http.post("/sleep")).status_code == 200
            c.engines[0].utility.sleeping_tags.clear()
            c.engines[0].utility.paused = False
            assert (await c.http.get("/is_sleeping")).json()["is_sleeping"] is False
            assert c.worker.held is None


async def test_a_restarted_engine_is_awake(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            assert (await c.http.post("/sleep")).status_code == 200
            old = c.worker.generation
            c.engines[0].die_silently()
            fresh = MockEngine(c.engines[0].handshake_address, MockEngineConfig())
            c.nursery.start_soon(fresh.run)
            while c.worker.generation == old or not c.worker.healthy:
                await c.manager.registry.changed.wait()  # the fresh engine's handshake
            assert c.worker.held is None
            assert (await c.chat()).status_code == 200


async def test_never_answering_engine_is_a_504_naming_it(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir, dp=2) as c:
            c.engines[1].utility.silent.add("reset_prefix_cache")
            resp = await c.http.post("/reset_prefix_cache")
            err = assert_error(
                resp, 504, f"worker {c.worker.worker_id}", "engine 1", "reset_prefix_cache"
            )
            assert err["code"] == "engine_timeout"
            assert "engine 0" not in err["message"]
            client = c.worker.engine_client
            assert client is not None
            assert client.utility_pending == 0
            # the client and the other rank carry on
            assert (await c.http.get("/is_paused")).status_code == 200


async def test_engine_refusal_is_a_4xx_naming_the_worker(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            c.engines[0].utility.sleep_mode = False
            resp = await c.http.post("/sleep")
            err = assert_error(resp, 400, c.worker.worker_id, "Sleep mode is not enabled")
            assert err["code"] == "engine_refused"
            # as vLLM's, the engine paused its scheduler before refusing: still held
            assert c.worker.held == "sleeping"
            assert (await c.http.get("/is_sleeping")).json()["is_sleeping"] is True
            assert (await c.http.post("/wake_up")).json()["status"] == "awake"
            assert (await c.chat()).status_code == 200


async def test_tokenspeed_worker_is_a_4xx_naming_it(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir, runtime="tokenspeed") as c:
            resp = await c.http.post("/reset_prefix_cache")
            err = assert_error(resp, 400, c.worker.worker_id, "tokenspeed")
            assert err["code"] == "unsupported_by_engine"
            # a refused sleep that left the engine running puts the worker back at once
            assert_error(await c.http.post("/sleep"), 400, c.worker.worker_id)
            assert c.worker.held is None
            assert (await c.chat()).status_code == 200


async def test_bad_input(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            err = assert_error(
                await c.http.post("/sleep", params={"worker_id": "nope"}), 404, "nope"
            )
            assert err["code"] == "worker_not_found"
            err = assert_error(await c.http.get("/is_sleeping", params={"model": "x"}), 404, "x")
            assert err["code"] == "model_not_found"
            assert_error(await c.http.post("/sleep", params={"level": "3"}), 400, "level")
            assert_error(await c.http.post("/pause", params={"mode": "later"}), 400, "mode")
            assert_error(
                await c.http.post("/reset_prefix_cache", params={"reset_external": "maybe"}),
                400,
                "reset_external",
            )
            assert _control_calls(c.engines[0]) == []
            resp = await c.http.post(
                "/reset_prefix_cache", params={"worker_id": c.worker.worker_id}
            )
            assert resp.json()["success"] is True


async def test_control_needs_the_admin_key(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir) as c:
            resp = await c.http.post("/sleep", headers={"Authorization": "Bearer wrong"})
            assert resp.status_code == 401
            resp = await c.http.get("/is_sleeping", headers={"Authorization": ""})
            assert resp.status_code == 401
            assert _control_calls(c.engines[0]) == []


async def test_server_info(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with control_server(ns, model_dir, dp=2) as c:
            doc = (await c.http.get("/server_info")).json()
            (worker,) = doc["workers"]
            assert worker["id"] == c.worker.worker_id
            assert sorted(e["dp_rank"] for e in worker["engines"]) == [0, 1]
            assert worker["engines"][0]["registration"]["vllm_version"] == "0.32.0"
