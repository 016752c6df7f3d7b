"""vLLM's ``--default-chat-template-kwargs`` (a JSON object) and ``--response-role`` reach the
gateway's HTTP config; anything but a JSON object is a usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smg_trio import cli
from smg_trio.serve import _http_config


def _config(argv: list[str]) -> object:
    parser = cli._parser()
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    return cli._config_from_args(args, [])


def test_flags_reach_the_http_config() -> None:
    config = _config(
        [
            "serve",
            "--backend",
            "mock",
            "--default-chat-template-kwargs",
            '{"enable_thinking": false}',
            "--response-role",
            "bot",
        ]
    )
    http = _http_config(config)  # type: ignore[arg-type]
    assert http.default_chat_template_kwargs == {"enable_thinking": False}
    assert http.response_role == "bot"
    plain = _http_config(_config(["serve", "--backend", "mock"]))  # type: ignore[arg-type]
    assert (plain.default_chat_template_kwargs, plain.response_role) == (None, "assistant")


def test_a_config_file_table_is_taken(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.json"
    cfg.write_text(json.dumps({"default_chat_template_kwargs": {"x": 1}}))
    config = _config(["serve", "--backend", "mock", "--config", str(cfg)])
    assert _http_config(config).default_chat_template_kwargs == {"x": 1}  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["[1]", "{bad", '"s"'])
def test_not_a_json_object_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _config(["serve", "--backend", "mock", "--default-chat-template-kwargs", value])
    assert exc.value.code == 2
    assert "--default-chat-template-kwargs" in capsys.readouterr().err
