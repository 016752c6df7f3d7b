"""WorkerManager against mock engines over real ZMQ: load sharing under every policy, removal
mid-traffic, engine death and automatic recovery, add/remove races, handshake-address
collisions, and a never-dialing engine that must not block anything (B24, B25)."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from smg_trio.backend import NoWorkerAvailable
from smg_trio.errors import EngineError, ValidationError
from smg_trio.gateway.openai.errors import to_api_error
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.protocol.addresses import derive_handshake_port
from smg_trio.protocol.handshake import decode_init, encode_status
from smg_trio.protocol.types import GenerateRequest, SamplingOptions
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager, WorkerSpec, WorkerState
from smg_trio.worker.policies import POLICY_NAMES
from tests.helpers.hostile import open_raw_peer
from tests.helpers.ipc import IpcNamespace, free_handshake_address, wait_tcp_listener_gone

DEADLINE_S = 30.0  # generous: CI machines are shared; a pass takes ~1 s


def make_spec(
    ns: IpcNamespace, name: str, model_dir: Path, *, model_id: str = "m", **kw: object
) -> WorkerSpec:
    kw.setdefault("zmq_handshake_address", free_handshake_address())
    kw.setdefault("runtime_type", "vllm")
    return WorkerSpec(url=ns.worker_url(name), model_path=str(model_dir), model_id=model_id, **kw)  # type: ignore[arg-type]


def temp_confinement() -> WorkerConfinement:
    tmp = tempfile.gettempdir()
    return WorkerConfinement(socket_dirs=(tmp,), model_dirs=(str(default_tiny_model_dir()), tmp))


@asynccontextmanager
async def open_manager(**kw: object) -> AsyncIterator[tuple[WorkerManager, trio.Nursery]]:
    """A manager in a test nursery (everything is cancelled on exit). Its confinement allows
    the test namespaces' sockets (under the temp dir) and the tiny model."""
    kw.setdefault("ready_timeout_s", 5.0)
    kw.setdefault("confinement", temp_confinement())
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, **kw)  # type: ignore[arg-type]
        yield manager, nursery
        nursery.cancel_scope.cancel()


async def start_engine(
    nursery: trio.Nursery, spec: WorkerSpec, config: MockEngineConfig | None = None
) -> MockEngine:
    """Start a mock that dials ``spec``'s handshake address (ZMQ retries until it is bound)."""
    assert spec.zmq_handshake_address is not None
    engine = MockEngine(spec.zmq_handshake_address, config or MockEngineConfig(step_s=0.001))
    nursery.start_soon(engine.run)
    return engine


async def serve_worker(
    manager: WorkerManager, nursery: trio.Nursery, spec: WorkerSpec
) -> tuple[WorkerState, MockEngine]:
    """Start a mock for ``spec`` and register it. The mock dials only once an earlier
    registration's handshake listener at the same address is gone (an engine it accepted
    would lose its HELLO, which engines send once)."""
    assert spec.zmq_handshake_address is not None
    await wait_tcp_listener_gone(spec.zmq_handshake_address)
    engine = await start_engine(nursery, spec)
    return await manager.register(spec), engine


async def wait_until(predicate: object) -> None:
    """Checkpoint until ``predicate()`` holds; callers run under ``fail_after``."""
    assert callable(predicate)
    while not predicate():
        await trio.lowlevel.checkpoint()


def gen_request(rid: str, max_tokens: int = 3) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, prompt_token_ids=[1, 2, 3], sampling=SamplingOptions(max_tokens=max_tokens)
    )


async def one_request(manager: WorkerManager, model: str, rid: str, max_tokens: int = 3) -> str:
    """Lease a worker, stream one request to its end; return the worker id."""
    with manager.lease(model) as lease:
        async with lease.client.generate(gen_request(rid, max_tokens)) as stream:
            outputs = [o async for o in stream]
        assert outputs[-1].finish_reason is not None
        return lease.worker_id


# -- load sharing ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
async def test_two_workers_share_load_under_each_policy(
    ns: IpcNamespace, model_dir: Path, policy: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager(policy=policy) as (manager, nursery):
            w0, _ = await serve_worker(manager, nursery, make_spec(ns, "a", model_dir))
            w1, _ = await serve_worker(manager, nursery, make_spec(ns, "b", model_dir))
            assert w0.status == w1.status == "ready"
            chosen: Counter[str] = Counter()

            async def client(c: int) -> None:
                for i in range(12):
                    chosen[await one_request(manager, "m", f"{policy}-{c}-{i}")] += 1

            async with trio.open_nursery() as clients:
                for c in range(3):
                    clients.start_soon(client, c)
            assert set(chosen) == {w0.worker_id, w1.worker_id}, chosen
            assert sum(chosen.values()) == 36
            assert w0.inflight == w1.inflight == 0


# -- removal -----------------------------------------------------------------------------


async def test_worker_removed_mid_traffic_no_request_hangs(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager(policy="round_robin", drain_timeout_s=0.3) as (manager, nursery):
            w0, _ = await serve_worker(manager, nursery, make_spec(ns, "a", model_dir))
            w1, _ = await serve_worker(manager, nursery, make_spec(ns, "b", model_dir))
            served: Counter[str] = Counter()
            failed: list[BaseException] = []
            removed = trio.Event()
            after_removal: Counter[str] = Counter()

            stop = trio.Event()

            async def traffic(c: int) -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        wid = await one_request(manager, "m", f"t{c}-{i}")
                    except EngineError as exc:  # cut off by the removal: an error, not a hang
                        failed.append(exc)
                        continue
                    served[wid] += 1
                    if removed.is_set():
                        after_removal[wid] += 1

            async def long_request() -> None:
                # Outlives the drain window: must fail with an error once the worker goes.
                try:
                    with manager.lease("m") as lease:
                        assert lease.worker_id == w0.worker_id
                        async with lease.client.generate(gen_request("long", 100_000)) as s:
                            async for _ in s:
                                pass
                except EngineError as exc:
                    failed.append(exc)
                else:
                    pytest.fail("a request outliving the drain must fail")

            async with trio.open_nursery() as clients:
                clients.start_soon(long_request)  # round robin: first pick is w0
                await wait_until(lambda: w0.inflight == 1)
                for c in range(3):
                    clients.start_soon(traffic, c)
                await wait_until(lambda: sum(served.values()) >= 6)
                assert await manager.remove_worker(w0.worker_id)
                removed.set()
                assert w0.status == "removed"
                assert manager.get_worker(w0.worker_id) is None
                await wait_until(lambda: sum(after_removal.values()) >= 6)
                stop.set()
            assert failed, "the long request must have failed"
            assert set(after_removal) <= {w1.worker_id}
            assert after_removal[w1.worker_id] > 0
            assert await one_request(manager, "m", "after") == w1.worker_id
            assert not await manager.remove_worker(w0.worker_id)  # unknown now


# -- engine death and recovery -------------------------------------------------------------


@pytest.mark.parametrize("death", ["sentinel", "silent_timeout", "silent_kill_client"])
async def test_engine_killed_and_restarted_worker_recovers(
    ns: IpcNamespace, model_dir: Path, death: str
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager(silence_timeout_s=0.3) as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            worker, engine = await serve_worker(manager, nursery, spec)
            assert await one_request(manager, "m", "before") == worker.worker_id
            errors: list[BaseException] = []
            started = trio.Event()

            async def in_flight() -> None:
                try:
                    with manager.lease("m") as lease:
                        async with lease.client.generate(gen_request("inflight", 100_000)) as s:
                            started.set()
                            async for _ in s:
                                pass
                except EngineError as exc:
                    errors.append(exc)

            async with trio.open_nursery() as inner:
                inner.start_soon(in_flight)
                await started.wait()
                if death == "sentinel":
                    await engine.die_with_sentinel()
                else:
                    engine.die_silently()
                    if death == "silent_kill_client":
                        await engine.dead.wait()
                        manager.kill_worker_client(spec.url, "engine process exited")
            assert len(errors) == 1  # the in-flight request failed fast, it did not hang
            await wait_until(lambda: worker.status == "unhealthy")
            assert not worker.healthy
            with pytest.raises(NoWorkerAvailable), manager.lease("m"):
                pass
            assert not manager.readiness().ready

            await start_engine(nursery, spec)  # a new engine process at the same address
            await wait_until(lambda: worker.healthy)
            assert worker.status == "ready"
            assert manager.get_worker(worker.worker_id) is worker
            assert await one_request(manager, "m", "after") == worker.worker_id
            assert manager.readiness().ready


async def test_hello_sent_before_the_death_is_noticed_is_answered(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """A restarted engine says HELLO once, often before the gateway has seen the old one die.
    That HELLO must survive the re-bind (it used to be lost with the closed handshake ROUTER,
    and the engine then waited for an INIT forever: issue 15 item 8)."""
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            assert spec.zmq_handshake_address is not None
            worker, engine = await serve_worker(manager, nursery, spec)
            engine.die_silently()  # idle: nothing in flight, so the gateway cannot tell yet
            await engine.dead.wait()
            registration = engine.registration()
            async with open_raw_peer(spec.zmq_handshake_address, b"\x00\x00") as restarted:
                await restarted.send(encode_status("HELLO"))
                await restarted.wait_connected()  # HELLO is on its way to the gateway
                assert worker.status == "ready"
                manager.kill_worker_client(spec.url, "engine process exited")
                with trio.fail_after(5.0):
                    (init_frame,) = await restarted.recv()
                init = decode_init(init_frame)
                await restarted.send(encode_status("READY"))
                async with open_raw_peer(init.addresses.inputs[0], b"\x00\x00") as inp:
                    await inp.send(registration)
                    await wait_until(lambda: worker.healthy)
                    assert worker.status == "ready"


async def test_hostile_peer_racing_a_restart_does_not_keep_the_worker_down(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """Issue 18 finding 4: while the engine restarts, a local stranger with the engine's
    identity says HELLO, sends garbage and HELLO again. The restarted engine must still be taken
    back and serve, within seconds (it used to abort the handshake, and the worker stayed down
    for minutes)."""
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            assert spec.zmq_handshake_address is not None
            worker, engine = await serve_worker(manager, nursery, spec)
            await engine.die_with_sentinel()
            await wait_until(lambda: worker.status == "unhealthy")
            async with open_raw_peer(spec.zmq_handshake_address, b"\x00\x00") as stranger:
                await stranger.send(encode_status("HELLO"))
                await stranger.recv()  # the gateway took the stranger's HELLO: it holds INIT
                with trio.fail_after(10.0):  # seconds, not minutes
                    await start_engine(nursery, spec)  # its HELLO is a duplicate
                    for garbage in [b"\xc1", b"", encode_status("READY"), encode_status("HELLO")]:
                        await stranger.send(garbage)
                    await wait_until(lambda: worker.healthy)
                    assert await one_request(manager, "m", "after") == worker.worker_id
                await stranger.send(encode_status("HELLO"), b"more")  # after: still harmless
            assert worker.status == "ready"
            assert await one_request(manager, "m", "after-2") == worker.worker_id


async def test_garbage_on_the_handshake_port_in_steady_state_is_harmless(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """Issue 18 (held up): while the worker serves, local strangers (the engine's identity and
    others) send garbage, HELLOs and READYs to its handshake port. The worker stays ready and
    serves; and a real restart afterwards is still taken back (the garbage queued on the
    persistent handshake socket does not block it)."""
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            assert spec.zmq_handshake_address is not None
            worker, engine = await serve_worker(manager, nursery, spec)
            junk = [b"\xc1", b"", b"\x00" * 70000, encode_status("HELLO"), encode_status("READY")]
            for identity in (b"\x00\x00", b"\x01\x00", b"stranger"):
                async with open_raw_peer(spec.zmq_handshake_address, identity) as stranger:
                    for frame in junk:
                        await stranger.send(frame)
                    await stranger.send(encode_status("HELLO"), b"extra")
                    assert await one_request(manager, "m", f"during-{identity!r}") == (
                        worker.worker_id
                    )
            assert worker.status == "ready"
            await engine.die_with_sentinel()
            await wait_until(lambda: worker.status == "unhealthy")
            await start_engine(nursery, spec)
            await wait_until(lambda: worker.healthy)
            assert await one_request(manager, "m", "after-restart") == worker.worker_id


# -- add/remove races ----------------------------------------------------------------------


async def test_add_then_remove_before_engine_dials_frees_everything(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            # 1. removed before the registration task even ran.
            job = manager.add_worker(spec)
            assert job.worker_id is not None
            assert await manager.remove_worker(job.worker_id)
            await job.done.wait()
            assert job.status in ("cancelled", "failed")
            assert manager.get_worker(job.worker_id) is None
            assert manager.get_model("m") is None

            # 2. removed while the handshake is waiting (sockets bound, nobody dialed).
            job = manager.add_worker(spec)
            assert job.worker_id is not None
            in_sock = ns.worker_url("a").removeprefix("ipc://") + "-in.sock"
            await wait_until(lambda: os.path.exists(in_sock))
            assert manager.get_worker(job.worker_id) is not None
            assert await manager.remove_worker(job.worker_id)
            await job.done.wait()
            assert job.status in ("cancelled", "failed")
            assert job.error
            assert len(manager.registry) == 0

            # 3. the same URL and handshake address register again with a real engine.
            worker, _ = await serve_worker(manager, nursery, spec)
            assert worker.status == "ready"
            assert await one_request(manager, "m", "r") == worker.worker_id


async def test_concurrent_add_and_remove_same_url(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            outcomes: list[str] = []

            async def add_remove(i: int) -> None:
                try:
                    job = manager.add_worker(spec)
                except ValidationError as exc:
                    outcomes.append(f"conflict-{to_api_error(exc).status}")
                    return
                assert job.worker_id is not None
                await trio.lowlevel.checkpoint()
                await manager.remove_worker(job.worker_id)
                await job.done.wait()
                outcomes.append(job.status)

            for _ in range(5):
                async with trio.open_nursery() as racers:
                    for i in range(4):
                        racers.start_soon(add_remove, i)
                assert len(manager.registry) == 0
            assert set(outcomes) <= {"conflict-409", "cancelled", "failed"}
            worker, _ = await serve_worker(manager, nursery, spec)
            assert await one_request(manager, "m", "r") == worker.worker_id


# -- validation ------------------------------------------------------------------------------


def _colliding_paths(directory: str) -> tuple[str, str]:
    """Two ipc paths whose derived FNV handshake ports collide."""
    seen: dict[int, str] = {}
    for i in range(100_000):
        path = f"{directory}/w{i}"
        port = derive_handshake_port(path)
        if port in seen:
            return seen[port], path
        seen[port] = path
    raise AssertionError("no collision found")


async def test_handshake_address_collisions_name_both_urls(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, _):
            hs = free_handshake_address()
            first = make_spec(ns, "a", model_dir, zmq_handshake_address=hs)
            second = make_spec(ns, "b", model_dir, zmq_handshake_address=hs)
            manager.add_worker(first)
            with pytest.raises(ValidationError) as err:
                manager.add_worker(second)
            assert to_api_error(err.value).status == 409
            assert err.value.param == "zmq_handshake_address"
            assert first.url in err.value.message
            assert second.url in err.value.message

            # The derived FNV port collides too (smg's hash-collision case).
            p1, p2 = _colliding_paths(ns.directory)
            d1 = WorkerSpec(url=f"ipc://{p1}", model_path=str(model_dir), runtime_type="vllm")
            d2 = WorkerSpec(url=f"ipc://{p2}", model_path=str(model_dir), runtime_type="vllm")
            manager.add_worker(d1)
            with pytest.raises(ValidationError) as err:
                manager.add_worker(d2)
            assert d1.url in err.value.message
            assert d2.url in err.value.message

            # Same URL again: 409 as well.
            with pytest.raises(ValidationError) as err:
                manager.add_worker(first)
            assert to_api_error(err.value).status == 409
            assert err.value.param == "url"


async def test_spec_validation_rejects_before_binding(ns: IpcNamespace, model_dir: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            bad = {
                "zmq_handshake_address": make_spec(
                    ns, "a", model_dir, zmq_handshake_address=f"ipc://{ns.directory}/hs"
                ),
                "runtime_type": make_spec(ns, "b", model_dir, runtime_type="sglang"),
                "url": WorkerSpec(url="http://127.0.0.1:8000", model_path=str(model_dir)),
                "dp_size": make_spec(ns, "c", model_dir, dp_size=0),
                "model_path": WorkerSpec(url=ns.worker_url("d")),
            }
            for param, spec in bad.items():
                with pytest.raises(ValidationError) as err:
                    manager.add_worker(spec)
                assert to_api_error(err.value).status == 400, param
                assert err.value.param == param
            assert len(manager.registry) == 0
            assert not manager.jobs
            await trio.lowlevel.checkpoint()
            assert os.listdir(ns.directory) == []  # nothing was bound

            # No runtime_type means vllm.
            spec = make_spec(ns, "e", model_dir, runtime_type=None)
            worker, _ = await serve_worker(manager, nursery, spec)
            assert worker.runtime == "vllm"


async def test_registration_fails_loudly_on_bad_model_path(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, _):
            missing = tempfile.mkdtemp(prefix="smg-") + "/nope"
            job = manager.add_worker(
                WorkerSpec(url=ns.worker_url("a"), model_path=missing, runtime_type="vllm")
            )
            await job.done.wait()
            assert job.status == "failed"
            assert job.error is not None
            assert "model_path" in job.error
            assert len(manager.registry) == 0


# -- B25: a never-dialing engine blocks nothing ---------------------------------------------


async def test_never_dialing_engine_does_not_block_other_models(
    ns: IpcNamespace, model_dir: Path
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            fast, _ = await serve_worker(
                manager, nursery, make_spec(ns, "fast", model_dir, model_id="fast")
            )
            slow_job = manager.add_worker(make_spec(ns, "slow", model_dir, model_id="slow"))
            assert slow_job.worker_id is not None
            slow = manager.get_worker(slow_job.worker_id)
            assert slow is not None
            await wait_until(lambda: manager.get_model("slow") is not None)
            assert slow.status == "pending"
            assert not slow_job.done.is_set()
            with trio.fail_after(1.0):
                for i in range(5):
                    with pytest.raises(NoWorkerAvailable), manager.lease("slow"):
                        pass
                    assert await one_request(manager, "fast", f"f{i}") == fast.worker_id
            assert manager.readiness().ready  # one healthy worker serves
            with trio.fail_after(1.0):
                assert await manager.remove_worker(slow.worker_id)
                await slow_job.done.wait()
            assert slow_job.status in ("cancelled", "failed")
            # known for the grace period (requests wait, then 503), never listed
            assert "slow" in manager.known_models()
            assert [m.model_id for m in manager.list_models()] == ["fast"]
            assert manager.get_model("fast") is not None


async def test_mass_engine_death_trips_circuit_but_restart_recovers_at_once(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """Many in-flight requests failing on one engine death open the breaker; the restarted
    engine's re-handshake proves the worker healthy again (no 60 s half-open wait)."""
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            spec = make_spec(ns, "a", model_dir)
            worker, engine = await serve_worker(manager, nursery, spec)
            errors: list[BaseException] = []

            async def in_flight(i: int) -> None:
                try:
                    with manager.lease("m") as lease:
                        async with lease.client.generate(gen_request(f"r{i}", 100_000)) as s:
                            async for _ in s:
                                pass
                except EngineError as exc:
                    errors.append(exc)

            async with trio.open_nursery() as inner:
                for i in range(12):
                    inner.start_soon(in_flight, i)
                await wait_until(lambda: len(engine.active) == 12)
                await engine.die_with_sentinel()
            assert len(errors) == 12
            assert str(worker.circuit.state) == "open"
            await wait_until(lambda: worker.status == "unhealthy")
            await start_engine(nursery, spec)
            await wait_until(lambda: worker.client is not None and worker.status == "ready")
            assert worker.healthy
            assert await one_request(manager, "m", "after") == worker.worker_id
