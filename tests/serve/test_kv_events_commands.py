"""``serve`` turns KV cache events on for the engines it launches: vLLM's and the mock's
``--kv-events-config`` with an ipc endpoint beside the worker's sockets, unless the operator
passed their own after ``--``; off (and said so) for a vLLM engine with several DP ranks."""

from __future__ import annotations

import json
import logging

import pytest

from smg_trio.mock.kv_publisher import parse_kv_events_config
from smg_trio.serve.commands import build_engine_command


def _config(argv: list[str]) -> dict[str, object]:
    (i,) = [i for i, a in enumerate(argv) if a == "--kv-events-config"]
    value = json.loads(argv[i + 1])
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize("backend", ["vllm", "mock"])
def test_launched_engines_publish_on_an_ipc_endpoint_they_bind(backend: str) -> None:
    launch = build_engine_command(backend, "/m", port=31000, socket_dir="/tmp/s")
    value = _config(launch.argv)
    assert value == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "ipc:///tmp/s/engine-31000-kv.sock",
    }
    parsed = parse_kv_events_config(json.dumps(value))  # vLLM's fields, nothing else
    assert parsed.zmq_enabled
    assert parsed.engine_binds


@pytest.mark.parametrize("backend", ["vllm", "mock"])
@pytest.mark.parametrize(
    "own",
    [
        ["--kv-events-config", '{"enable_kv_cache_events": false}'],
        ['--kv-events-config={"enable_kv_cache_events": true, "endpoint": "tcp://*:7000"}'],
    ],
)
def test_the_operators_own_config_wins(backend: str, own: list[str]) -> None:
    launch = build_engine_command(backend, "/m", port=31000, socket_dir="/tmp/s", engine_args=own)
    assert sum(a.startswith("--kv-events-config") for a in launch.argv) == 1
    assert launch.argv[-len(own) :] == own


def test_vllm_with_several_dp_ranks_gets_none_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="smg_trio.serve.commands"):
        launch = build_engine_command(
            "vllm", "/m", port=31000, socket_dir="/tmp/s", engine_args=["--data-parallel-size", "2"]
        )
    assert "--kv-events-config" not in launch.argv
    assert "KV cache events stay off" in caplog.text


def test_tokenspeed_gets_none() -> None:
    launch = build_engine_command("tokenspeed", "/m", port=31000, socket_dir="/tmp/s")
    assert not any(a.startswith("--kv-events-config") for a in launch.argv)


@pytest.mark.parametrize("backend", ["vllm", "mock"])
def test_none_without_prefix_caching(backend: str) -> None:
    off = ["--no-enable-prefix-caching"]
    launch = build_engine_command(backend, "/m", port=31000, socket_dir="/tmp/s", engine_args=off)
    assert "--kv-events-config" not in launch.argv
