"""vLLM's KV event wire: pinned payloads from vLLM 0.32.0's own structs, tolerance, framing."""

from __future__ import annotations

import msgspec
import pytest

from smg_trio.errors import DecodeError
from smg_trio.protocol.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    decode_kv_events_config,
    decode_seq,
    encode_batch,
    encode_replay_request,
    encode_seq,
    offset_endpoint_port,
)

# msgspec.msgpack.encode(vllm.distributed.kv_events.KVEventBatch(...)) in the vLLM 0.32.0 venv:
# BlockStored (int and bytes hashes, no parent), BlockRemoved, AllBlocksCleared, DP rank 1.
VLLM_BATCH_1 = bytes.fromhex(
    "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920b"
    "c4020102b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b"
    "5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac"
    "426c6f636b52656d6f766564ac626c6f636b5f686173686573910ba66d656469756da347505581a474797065"
    "b0416c6c426c6f636b73436c656172656401"
)
# A stored block with a parent, a LoRA name and extra_keys; data_parallel_rank omitted.
VLLM_BATCH_2 = bytes.fromhex(
    "93cb40000000000000009189a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739107"
    "b1706172656e745f626c6f636b5f6861736805a9746f6b656e5f696473920909aa626c6f636b5f73697a6502"
    "a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65a3616431aa65787472615f6b6579"
    "739191a3616431c0"
)


def test_vllm_batch_decodes() -> None:
    batch = decode_batch(VLLM_BATCH_1)
    assert batch.ts == 1.5
    assert batch.data_parallel_rank == 1
    assert batch.unknown == 0
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [11, b"\x01\x02"]
    assert stored.parent_block_hash is None
    assert stored.token_ids == [1, 2, 3, 4]
    assert stored.block_size == 2
    assert stored.medium == "GPU"
    assert stored.lora_name is None
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == [11]
    assert isinstance(cleared, AllBlocksCleared)


def test_vllm_batch_with_parent_lora_and_no_rank() -> None:
    batch = decode_batch(VLLM_BATCH_2)
    assert batch.data_parallel_rank is None
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.parent_block_hash == 5
    assert stored.lora_name == "ad1"
    assert stored.extra_keys == [("ad1",)]


def test_encode_matches_vllm_bytes() -> None:
    """The mock engine's publisher encodes exactly as vLLM's does."""
    batch = KVEventBatch(
        ts=1.5,
        events=[
            BlockStored(
                block_hashes=[11, b"\x01\x02"],
                parent_block_hash=None,
                token_ids=[1, 2, 3, 4],
                block_size=2,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            ),
            BlockRemoved(block_hashes=[11], medium="GPU"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=1,
    )
    assert encode_batch(batch) == VLLM_BATCH_1


def test_unknown_event_type_and_fields_are_tolerated() -> None:
    payload = msgspec.msgpack.encode(
        [
            3.0,
            [
                {"type": "BlockPromoted", "block_hashes": [1]},
                {"type": "BlockRemoved", "block_hashes": [2], "medium": None, "new_field": 7},
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.unknown == 1
    assert batch.events == [BlockRemoved(block_hashes=[2], medium=None)]


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgspec.msgpack.encode({"ts": 1}),
        msgspec.msgpack.encode([1.0, "not a list"]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": "x"}]]),
        msgspec.msgpack.encode([1.0, [{"no": "type"}]]),
        msgspec.msgpack.encode([1.0, [7]]),
    ],
)
def test_malformed_batches_raise_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_seq_frames() -> None:
    assert encode_seq(0) == b"\x00" * 8
    assert decode_seq(encode_seq(513)) == 513
    assert decode_seq(END_SEQ) == -1
    assert encode_replay_request(7) == [b"", (7).to_bytes(8, "big")]
    with pytest.raises(DecodeError):
        decode_seq(b"\x00" * 7)


def test_ready_response_config() -> None:
    cfg = decode_kv_events_config(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": "tcp://*:5557",
            "replay_endpoint": None,
            "buffer_steps": 10,
            "hwm": 5,
            "max_queue_size": 5,
            "topic": "kv",
            "future": 1,
        }
    )
    assert cfg is not None
    assert cfg.zmq_enabled
    assert cfg.engine_binds
    assert cfg.topic == "kv"
    dialer = decode_kv_events_config(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:6000"}
    )
    assert dialer is not None
    assert not dialer.engine_binds
    assert decode_kv_events_config(None) is None
    assert decode_kv_events_config({"endpoint": 5}) is None
    off = decode_kv_events_config({"enable_kv_cache_events": False})
    assert off is not None
    assert not off.zmq_enabled


def test_offset_endpoint_port_follows_vllm() -> None:
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    assert offset_endpoint_port("ipc:///run/kv", 0) == "ipc:///run/kv"
    with pytest.raises(ValueError):
        offset_endpoint_port("ipc:///run/kv", 1)


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deeply_nested_payload_is_a_decode_error(depth: int) -> None:
    """msgspec raises ``RecursionError`` on arrays nested past the interpreter's limit: a
    publisher's payload of them is malformed (``DecodeError``), not a crash of the feed."""
    head = msgspec.msgpack.encode(1.0)
    payload = b"\x93" + head + b"\x91" * depth + b"\xc0" + b"\xc0"
    with pytest.raises(DecodeError):
        decode_batch(payload)
