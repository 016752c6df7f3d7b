"""vLLM 0.33.0 wire: ``EngineCoreOutput.error`` (a ``RequestError`` map sent with finish ERROR)
and the three coordinator keys of the registration. The struct copies below are vLLM 0.33.0's
own definitions (``vllm/v1/engine/__init__.py``, ``vllm/outputs.py`` in the vllm-0.33.0 wheel),
field for field, with the torch/numpy types replaced by ``Any``; the pinned vectors in
``conformance/vectors.py`` are what they encode to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from conformance import vectors as V
from smg_trio.codec import encoder
from smg_trio.protocol.handshake import (
    EngineCoreReadyResponse,
    decode_ready_response,
    encode_ready_response,
)
from smg_trio.protocol.types import EngineError
from smg_trio.protocol.vllm import decode_outputs


@dataclass(frozen=True)
class RequestError:  # vllm/outputs.py, 0.33.0
    code: str
    message: str
    retryable: bool = False


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vllm/v1/engine/__init__.py, 0.33.0 (19 fields)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    prefill_stats: Any = None
    routed_experts: Any = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: Any = None
    error: RequestError | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vllm/v1/engine/__init__.py, 0.33.0 (9 fields)."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: Any = None
    timestamp: float = 0.0
    utility_output: Any = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


PAUSED = RequestError(
    "engine_paused", "Generation is paused. Please retry after it resumes.", retryable=True
)
VALIDATION = RequestError("validation_error", "bad prompt")


def _error_envelope(err: RequestError) -> bytes:
    out = EngineCoreOutput("req-1", [], finish_reason=3, error=err)
    env = EngineCoreOutputs(outputs=[out], timestamp=1.5, finished_requests=["req-1"])
    return msgspec.msgpack.encode(env)


@pytest.mark.parametrize(
    ("err", "pinned"),
    [(PAUSED, V.VLLM033_OUTPUTS_PAUSED_HEX), (VALIDATION, V.VLLM033_OUTPUTS_VALIDATION_HEX)],
)
def test_error_vectors_are_what_vllm_033_definitions_encode(err: RequestError, pinned: str) -> None:
    assert _error_envelope(err).hex() == pinned


def test_stop_vector_is_the_033_layout() -> None:
    out = EngineCoreOutput("req-1", [100, 101], finish_reason=0)
    env = EngineCoreOutputs(outputs=[out], timestamp=1.5, finished_requests=["req-1"])
    assert msgspec.msgpack.encode(env).hex() == V.VLLM033_OUTPUTS_STOP_HEX


@pytest.mark.parametrize(
    ("pinned", "expected"),
    [
        (V.VLLM033_OUTPUTS_PAUSED_HEX, EngineError(PAUSED.code, PAUSED.message, True)),
        (V.VLLM033_OUTPUTS_VALIDATION_HEX, EngineError("validation_error", "bad prompt", False)),
    ],
)
def test_error_is_decoded(pinned: str, expected: EngineError) -> None:
    batch = decode_outputs([bytes.fromhex(pinned)])
    [out] = batch.outputs
    assert (out.request_id, out.new_token_ids, out.finish_reason) == ("req-1", [], "error")
    assert out.error == expected
    assert batch.finished_request_ids == ["req-1"]


def test_033_stop_and_032_vectors_decode_without_an_error() -> None:
    for pinned in (V.VLLM033_OUTPUTS_STOP_HEX, V.VLLM_OUTPUTS_STOP_HEX):
        [out] = decode_outputs([bytes.fromhex(pinned)]).outputs
        assert (out.new_token_ids, out.finish_reason, out.error) == ([100, 101], "stop", None)


def test_retryable_defaults_to_false_and_a_malformed_error_is_dropped() -> None:
    row: list[Any] = ["r", [], None, None, None, 3, *[None] * 7, 0, *[None] * 4]  # 18 fields
    ok = decode_outputs([encoder.encode([0, [[*row, {"code": "x", "message": "m"}]]])])
    assert ok.outputs[0].error == EngineError("x", "m", False)
    for bad in ("oops", {"code": 1}, [1, 2]):
        [out] = decode_outputs([encoder.encode([0, [[*row, bad]]])]).outputs
        assert (out.finish_reason, out.error) == ("error", None)


def test_033_registration_keys_decode_and_032_shape_is_unchanged() -> None:
    base = EngineCoreReadyResponse(
        max_model_len=4096,
        num_gpu_blocks=10,
        block_size=16,
        dtype="bfloat16",
        vllm_version="0.33.0",
        world_size=1,
        data_parallel_size=1,
    )
    plain = msgspec.msgpack.decode(encode_ready_response(base))
    assert "coord_store_port" not in plain
    assert "coordinator_input_address" not in plain
    payload = encode_ready_response(
        base,
        supports_lora=False,
        coord_store_port=29555,
        coordinator_input_address="tcp://127.0.0.1:1",
        coordinator_output_address="tcp://127.0.0.1:2",
    )
    got = decode_ready_response(payload)
    assert got.coord_store_port == 29555
    assert got.coordinator_input_address == "tcp://127.0.0.1:1"
    assert got.coordinator_output_address == "tcp://127.0.0.1:2"
    assert decode_ready_response(encode_ready_response(base)).coord_store_port == 0
