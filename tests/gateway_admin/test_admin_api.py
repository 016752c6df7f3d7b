"""The ``/workers`` admin API over real HTTP (hypercorn on an ephemeral port, httpx) in front
of a WorkerManager driving mock engines over real ZMQ."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from smg_trio.gateway.admin import admin_blueprint
from smg_trio.testing.ipc import IpcNamespace, free_handshake_address
from smg_trio.testing.mock_engine import MockEngine, MockEngineConfig
from smg_trio.testing.tiny_model import default_tiny_model_dir
from smg_trio.worker.manager import WorkerManager

DEADLINE_S = 10.0
KEY = "admin-secret"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return default_tiny_model_dir()


@pytest.fixture
def ns() -> Iterator[IpcNamespace]:
    with IpcNamespace() as namespace:
        yield namespace


@asynccontextmanager
async def admin_server(
    admin_api_key: str | None = KEY,
) -> AsyncIterator[tuple[httpx.AsyncClient, WorkerManager, trio.Nursery]]:
    """A manager plus an app with only the admin blueprint, served on 127.0.0.1:<ephemeral>;
    yields an httpx client (with the admin key) pointed at it."""
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, ready_timeout_s=5.0)
        app = QuartTrio(__name__)
        app.register_blueprint(admin_blueprint(manager, admin_api_key=admin_api_key))
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = None
        shutdown = trio.Event()
        binds = await nursery.start(
            lambda task_status: serve(
                app, config, shutdown_trigger=shutdown.wait, task_status=task_status
            )
        )
        headers = {"Authorization": f"Bearer {KEY}"} if admin_api_key else {}
        async with httpx.AsyncClient(base_url=binds[0], headers=headers) as client:
            yield client, manager, nursery
        shutdown.set()
        nursery.cancel_scope.cancel()


def body(ns: IpcNamespace, name: str, model_dir: Path, **kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "url": ns.worker_url(name),
        "model_path": str(model_dir),
        "model_id": "m",
        "runtime_type": "vllm",
        "zmq_handshake_address": free_handshake_address(),
    }
    doc.update(kw)
    return doc


def assert_envelope(resp: httpx.Response, status: int, *needles: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for needle in needles:
        assert needle in err["message"]
    return dict(err)


async def test_add_poll_list_get_delete(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, nursery):
            spec = body(ns, "a", model_dir)
            resp = await http.post("/workers", json=spec)
            assert resp.status_code == 202, resp.text
            doc = resp.json()
            assert set(doc) == {"job_id", "worker_id", "status_url"}
            assert resp.headers["Location"] == doc["status_url"]

            # Pending until an engine dials; the job shows it, nothing blocks.
            job = (await http.get(doc["status_url"])).json()
            assert job["status"] in ("pending", "running")
            assert job["error"] is None
            worker = (await http.get(f"/workers/{doc['worker_id']}")).json()
            assert worker["status"] == "pending"
            assert worker["healthy"] is False

            nursery.start_soon(MockEngine(spec["zmq_handshake_address"], MockEngineConfig()).run)
            await manager.jobs[doc["job_id"]].done.wait()
            job = (await http.get(doc["status_url"])).json()
            assert job["status"] == "succeeded", job
            assert job["worker_id"] == doc["worker_id"]
            assert job["steps"]["activate"] == "succeeded"

            listing = (await http.get("/workers")).json()
            assert listing["total"] == 1
            (w,) = listing["workers"]
            assert w["id"] == doc["worker_id"]
            assert w["url"] == spec["url"]
            assert w["status"] == "ready"
            assert w["healthy"] is True
            assert w["runtime_type"] == "vllm"
            assert w["metadata"]["max_model_len"] == 4096
            assert (await http.get("/workers", params={"model": "m"})).json()["total"] == 1
            assert (await http.get("/workers", params={"model": "x"})).json()["total"] == 0

            loads = (await http.get("/get_loads")).json()["workers"]
            assert [ld["worker_id"] for ld in loads] == [doc["worker_id"]]
            assert loads[0]["loads"][0]["dp_rank"] == 0
            assert set(loads[0]["loads"][0]) >= {"num_running", "num_waiting", "kv_cache_usage"}

            resp = await http.delete(f"/workers/{doc['worker_id']}")
            assert resp.status_code == 200
            assert resp.json() == {"id": doc["worker_id"], "status": "removed"}
            assert (await http.get("/workers")).json()["total"] == 0
            assert_envelope(await http.get(f"/workers/{doc['worker_id']}"), 404)
            assert_envelope(await http.delete(f"/workers/{doc['worker_id']}"), 404)
            assert_envelope(await http.get("/workers/jobs/nope"), 404)


async def test_validation_errors(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, _):
            err = assert_envelope(
                await http.post("/workers", json=body(ns, "a", model_dir, runtime_type="sglang")),
                400,
                "sglang",
            )
            assert err["type"] == "invalid_request_error"
            assert err["param"] == "runtime_type"
            err = assert_envelope(
                await http.post(
                    "/workers",
                    json=body(ns, "a", model_dir, zmq_handshake_address="ipc:///tmp/x"),
                ),
                400,
                "tcp://",
            )
            assert err["param"] == "zmq_handshake_address"
            assert_envelope(
                await http.post(
                    "/workers", content=b"{not json", headers={"Content-Type": "application/json"}
                ),
                400,
            )
            assert_envelope(await http.post("/workers", json=[1, 2]), 400)
            assert_envelope(await http.post("/workers", json={"model_id": "m"}), 400, "url")
            err = assert_envelope(
                await http.post("/workers", json=body(ns, "a", model_dir, dp_size="2")), 400
            )
            assert err["param"] == "dp_size"
            assert_envelope(
                await http.post("/workers", json=body(ns, "a", model_dir, bogus=1)), 400
            )
            assert len(manager.registry) == 0
            assert not manager.jobs

            first = body(ns, "a", model_dir)
            assert (await http.post("/workers", json=first)).status_code == 202
            err = assert_envelope(await http.post("/workers", json=first), 409, first["url"])
            assert err["param"] == "url"
            clash = body(ns, "b", model_dir, zmq_handshake_address=first["zmq_handshake_address"])
            err = assert_envelope(await http.post("/workers", json=clash), 409, first["url"])
            assert clash["url"] in err["message"]


async def test_failed_registration_reported_in_job(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, _):
            resp = await http.post(
                "/workers",
                json={"url": ns.worker_url("a"), "model_path": "/nonexistent/model"},
            )
            assert resp.status_code == 202
            job_id = resp.json()["job_id"]
            await manager.jobs[job_id].done.wait()
            job = (await http.get(f"/workers/jobs/{job_id}")).json()
            assert job["status"] == "failed"
            assert "model_path" in job["error"]
            assert (await http.get("/workers")).json()["total"] == 0


async def test_admin_key_required(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, _):
            for wrong in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
                anon = httpx.AsyncClient(base_url=str(http.base_url), headers=wrong)
                async with anon:
                    for method, path in [
                        ("POST", "/workers"),
                        ("GET", "/workers"),
                        ("GET", "/workers/x"),
                        ("DELETE", "/workers/x"),
                        ("GET", "/workers/jobs/x"),
                        ("GET", "/get_loads"),
                    ]:
                        kw: dict[str, Any] = {}
                        if method == "POST":
                            kw["json"] = body(ns, "a", model_dir)
                        resp = await anon.request(method, path, **kw)
                        err = assert_envelope(resp, 401)
                        assert err["type"] == "authentication_error"
            assert len(manager.registry) == 0
            assert (await http.get("/workers")).status_code == 200
            # the auth scheme is case-insensitive (RFC 7235), as on the inference endpoints
            for header in (f"bearer {KEY}", f"BEARER  {KEY}"):
                resp = await http.get("/workers", headers={"Authorization": header})
                assert resp.status_code == 200, header


async def test_no_admin_key_configured_is_open() -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server(admin_api_key=None) as (http, _, _):
            assert (await http.get("/workers")).json() == {"workers": [], "total": 0}


@pytest.mark.parametrize(
    "raw",
    [b'{"url": "\xff"}', b"\xff\xfe{}", b'{"url": "ipc:///x\\ud800"}'],
    ids=["non-utf8-in-string", "non-utf8-bom", "lone-surrogate"],
)
async def test_undecodable_body_is_a_400(raw: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Finding 7: a non-UTF-8 body was a 500 (Quart's get_json decodes before it parses)."""
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, _):
            resp = await http.post(
                "/workers", content=raw, headers={"Content-Type": "application/json"}
            )
            err = assert_envelope(resp, 400)
            assert err["code"] == "json_parse_error"
            assert len(manager.registry) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
