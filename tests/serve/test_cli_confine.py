"""The admin and confinement flags (issue 18): --allow-insecure-admin, --allowed-socket-dirs,
--allowed-engine-hosts, --allowed-model-dirs, from the command line, SMG_TRIO_* and the
config file, and how serve turns them into the manager's WorkerConfinement."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

pytest.importorskip("smg_trio.gateway.http.app", reason="the HTTP app has not landed yet")

from smg_trio import cli
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import GatewayConfig, _confinement, _log_admin_access
from smg_trio.serve.config import EngineLaunchConfig
from smg_trio.worker.confine import hf_hub_cache


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SMG_TRIO_"):
            monkeypatch.delenv(key)


def _config(argv: list[str]) -> GatewayConfig:
    parser = cli._parser()
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    config = cli._config_from_args(args, [])
    assert isinstance(config, GatewayConfig)
    return config


def _launch(*extra: str) -> list[str]:
    model = str(default_tiny_model_dir())
    return ["launch", "--worker-urls", "ipc:///srv/socks/e1", "--model-path", model, *extra]


def test_defaults_are_safe() -> None:
    config = _config(_launch())
    assert config.allow_insecure_admin is False
    assert config.allowed_socket_dirs == ()
    assert config.allowed_engine_hosts == ()
    assert config.allowed_model_dirs is None


def test_flags() -> None:
    config = _config(
        _launch(
            "--allow-insecure-admin",
            "--allowed-socket-dirs",
            "/a",
            "/b",
            "--allowed-engine-hosts",
            "10.0.0.7",
            "--allowed-model-dirs",
            "/models",
        )
    )
    assert config.allow_insecure_admin is True
    assert config.allowed_socket_dirs == ("/a", "/b")
    assert config.allowed_engine_hosts == ("10.0.0.7",)
    assert config.allowed_model_dirs == ("/models",)


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("true", True), ("on", True), ("0", False), ("no", False)]
)
def test_env(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("SMG_TRIO_ALLOW_INSECURE_ADMIN", value)
    monkeypatch.setenv("SMG_TRIO_ALLOWED_MODEL_DIRS", "/m1,/m2")
    config = _config(_launch())
    assert config.allow_insecure_admin is expected
    assert config.allowed_model_dirs == ("/m1", "/m2")


def test_env_bool_garbage_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SMG_TRIO_ALLOW_INSECURE_ADMIN", "maybe")
    with pytest.raises(SystemExit) as exc:
        _config(_launch())
    assert exc.value.code == 2
    assert "SMG_TRIO_ALLOW_INSECURE_ADMIN" in capsys.readouterr().err


def test_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('allow_insecure_admin = true\nallowed_engine_hosts = ["engine-1"]\n')
    config = _config(_launch("--config", str(cfg)))
    assert config.allow_insecure_admin is True
    assert config.allowed_engine_hosts == ("engine-1",)


def test_launch_confinement_counts_what_the_operator_gave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SMG_ZMQ_SOCKET_DIR", "/run/smg")
    config = _config(_launch("--zmq-handshake-address", "tcp://10.1.2.3:7000"))
    conf = _confinement(config)
    assert conf.socket_dirs == ("/run/smg", "/srv/socks")
    assert conf.engine_hosts == ("10.1.2.3",)
    assert conf.model_dirs == (str(default_tiny_model_dir()), hf_hub_cache())
    conf.check_url("ipc:///srv/socks/e2")
    conf.check_handshake("tcp://10.1.2.3:7001")


def test_serve_confinement_and_explicit_model_dirs() -> None:
    config = GatewayConfig(
        engines=EngineLaunchConfig(backend="mock", model="/m/tiny", socket_dir="/run/s"),
        allowed_socket_dirs=("/run/more",),
        allowed_model_dirs=("/models",),
    )
    conf = _confinement(config)
    assert conf.socket_dirs == ("/run/s", "/run/more")
    assert conf.model_dirs == ("/m/tiny", "/models")  # no HF cache once dirs are named


def test_startup_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _log_admin_access(GatewayConfig(allow_insecure_admin=True), None)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "--allow-insecure-admin" in record.getMessage()
    caplog.clear()
    _log_admin_access(GatewayConfig(), None)
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert "refused (403)" in record.getMessage()
    caplog.clear()
    _log_admin_access(GatewayConfig(allow_insecure_admin=True), "key")
    assert not caplog.records


def test_tcp_worker_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = _config(_launch())
    assert defaults.zmq_advertise_host is None
    assert defaults.zmq_heartbeat_interval_s == 1.0
    assert defaults.zmq_heartbeat_timeout_s == 5.0
    monkeypatch.setenv("SMG_TRIO_ZMQ_HEARTBEAT_TIMEOUT_SECS", "2.5")
    config = _config(
        _launch("--zmq-advertise-host", "gw.example", "--zmq-heartbeat-interval-secs", "0.5")
    )
    assert config.zmq_advertise_host == "gw.example"
    assert config.zmq_heartbeat_interval_s == 0.5
    assert config.zmq_heartbeat_timeout_s == 2.5


def test_a_startup_tcp_worker_host_counts_as_allowed() -> None:
    model = str(default_tiny_model_dir())
    config = _config(["launch", "--worker-urls", "tcp://10.0.0.9:7100", "--model-path", model])
    conf = _confinement(config)
    conf.check_url("tcp://10.0.0.9:7100")
    assert conf.host_allowed("10.0.0.9")
    assert not conf.host_allowed("10.0.0.10")


def test_allowed_engine_uids_reach_the_tcp_options(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config(_launch()).allowed_engine_uids is None  # root and the gateway's own
    config = _config(_launch("--allowed-engine-uids", "1000", "1001"))
    assert config.allowed_engine_uids == (1000, 1001)
    monkeypatch.setenv("SMG_TRIO_ALLOWED_ENGINE_UIDS", "7,8")
    assert _config(_launch()).allowed_engine_uids == (7, 8)


def test_allowed_engine_uids_must_be_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _config(_launch("--allowed-engine-uids", "nobody"))
    assert exc.value.code == 2
    assert "--allowed-engine-uids" in capsys.readouterr().err
