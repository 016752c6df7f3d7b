"""``--api-server-count N|auto``: parsing, env and config-file fallbacks, ``auto`` from the CPU
affinity (printed), and the usage errors (TokenSpeed's wire has one frontend client)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from smg_trio import cli
from smg_trio.serve.frontends import (
    TOKENSPEED_SINGLE_CLIENT,
    api_server_count_problem,
    parse_api_server_count,
    resolve_api_server_count,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SMG_TRIO_"):
            monkeypatch.delenv(key)


def test_values() -> None:
    assert parse_api_server_count("3") == 3
    assert parse_api_server_count("AUTO") == "auto"
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError):
            parse_api_server_count(bad)
    assert resolve_api_server_count("auto", affinity={0, 3, 5}) == 3
    assert resolve_api_server_count(2, affinity={0}) == 2


def test_only_tokenspeed_is_refused_for_its_wire() -> None:
    assert api_server_count_problem(1, "tokenspeed") is None
    assert api_server_count_problem(2, "tokenspeed") == TOKENSPEED_SINGLE_CLIENT
    assert "inputs[0]" in TOKENSPEED_SINGLE_CLIENT


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out + out.err


@pytest.mark.parametrize("command", ["serve", "launch"])
def test_tokenspeed_with_two_frontends_is_a_usage_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _exit([command, "--backend", "tokenspeed", "--api-server-count", "2"], capsys)
    assert code == 2
    assert "TokenSpeed" in text
    assert "one" in text


def test_env_and_config_file_set_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SMG_TRIO_API_SERVER_COUNT", "2")
    code, text = _exit(["launch", "--backend", "tokenspeed"], capsys)
    assert (code, "TokenSpeed" in text) == (2, True)
    monkeypatch.delenv("SMG_TRIO_API_SERVER_COUNT")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"api_server_count": 3}))
    code, text = _exit(["launch", "--backend", "tokenspeed", "--config", str(config)], capsys)
    assert (code, "TokenSpeed" in text) == (2, True)
    monkeypatch.setenv("SMG_TRIO_API_SERVER_COUNT", "0")
    code, text = _exit(["launch", "--backend", "vllm"], capsys)
    assert code == 2
    assert "SMG_TRIO_API_SERVER_COUNT" in text


def test_auto_is_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    seen: list[int] = []

    def stop(args: object, engine_args: object) -> None:
        seen.append(args.api_server_count)
        raise SystemExit(5)

    monkeypatch.setattr(cli, "_config_from_args", stop)
    code, text = _exit(["serve", "--backend", "mock", "--api-server-count", "auto"], capsys)
    assert "--api-server-count auto: 2" in text
    assert (code, seen) == (5, [2])  # serve runs two frontends (no usage error)
