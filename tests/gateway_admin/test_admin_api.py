"""The ``/workers`` admin API over real HTTP (hypercorn on an ephemeral port, httpx) in front
of a WorkerManager driving mock engines over real ZMQ."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve.admin import admin_blueprint
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager
from tests.helpers.ipc import IpcNamespace, free_handshake_address

DEADLINE_S = 10.0
KEY = "admin-secret"


@asynccontextmanager
async def admin_server(
    admin_api_key: str | None = KEY,
    *,
    allow_insecure: bool = False,
    confinement: WorkerConfinement | None = None,
    **manager_kw: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, WorkerManager, trio.Nursery]]:
    """A manager plus an app with only the admin blueprint, served on 127.0.0.1:<ephemeral>;
    yields an httpx client (with the admin key) pointed at it. The default confinement allows
    sockets under the temp dir (the test namespaces) and models in the tiny model's dir and
    the temp dir."""
    if confinement is None:
        tmp = tempfile.gettempdir()
        confinement = WorkerConfinement(
            socket_dirs=(tmp,), model_dirs=(str(default_tiny_model_dir()), tmp)
        )
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, ready_timeout_s=5.0, confinement=confinement, **manager_kw)
        app = QuartTrio(__name__)
        app.register_blueprint(
            admin_blueprint(manager, admin_api_key=admin_api_key, allow_insecure=allow_insecure)
        )
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


async def test_model_id_alone_joins_a_served_model_or_is_a_400(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """A spec without model_path cannot load a tokenizer: a 400 naming model_path at once for
    a model not served (it was a 202 and a job that always failed), and for a served model the
    new worker shares that model's tokenizer and becomes ready."""
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, nursery):
            alone = {k: v for k, v in body(ns, "b", model_dir).items() if k != "model_path"}
            err = assert_envelope(await http.post("/workers", json=alone), 400, "model_path")
            assert err["param"] == "model_path"
            assert "None" not in err["message"]
            assert len(manager.registry) == 0

            first = body(ns, "a", model_dir)
            doc = (await http.post("/workers", json=first)).json()
            nursery.start_soon(MockEngine(first["zmq_handshake_address"], MockEngineConfig()).run)
            await manager.jobs[doc["job_id"]].done.wait()
            resp = await http.post("/workers", json=alone)
            assert resp.status_code == 202, resp.text
            nursery.start_soon(MockEngine(alone["zmq_handshake_address"], MockEngineConfig()).run)
            job = manager.jobs[resp.json()["job_id"]]
            await job.done.wait()
            assert job.status == "succeeded", job.error
            assert {w.status for w in manager.workers} == {"ready"}
            assert len(manager.workers) == 2


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
            err = assert_envelope(
                await http.post("/workers", json=body(ns, "a", model_dir, dp_size=1_000_000)), 400
            )
            assert err["param"] == "dp_size"  # would wait for a million engines
            err = assert_envelope(
                await http.post("/workers", json=body(ns, "a", model_dir, tool_call_parser="nope")),
                400,
                "unknown tool call parser 'nope'; valid names: ",
            )
            assert err["param"] == "tool_call_parser"
            assert "hermes" in err["message"]
            assert "deepseek_v3" in err["message"]
            for revision, says in [("../../etc", "not a branch"), ("v2", "Hugging Face id")]:
                err = assert_envelope(
                    await http.post("/workers", json=body(ns, "a", model_dir, revision=revision)),
                    400,
                    says,
                )
                assert err["param"] == "revision"  # the local model_path takes none
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


async def test_expired_job_is_a_404(ns: IpcNamespace) -> None:
    """With --max-finished-jobs 1, the older of two finished jobs is gone."""
    with trio.fail_after(DEADLINE_S):
        async with admin_server(max_finished_jobs=1) as (http, manager, _):
            missing = tempfile.mkdtemp(prefix="smg-") + "/nonexistent-model"
            ids = []
            for name in ("a", "b"):
                resp = await http.post(
                    "/workers", json={"url": ns.worker_url(name), "model_path": missing}
                )
                assert resp.status_code == 202
                ids.append(resp.json()["job_id"])
                await manager.jobs[ids[-1]].done.wait()
            assert_envelope(await http.get(f"/workers/jobs/{ids[0]}"), 404, ids[0])
            newest = await http.get(f"/workers/jobs/{ids[1]}")
            assert newest.status_code == 200
            assert newest.json()["status"] == "failed"


async def test_failed_registration_reported_in_job(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server() as (http, manager, _):
            # inside the allowed model dirs (else a 400 at once), but not there
            missing = tempfile.mkdtemp(prefix="smg-") + "/nonexistent-model"
            resp = await http.post(
                "/workers", json={"url": ns.worker_url("a"), "model_path": missing}
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


async def test_no_admin_key_reading_is_open_changing_is_403(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """Safe by default (issue 18, finding 1): without a key nobody can add or remove a
    worker; the 403 names the flags to set."""
    with trio.fail_after(DEADLINE_S):
        async with admin_server(admin_api_key=None) as (http, manager, _):
            assert (await http.get("/workers")).json() == {"workers": [], "total": 0}
            assert (await http.get("/get_loads")).status_code == 200
            assert_envelope(await http.get("/workers/jobs/x"), 404)
            for method, path in [("POST", "/workers"), ("DELETE", "/workers/x")]:
                kw: dict[str, Any] = {"json": body(ns, "a", model_dir)} if method == "POST" else {}
                resp = await http.request(method, path, **kw)
                err = assert_envelope(
                    resp,
                    403,
                    f"{method} {path} is an admin route",
                    "--admin-api-key",
                    "--api-key",
                    "--allow-insecure-admin",
                )
                assert err["type"] == "permission_error"
                assert err["code"] == "admin_api_disabled"
            assert len(manager.registry) == 0
            assert not manager.jobs
            assert os.listdir(ns.directory) == []


async def test_allow_insecure_opens_changes_without_a_key(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with admin_server(admin_api_key=None, allow_insecure=True) as (http, manager, _):
            resp = await http.post("/workers", json=body(ns, "a", model_dir))
            assert resp.status_code == 202, resp.text
            resp = await http.delete(f"/workers/{resp.json()['worker_id']}")
            assert resp.status_code == 200, resp.text
            assert len(manager.registry) == 0


# -- confinement (issue 18, findings 1 and 5) -----------------------------------------------


async def test_worker_urls_outside_the_socket_dirs_are_400(
    ns: IpcNamespace, model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    only_ns = WorkerConfinement(socket_dirs=(ns.directory,), model_dirs=(str(model_dir),))
    with trio.fail_after(DEADLINE_S):
        async with admin_server(confinement=only_ns) as (http, manager, _):
            other = tempfile.mkdtemp(prefix="smg-")
            try:
                for url in (
                    "ipc://@x",
                    "ipc://relative-w",
                    f"ipc://{other}/w",
                    f"ipc://{ns.directory}/../w",
                    f"ipc://{ns.directory}/new/deeper/w\nERROR forged",
                ):
                    resp = await http.post("/workers", json=body(ns, "a", model_dir, url=url))
                    err = assert_envelope(resp, 400)
                    assert err["param"] == "url", url
                assert os.listdir(other) == []
            finally:
                os.rmdir(other)
            for address in ("tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://lo:5555"):
                resp = await http.post(
                    "/workers", json=body(ns, "a", model_dir, zmq_handshake_address=address)
                )
                err = assert_envelope(resp, 400, "loopback")
                assert err["param"] == "zmq_handshake_address"
            assert len(manager.registry) == 0
            assert os.listdir(ns.directory) == []  # nothing created, not even new/deeper
    assert not any("forged" in r.getMessage() for r in caplog.records)


async def test_model_paths_outside_the_roots_are_400_without_saying_if_they_exist(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    evil = root / "evil"
    shutil.copytree(model_dir, evil)
    secret = tmp_path / "secret.jinja"
    secret.write_text("{{ 'TOP-SECRET-c0ffee' }}")
    (evil / "chat_template.jinja").symlink_to(secret)
    conf = WorkerConfinement(socket_dirs=(ns.directory,), model_dirs=(str(root),))
    with trio.fail_after(DEADLINE_S):
        async with admin_server(confinement=conf) as (http, manager, _):
            messages = set()
            for path in ("/etc", "/root", "/nonexistent/model", str(model_dir)):
                resp = await http.post(
                    "/workers",
                    json=body(ns, "a", model_dir, model_path=path, url=ns.worker_url("sub/a")),
                )
                err = assert_envelope(resp, 400, "--allowed-model-dirs")
                assert err["param"] == "model_path"
                messages.add(err["message"])
            assert len(messages) == 1
            resp = await http.post(
                "/workers",
                json=body(ns, "a", evil, url=ns.worker_url("sub/a")),
            )
            err = assert_envelope(resp, 400, "chat_template.jinja", "--allowed-model-dirs")
            assert "TOP-SECRET" not in resp.text
            assert str(secret) not in resp.text
            assert len(manager.registry) == 0
            assert not manager.jobs
            assert os.listdir(ns.directory) == []  # nothing was created for "sub/"


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
