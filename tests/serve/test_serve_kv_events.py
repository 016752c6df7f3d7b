"""``serve --backend mock`` end to end: the launched mock binds its KV event endpoint in the
socket dir and publishes vLLM's batches there, and with ``--enable-prompt-tokens-details``
a repeated prompt reports the engine's cached tokens."""

from __future__ import annotations

import contextlib

import httpx
import trio
import zmq

from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.protocol.kv_events import BlockStored, decode_batch, decode_seq
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, open_gateway
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ports import random_worker_base_port
from tests.helpers.sockets import raw_socket

#: Starting serve and its mock engine process (imports numpy, zmq, the tokenizer).
DEADLINE_S = 60.0
PROBE_S = 0.2
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. " * 12},
    {"role": "user", "content": "Hello"},
]


async def test_serve_mock_publishes_kv_events_and_reports_hits(sock_dir: str) -> None:
    port = random_worker_base_port()
    config = GatewayConfig(
        port=0,
        served_model_name="mock-tiny",
        enable_prompt_tokens_details=True,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=port,
            socket_dir=sock_dir,
            engine_args=("--step-ms", "1"),
        ),
    )
    body = {"model": "mock-tiny", "messages": MESSAGES, "max_tokens": 2}
    with trio.fail_after(DEADLINE_S), contextlib.ExitStack() as stack:
        async with (
            open_gateway(with_api_server_count(config)) as handle,
            httpx.AsyncClient(base_url=handle.base_url, timeout=30) as http,
        ):
            sub = raw_socket(
                stack, zmq.SUB, connect=f"ipc://{sock_dir}/engine-{port}-kv.sock", SUBSCRIBE=b""
            )
            usages = []
            frames = None
            while frames is None:  # the first batches are lost while the SUB subscribes
                res = await http.post("/v1/chat/completions", json=body)
                assert res.status_code == 200, res.text
                usages.append(res.json()["usage"])
                with trio.move_on_after(PROBE_S):
                    frames = await sub.recv_multipart()
            res = await http.post("/v1/chat/completions", json=body)
            again = res.json()["usage"]
    topic, seq, payload = frames
    assert topic == b""
    assert decode_seq(seq) >= 0
    batch = decode_batch(payload)
    assert batch.events
    assert all(isinstance(e, BlockStored) for e in batch.events)
    assert usages[0]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["prompt_tokens_details"]["cached_tokens"] > 0
