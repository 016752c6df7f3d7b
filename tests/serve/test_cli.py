"""CLI unit tests: flag/env/config precedence, version, --help, backend validation, engine
command builders against smg's launcher (wire-spec §9), handshake-collision rejection."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import attrs
import pytest

from smg_trio.mock.tiny_model import default_tiny_model_dir

# smg_trio.serve imports the HTTP app; these run once it is importable.
pytest.importorskip("smg_trio.gateway.http.app", reason="the HTTP app has not landed yet")

from smg_trio import __version__, cli
from smg_trio.protocol.addresses import derive_handshake_port
from smg_trio.serve.commands import (
    build_engine_command,
    filter_owned_flags,
    kv_events_config,
    reject_handshake_collisions,
    tokenspeed_dist_port,
    worker_url,
)


def _args(argv: list[str]) -> object:
    parser = cli._parser()
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    return args


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("SMG_TRIO_"):
            monkeypatch.delenv(key)


# -- precedence ------------------------------------------------------------------------------


def test_env_fallback_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_TRIO_PORT", "9123")
    assert _args(["serve", "--backend", "mock"]).port == 9123  # type: ignore[attr-defined]


def test_env_fallback_list_and_float(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_TRIO_WORKER_URLS", "ipc:///tmp/a/engine-1,ipc:///tmp/a/engine-2")
    monkeypatch.setenv("SMG_TRIO_SHUTDOWN_GRACE_PERIOD_SECS", "2.5")
    args = _args(["launch", "--model-path", "/m"])
    assert args.worker_urls == ["ipc:///tmp/a/engine-1", "ipc:///tmp/a/engine-2"]  # type: ignore[attr-defined]
    assert args.shutdown_grace_period_secs == 2.5  # type: ignore[attr-defined]


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_precedence_cli_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    cfg = tmp_path / f"gw{suffix}"
    values = {"port": 7001, "host": "127.0.0.2", "max_n": 3, "policy": "least_load"}
    if suffix == ".toml":
        cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items()))
    else:
        cfg.write_text(json.dumps(values))
    monkeypatch.setenv("SMG_TRIO_PORT", "7002")
    monkeypatch.setenv("SMG_TRIO_HOST", "127.0.0.3")
    args = _args(["serve", "--backend", "mock", "--config", str(cfg), "--port=7003"])
    assert args.port == 7003  # type: ignore[attr-defined]  # CLI (--flag=v form) beats env
    assert args.host == "127.0.0.3"  # type: ignore[attr-defined]  # env beats file
    assert args.max_n == 3  # type: ignore[attr-defined]  # file beats default
    assert args.policy == "least_load"  # type: ignore[attr-defined]


def test_job_table_bounds_from_flags_env_and_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    defaults = _args(["serve", "--backend", "mock"])
    assert defaults.max_finished_jobs == 1000  # type: ignore[attr-defined]
    assert defaults.job_ttl_secs == 3600.0  # type: ignore[attr-defined]
    cfg = tmp_path / "gw.toml"
    cfg.write_text("max_finished_jobs = 7\njob_ttl_secs = 60\n")
    monkeypatch.setenv("SMG_TRIO_JOB_TTL_SECS", "inf")
    args = _args(["serve", "--backend", "mock", "--config", str(cfg)])
    assert args.max_finished_jobs == 7  # type: ignore[attr-defined]
    assert args.job_ttl_secs == float("inf")  # type: ignore[attr-defined]
    config = cli._config_from_args(args, [])  # type: ignore[arg-type]
    assert (config.max_finished_jobs, config.job_ttl_s) == (7, float("inf"))
    args = _args(["serve", "--backend", "mock", "--max-finished-jobs", "0"])
    assert args.max_finished_jobs == 0  # type: ignore[attr-defined]


def test_alias_flag_counts_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_TRIO_DP_SIZE", "4")
    assert _args(["serve", "--data-parallel-size", "2"]).dp_size == 2  # type: ignore[attr-defined]
    assert _args(["serve"]).dp_size == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "env", "value"),
    [
        (["launch", "--por", "9000"], ("SMG_TRIO_PORT", "8000"), "--por"),
        (["serve", "--dp", "2"], ("SMG_TRIO_DP_SIZE", "4"), "--dp"),
        (["serve", "--allow-insecure"], ("SMG_TRIO_ALLOW_INSECURE_ADMIN", "0"), "--allow-insecure"),
    ],
    ids=["port", "alias", "boolean"],
)
def test_abbreviated_flag_is_an_error_not_overridden_by_env(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: tuple[str, str],
    value: str,
) -> None:
    """Issue 17 finding 7: argparse took ``--por 9000`` for ``--port`` while the env layer,
    not seeing ``--port`` given, let SMG_TRIO_PORT=8000 win. Abbreviations are refused now."""
    monkeypatch.setenv(*env)
    with pytest.raises(SystemExit) as exc:
        _args(argv)
    assert exc.value.code == 2
    assert value in capsys.readouterr().err


def test_every_parser_refuses_abbreviations() -> None:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert parser.allow_abbrev is False
    assert {name: p.allow_abbrev for name, p in sub.choices.items()} == dict.fromkeys(
        sub.choices, False
    )


def test_alias_precedence_cli_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both names of an aliased flag: either spelling on the command line beats either env
    variable, the first name's variable beats the alias's, and env beats either file key."""
    cfg = tmp_path / "gw.json"
    cfg.write_text(json.dumps({"data_parallel_size": 5}))
    assert _args(["serve", "--config", str(cfg)]).dp_size == 5  # type: ignore[attr-defined]
    monkeypatch.setenv("SMG_TRIO_DATA_PARALLEL_SIZE", "3")
    assert _args(["serve", "--config", str(cfg)]).dp_size == 3  # type: ignore[attr-defined]
    monkeypatch.setenv("SMG_TRIO_DP_SIZE", "4")
    assert _args(["serve", "--config", str(cfg)]).dp_size == 4  # type: ignore[attr-defined]
    assert _args(["serve", "--data-parallel-size=2"]).dp_size == 2  # type: ignore[attr-defined]
    assert _args(["serve", "--dp-size", "6"]).dp_size == 6  # type: ignore[attr-defined]


def test_precedence_for_boolean_and_list_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """File < env < command line for an on/off flag and a list flag; SMG_TRIO_CONFIG names
    the file when --config does not."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text('allow_insecure_admin = true\nallowed_engine_hosts = ["10.0.0.1"]\n')
    monkeypatch.setenv("SMG_TRIO_CONFIG", str(cfg))
    args = _args(["serve"])
    assert args.allow_insecure_admin is True  # type: ignore[attr-defined]
    assert args.allowed_engine_hosts == ["10.0.0.1"]  # type: ignore[attr-defined]
    monkeypatch.setenv("SMG_TRIO_ALLOW_INSECURE_ADMIN", "off")
    monkeypatch.setenv("SMG_TRIO_ALLOWED_ENGINE_HOSTS", "10.0.0.2,10.0.0.3")
    args = _args(["serve"])
    assert args.allow_insecure_admin is False  # type: ignore[attr-defined]
    assert args.allowed_engine_hosts == ["10.0.0.2", "10.0.0.3"]  # type: ignore[attr-defined]
    args = _args(["serve", "--allow-insecure-admin", "--allowed-engine-hosts", "10.0.0.4"])
    assert args.allow_insecure_admin is True  # type: ignore[attr-defined]
    assert args.allowed_engine_hosts == ["10.0.0.4"]  # type: ignore[attr-defined]


def test_bad_file_value_names_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gw.json"
    cfg.write_text(json.dumps({"data_parallel_size": 0}))
    with pytest.raises(SystemExit) as exc:
        _args(["serve", "--config", str(cfg)])
    assert exc.value.code == 2
    assert "--config key 'data_parallel_size'" in capsys.readouterr().err


def test_env_value_outside_choices_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_TRIO_BACKEND", "sglang")
    with pytest.raises(SystemExit) as exc:
        _args(["serve"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--dp-size", "0", "must be at least 1"),
        ("--max-n", "0", "must be at least 1"),
        ("--port", "70000", "between 0 and 65535"),
        ("--worker-base-port", "0", "between 1 and 65535"),
        ("--engine-silence-timeout-secs", "-1", "must be positive"),
        ("--worker-startup-timeout-secs", "0", "must be positive"),
        ("--shutdown-grace-period-secs", "nan", "finite"),
        ("--shutdown-grace-period-secs", "inf", "finite"),
        ("--frontend-stall-timeout-secs", "-1", "must be non-negative"),
        ("--frontend-stall-timeout-secs", "nan", "finite"),
        ("--frontend-stall-timeout-secs", "0.5", "0 (off) or at least 1 second"),
        ("--dp-size", "two", "not an integer"),
    ],
)
def test_out_of_range_values_are_usage_errors(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _args(["serve", flag, value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_out_of_range_env_value_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SMG_TRIO_DP_SIZE", "0")
    with pytest.raises(SystemExit) as exc:
        _args(["serve"])
    assert exc.value.code == 2
    assert "SMG_TRIO_DP_SIZE" in capsys.readouterr().err


def test_config_to_gateway_config_mock() -> None:
    args = _args(["serve", "--backend", "mock", "--dp-size", "2", "--worker-base-port", "41000"])
    config = cli._config_from_args(args, ["--step-ms", "0"])  # type: ignore[arg-type]
    assert config.engines.backend == "mock"
    assert config.engines.dp_size == 2
    assert config.engines.worker_base_port == 41000
    assert config.engines.engine_args[:2] == ("--step-ms", "0")
    assert "--eos-token-id" in config.engines.engine_args
    assert config.model_path == config.engines.model  # the model reaches the gateway by itself
    assert config.served_model_name == "mock-tiny"


def test_engine_python_flag() -> None:
    model = str(default_tiny_model_dir())
    args = _args(
        ["serve", "--backend", "vllm", "--model", model, "--engine-python", "/v/bin/python"]
    )
    config = cli._config_from_args(args, [])  # type: ignore[arg-type]
    assert config.engines.python == "/v/bin/python"
    assert config.model_path == model


def test_serve_vllm_needs_model() -> None:
    args = _args(["serve", "--backend", "vllm"])
    with pytest.raises(SystemExit, match="--model"):
        cli._config_from_args(args, [])  # type: ignore[arg-type]


def test_launch_starts_empty_without_worker_urls_or_model_path() -> None:
    """Issue 15 item 3: neither flag is needed; workers come later (API or discovery)."""
    config = cli._config_from_args(_args(["launch"]), [])  # type: ignore[arg-type]
    assert config.worker_urls == ()
    assert config.model_path is None
    assert config.worker_wait_timeout_s == 10.0
    assert config.discovery_file is None
    model = str(default_tiny_model_dir())
    config = cli._config_from_args(_args(["launch", "--model-path", model]), [])  # type: ignore[arg-type]
    assert config.worker_urls == ()
    assert config.model_path == model


def test_discovery_and_worker_wait_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["launch", "--discovery-provider", "file", "--discovery-file", "/etc/w.json"]
    config = cli._config_from_args(_args(argv), [])  # type: ignore[arg-type]
    assert config.discovery_file == "/etc/w.json"
    monkeypatch.setenv("SMG_TRIO_WORKER_WAIT_TIMEOUT_SECS", "2.5")
    monkeypatch.setenv("SMG_TRIO_DISCOVERY_FILE", "/etc/w.toml")
    config = cli._config_from_args(_args(["launch"]), [])  # type: ignore[arg-type]
    assert config.worker_wait_timeout_s == 2.5
    assert config.discovery_file == "/etc/w.toml"
    monkeypatch.delenv("SMG_TRIO_DISCOVERY_FILE")
    with pytest.raises(SystemExit) as exc:
        cli._config_from_args(_args(["launch", "--discovery-provider", "file"]), [])  # type: ignore[arg-type]
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        _args(["launch", "--discovery-provider", "kubernetes"])


# -- subcommands ------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


@pytest.mark.parametrize("command", ["serve", "launch"])
def test_help_exits_zero(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out
    assert "--log-format" in out
    assert "--config" in out


@pytest.mark.parametrize("backend", ["sglang", "trtllm", "http"])
def test_serve_non_zmq_backend_rejected(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--backend", backend, "--model", "/m"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_build_engine_command_rejects_non_zmq_backend() -> None:
    with pytest.raises(ValueError, match="no ZMQ wire"):
        build_engine_command("sglang", "/m", port=31000, socket_dir="/tmp/s")


# -- handshake collisions ---------------------------------------------------------------------


def _colliding_pair() -> tuple[str, str]:
    seen: dict[int, str] = {}
    for port in range(31000, 60000):
        url = worker_url(port, "/tmp/smg-c")
        hs = derive_handshake_port(url)
        if hs in seen:
            return seen[hs], url
        seen[hs] = url
    raise AssertionError("no collision found")


def test_handshake_collision_rejected_naming_both() -> None:
    a, b = _colliding_pair()
    with pytest.raises(ValueError, match="collision") as exc:
        reject_handshake_collisions([a, b])
    assert a in str(exc.value)
    assert b in str(exc.value)
    reject_handshake_collisions([a])  # one alone is fine


def test_serve_rejects_collision_before_launch() -> None:
    serve_mod = pytest.importorskip("smg_trio.serve")
    from smg_trio.serve.config import EngineLaunchConfig, GatewayConfig

    # 36770 and 36802 in /tmp/smg-c derive the same FNV handshake port (found by search).
    lo, hi = 36770, 36802
    a, b = worker_url(lo, "/tmp/smg-c"), worker_url(hi, "/tmp/smg-c")
    assert derive_handshake_port(a) == derive_handshake_port(b)
    # dp_size spans both colliding ports: the plan must fail before any process starts.
    config = GatewayConfig(
        engines=EngineLaunchConfig(
            backend="mock", model="/m", dp_size=hi - lo + 1, worker_base_port=lo,
            socket_dir="/tmp/smg-c",
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match="collision") as exc:
        serve_mod._launch_plan(config)
    assert str(exc.value).count("ipc:///tmp/smg-c/engine-") == 2  # names both workers


# -- engine command builders (wire-spec §9) ---------------------------------------------------


def test_worker_url_and_socket_dir_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_ZMQ_SOCKET_DIR", "/tmp/sdir")
    assert worker_url(31000) == "ipc:///tmp/sdir/engine-31000"
    monkeypatch.delenv("SMG_ZMQ_SOCKET_DIR")
    import os

    assert worker_url(31000) == f"ipc:///tmp/smg-zmq-{os.getuid()}/engine-31000"


def test_vllm_command() -> None:
    launch = build_engine_command(
        "vllm",
        "/models/tiny",
        port=31000,
        socket_dir="/tmp/s",
        engine_args=["--model", "/other", "--headless", "--data-parallel-size=2",
                     "--data-parallel-rpc-port", "1", "--dtype", "float32", "--enforce-eager"],
    )  # fmt: skip
    hs = str(derive_handshake_port("ipc:///tmp/s/engine-31000"))
    assert launch.worker_url == "ipc:///tmp/s/engine-31000"
    assert launch.engine_count == 2
    assert launch.env["PYTHONUNBUFFERED"] == "1"
    assert launch.argv == [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/tiny", "--headless",
        "--data-parallel-size", "2", "--data-parallel-size-local", "2",
        "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", hs,
        "--dtype", "float32", "--enforce-eager",
    ]  # fmt: skip


def test_vllm_engine_python_override() -> None:
    launch = build_engine_command("vllm", "/m", port=31000, socket_dir="/tmp/s", python="/v/py")
    assert launch.argv[0] == "/v/py"
    assert launch.engine_count == 1


@pytest.mark.parametrize(("port", "dist"), [(31000, 31233), (65500, 65267), (19800, 30033)])
def test_tokenspeed_dist_port(port: int, dist: int) -> None:
    assert tokenspeed_dist_port(port) == dist


def test_tokenspeed_command_defaults() -> None:
    launch = build_engine_command(
        "tokenspeed",
        "/m",
        port=31000,
        socket_dir="/tmp/s",
        engine_args=["--port", "5", "--dist-init-addr=1.2.3.4:5", "--zmq-engine-index", "3",
                     "--data-parallel-size", "2", "--tp", "1"],
    )  # fmt: skip
    hs = str(derive_handshake_port("ipc:///tmp/s/engine-31000"))
    assert launch.argv == [
        sys.executable, "-m", "tokenspeed.cli", "serve", "--headless", "--model", "/m",
        "--port", "31000", "--dist-init-addr", "127.0.0.1:31233",
        "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", hs,
        "--zmq-engine-index", "0", "--grammar-backend", "xgrammar", "--enable-output-logprobs",
        "--data-parallel-size", "2", "--tp", "1",
    ]  # fmt: skip
    assert launch.engine_count == 2


@pytest.mark.parametrize(
    "operator_args",
    [
        ["--grammar-backend", "outlines", "--enable-output-logprobs"],
        ["--grammar-backend=outlines", "--enable-output-logprobs"],
    ],
)
def test_tokenspeed_defaults_yield_to_operator(operator_args: list[str]) -> None:
    launch = build_engine_command(
        "tokenspeed", "/m", port=65500, socket_dir="/tmp/s", engine_args=operator_args
    )
    assert "xgrammar" not in launch.argv
    assert launch.argv.count("--enable-output-logprobs") == 1
    assert launch.argv[-len(operator_args) :] == operator_args
    assert "127.0.0.1:65267" in launch.argv


def test_mock_command() -> None:
    launch = build_engine_command(
        "mock", "/m", port=31000, socket_dir="/tmp/s", engine_args=["--step-ms", "0"]
    )
    hs = derive_handshake_port("ipc:///tmp/s/engine-31000")
    assert launch.argv == [
        sys.executable, "-m", "smg_trio.mock.engine",
        "--handshake", f"tcp://127.0.0.1:{hs}", "--step-ms", "0",
        "--kv-events-config", kv_events_config("ipc:///tmp/s/engine-31000"),
    ]  # fmt: skip
    assert launch.engine_count == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "/x", "--dtype", "f"], ["--dtype", "f"]),
        (["--model=/x", "--dtype", "f"], ["--dtype", "f"]),
        (["--headless", "--enforce-eager"], ["--enforce-eager"]),  # flag without a value
        (["--data-parallel-address", "--dtype", "f"], ["--dtype", "f"]),  # next starts with -
    ],
)
def test_filter_owned_flags(args: list[str], expected: list[str]) -> None:
    owned = ("--model", "--headless", "--data-parallel-address")
    assert filter_owned_flags(args, owned) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--backend", "mock", "--model", "/nonexistent"], "not a local directory"),
        # a Hugging Face id is resolved in the hub cache: tests/serve/test_hub_models.py
        (["launch", "--worker-urls", "ipc:///tmp/x/w", "--model-path", "/"], "no tokenizer.json"),
    ],
)
def test_bad_model_dir_is_a_clean_error_before_launch(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from smg_trio.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert message in str(exc.value.code)
    assert "Traceback" not in capsys.readouterr().err


def test_engine_flag_before_the_separator_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    from smg_trio.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--backend", "mock", "--tensor-parallel-size", "2"])
    assert exc.value.code == 2
    assert "engine arguments go after '--'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # smg's launch names its model --model-path (serve takes vLLM's positional MODEL)
        (["launch", "/tmp/m"], "--model-path /tmp/m)"),
        # serve and launch name the model differently (vLLM's --model, smg's --model-path)
        (["serve", "--model-path", "/tmp/m"], "serve names its model with --model)"),
        (["launch", "--model", "/tmp/m"], "launch names its model with --model-path)"),
        (["launch", "--dp-size", "2"], "--dp-size is a flag of 'serve', not of 'launch'"),
    ],
)
def test_stray_value_gets_a_hint_not_the_engine_separator(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from smg_trio.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "serve ... --" not in err


def test_tracing_without_opentelemetry_says_how_to_install_it_from_the_checkout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README installs smg_trio from its checkout (``pip install -e .``): the usage error
    names the extra as that user installs it, not a ``smg_trio[otel]`` from an index."""
    import importlib.util

    from smg_trio.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("opentelemetry") else real(name, *a),
    )
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--backend", "mock", "--otlp-traces-endpoint", "http://127.0.0.1:4317"])
    assert exc.value.code == 2
    assert "pip install -e '.[otel]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--balance-rel-threshold", "0.5"], "must be a finite number at least 1.0, got 0.5"),
        (["--balance-abs-threshold", "inf"], "must be a finite number at least 0.0, got inf"),
        (["--cache-threshold", "1.5"], "must be a finite number between 0.0 and 1.0, got 1.5"),
    ],
)
def test_routing_knob_out_of_range_names_the_range(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No 'between 1.0 and inf' for a bound that has no top."""
    with pytest.raises(SystemExit):
        _args(["serve", "--backend", "mock", *argv])
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag", ["--served-model-name=x", "--port", "--api-key", "--chat-template", "--lora-modules"]
)
def test_gateway_flag_after_the_separator_is_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm serve's habits: a flag smg_trio's gateway owns, written among the engine's
    arguments, would be ignored by the headless engine."""
    args = _args(["serve", "--backend", "mock"])
    with pytest.raises(SystemExit) as exc:
        cli._config_from_args(args, [flag, "x"] if "=" not in flag else [flag])  # type: ignore[arg-type]
    assert exc.value.code == 2
    assert f"give {flag.split('=')[0]} before '--'" in capsys.readouterr().err


def test_frontend_only_flag_after_the_separator_warns(caplog: pytest.LogCaptureFixture) -> None:
    args = _args(["serve", "--backend", "mock"])
    with caplog.at_level(logging.WARNING, logger="smg_trio"):
        cli._config_from_args(args, ["--ssl-keyfile", "k.pem", "--dtype", "float32"])  # type: ignore[arg-type]
    assert "--ssl-keyfile after '--' does nothing" in caplog.text
    assert "--dtype" not in caplog.text


def test_version_flag_as_vllm_has_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``vllm --version``'s spelling works too (beside the ``version`` subcommand)."""
    from smg_trio import __version__
    from smg_trio.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == __version__


def test_vllm_api_key_variable_is_the_last_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server moved from ``vllm serve`` with ``VLLM_API_KEY`` set stays protected; the
    gateway's own spellings win over it."""
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    args = _args(["serve", "--backend", "mock"])
    assert cli._config_from_args(args, []).api_key == "from-vllm"  # type: ignore[arg-type]
    monkeypatch.setenv("SMG_TRIO_API_KEY", "from-env")
    args = _args(["serve", "--backend", "mock"])
    assert cli._config_from_args(args, []).api_key == "from-env"  # type: ignore[arg-type]
    args = _args(["serve", "--backend", "mock", "--api-key", "from-flag"])
    assert cli._config_from_args(args, []).api_key == "from-flag"  # type: ignore[arg-type]
    monkeypatch.delenv("VLLM_API_KEY")
    monkeypatch.delenv("SMG_TRIO_API_KEY")
    args = _args(["serve", "--backend", "mock"])
    assert cli._config_from_args(args, []).api_key is None  # type: ignore[arg-type]


def test_limit_flags_reach_the_gateway_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue-18 limits: defaults from one place, flags and SMG_TRIO_* env both work."""
    from smg_trio.gateway.config import GatewayHttpConfig
    from smg_trio.serve import _http_config

    args = _args(["serve", "--backend", "mock"])
    http = _http_config(cli._config_from_args(args, []))  # type: ignore[arg-type]
    defaults = GatewayHttpConfig()
    for name in (
        "max_sequences_per_request",
        "max_tokens_per_request",
        "max_concurrent_requests",
        "queue_size",
        "queue_timeout_s",
        "write_timeout_s",
    ):
        assert getattr(http, name) == getattr(defaults, name), name
    monkeypatch.setenv("SMG_TRIO_QUEUE_SIZE", "7")
    args = _args(
        [
            "serve",
            "--backend",
            "mock",
            "--max-sequences-per-request",
            "9",
            "--max-tokens-per-request",
            "1000",
            "--max-concurrent-requests",
            "3",
            "--queue-timeout-secs",
            "0",
            "--write-timeout-secs",
            "5",
        ]
    )
    http = _http_config(cli._config_from_args(args, []))  # type: ignore[arg-type]
    assert http.max_sequences_per_request == 9
    assert http.max_tokens_per_request == 1000
    assert http.max_concurrent_requests == 3
    assert http.queue_size == 7
    assert http.queue_timeout_s == 0
    assert http.write_timeout_s == 5


def test_cli_defaults_are_the_config_defaults() -> None:
    """Issue 17: one source per default. A bare ``launch`` or ``serve`` yields exactly the
    config classes' defaults, and those the worker manager's and the HTTP front's."""
    import inspect

    from smg_trio.gateway.config import GatewayHttpConfig
    from smg_trio.serve import _http_config
    from smg_trio.serve.config import EngineLaunchConfig, GatewayConfig
    from smg_trio.worker.manager import WorkerManager

    model = str(default_tiny_model_dir())
    launch = cli._config_from_args(
        _args(["launch", "--worker-urls", "ipc:///tmp/x/w0", "--model-path", model]),  # type: ignore[arg-type]
        [],
    )
    assert launch == GatewayConfig(worker_urls=("ipc:///tmp/x/w0",), model_path=model)
    served = cli._config_from_args(_args(["serve", "--backend", "mock", "--model", model]), [])  # type: ignore[arg-type]
    assert served.engines is not None
    assert served == GatewayConfig(
        model_path=model,
        served_model_name="mock-tiny",
        engines=EngineLaunchConfig(
            backend="mock", model=model, engine_args=served.engines.engine_args
        ),
    )
    manager = inspect.signature(WorkerManager).parameters
    defaults = GatewayConfig()
    assert manager["policy"].default == defaults.policy
    assert manager["ready_timeout_s"].default == defaults.worker_startup_timeout_s
    assert manager["silence_timeout_s"].default == defaults.engine_silence_timeout_s
    http, front = _http_config(defaults), GatewayHttpConfig()
    shared = set(attrs.fields_dict(GatewayConfig)) & set(attrs.fields_dict(GatewayHttpConfig))
    for name in sorted(shared):
        assert getattr(http, name) == getattr(front, name), name


# -- tool calling ------------------------------------------------------------------------------


def test_tool_call_flags_from_cli_env_and_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = _args(["serve", "--backend", "mock"])
    config = cli._config_from_args(args, [])  # type: ignore[arg-type]
    assert (config.tool_call_parser, config.enable_auto_tool_choice) == (None, False)
    for cmd in (["serve", "--backend", "mock"], ["launch"]):
        args = _args([*cmd, "--tool-call-parser", "hermes", "--enable-auto-tool-choice"])
        config = cli._config_from_args(args, [])  # type: ignore[arg-type]
        assert (config.tool_call_parser, config.enable_auto_tool_choice) == ("hermes", True)
    monkeypatch.setenv("SMG_TRIO_TOOL_CALL_PARSER", "pythonic")
    monkeypatch.setenv("SMG_TRIO_ENABLE_AUTO_TOOL_CHOICE", "1")
    config = cli._config_from_args(_args(["serve", "--backend", "mock"]), [])  # type: ignore[arg-type]
    assert (config.tool_call_parser, config.enable_auto_tool_choice) == ("pythonic", True)
    monkeypatch.delenv("SMG_TRIO_TOOL_CALL_PARSER")
    monkeypatch.delenv("SMG_TRIO_ENABLE_AUTO_TOOL_CHOICE")
    cfg = tmp_path / "gw.toml"
    cfg.write_text('tool_call_parser = "mistral"\nenable_auto_tool_choice = true\n')
    args = _args(["serve", "--backend", "mock", "--config", str(cfg)])
    config = cli._config_from_args(args, [])  # type: ignore[arg-type]
    assert (config.tool_call_parser, config.enable_auto_tool_choice) == ("mistral", True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tool-call-parser", "nope"], "valid names: "),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    ],
    ids=["unknown-parser", "auto-without-parser"],
)
def test_tool_call_flag_errors_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli._config_from_args(_args(["serve", "--backend", "mock", *argv]), [])  # type: ignore[arg-type]
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    if "valid names" in message:
        for name in ("hermes", "llama3_json", "mistral", "pythonic"):
            assert name in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["launch", "--worker-urls", "ipc:///tmp/x/engine"], "needs --model-path DIR"),
        (["serve", "--discovery-provider", "file"], "needs --discovery-file FILE"),
    ],
)
def test_missing_companion_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli._config_from_args(_args(argv), [])  # type: ignore[arg-type]
    assert exc.value.code == 2  # argparse's usage-error status, as every other flag error
    err = capsys.readouterr().err
    assert err.startswith("smg_trio: error: ")
    assert message in err


def test_chat_template_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's --chat-template (a file, or the template inline), its content format and
    --trust-request-chat-template belong to the gateway, which renders templates."""
    model = str(default_tiny_model_dir())
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}")
    base = ["serve", "--backend", "mock", "--model", model]
    argv = [*base, "--chat-template", str(f), "--chat-template-content-format", "string"]
    config = cli._config_from_args(_args([*argv, "--trust-request-chat-template"]), [])  # type: ignore[arg-type]
    assert config.chat_template == "{{ messages[0].content }}"
    assert config.chat_template_content_format == "string"
    assert config.trust_request_chat_template is True
    inline = cli._config_from_args(_args([*base, "--chat-template", "{{ 1 }}"]), [])  # type: ignore[arg-type]
    assert inline.chat_template == "{{ 1 }}"
    assert inline.chat_template_content_format == "auto"
    assert inline.trust_request_chat_template is False
    with pytest.raises(SystemExit) as exit_:
        cli._config_from_args(_args([*base, "--chat-template", str(tmp_path / "nope.jinja")]), [])  # type: ignore[arg-type]
    assert exit_.value.code == 2
    assert "looks like a file path" in capsys.readouterr().err


def test_vllm_serve_command_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's `serve MODEL` (positional), its request-log flags and its access-log flags
    (accepted: smg_trio writes no access log) parse."""
    model = str(default_tiny_model_dir())
    argv = ["serve", model, "--backend", "mock", "--enable-log-requests", "--max-log-len", "100"]
    config = cli._config_from_args(_args([*argv, "--disable-uvicorn-access-log"]), [])  # type: ignore[arg-type]
    assert config.model_path == model
    assert config.enable_log_requests is True
    assert config.max_log_len == 100
    both = ["serve", model, "--model", model, "--backend", "mock", "--disable-access-log"]
    assert cli._config_from_args(_args(both), []).model_path == model  # type: ignore[arg-type]
    with pytest.raises(SystemExit) as exit_:
        cli._config_from_args(_args(["serve", model, "--model", "/other", "--backend", "mock"]), [])  # type: ignore[arg-type]
    assert exit_.value.code == 2
    assert "given twice" in capsys.readouterr().err


def test_cors_flags_with_vllms_defaults() -> None:
    model = str(default_tiny_model_dir())
    base = ["serve", model, "--backend", "mock"]
    plain = cli._config_from_args(_args(base), [])  # type: ignore[arg-type]
    assert (plain.allowed_origins, plain.allowed_methods, plain.allowed_headers) == (
        (),
        ("*",),
        ("*",),
    )
    assert plain.allow_credentials is False
    argv = [*base, "--allowed-origins", "https://a.example", "https://b.example",
            "--allowed-methods", '["GET", "POST"]', "--allow-credentials"]  # fmt: skip
    config = cli._config_from_args(_args(argv), [])  # type: ignore[arg-type]
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.allowed_methods == ("GET", "POST")
    assert config.allow_credentials is True
