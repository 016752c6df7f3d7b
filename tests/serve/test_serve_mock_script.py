"""The scriptable mock (docs/mock.md) end to end: the openai SDK against the real gateway over
real ZMQ, on the vLLM wire (``serve`` launching ``--backend mock`` with ``mock_script``) and
the TokenSpeed wire (``python -m smg_trio mock-engine --protocol tokenspeed --script`` dialing a
``launch``-style gateway); bad scripts are usage errors (exit 2) naming the rule."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from smg_trio import cli
from smg_trio.mock import engine as mock_engine
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, ServeHandle, open_gateway
from smg_trio.tokenizer import Tokenizer
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ipc import free_handshake_address
from tests.helpers.ports import random_worker_base_port

MODEL = "mock-tiny"
TEXT = "The weather is sunny today, with a light breeze."
IDS_TEXT = "Forty two."
LONG = "one two three four five six seven eight nine ten"


def _tok() -> Tokenizer:
    return Tokenizer.from_dir(default_tiny_model_dir())


def _rules(tok: Tokenizer) -> list[dict[str, Any]]:
    return [
        {"name": "tps2", "contains": "[tps2]", "text": TEXT, "tokens_per_step": 2},
        {"name": "tps7", "contains": "[tps7]", "text": TEXT, "tokens_per_step": 7},
        {"name": "ids", "contains": "[ids]", "token_ids": tok.encode(IDS_TEXT)},
        {"name": "steps", "contains": "[steps]", "steps": ["The weather", tok.encode(" is"), ""]},
        {"name": "cut", "contains": "[cut]", "text": LONG},
        {"name": "len", "contains": "[len]", "text": "short", "finish_reason": "length"},
        {"name": "stop-reason", "contains": "[stopr]", "text": "done", "stop_reason": "END"},
        {"name": "weather", "regex": r"(?i)\bweather\b", "text": TEXT},
    ]


def _write_toml(path: Path, rules: list[dict[str, Any]]) -> None:
    lines: list[str] = []
    for rule in rules:
        lines.append("[[rules]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in rule.items()]
    path.write_text("\n".join(lines) + "\n")


def _script(tmp_path: Path, suffix: str) -> Path:
    path = tmp_path / f"script{suffix}"
    rules = _rules(_tok())
    if suffix == ".toml":
        _write_toml(path, rules)
    else:
        path.write_text(json.dumps({"rules": rules}))
    return path


@asynccontextmanager
async def _vllm_gateway(script: Path, sock_dir: str) -> AsyncIterator[str]:
    config = GatewayConfig(
        port=0,
        served_model_name=MODEL,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
            engine_args=("--eos-token-id", "2", "--step-ms", "1"),
            mock_script=str(script),
        ),
    )
    async with open_gateway(with_api_server_count(config)) as handle:
        yield handle.base_url


@asynccontextmanager
async def _tokenspeed_gateway(script: Path, sock_dir: str) -> AsyncIterator[str]:
    url = f"ipc://{sock_dir}/engine-ts"
    handshake = free_handshake_address()
    assert worker_addresses(url, handshake).handshake == handshake
    argv = [
        sys.executable, "-m", "smg_trio", "mock-engine", "--protocol", "tokenspeed",
        "--handshake", handshake, "--eos-token-id", "2", "--step-ms", "1",
        "--script", str(script), "--model", str(default_tiny_model_dir()),
    ]  # fmt: skip
    proc = await trio.lowlevel.open_process(argv, stdout=subprocess.DEVNULL)
    config = GatewayConfig(
        port=0,
        served_model_name=MODEL,
        worker_urls=(url,),
        backend="tokenspeed",
        model_path=str(default_tiny_model_dir()),
        zmq_handshake_address=handshake,
    )
    try:
        handle: ServeHandle
        # always one frontend: TokenSpeed's wire has a single client (docs/multi-frontend.md)
        async with open_gateway(config) as handle:
            yield handle.base_url
    finally:
        proc.terminate()
        await proc.wait()


async def _both(client: openai.AsyncOpenAI, prompt: str, **kw: Any) -> tuple[Any, str, str]:
    """The non-streamed response, its content, and the streamed deltas' concatenation."""
    messages = [{"role": "user", "content": prompt}]
    res = await client.chat.completions.create(model=MODEL, messages=messages, **kw)  # type: ignore[arg-type]
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        stream=True,
        **kw,
    )
    parts: list[str] = []
    finish: list[str] = []
    async for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason is not None:
                finish.append(choice.finish_reason)
    assert finish == [res.choices[0].finish_reason], (prompt, finish)
    return res, res.choices[0].message.content or "", "".join(parts)


# The openai client stops reading its SSE generators at [DONE] without closing them; trio's
# async-generator finalizer then warns when they are collected. That is the client's issue.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
@pytest.mark.parametrize(("wire", "suffix"), [("vllm", ".json"), ("tokenspeed", ".toml")])
async def test_scripted_replies_on_both_wires(
    wire: str, suffix: str, tmp_path: Path, sock_dir: str
) -> None:
    script = _script(tmp_path, suffix)
    gateway = _vllm_gateway if wire == "vllm" else _tokenspeed_gateway
    with trio.fail_after(90):
        async with gateway(script, sock_dir) as base_url:
            client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
            try:
                # A regex rule; 1, 2 and 7 tokens per step; streamed == non-streamed.
                for prompt in ("What's the WEATHER?", "[tps2] weather", "[tps7] weather"):
                    res, content, streamed = await _both(client, prompt, max_tokens=64)
                    assert content == TEXT, prompt
                    assert streamed == TEXT, prompt
                    assert res.choices[0].finish_reason == "stop"
                # token_ids and explicit steps (text chunks, ids, an empty step)
                res, content, streamed = await _both(client, "[ids]", max_tokens=64)
                assert content == streamed == IDS_TEXT
                res, content, streamed = await _both(client, "[steps]", max_tokens=64)
                assert content == streamed == "The weather is"
                # a scripted reply longer than max_tokens is cut there with finish 'length'
                res, content, streamed = await _both(client, "[cut]", max_tokens=3)
                assert res.choices[0].finish_reason == "length"
                assert res.usage is not None
                assert res.usage.completion_tokens == 3
                assert content == streamed
                assert LONG.startswith(content)
                assert content != LONG
                # a scripted finish reason
                res, content, streamed = await _both(client, "[len]", max_tokens=64)
                assert content == streamed == "short"
                assert res.choices[0].finish_reason == "length"
                # a stop_reason: the vLLM wire carries it, TokenSpeed's has no such column
                res, content, streamed = await _both(client, "[stopr]", max_tokens=64)
                assert content == streamed == "done"
                assert res.choices[0].finish_reason == "stop"
                stop_reason = (res.choices[0].model_extra or {}).get("stop_reason")
                assert stop_reason == ("END" if wire == "vllm" else None)
                # no rule matches: today's random tokens, up to max_tokens
                res, content, _ = await _both(client, "hello there", max_tokens=5)
                assert res.choices[0].finish_reason == "length"
                assert res.usage is not None
                assert res.usage.completion_tokens == 5
                assert content not in (TEXT, IDS_TEXT, "short")
            finally:
                await client.close()


# -- bad scripts are usage errors --------------------------------------------------------------

_BAD: list[tuple[Any, str]] = [
    ({"rules": [{"name": "w", "contains": "x", "text": "y", "colour": 1}]}, "rule 1 ('w'): unknown key `colour`"),
    ({"rules": [{"contains": "x", "text": "y"}, {"regex": "(open", "text": "y"}]}, "rule 2: bad regex '(open'"),
    ({"rules": [{"name": "empty", "contains": "x"}]}, "rule 1 ('empty'): needs a reply"),
    ({"rules": [{"contains": "x", "text": "y", "token_ids": [5]}]}, "gives both 'text' and 'token_ids'"),
    ({"rules": [{"contains": "x", "token_ids": [1 << 20]}]}, "outside the vocabulary"),
    ({"rules": [{"contains": "x", "text": "y", "finish_reason": "tool_calls"}]}, "$.finish_reason"),
    ({"rules": [{"contains": "x", "text": "y", "tokens_per_step": 0}]}, "$.tokens_per_step"),
    ({"rules": [{"text": "y"}, {"contains": "x", "text": "z"}]}, "rule 2 is never reached"),
    ({"rule": []}, "unknown key `rule`"),
    ("{not json", "not valid JSON"),
]  # fmt: skip


def _bad_file(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(("content", "message"), _BAD)
def test_bad_script_is_a_usage_error_from_serve(
    content: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bad_file(tmp_path, content)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--backend", "mock", "--port", "0", "--mock-script", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"mock script {path}" in err, err
    assert message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("content", "message"), _BAD[:3])
def test_bad_script_is_a_usage_error_from_the_mock_engine(
    content: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bad_file(tmp_path, content)
    argv = ["--handshake", "tcp://127.0.0.1:1", "--script", str(path)]
    for run in (mock_engine.main, lambda a: cli.main(["mock-engine", *a])):
        with pytest.raises(SystemExit) as exc:
            run(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert "Traceback" not in err, err


def test_bad_script_exits_2_from_a_real_process(tmp_path: Path) -> None:
    path = _bad_file(tmp_path, _BAD[1][0])
    done = subprocess.run(
        [sys.executable, "-m", "smg_trio.mock.engine", "--handshake", "tcp://127.0.0.1:1",
         "--script", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "rule 2: bad regex" in done.stderr
    assert "Traceback" not in done.stderr


def test_mock_script_needs_the_mock_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _script(tmp_path, ".json")
    model = str(default_tiny_model_dir())
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--backend", "vllm", "--model", model, "--mock-script", str(path)])
    assert exc.value.code == 2
    assert "--mock-script needs --backend mock" in capsys.readouterr().err


def test_mock_script_reads_env_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _script(tmp_path, ".json")
    monkeypatch.setenv("SMG_TRIO_MOCK_SCRIPT", str(path))
    parser = cli._parser()
    argv = ["serve", "--backend", "mock"]
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    config = cli._config_from_args(args, [])
    assert config.engines.mock_script == str(path)
    monkeypatch.delenv("SMG_TRIO_MOCK_SCRIPT")
    conf = tmp_path / "gw.toml"
    conf.write_text(f"mock_script = {json.dumps(str(path))}\n")
    argv = ["serve", "--backend", "mock", "--config", str(conf)]
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    assert args.mock_script == str(path)


async def test_embedding_refuses_a_bad_script_before_launch(tmp_path: Path, sock_dir: str) -> None:
    path = _bad_file(tmp_path, _BAD[2][0])
    config = GatewayConfig(
        port=0,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=random_worker_base_port(),
            mock_script=str(path),
        ),
    )
    with (
        trio.fail_after(30),
        pytest.RaisesGroup(
            pytest.RaisesExc(ValueError, match="needs a reply"), flatten_subgroups=True
        ),
    ):
        async with open_gateway(with_api_server_count(config)):
            pytest.fail("serve started with a bad mock script")
    other = GatewayConfig(
        port=0,
        engines=EngineLaunchConfig(
            backend="vllm", model=str(default_tiny_model_dir()), mock_script=str(path)
        ),
    )
    with (
        trio.fail_after(30),
        pytest.RaisesGroup(
            pytest.RaisesExc(ValueError, match="needs backend 'mock'"), flatten_subgroups=True
        ),
    ):
        async with open_gateway(with_api_server_count(other)):
            pytest.fail("serve started a vllm backend with a mock script")
