"""An engine's supported tasks: learnt from ``get_supported_tasks`` (beside a worker's
registration, or on a pooling request's first use), and taken as generate-only when the
engine has no utility calls, fails the call or never answers (bounded, nothing pending)."""

from __future__ import annotations

from pathlib import Path

import trio

from smg_trio.connector.tasks import DEFAULT_TASKS, learn_tasks
from smg_trio.mock.engine import MockEngineConfig
from smg_trio.mock.pooling import MockPooler
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.worker.registration import RegistrationTiming
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import serving
from tests.helpers.ipc import IpcNamespace
from tests.worker.test_manager import make_spec, open_manager, start_engine

POOLER = MockPooler(labels=("a", "b"))


async def test_a_pooling_engine_answers_its_tasks(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(pooler=POOLER)) as (client, _):
            assert client.tasks.tasks is None
            assert not client.tasks.refuses_generation()
            await learn_tasks(client, IO_DEADLINE_S, "w")
            assert client.tasks.tasks == {"embed", "classify"}
            assert client.tasks.refuses_generation()


async def test_an_engine_that_never_answers_is_generate_only(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            engine.utility.silent.add("get_supported_tasks")
            assert await client.tasks.ensure(client, 0.05, "w") == DEFAULT_TASKS
            assert client.tasks.tasks == DEFAULT_TASKS
            assert client.utility_pending == 0


async def test_an_unusable_answer_is_generate_only(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            engine.utility.supported_tasks = "not a list"  # type: ignore[assignment]
            await learn_tasks(client, IO_DEADLINE_S, "w")
            assert client.tasks.tasks == DEFAULT_TASKS


async def test_tokenspeed_has_no_utility_calls(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol="tokenspeed")) as (client, _):
            await learn_tasks(client, IO_DEADLINE_S, "w")
            assert client.tasks.tasks == DEFAULT_TASKS


async def test_registration_learns_the_tasks_without_waiting_for_them(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with open_manager(registration_timing=RegistrationTiming(tasks_timeout_s=60)) as (
            manager,
            nursery,
        ):
            pooling = make_spec(ns, "pool", model_dir, model_id="p")
            engine = await start_engine(nursery, pooling, MockEngineConfig(pooler=POOLER))
            await manager.register(pooling)
            (worker,) = manager.workers
            client = worker.engine_client
            assert client is not None
            assert await client.tasks.wait() == {"embed", "classify"}
            assert ("get_supported_tasks", []) in engine.utility.calls
            # an engine that never answers still registers (the bound is 60 s)
            silent = make_spec(ns, "gen", model_dir, model_id="g")
            cfg = MockEngineConfig()
            other = await start_engine(nursery, silent, cfg)
            other.utility.silent.add("get_supported_tasks")
            await manager.register(silent)
