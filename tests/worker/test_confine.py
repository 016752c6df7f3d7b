"""WorkerConfinement: which ipc URLs, handshake hosts and model paths a worker spec may name,
and that a refused spec is refused before anything is logged (issue 18, findings 1, 5, 9)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import trio

from smg_trio.errors import ModelPathError, ValidationError
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.worker.confine import WorkerConfinement, escape, hf_hub_cache
from smg_trio.worker.manager import WorkerManager, WorkerSpec
from tests.helpers.ipc import IpcNamespace, free_handshake_address

SOCK = "/run/smg-test-sockets"
MODELS = "/srv/smg-test-models"


@pytest.fixture
def conf() -> WorkerConfinement:
    return WorkerConfinement(socket_dirs=(SOCK,), model_dirs=(MODELS,))


@pytest.mark.parametrize(
    "url", [f"ipc://{SOCK}/w", f"ipc://{SOCK}/sub/dir/w", "tcp://127.0.0.1:5555", "tcp://[::1]:7"]
)
def test_urls_under_the_socket_dir_pass(conf: WorkerConfinement, url: str) -> None:
    conf.check_url(url)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("ipc://@x", "abstract"),
        (f"ipc://@{SOCK}/w", "abstract"),
        ("ipc://relative/w", "absolute"),
        ("ipc://w", "absolute"),
        (f"ipc://{SOCK}/../etc/w", ".."),
        (f"ipc://{SOCK}/./w", ".."),
        (f"ipc://{SOCK}//w", "normalized"),  # one spelling per socket (breaker: aliases)
        (f"ipc://{SOCK}/w/", "normalized"),
        ("ipc:///tmp/w", "outside the allowed socket directories"),
        (f"ipc://{SOCK}-other/w", "outside the allowed socket directories"),
        (f"ipc://{SOCK}", "outside the allowed socket directories"),
        ("tcp://10.0.0.5:5555", "--allowed-engine-hosts"),  # a remote bind must be named
        ("tcp://0.0.0.0:5555", "--allowed-engine-hosts"),
        ("tcp://127.0.0.1:*", "tcp://HOST:PORT"),  # engines must know the port
        ("tcp://127.0.0.1", "tcp://HOST:PORT"),
        ("http://127.0.0.1:5555", "ipc://"),
        ("ipc://", "ipc://"),
        (f"ipc://{SOCK}/w\nINFO forged line", "control characters"),
        (f"ipc://{SOCK}/w\x1b[2J", "control characters"),
    ],
)
def test_bad_urls_are_refused_naming_url(conf: WorkerConfinement, url: str, needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        conf.check_url(url)
    assert err.value.param == "url"
    assert needle in err.value.message
    assert "\n" not in err.value.message
    assert "\x1b" not in err.value.message


def test_a_url_outside_the_socket_dirs_is_refused_without_naming_them(
    conf: WorkerConfinement, caplog: pytest.LogCaptureFixture
) -> None:
    # The allowed directories are the gateway's business: the 400 says how to allow one,
    # the log names them (issue 28, item 8).
    caplog.set_level(logging.WARNING, logger="smg_trio.worker.confine")
    with pytest.raises(ValidationError) as err:
        conf.check_url("ipc:///var/run/elsewhere/w")
    assert "--allowed-socket-dirs" in err.value.message
    assert SOCK not in err.value.message
    assert SOCK in caplog.text


def test_an_allowed_engine_host_may_bind_a_tcp_worker() -> None:
    conf = WorkerConfinement(socket_dirs=(SOCK,), model_dirs=(MODELS,), engine_hosts=("10.0.0.5",))
    conf.check_url("tcp://10.0.0.5:5555")
    assert conf.host_allowed("10.0.0.5")
    assert not conf.host_allowed("10.0.0.6")


def test_extra_allowed_socket_dirs(conf: WorkerConfinement) -> None:
    wider = WorkerConfinement(socket_dirs=(SOCK, "/var/lib/smg/../smg2"), model_dirs=(MODELS,))
    wider.check_url("ipc:///var/lib/smg2/w")  # the allowed dirs are normalised
    with pytest.raises(ValidationError):
        conf.check_url("ipc:///var/lib/smg2/w")


@pytest.mark.parametrize(
    "address",
    [
        "tcp://127.0.0.1:5555",
        "tcp://127.3.2.1:5555",
        "tcp://localhost:5555",
        "tcp://LocalHost:5555",
        "tcp://[::1]:5555",
        "tcp://127.0.0.1:*",
    ],
)
def test_loopback_handshakes_pass(conf: WorkerConfinement, address: str) -> None:
    conf.check_handshake(address)


@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("tcp://0.0.0.0:5555", "not a loopback address"),
        ("tcp://*:5555", "not a loopback address"),
        ("tcp://eth0:5555", "not a loopback address"),
        ("tcp://lo:5555", "not a loopback address"),
        ("tcp://[::]:5555", "not a loopback address"),
        ("tcp://10.0.0.7:5555", "not a loopback address"),
        ("tcp://127.0.0.1;10.0.0.7:5555", "not a loopback address"),
        ("tcp://127.0.0.1", "tcp://HOST:PORT"),
        ("tcp://127.0.0.1:0", "tcp://HOST:PORT"),
        ("tcp://127.0.0.1:70000", "tcp://HOST:PORT"),
        ("tcp://127.0.0.1:\u00b2", "tcp://HOST:PORT"),
        ("ipc:///tmp/hs", "tcp://"),
        ("tcp://127.0.0.1:5555\n", "control characters"),
    ],
)
def test_bad_handshakes_are_refused(conf: WorkerConfinement, address: str, needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        conf.check_handshake(address)
    assert err.value.param == "zmq_handshake_address"
    assert needle in err.value.message


def test_allowed_engine_hosts_widen_the_handshake_rule() -> None:
    conf = WorkerConfinement(
        socket_dirs=(SOCK,), model_dirs=(MODELS,), engine_hosts=("10.0.0.7", "Engine-Host")
    )
    conf.check_handshake("tcp://10.0.0.7:5555")
    conf.check_handshake("tcp://engine-host:5555")
    with pytest.raises(ValidationError):
        conf.check_handshake("tcp://0.0.0.0:5555")


def test_model_path_outside_the_roots_same_message_exists_or_not(
    conf: WorkerConfinement, tmp_path: Path
) -> None:
    inside = WorkerConfinement(socket_dirs=(SOCK,), model_dirs=(str(tmp_path / "models"),))
    inside.check_model_path(str(tmp_path / "models" / "m"))
    inside.check_model_path(str(tmp_path / "models"))
    messages = set()
    for path in ("/etc", "/root", str(tmp_path / "does-not-exist"), f"{tmp_path}/models/../x"):
        with pytest.raises(ModelPathError) as err:
            inside.check_model_path(path)
        assert err.value.param == "model_path"
        messages.add(err.value.message)
    assert len(messages) == 1
    (message,) = messages
    assert "--allowed-model-dirs" in message
    assert str(tmp_path) not in message


def test_hf_cache_snapshot_root_widens_to_its_repo(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    conf = WorkerConfinement(socket_dirs=(SOCK,), model_dirs=(str(snapshot),))
    assert conf.model_dirs == (str(tmp_path / "hub" / "models--org--tiny"),)


def test_hf_hub_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_hub_cache() == str(tmp_path / ".cache" / "huggingface" / "hub")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert hf_hub_cache() == "/xdg/huggingface/hub"
    monkeypatch.setenv("HF_HOME", "/hf")
    assert hf_hub_cache() == "/hf/hub"
    monkeypatch.setenv("HF_HUB_CACHE", "/hubcache")
    assert hf_hub_cache() == "/hubcache"


def test_escape() -> None:
    assert escape("ipc:///a/b") == "ipc:///a/b"
    assert escape("a\nb\x1b[0m") == "a\\nb\\x1b[0m"


async def test_manager_refuses_before_logging(
    conf: WorkerConfinement, caplog: pytest.LogCaptureFixture
) -> None:
    """A forged log line in a url: refused, and nothing about it was logged (the missing
    runtime_type warning used to be logged before validation)."""
    caplog.set_level(logging.DEBUG)
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, confinement=conf)
        forged = f"ipc://{SOCK}/w\n2025-01-01 ERROR smg_trio: forged"
        with pytest.raises(ValidationError) as err:
            manager.add_worker(WorkerSpec(url=forged, model_id="m"))
        assert err.value.param == "url"
        for field, spec in {
            "model_id": WorkerSpec(url=f"ipc://{SOCK}/w", model_id="m\nforged"),
            "model_path": WorkerSpec(url=f"ipc://{SOCK}/w", model_path=f"{MODELS}/m\rforged"),
        }.items():
            with pytest.raises(ValidationError) as err:
                manager.add_worker(spec)
            assert err.value.param == field
        assert not manager.jobs
        nursery.cancel_scope.cancel()
    assert all("\n" not in r.getMessage() for r in caplog.records), caplog.records
    assert not any("forged" in r.getMessage() for r in caplog.records)


async def test_manager_logs_urls_escaped(
    conf: WorkerConfinement, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, confinement=conf)
        job = manager.add_worker(WorkerSpec(url=f"ipc://{SOCK}/w", model_path=f"{MODELS}/x"))
        await job.done.wait()
        assert job.status == "failed"
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records]
    assert f"worker 'ipc://{SOCK}/w' has no runtime_type: vllm" in lines
    assert not await trio.Path(SOCK).exists()  # refused in load_tokenizer: connect never ran


async def test_a_template_linked_out_never_reaches_an_engine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Even past ``POST /workers``'s pre-check (``add_worker`` directly), the registration
    reads the model files confined, fails, and binds nothing: the engine never sees a prompt
    rendered from the linked file."""
    root = tmp_path / "models"
    evil = root / "evil"
    shutil.copytree(default_tiny_model_dir(), evil)
    secret = tmp_path / "secret.jinja"
    secret.write_text("{{ 'TOP-SECRET-5eed' }}")
    (evil / "chat_template.jinja").symlink_to(secret)
    with IpcNamespace() as ns, trio.fail_after(20):
        conf = WorkerConfinement(socket_dirs=(ns.directory,), model_dirs=(str(root),))
        async with trio.open_nursery() as nursery:
            manager = WorkerManager(nursery, ready_timeout_s=5.0, confinement=conf)
            spec = WorkerSpec(
                url=ns.worker_url("sub/w"),
                model_path=str(evil),
                model_id="m",
                runtime_type="vllm",
                zmq_handshake_address=free_handshake_address(),
            )
            assert spec.zmq_handshake_address is not None
            engine = MockEngine(spec.zmq_handshake_address, MockEngineConfig())
            nursery.start_soon(engine.run)
            job = manager.add_worker(spec)
            await job.done.wait()
            assert job.status == "failed"
            assert job.error is not None
            assert "chat_template.jinja" in job.error
            assert "TOP-SECRET" not in job.error
            assert engine.requests == []
            assert manager.get_model("m") is None
            assert os.listdir(ns.directory) == []  # connect never ran: no sub/, no sockets
            nursery.cancel_scope.cancel()
    assert not any("TOP-SECRET" in r.getMessage() for r in caplog.records)
