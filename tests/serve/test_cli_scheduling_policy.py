"""``serve --scheduling-policy``: vLLM's flag, passed to the vLLM engine command unless the
engine arguments after '--' set their own; a usage error with TokenSpeed."""

from __future__ import annotations

import os
from typing import Any

import pytest

from smg_trio import cli
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve.commands import build_engine_command


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SMG_TRIO_"):
            monkeypatch.delenv(key)


def _config(argv: list[str], engine_args: list[str]) -> Any:
    parser = cli._parser()
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    return cli._config_from_args(args, engine_args)


def _vllm(*flags: str, engine_args: tuple[str, ...] = ()) -> tuple[str, ...]:
    model = str(default_tiny_model_dir())
    config = _config(["serve", "--backend", "vllm", "--model", model, *flags], list(engine_args))
    return tuple(config.engines.engine_args)


def test_priority_policy_reaches_the_vllm_command() -> None:
    args = _vllm("--scheduling-policy", "priority")
    assert args == ("--scheduling-policy", "priority")
    argv = build_engine_command("vllm", "/m", port=31000, engine_args=args).argv
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"


def test_unset_policy_adds_nothing() -> None:
    assert "--scheduling-policy" not in _vllm()


@pytest.mark.parametrize("theirs", [("--scheduling-policy", "fcfs"), ("--scheduling-policy=fcfs",)])
def test_engine_args_after_the_separator_win(theirs: tuple[str, ...]) -> None:
    args = _vllm("--scheduling-policy", "priority", engine_args=theirs)
    assert args == theirs


def test_env_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_TRIO_SCHEDULING_POLICY", "priority")
    assert _vllm() == ("--scheduling-policy", "priority")


def test_tokenspeed_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(default_tiny_model_dir())
    with pytest.raises(SystemExit) as exc:
        _config(
            ["serve", "--backend", "tokenspeed", "--model", model, "--scheduling-policy", "fcfs"],
            [],
        )
    assert exc.value.code == 2
    assert "TokenSpeed" in capsys.readouterr().err


def test_bad_value_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        _config(["serve", "--backend", "vllm", "--scheduling-policy", "lifo"], [])
