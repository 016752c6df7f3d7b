"""WorkerManager with ``tcp://`` workers: a mock engine (``local: false``) registers over tcp
and serves; a wildcard bind needs an advertised host; engines outside the allow-list never
make the worker ready."""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import pytest
import trio

from smg_trio.errors import ValidationError
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.transport.tcp import TcpOptions
from smg_trio.worker.manager import WorkerSpec
from tests.helpers.ports import free_port
from tests.worker.test_manager import DEADLINE_S, one_request, open_manager


def tcp_spec(model_dir: Path, url: str | None = None) -> WorkerSpec:
    url = url or f"tcp://127.0.0.1:{free_port()}"
    return WorkerSpec(url=url, model_path=str(model_dir), model_id="m", runtime_type="vllm")


async def test_a_tcp_worker_registers_and_serves(model_dir: Path) -> None:
    spec = tcp_spec(model_dir)
    with trio.fail_after(DEADLINE_S):
        async with open_manager() as (manager, nursery):
            engine = MockEngine(spec.url, MockEngineConfig(step_s=0.001))
            nursery.start_soon(engine.run)
            worker = await manager.register(spec)
            assert worker.status == "ready"
            assert worker.handshake_address == spec.url
            assert await one_request(manager, "m", "tcp-r1") == worker.worker_id
            client = worker.engine_client
            assert client is not None
            assert client._sockets.input_address.startswith("tcp://127.0.0.1:")


async def test_a_wildcard_tcp_worker_needs_an_advertised_host(model_dir: Path) -> None:
    async with open_manager() as (manager, _):
        manager.confinement = manager.confinement.__class__(
            socket_dirs=manager.confinement.socket_dirs,
            model_dirs=manager.confinement.model_dirs,
            engine_hosts=("0.0.0.0",),
        )
        with pytest.raises(ValidationError, match="--zmq-advertise-host") as err:
            manager.validate_spec(tcp_spec(model_dir, "tcp://0.0.0.0:7100"))
        assert err.value.param == "url"
        manager.tcp = TcpOptions(advertise_host="10.0.0.1")
        manager.validate_spec(tcp_spec(model_dir, "tcp://0.0.0.0:7100"))


async def test_an_engine_outside_the_allow_list_never_makes_the_worker_ready(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = tcp_spec(model_dir)
    with trio.fail_after(DEADLINE_S):
        async with open_manager(ready_timeout_s=0.5, tcp=TcpOptions(allow_loopback=False)) as (
            manager,
            nursery,
        ):
            engine = MockEngine(spec.url, MockEngineConfig(step_s=0.001))
            nursery.start_soon(engine.run)
            job = manager.add_worker(spec)
            await job.done.wait()
            assert job.status == "failed"
            assert "HELLO" in (job.error or "")
            assert manager.registry.get(job.worker_id or "") is None
            assert list(manager.list_models()) == []
    assert "refused, the host is not loopback or in --allowed-engine-hosts" in caplog.text


async def test_a_tcp_worker_off_loopback_is_warned_about(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its prompts cross the network unencrypted, and its engines are admitted by address:
    # the operator is told to keep it on a trusted network (issue 28, item 2).
    caplog.set_level(logging.WARNING, logger="smg_trio.worker.spec")
    with trio.fail_after(DEADLINE_S):
        async with open_manager(tcp=TcpOptions(advertise_host="127.0.0.1")) as (manager, _):
            manager.confinement = attrs.evolve(manager.confinement, engine_hosts=("0.0.0.0",))
            manager.add_worker(tcp_spec(model_dir))
            assert "trusted, private network" not in caplog.text  # loopback: this host only
            remote = tcp_spec(model_dir, f"tcp://0.0.0.0:{free_port()}")
            manager.add_worker(remote)
            assert f"worker {remote.url!r}: its engine traffic" in caplog.text
            assert "trusted, private network" in caplog.text
