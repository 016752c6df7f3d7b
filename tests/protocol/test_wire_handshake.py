"""Handshake maps: HELLO/READY, INIT, and the input registration (wire-spec section 1.2)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from smg_trio.codec import encoder
from smg_trio.errors import DecodeError
from smg_trio.protocol.handshake import (
    EngineCoreReadyResponse,
    decode_init,
    decode_ready_response,
    decode_status,
    encode_init,
    encode_ready_response,
    encode_status,
)

HELLO_HEX = (
    "84a6737461747573a548454c4c4fa56c6f63616cc3a8686561646c657373c3b4706172616c6c656c5f636f6e"
    "6669675f68617368c0"
)
INIT_HEX = (
    "82a961646472657373657385a6696e7075747391b46970633a2f2f2f746d702f772d696e2e736f636ba76f75"
    "747075747391b56970633a2f2f2f746d702f772d6f75742e736f636bb1636f6f7264696e61746f725f696e70"
    "7574c0b2636f6f7264696e61746f725f6f7574707574c0be66726f6e74656e645f73746174735f7075626c69"
    "73685f61646472657373c0af706172616c6c656c5f636f6e66696780"
)
# vLLM 0.32.0's own HELLO (captured): three keys, local false.
VLLM_HELLO_HEX = "83a6737461747573a548454c4c4fa56c6f63616cc2a8686561646c657373c3"


def test_hello_matches_the_pinned_hex() -> None:
    assert encode_status("HELLO").hex() == HELLO_HEX


def test_ready_differs_from_hello_only_in_the_status_string() -> None:
    expected = HELLO_HEX.replace("a548454c4c4f", "a55245414459")
    assert expected != HELLO_HEX
    assert encode_status("READY").hex() == expected


def test_vllm_three_key_form_matches_the_real_engine() -> None:
    assert encode_status("HELLO", local=False, with_hash_key=False).hex() == VLLM_HELLO_HEX


def test_decode_status_accepts_three_and_four_key_forms() -> None:
    three = decode_status(bytes.fromhex(VLLM_HELLO_HEX))
    assert (three.status, three.local, three.headless) == ("HELLO", False, True)
    assert three.parallel_config_hash is None
    four = decode_status(bytes.fromhex(HELLO_HEX))
    assert (four.status, four.local, four.headless) == ("HELLO", True, True)


def test_decode_status_ignores_unknown_keys_and_defaults_missing_ones() -> None:
    msg = decode_status(
        encoder.encode({"status": "READY", "num_gpu_blocks": 8192, "dp_stats_address": None})
    )
    assert msg.status == "READY"
    assert msg.local is None
    assert msg.headless is None
    hashed = decode_status(encoder.encode({"status": "READY", "parallel_config_hash": "abc"}))
    assert hashed.parallel_config_hash == "abc"


@pytest.mark.parametrize("payload", [b"\x92\xa5HELLO\xc3", b"\xa5HELLO", b"\xc1"])
def test_decode_status_rejects_non_maps(payload: bytes) -> None:
    with pytest.raises(DecodeError, match="HandshakeStatus"):
        decode_status(payload)


def test_init_matches_the_pinned_hex() -> None:
    assert encode_init("ipc:///tmp/w-in.sock", "ipc:///tmp/w-out.sock").hex() == INIT_HEX


def test_init_is_a_map_with_nil_coordinators_and_empty_parallel_config() -> None:
    raw = msgspec.msgpack.decode(encode_init("ipc:///a-in.sock", "ipc:///a-out.sock"))
    assert raw == {
        "addresses": {
            "inputs": ["ipc:///a-in.sock"],
            "outputs": ["ipc:///a-out.sock"],
            "coordinator_input": None,
            "coordinator_output": None,
            "frontend_stats_publish_address": None,
        },
        "parallel_config": {},
    }
    assert list(raw) == ["addresses", "parallel_config"]


def test_decode_init_round_trips_and_ignores_unknown_keys() -> None:
    meta = decode_init(bytes.fromhex(INIT_HEX))
    assert meta.addresses.inputs == ["ipc:///tmp/w-in.sock"]
    assert meta.addresses.outputs == ["ipc:///tmp/w-out.sock"]
    assert meta.parallel_config == {}
    extra = encoder.encode(
        {"addresses": {"inputs": ["i"], "outputs": ["o"], "future": 1}, "new_top_level": True}
    )
    assert decode_init(extra).addresses.inputs == ["i"]


@pytest.mark.parametrize(
    "addresses",
    [{"inputs": [], "outputs": ["o"]}, {"inputs": ["i"], "outputs": []}],
)
def test_decode_init_requires_an_input_and_an_output(addresses: dict[str, Any]) -> None:
    with pytest.raises(DecodeError, match="at least one input and one output"):
        decode_init(encoder.encode({"addresses": addresses, "parallel_config": {}}))


def ready_map(**overrides: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "max_model_len": 4096,
        "num_gpu_blocks": 100,
        "block_size": 16,
        "dp_stats_address": None,
        "dtype": "bfloat16",
        "vllm_version": "0.22.0",
        "world_size": 1,
        "data_parallel_size": 1,
    }
    msg.update(overrides)
    return {k: v for k, v in msg.items() if v is not ...}


def test_ready_response_reads_version_dtype_and_defaults() -> None:
    r = decode_ready_response(encoder.encode(ready_map()))
    assert r.vllm_version == "0.22.0"
    assert r.dtype == "bfloat16"
    assert r.max_model_len == 4096
    assert r.block_size_tokens == 16
    assert r.kv_events_config is None
    assert r.kv_cache_size_tokens is None
    assert r.tensor_parallel_size == 0
    assert r.instance_id == ""
    assert not r.is_lockstep


def test_ready_response_accepts_negative_max_num_batched_tokens() -> None:
    r = decode_ready_response(encoder.encode(ready_map(max_num_batched_tokens=-1)))
    assert r.max_num_batched_tokens == -1


def test_ready_response_accepts_tokenspeed_prefix_granularity() -> None:
    r = decode_ready_response(
        encoder.encode(
            ready_map(block_size=..., prefix_granularity=64, vllm_version="tokenspeed-0.1.1")
        )
    )
    assert r.block_size is None
    assert r.block_size_tokens == 64


def test_ready_response_without_block_size_or_granularity_is_rejected() -> None:
    with pytest.raises(DecodeError, match="neither block_size nor prefix_granularity"):
        decode_ready_response(encoder.encode(ready_map(block_size=...)))


def test_ready_response_ignores_unknown_keys() -> None:
    r = decode_ready_response(
        encoder.encode(ready_map(supports_lora=False, mamba_block_size=None, max_loras=0))
    )
    assert r.world_size == 1


def test_lockstep_when_data_parallel_size_above_one() -> None:
    assert decode_ready_response(encoder.encode(ready_map(data_parallel_size=2))).is_lockstep


def test_empty_registration_is_rejected() -> None:
    with pytest.raises(DecodeError, match="empty engine registration"):
        decode_ready_response(b"")


@pytest.mark.parametrize("dtype", ["float64", "int8", "fp8", "half"])
def test_ready_response_rejects_other_dtypes(dtype: str) -> None:
    with pytest.raises(DecodeError, match="EngineCoreReadyResponse"):
        decode_ready_response(encoder.encode(ready_map(dtype=dtype)))


@pytest.mark.parametrize(
    "missing", ["max_model_len", "num_gpu_blocks", "dtype", "vllm_version", "world_size"]
)
def test_ready_response_requires_its_required_keys(missing: str) -> None:
    with pytest.raises(DecodeError, match=missing):
        decode_ready_response(encoder.encode(ready_map(**{missing: ...})))


def test_encode_ready_response_round_trips_with_extra_keys() -> None:
    resp = EngineCoreReadyResponse(
        max_model_len=1024,
        num_gpu_blocks=0,
        dtype="float32",
        vllm_version="tokenspeed-x",
        world_size=1,
        data_parallel_size=2,
        prefix_granularity=32,
        instance_id="mock",
    )
    payload = encode_ready_response(resp, multimodal_encoder_dtype="float32")
    raw = msgspec.msgpack.decode(payload)
    assert "block_size" not in raw
    assert raw["prefix_granularity"] == 32
    assert raw["multimodal_encoder_dtype"] == "float32"
    back = decode_ready_response(payload)
    assert back == resp
