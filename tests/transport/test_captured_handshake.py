"""Real vLLM 0.32.0 handshake frames (captured on the wire) through our decoders and driver."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import trio
import zmq

from smg_trio.protocol.handshake import (
    decode_init,
    decode_ready_response,
    decode_status,
    encode_init,
)
from smg_trio.transport import bind_worker_sockets, engine_index, run_handshake
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import RawSocketFactory

CAPTURE = Path(__file__).parent.parent / "data" / "vllm0.32.0_engine_wire.jsonl"


def _frames(kind: str) -> list[bytes]:
    with CAPTURE.open() as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == kind:
                return [bytes.fromhex(h) for h in record["frames_hex"]]
    pytest.fail(f"no {kind!r} record in {CAPTURE.name}")


@pytest.mark.parametrize(
    ("kind", "status"), [("handshake_hello", "HELLO"), ("handshake_ready", "READY")]
)
def test_status_messages(kind: str, status: str) -> None:
    identity, payload = _frames(kind)
    assert engine_index(identity) == 0
    msg = decode_status(payload)
    assert msg.status == status
    assert msg.local is False
    assert msg.headless is True
    assert msg.parallel_config_hash is None  # vLLM 0.32 sends only three keys


def test_init() -> None:
    (payload,) = _frames("handshake_init")
    init = decode_init(payload)
    assert init.addresses.inputs == ["ipc:///tmp/probe-zmq/engine-in.sock"]
    assert init.addresses.outputs == ["ipc:///tmp/probe-zmq/engine-out.sock"]
    assert init.addresses.coordinator_input is None
    assert init.addresses.coordinator_output is None
    assert init.addresses.frontend_stats_publish_address is None
    assert init.parallel_config == {}
    # Our encoder produces the captured bytes exactly.
    assert encode_init(init.addresses.inputs[0], init.addresses.outputs[0]) == payload


def test_registration() -> None:
    identity, payload = _frames("registration")
    assert engine_index(identity) == 0
    ready = decode_ready_response(payload)
    assert ready.block_size == 128
    assert ready.block_size_tokens == 128
    assert ready.max_num_seqs == 128
    assert ready.max_num_batched_tokens == 2048
    assert ready.kv_cache_size_tokens == 1048576
    assert ready.kv_cache_max_concurrency == 1024.0
    assert ready.dtype == "float32"
    assert ready.vllm_version == "0.32.0"
    assert ready.max_model_len == 1024
    assert ready.num_gpu_blocks == 8192
    assert ready.world_size == 1
    assert ready.data_parallel_size == 1
    assert ready.data_parallel_rank == 0
    assert ready.dp_stats_address is None
    assert ready.kv_events_config is None
    assert not ready.is_lockstep


async def test_replayed_capture_completes_the_handshake(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    """A fake engine that replays the captured bytes verbatim, registration first (as vLLM does
    from its input thread), satisfies run_handshake."""
    identity, hello = _frames("handshake_hello")
    _, ready = _frames("handshake_ready")
    _, registration = _frames("registration")

    async def replay(handshake_address: str) -> None:
        hs = raw_socket(zmq.DEALER, connect=handshake_address, identity=identity)
        await hs.send_multipart([hello])
        init = decode_init((await hs.recv_multipart())[0])
        inp = raw_socket(zmq.DEALER, connect=init.addresses.inputs[0], identity=identity)
        await inp.send_multipart([registration])
        await hs.send_multipart([ready])

    with trio.fail_after(IO_DEADLINE_S):
        async with (
            bind_worker_sockets(ipc.addresses("engine")) as bound,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(partial(replay, bound.handshake_address))
            (reg,) = await run_handshake(bound, engine_count=1)
    assert reg.identity == b"\x00\x00"
    assert reg.index == 0
    assert reg.ready.vllm_version == "0.32.0"
    assert reg.ready.kv_cache_size_tokens == 1048576
