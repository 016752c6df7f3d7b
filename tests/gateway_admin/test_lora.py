"""LoRA adapters over real HTTP in front of a WorkerManager driving in-process mock engines over
real ZMQ: vLLM's load and unload routes (add_lora / remove_lora on every engine), /v1/models
with ``parent``, requests sent with the adapter's ``lora_request`` (a stable id) and answered
by it, and every refusal a 4xx in the envelope with nothing half-registered."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.lora import LoraAdapter, LoraModule, lora_int_id
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_lora import build_tiny_lora
from smg_trio.serve.admin import admin_blueprint
from smg_trio.serve.lora_routes import add_lora_routes
from smg_trio.serve.lora_setup import LoraSetupError, register_static_adapters
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager, WorkerSpec
from tests.helpers.ipc import IpcNamespace, free_handshake_address

DEADLINE_S = 15.0
KEY = "admin-secret"


@attrs.define
class Lora:
    http: httpx.AsyncClient
    manager: WorkerManager
    engines: list[MockEngine]
    root: Path

    async def chat(self, model: str, **kw: Any) -> httpx.Response:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 6,
            "temperature": 0,
        }
        return await self.http.post("/v1/chat/completions", json={**body, **kw})

    async def load(self, name: str, path: Path | str, **kw: Any) -> httpx.Response:
        body = {"lora_name": name, "lora_path": str(path), **kw}
        return await self.http.post("/v1/load_lora_adapter", json=body)

    async def unload(self, name: str) -> httpx.Response:
        return await self.http.post("/v1/unload_lora_adapter", json={"lora_name": name})

    def adapter(self, name: str, **kw: Any) -> Path:
        return build_tiny_lora(self.root / name, base_model=kw.pop("base_model", "m"), **kw)

    def engine_calls(self, method: str) -> list[list[Any]]:
        return [args for e in self.engines for m, args in e.utility.calls if m == method]


@asynccontextmanager
async def lora_server(
    ns: IpcNamespace,
    model_dir: Path,
    tmp_path: Path,
    *,
    engines: int = 2,
    runtime: str = "vllm",
    max_loras: int = 4,
    max_lora_rank: int | None = None,
    policy: str = "round_robin",
) -> AsyncIterator[Lora]:
    root = tmp_path / "adapters"
    root.mkdir()
    confinement = WorkerConfinement(
        socket_dirs=(tempfile.gettempdir(),), model_dirs=(str(model_dir), str(root))
    )
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(
            nursery,
            policy=policy,
            ready_timeout_s=5.0,
            confinement=confinement,
            worker_wait_timeout_s=5.0,
        )
        app = create_app(manager, GatewayHttpConfig())
        admin = admin_blueprint(manager, admin_api_key=KEY)
        add_lora_routes(admin, manager, max_lora_rank=max_lora_rank, bound_s=5.0)
        app.register_blueprint(admin)
        mocks = []
        for i in range(engines):
            handshake = free_handshake_address()
            mock = MockEngine(
                handshake,
                MockEngineConfig(protocol=runtime, max_loras=max_loras),  # type: ignore[arg-type]
            )
            mocks.append(mock)
            nursery.start_soon(mock.run)
            await manager.register(
                WorkerSpec(
                    url=ns.worker_url(f"w{i}"),
                    model_path=str(model_dir),
                    model_id="m",
                    runtime_type=runtime,
                    zmq_handshake_address=handshake,
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
            yield Lora(http, manager, mocks, root)
        shutdown.set()
        nursery.cancel_scope.cancel()


def assert_error(resp: httpx.Response, status: int, *needles: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    for needle in needles:
        assert needle in err["message"], err
    return dict(err)


def _lora_of_requests(engines: list[MockEngine]) -> list[tuple[str, int, str] | None]:
    return [r.lora for e in engines for r in e.requests]


async def test_load_use_list_unload(ns: IpcNamespace, model_dir: Path, tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path) as c:
            path = c.adapter("sql")
            resp = await c.load("sql", path)
            assert resp.status_code == 200, resp.text
            assert resp.text == "Success: LoRA adapter 'sql' added successfully."
            want = ["sql", lora_int_id("sql"), str(path), None, False, False]
            assert c.engine_calls("add_lora") == [[want], [want]]  # every engine

            cards = {m["id"]: m for m in (await c.http.get("/v1/models")).json()["data"]}
            assert cards["sql"]["parent"] == "m"
            assert cards["sql"]["root"] == str(path)
            assert cards["m"]["parent"] is None
            assert (await c.http.get("/v1/models/sql")).json()["parent"] == "m"

            base = await c.chat("m")
            first = await c.chat("sql")
            again = await c.chat("sql")
            assert base.status_code == first.status_code == 200, (base.text, first.text)
            assert first.json()["model"] == "sql"
            text = first.json()["choices"][0]["message"]["content"]
            assert text == again.json()["choices"][0]["message"]["content"]  # stable
            assert text != base.json()["choices"][0]["message"]["content"]  # the adapter's
            sent = _lora_of_requests(c.engines)
            assert sent.count(None) == 1
            assert sent.count(("sql", lora_int_id("sql"), str(path))) == 2
            assert c.manager.loras.inflight("sql") == 0

            resp = await c.unload("sql")
            assert resp.status_code == 200, resp.text
            assert resp.text == "Success: LoRA adapter 'sql' removed successfully."
            assert c.engine_calls("remove_lora") == [[lora_int_id("sql")]] * 2
            assert all(e.utility.loras.loaded == {} for e in c.engines)
            err = assert_error(await c.chat("sql"), 404, "The model 'sql' does not exist.")
            assert err["code"] == "model_not_found"
            assert "sql" not in {m["id"] for m in (await c.http.get("/v1/models")).json()["data"]}
            assert_error(await c.unload("sql"), 404, "cannot be found")


async def test_two_adapters_interleaved(ns: IpcNamespace, model_dir: Path, tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, engines=1) as c:
            for name, seed in (("a", 1), ("b", 2)):
                assert (await c.load(name, c.adapter(name, seed=seed))).status_code == 200
            texts: dict[str, set[str]] = {"a": set(), "b": set(), "m": set()}
            for model in ("a", "b", "m", "b", "a", "m"):
                resp = await c.chat(model)
                assert resp.status_code == 200, resp.text
                texts[model].add(resp.json()["choices"][0]["message"]["content"])
            assert all(len(t) == 1 for t in texts.values())  # each stable
            assert len(set.union(*texts.values())) == 3  # and each its own


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
async def test_requests_prefer_the_engine_holding_their_adapter(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path, policy: str
) -> None:
    # static adapters (not preloaded), engines holding one adapter each: without the
    # preference, round robin puts "a" on both engines (and cache_aware balances the same
    # prompt across them); the preference narrows, then the policy picks
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, max_loras=1, policy=policy) as c:
            for name in ("a", "b"):
                path = str(c.adapter(name))
                c.manager.loras.add(LoraAdapter(name, "m", path, lora_int_id(name), static=True))
            for model in ("a", "a", "b", "b", "a", "b"):
                assert (await c.chat(model)).status_code == 200
            served = [{r.lora[0] for r in e.requests if r.lora} for e in c.engines]
            assert sorted(map(sorted, served)) == [["a"], ["b"]], served


@pytest.mark.parametrize(
    "case",
    [
        "outside",
        "symlink_out",
        "not_adapter",
        "other_base",
        "rank_gateway",
        "rank_engine",
        "twice",
        "base_name",
        "too_many",
        "no_key",
        "bad_body",
    ],
)
async def test_bad_loads_are_4xx_and_register_nothing(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path, case: str
) -> None:
    outside = build_tiny_lora(tmp_path / "outside", base_model="m")
    limit = 8 if case == "rank_gateway" else None
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, max_loras=1, max_lora_rank=limit) as c:
            before = 0
            if case == "outside":
                resp = await c.load("x", outside)
                assert_error(resp, 400, "outside the allowed model directories")
            elif case == "symlink_out":
                os.symlink(outside, c.root / "link")
                resp = await c.load("x", c.root / "link")
                assert_error(resp, 400, "outside the allowed model directories")
            elif case == "not_adapter":
                (c.root / "plain").mkdir()
                (c.root / "plain" / "config.json").write_text("{}")
                assert_error(await c.load("x", c.root / "plain"), 400, "no adapter_config.json")
            elif case == "other_base":
                path = c.adapter("x", base_model="org/other-model")
                err = assert_error(await c.load("x", path), 400, "org/other-model")
                assert err["code"] == "base_model_mismatch"
            elif case == "rank_gateway":
                path = c.adapter("x", rank=16)
                assert_error(await c.load("x", path), 400, "greater than")
            elif case == "rank_engine":  # the mocks' max_lora_rank is 16
                path = c.adapter("x", rank=32)
                err = assert_error(await c.load("x", path), 400, "max_lora_rank")
                assert err["code"] == "engine_refused"
            elif case == "twice":
                assert (await c.load("x", c.adapter("x"))).status_code == 200
                before = 1
                assert_error(await c.load("x", c.root / "x"), 400, "has already been loaded")
            elif case == "base_name":
                assert_error(await c.load("m", c.adapter("x")), 400, "conflicts with a served")
            elif case == "too_many":  # max_loras=1
                assert (await c.load("x", c.adapter("x"))).status_code == 200
                before = 1
                err = assert_error(await c.load("y", c.adapter("y", seed=3)), 400, "max_loras")
                assert err["code"] == "too_many_lora_adapters"
            elif case == "no_key":
                resp = await c.http.post(
                    "/v1/load_lora_adapter",
                    json={"lora_name": "x", "lora_path": str(c.adapter("x"))},
                    headers={"Authorization": "Bearer wrong"},
                )
                assert resp.status_code == 401
            elif case == "bad_body":
                resp = await c.http.post("/v1/load_lora_adapter", json={"lora_name": "x"})
                assert_error(resp, 400, "lora_path")
            assert len(c.manager.loras) == before
            # nothing left in an engine either: every add_lora that took was taken back
            assert all(len(e.utility.loras.loaded) == before for e in c.engines)


async def test_unloading_an_adapter_in_use_is_refused(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, engines=1) as c:
            assert (await c.load("sql", c.adapter("sql"))).status_code == 200
            c.engines[0].stall()
            body = {
                "model": "sql",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "stream": True,
            }
            async with c.http.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                assert c.manager.loras.inflight("sql") == 1
                metrics = (await c.http.get("/metrics")).text
                assert (
                    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",'
                    'waiting_lora_adapters="sql"}'
                ) in metrics
                err = assert_error(await c.unload("sql"), 409, "in use by 1 request")
                assert err["code"] == "lora_adapter_in_use"
                c.engines[0].resume()
                await stream.aread()
            assert c.manager.loras.inflight("sql") == 0
            metrics = (await c.http.get("/metrics")).text
            assert 'running_lora_adapters="",waiting_lora_adapters=""}' in metrics
            assert (await c.unload("sql")).status_code == 200


async def test_tokenspeed_worker_refuses_an_adapter(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, engines=1, runtime="tokenspeed") as c:
            # (a static adapter: the load route would already refuse one for TokenSpeed)
            c.manager.loras.add(LoraAdapter("sql", "m", str(c.adapter("sql")), lora_int_id("sql")))
            err = assert_error(await c.chat("sql"), 400, "TokenSpeed")
            assert err["param"] == "model"
            assert c.engines[0].requests == []
            assert c.manager.loras.inflight("sql") == 0
            assert_error(await c.load("x", c.adapter("x")), 400, "--enable-lora")
            assert len(c.manager.loras) == 1


async def test_static_adapters_are_preloaded_on_every_engine(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path) as c:
            big = LoraModule("big", str(c.adapter("big", rank=32)))  # the mocks' limit is 16
            with pytest.raises(LoraSetupError, match="max_lora_rank"):
                await register_static_adapters(c.manager, [big], None)
            assert len(c.manager.loras) == 0
            good = LoraModule("s", str(c.adapter("s")))
            await register_static_adapters(c.manager, [good], None)
            assert c.manager.loras.get("s") is not None
            assert c.manager.loras.get("s").static  # type: ignore[union-attr]
            assert all(lora_int_id("s") in e.utility.loras.loaded for e in c.engines)
            assert (await c.chat("s")).status_code == 200


async def test_load_inplace_reloads_under_the_same_id(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, engines=1) as c:
            assert (await c.load("sql", c.adapter("sql"))).status_code == 200
            newer = build_tiny_lora(c.root / "sql-v2", base_model="m", seed=9)
            resp = await c.load("sql", newer, load_inplace=True)
            assert resp.status_code == 200, resp.text
            assert [a[0][4] for a in c.engine_calls("add_lora")] == [False, True]
            adapter = c.manager.loras.get("sql")
            assert adapter is not None
            assert (adapter.path, adapter.int_id) == (str(newer), lora_int_id("sql"))
            assert len(c.manager.loras) == 1


async def test_a_link_inside_the_allow_list_is_loaded_by_its_target(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lora_server(ns, model_dir, tmp_path, engines=1) as c:
            target = c.adapter("v1")
            os.symlink(target, c.root / "current")
            assert (await c.load("sql", c.root / "current")).status_code == 200
            # the engines get the resolved folder: re-pointing the link changes nothing
            real = str(await trio.Path(target).resolve())
            assert c.engine_calls("add_lora")[0][0][2] == real
            assert c.manager.loras.get("sql").path == real  # type: ignore[union-attr]
