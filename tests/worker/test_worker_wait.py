"""Rolling updates at the worker layer (issue 15 item 4): a known model's requests wait for a
ready worker (bounded), a removed model stays known for a grace period, only models with a
ready worker are listed, and ``lease(exclude=...)`` skips the workers it names."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.lowlevel
import trio.testing

from smg_trio.backend import NoWorkerAvailable
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager, WorkerSpec, WorkerState
from tests.helpers.ipc import IpcNamespace, free_handshake_address

DEADLINE_S = 30.0


def spec_for(ns: IpcNamespace, name: str, model_id: str = "m") -> WorkerSpec:
    return WorkerSpec(
        url=ns.worker_url(name),
        model_path=str(default_tiny_model_dir()),
        model_id=model_id,
        runtime_type="vllm",
        zmq_handshake_address=free_handshake_address(),
    )


@asynccontextmanager
async def open_manager(**kw: object) -> AsyncIterator[tuple[WorkerManager, trio.Nursery]]:
    tmp = tempfile.gettempdir()
    conf = WorkerConfinement(socket_dirs=(tmp,), model_dirs=(str(default_tiny_model_dir()), tmp))
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, ready_timeout_s=5.0, confinement=conf, **kw)  # type: ignore[arg-type]
        yield manager, nursery
        nursery.cancel_scope.cancel()


async def serve_worker(
    manager: WorkerManager, nursery: trio.Nursery, spec: WorkerSpec
) -> WorkerState:
    assert spec.zmq_handshake_address is not None
    nursery.start_soon(MockEngine(spec.zmq_handshake_address, MockEngineConfig(step_s=0.001)).run)
    return await manager.register(spec)


async def test_lease_exclude_skips_the_named_workers(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager(policy="round_robin") as (manager, nursery):
            a = await serve_worker(manager, nursery, spec_for(ns, "a"))
            b = await serve_worker(manager, nursery, spec_for(ns, "b"))
            for _ in range(6):
                with manager.lease("m", exclude=(a.worker_id,)) as lease:
                    assert lease.worker_id == b.worker_id
            with (
                pytest.raises(NoWorkerAvailable),
                manager.lease("m", exclude={a.worker_id, b.worker_id}),
            ):
                pass
            await manager.wait_for_worker("m", exclude=(a.worker_id,))  # b is ready: no wait


async def test_request_for_a_registering_worker_waits_for_it(ns: IpcNamespace) -> None:
    """The model is known (not a 404) from registration on; a waiter returns when the engine
    finished its handshake, and not before."""
    with trio.fail_after(DEADLINE_S):
        async with open_manager(worker_wait_timeout_s=DEADLINE_S) as (manager, nursery):
            spec = spec_for(ns, "a")
            job = manager.add_worker(spec)
            assert "m" in manager.known_models()
            assert manager.list_models() == []
            assert manager.readiness().reason == "insufficient healthy workers"
            served = trio.Event()

            async def waiter() -> None:
                await manager.wait_for_worker("m")
                with manager.lease("m") as lease:
                    assert lease.worker_id == job.worker_id
                served.set()

            nursery.start_soon(waiter)
            while manager.get_model("m") is None:  # the tokenizer loads in a thread
                await trio.lowlevel.checkpoint()
            await trio.testing.wait_all_tasks_blocked()
            assert not served.is_set()  # nobody has dialled yet
            assert spec.zmq_handshake_address is not None
            nursery.start_soon(MockEngine(spec.zmq_handshake_address, MockEngineConfig()).run)
            await served.wait()
            assert [m.model_id for m in manager.list_models()] == ["m"]
            assert manager.readiness().ready


async def test_wait_is_bounded_and_unknown_models_do_not_wait(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager(worker_wait_timeout_s=0.2) as (manager, _):
            assert manager.readiness().reason == "no workers"
            manager.add_worker(spec_for(ns, "a"))  # no engine ever dials
            with pytest.raises(NoWorkerAvailable, match=r"waited up to 0\.2 s"):
                await manager.wait_for_worker("m")
            manager.worker_wait_timeout_s = 1e9
            with pytest.raises(NoWorkerAvailable):
                await manager.wait_for_worker("never-registered")  # at once


async def test_removed_model_stays_known_for_the_grace_period(ns: IpcNamespace) -> None:
    """Removing the last worker used to forget the model at once (404 model_not_found)."""
    with trio.fail_after(DEADLINE_S):
        async with open_manager(worker_wait_timeout_s=0.2) as (manager, nursery):
            a = await serve_worker(manager, nursery, spec_for(ns, "a"))
            served = manager.get_model("m")
            assert served is not None
            assert await manager.remove_worker(a.worker_id)
            assert manager.get_model("m") is served  # tokenizer kept: requests resolve
            assert manager.known_models() == ["m"]
            assert manager.list_models() == []
            with pytest.raises(NoWorkerAvailable):
                await manager.wait_for_worker("m")
            b = await serve_worker(manager, nursery, spec_for(ns, "b"))
            await manager.wait_for_worker("m")
            with manager.lease("m") as lease:
                assert lease.worker_id == b.worker_id


async def test_removed_model_is_forgotten_after_the_grace_period(
    ns: IpcNamespace, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_manager(model_grace_s=10.0) as (manager, _):
        job = manager.add_worker(spec_for(ns, "a"))
        assert job.worker_id is not None
        assert await manager.remove_worker(job.worker_id)
        await job.done.wait()
        assert manager.known_models() == ["m"]
        await trio.sleep(9.0)
        assert manager.known_models() == ["m"]
        await trio.sleep(1.5)
        assert manager.known_models() == []
        assert manager.get_model("m") is None
