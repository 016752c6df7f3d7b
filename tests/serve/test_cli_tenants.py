"""The tenants' and tracing flags of the CLI: --api-keys-file and --tenant-api-key reach the
config, a bad keys file is a usage error that never quotes a key."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from smg_trio import cli

KEY = "sk-secret-0123456789"


def _config(argv: list[str]) -> object:
    parser = cli._parser()
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    assert isinstance(args, argparse.Namespace)
    return cli._config_from_args(args, [])


def test_flags_reach_the_config(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[tenants]]\nname = "a"\nkey = "{KEY}"\nmax_concurrent_requests = 2\n')
    config = _config(
        [
            "serve", "--backend", "mock", "--api-keys-file", str(keys),
            "--tenant-api-key", "b:sk-other-0123456789", "--tenant-api-key", "c:sk-third-01234567",
            "--otlp-traces-endpoint", "http://127.0.0.1:4317",
        ]
    )  # fmt: skip
    assert config.api_keys_file == str(keys)  # type: ignore[attr-defined]
    assert config.tenant_api_keys == ("b:sk-other-0123456789", "c:sk-third-01234567")  # type: ignore[attr-defined]
    assert config.otlp_traces_endpoint == "http://127.0.0.1:4317"  # type: ignore[attr-defined]


def test_bad_keys_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(f'{{"tenants": [{{"name": "a", "key": "{KEY}", "rpm": 3}}]}}')
    with pytest.raises(SystemExit) as info:
        _config(["serve", "--backend", "mock", "--api-keys-file", str(keys)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown field(s) ['rpm']" in err
    assert KEY not in err


def test_unknown_otlp_protocol_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(SystemExit) as info:
        _config(["serve", "--backend", "mock", "--otlp-traces-endpoint", "http://127.0.0.1:4318"])
    assert info.value.code == 2
    assert "'http/json' is not supported" in capsys.readouterr().err
