"""The registration workflow over real ZMQ: per-step timeouts, retries of transient failures
only, the DP-group branch, and the failure step that undoes a failed registration."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from smg_trio.mock.engine import MockEngineConfig
from smg_trio.protocol.handshake import encode_status
from smg_trio.worker import registration_flow
from smg_trio.worker.jobs import RegistrationJob
from smg_trio.worker.manager import WorkerManager, WorkerSpec
from smg_trio.worker.registration import RegistrationTiming
from smg_trio.workflow import RetryPolicy
from tests.helpers.hostile import open_raw_peer
from tests.helpers.ipc import IpcNamespace, tcp_listener_gone
from tests.worker.test_manager import (
    DEADLINE_S,
    make_spec,
    one_request,
    open_manager,
    start_engine,
    wait_until,
)

FAST = RetryPolicy(max_attempts=3, initial_s=0.01, max_s=0.01)


def timing(**kw: Any) -> RegistrationTiming:
    kw.setdefault("tokenizer_retry", FAST)
    kw.setdefault("bind_retry", FAST)
    kw.setdefault("handshake_retry", FAST)
    return RegistrationTiming(**kw)


def socket_files(namespace: IpcNamespace, name: str) -> list[str]:
    base = namespace.worker_url(name).removeprefix("ipc://")
    return [p for p in (base + "-in.sock", base + "-out.sock") if os.path.exists(p)]


async def assert_cleaned_up(
    manager: WorkerManager, namespace: IpcNamespace, spec: WorkerSpec
) -> None:
    """What the failure step must leave: no registry or model entry, no ipc files, and the
    handshake port released (libzmq frees the fd in its I/O thread just after the close)."""
    assert spec.zmq_handshake_address is not None
    assert len(manager.registry) == 0
    assert manager.get_model("m") is None
    assert socket_files(namespace, spec.url.rsplit("/", 1)[-1]) == []
    address = spec.zmq_handshake_address
    with trio.fail_after(5.0):
        await wait_until(lambda: tcp_listener_gone(address))


async def wait_done(job: RegistrationJob) -> None:
    with trio.fail_after(DEADLINE_S):
        await job.done.wait()


# -- timeouts and retries ----------------------------------------------------------------------


async def test_handshake_step_timeout_fails_the_job_with_a_clear_error(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """No engine ever dials: the step's own deadline ends each attempt (the handshake's
    per-stage deadline is far away), and the job says which step timed out after how long."""
    t = timing(handshake_timeout_s=0.2, handshake_retry=RetryPolicy(max_attempts=2, initial_s=0))
    async with open_manager(ready_timeout_s=60.0, registration_timing=t) as (manager, _):
        spec = make_spec(ns, "a", model_dir)
        job = manager.add_worker(spec)
        await wait_done(job)
        assert job.status == "failed"
        assert job.error == ("step handshake: step 'handshake' attempt 2 timed out after 0.2 s")
        assert job.to_json()["attempts"]["handshake"] == 2
        assert job.steps["cleanup"] == "succeeded"
        await assert_cleaned_up(manager, ns, spec)


async def test_transient_handshake_failure_is_retried_then_succeeds(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """A peer that says HELLO and never READY (an engine that died mid-handshake) times the
    first attempt out; the retry, on the same handshake ROUTER, takes the real engine."""
    t = timing(handshake_retry=RetryPolicy(max_attempts=5, initial_s=0.01, max_s=0.01))
    async with open_manager(ready_timeout_s=1.0, registration_timing=t) as (
        manager,
        nursery,
    ):
        spec = make_spec(ns, "a", model_dir)
        assert spec.zmq_handshake_address is not None
        job = manager.add_worker(spec)
        with trio.fail_after(DEADLINE_S):
            async with open_raw_peer(spec.zmq_handshake_address, b"\x00\x00") as dying:
                await dying.send(encode_status("HELLO"))
                await dying.recv()  # INIT; then it "dies"
                await wait_until(
                    lambda: "handshake" in job.states and job.states["handshake"].attempt >= 2
                )
            assert "waiting for READY" in (job.states["handshake"].last_error or "")
            await start_engine(nursery, spec)
            await wait_done(job)
        assert job.status == "succeeded", job.error
        assert job.to_json()["attempts"]["handshake"] >= 2
        assert job.steps["cleanup"] == "skipped"
        assert await one_request(manager, "m", "r") == job.worker_id


async def test_validation_failure_is_not_retried(ns: IpcNamespace, tmp_path: Path) -> None:
    async with open_manager(registration_timing=timing()) as (manager, _):
        spec = WorkerSpec(url=ns.worker_url("a"), model_path=str(tmp_path / "nope"))
        job = manager.add_worker(spec)
        await wait_done(job)
        assert job.status == "failed"
        assert job.error is not None
        assert "model_path" in job.error
        assert job.to_json()["attempts"] == {"load_tokenizer": 1, "cleanup": 1}
        assert len(manager.registry) == 0


async def test_transient_tokenizer_error_is_retried(
    ns: IpcNamespace, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = registration_flow.load_model
    calls = 0

    def flaky(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(5, "Input/output error")
        return real(*args)

    monkeypatch.setattr(registration_flow, "load_model", flaky)
    async with open_manager(registration_timing=timing()) as (manager, nursery):
        spec = make_spec(ns, "a", model_dir)
        await start_engine(nursery, spec)
        job = manager.add_worker(spec)
        await wait_done(job)
        assert job.status == "succeeded", job.error
        assert job.to_json()["attempts"]["load_tokenizer"] == 2


async def test_tokenizer_load_keeps_the_event_loop_running(
    ns: IpcNamespace, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow tokenizer load (``POST /workers``) runs in a worker thread: while it is in
    progress, other tasks (every running stream) keep being scheduled. Were it on the loop,
    the load would hold the loop until its own release, which then never comes."""
    real = registration_flow.load_model
    loading, release = threading.Event(), threading.Event()
    stalled: list[str] = []

    def slow(*args: Any) -> Any:
        loading.set()
        if not release.wait(DEADLINE_S):  # never released: the loop is stuck behind this
            stalled.append("the event loop did not run while the tokenizer loaded")
            raise ValueError(stalled[0])
        return real(*args)

    monkeypatch.setattr(registration_flow, "load_model", slow)
    async with open_manager(registration_timing=timing()) as (manager, nursery):
        spec = make_spec(ns, "a", model_dir)
        await start_engine(nursery, spec)
        job = manager.add_worker(spec)
        ticked = trio.Event()

        async def ticker() -> None:  # stands for a stream's writer: it needs the loop
            for _ in range(20):
                await trio.lowlevel.checkpoint()
            ticked.set()

        with trio.fail_after(DEADLINE_S):
            await trio.to_thread.run_sync(loading.wait)
            nursery.start_soon(ticker)
            await ticked.wait()
        assert not job.done.is_set(), "the load finished before the loop ran"
        release.set()
        await wait_done(job)
        assert stalled == []
        assert job.status == "succeeded", job.error


# -- the DP branch ----------------------------------------------------------------------------


async def test_dp_group_check_runs_only_for_dp_workers(ns: IpcNamespace, model_dir: Path) -> None:
    async with open_manager() as (manager, nursery):
        single = make_spec(ns, "one", model_dir)
        await start_engine(nursery, single)
        job = manager.add_worker(single)
        await wait_done(job)
        assert job.status == "succeeded", job.error
        assert job.steps["check_dp_group"] == "skipped"

        group = make_spec(ns, "two", model_dir, dp_size=2, model_id="g")
        for rank, max_len in ((0, 4096), (1, 2048)):
            cfg = MockEngineConfig(step_s=0.001, engine_index=rank, max_model_len=max_len)
            await start_engine(nursery, group, cfg)
        job = manager.add_worker(group)
        await wait_done(job)
        assert job.status == "succeeded", job.error
        assert job.steps["check_dp_group"] == "succeeded"
        worker = manager.get_worker(job.worker_id or "")
        assert worker is not None
        assert sorted(worker.metadata["dp_ranks"]) == [0, 1]
        assert worker.metadata["dp_mode"] == "independent"
        model = manager.get_model("g")
        assert model is not None
        assert model.max_model_len == 2048  # the smallest rank's


async def test_inconsistent_dp_group_fails_and_the_failure_step_cleans_up(
    ns: IpcNamespace, model_dir: Path
) -> None:
    """Rank 1 reports a lockstep group, rank 0 does not: the handshake completed (sockets
    bound, client live), the DP check fails at once, and the failure step closes the sockets,
    unlinks the ipc files and drops the registry and model entries."""
    async with open_manager() as (manager, nursery):
        spec = make_spec(ns, "a", model_dir, dp_size=2)
        for rank, size in ((0, 1), (1, 2)):
            cfg = MockEngineConfig(step_s=0.001, engine_index=rank, data_parallel_size=size)
            await start_engine(nursery, spec, cfg)
        job = manager.add_worker(spec)
        await wait_done(job)
        assert job.status == "failed"
        assert "step check_dp_group" in (job.error or "")
        assert "disagree on data_parallel_size" in (job.error or "")
        assert job.to_json()["attempts"]["check_dp_group"] == 1
        assert job.steps["handshake"] == "succeeded"
        assert job.steps["cleanup"] == "succeeded"
        await assert_cleaned_up(manager, ns, spec)


async def test_registration_reads_the_sampling_defaults(
    ns: IpcNamespace, model_dir: Path, tmp_path: Path
) -> None:
    """The model's generation_config.json sampling fields become its requests' defaults, as
    vLLM's server applies them (tests/gateway/test_gateway_chat.py checks the wire)."""
    import json
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    gen = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.6}))
    async with open_manager() as (manager, nursery):
        spec = make_spec(ns, "a", copy)
        job = manager.add_worker(spec)
        with trio.fail_after(DEADLINE_S):
            await start_engine(nursery, spec)
            await wait_done(job)
        assert job.status == "succeeded", job.error
        assert manager.models["m"].sampling_defaults == {"temperature": 0.6}
