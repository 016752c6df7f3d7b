"""Reading a launched vLLM engine's structured-output backend from its own flag."""

from __future__ import annotations

import pytest

from smg_trio import cli
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve.so_backend import engine_structured_backend


@pytest.mark.parametrize(
    ("args", "backend"),
    [
        ([], None),
        (["--structured-outputs-config.backend", "xgrammar"], "xgrammar"),
        (["--structured-outputs-config.backend=guidance"], "guidance"),
        (["--structured-outputs-config", '{"backend": "outlines"}'], "outlines"),
        (['--structured-outputs-config={"disable_any_whitespace": true}'], None),
        (["--max-model-len", "4096"], None),
    ],
)
def test_engine_structured_backend(args: list[str], backend: str | None) -> None:
    assert engine_structured_backend(args) == backend


def test_a_bad_backend_is_an_error() -> None:
    with pytest.raises(ValueError, match="not one of"):
        engine_structured_backend(["--structured-outputs-config.backend", "magic"])


def test_serve_reads_it_from_the_engine_args() -> None:
    parser = cli._parser()
    argv = ["serve", str(default_tiny_model_dir()), "--backend", "mock"]
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    extra = ["--structured-outputs-config.backend", "xgrammar"]
    assert cli._config_from_args(args, extra).structured_outputs_backend == "xgrammar"
    assert cli._config_from_args(args, []).structured_outputs_backend == "auto"
