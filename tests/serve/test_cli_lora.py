"""``serve --lora-modules`` (vLLM's two forms), ``--enable-lora``, ``--max-loras`` and
``--max-lora-rank``: parsed as vLLM parses them and passed to the vLLM engine command unless
given after '--'; a usage error with TokenSpeed or a malformed entry. And the static adapters'
startup checks (allow-list, adapter folder, names)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from smg_trio import cli
from smg_trio.lora import LoraModule, parse_lora_module
from smg_trio.mock.tiny_lora import build_tiny_lora
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve.lora_setup import LoraSetupError, check_static_adapters
from smg_trio.worker.confine import WorkerConfinement


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


def _serve(backend: str, *flags: str, engine_args: tuple[str, ...] = ()) -> Any:
    model = str(default_tiny_model_dir())
    return _config(["serve", "--backend", backend, "--model", model, *flags], list(engine_args))


def test_both_forms_parse_as_vllm_does() -> None:
    assert parse_lora_module("sql=/a/b") == LoraModule("sql", "/a/b")
    doc = '{"name": "sql", "path": "/a/b", "base_model_name": "tiny"}'
    assert parse_lora_module(doc) == LoraModule("sql", "/a/b", "tiny")
    config = _serve("vllm", "--lora-modules", "a=/x", doc)
    assert config.lora_modules == (LoraModule("a", "/x"), LoraModule("sql", "/a/b", "tiny"))


@pytest.mark.parametrize(
    "bad", ["{not json", '{"name": "x"}', '{"name": "x", "path": "/p", "z": 1}']
)
def test_a_malformed_entry_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _serve("vllm", "--lora-modules", bad)
    assert exc.value.code == 2
    assert "--lora-modules" in capsys.readouterr().err


def test_adapters_launch_vllm_with_lora_enabled() -> None:
    config = _serve("vllm", "--lora-modules", "a=/x", "b=/y")
    assert config.engines.engine_args == (
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
    )  # fmt: skip
    assert config.max_lora_rank == 16
    config = _serve("vllm", "--enable-lora", "--max-loras", "3", "--max-lora-rank", "32")
    assert config.engines.engine_args == (
        "--enable-lora",
        "--max-loras",
        "3",
        "--max-lora-rank",
        "32",
    )
    assert config.max_lora_rank == 32
    assert _serve("vllm").engines.engine_args == ()  # no adapters: nothing
    assert _serve("vllm").max_lora_rank is None


def test_engine_args_after_the_separator_win() -> None:
    theirs = ("--enable-lora", "--max-loras", "5", "--max-lora-rank=64")
    config = _serve("vllm", "--lora-modules", "a=/x", engine_args=theirs)
    assert config.engines.engine_args == theirs
    assert config.max_lora_rank == 64  # read back: the gateway checks loads against it


def test_tokenspeed_has_no_adapters(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _serve("tokenspeed", "--lora-modules", "a=/x")
    assert "TokenSpeed" in capsys.readouterr().err


async def test_static_adapters_are_checked_before_launch(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    good = build_tiny_lora(root / "good", base_model="tiny")
    outside = build_tiny_lora(tmp_path / "outside", base_model="tiny")
    (root / "plain").mkdir()
    os.symlink(outside, root / "link")
    confinement = WorkerConfinement(socket_dirs=(str(tmp_path),), model_dirs=(str(root),))
    with trio.fail_after(10):
        await check_static_adapters([LoraModule("good", str(good))], confinement)
        for module, needle in [
            (LoraModule("x", str(outside)), "outside the allowed"),
            (LoraModule("x", str(root / "link")), "outside the allowed"),
            (LoraModule("x", str(root / "plain")), "no adapter_config.json"),
        ]:
            with pytest.raises(LoraSetupError, match=needle):
                await check_static_adapters([module], confinement)
        with pytest.raises(LoraSetupError, match="twice"):
            await check_static_adapters(
                [LoraModule("good", str(good)), LoraModule("good", str(good))], confinement
            )


def test_frontends_lora_info_is_merged_by_time_not_summed() -> None:
    from smg_trio.serve.metrics_merge import merge_expositions

    series = (
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
        'waiting_lora_adapters=""} %s\n'
    )
    text = merge_expositions([series % "100.0", series % "101.0"]).decode()
    assert 'waiting_lora_adapters=""} 101.0' in text
