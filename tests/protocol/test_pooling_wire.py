"""The vLLM pooling wire: ``PoolingParams`` bytes equal vLLM 0.32's own encoder's, and
``pooling_output`` decodes from aux frames (in place), inline ``bfloat16``, and refuses NaN and
malformed tensors."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from smg_trio.codec.msgpack import decode, encoder
from smg_trio.errors import DecodeError, UnsupportedField
from smg_trio.protocol.pooling import PoolingParams, decode_pooling_output
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import GenerateRequest, PoolingOptions, SamplingOptions
from smg_trio.protocol.vllm import EngineCoreRequest, VllmProtocol, decode_outputs

# Pinned: vllm 0.32.0's ``MsgpackEncoder().encode(PoolingParams(...))`` in the vLLM peer venv,
# with the fields its frontend's ``verify`` resolves (use_activation, skip_reading_prefix_cache).
EMBED = "9ac3c0c0c0a5656d626564c2c2c0c002"
EMBED_DIM4_NO_ACT = "9ac204c0c0a5656d626564c2c2c0c002"
CLASSIFY = "9ac3c0c0c0a8636c617373696679c2c2c0c002"
# A cross-encoder pair whose second text's token type starts at 5 (vLLM's scoring frontend
# puts it in extra_kwargs as compressed_token_type_ids).
CLASSIFY_TYPES_5 = (
    "9ac3c0c0c0a8636c617373696679c2c2c081b9636f6d707265737365645f746f6b656e5f747970655f6964730502"
)
# EngineCoreOutputs with one finished output whose pooling_output is
# ``torch.arange(300, dtype=float32) / 7``: 1200 bytes, so an aux frame (index 1).
AUX_ENVELOPE = (
    "990091dc0012a17290c0c093a7666c6f6174333291cd012c0100c0c0c0c0c0c0c000c0c0c0c0c0cb40a158ad"
    "aac36296c0c0c0c0c0"
)
# ... and ``torch.tensor([1.5, -2.0], dtype=bfloat16)``: inline (ext 3).
BF16_ENVELOPE = (
    "990091dc0012a17290c0c093a862666c6f617431369102d603c03f00c000c0c0c0c0c0c0c000c0c0c0c0c0cb"
    "40a158af0e2bb430c0c0c0c0c0"
)


@pytest.mark.parametrize(
    ("opts", "pinned"),
    [
        (PoolingOptions(task="embed"), EMBED),
        (PoolingOptions(task="embed", dimensions=4, use_activation=False), EMBED_DIM4_NO_ACT),
        (PoolingOptions(task="classify"), CLASSIFY),
        (PoolingOptions(task="classify", token_type_start=5), CLASSIFY_TYPES_5),
    ],
)
def test_pooling_params_bytes_equal_vllms(opts: PoolingOptions, pinned: str) -> None:
    assert encoder.encode(PoolingParams.of(opts)).hex() == pinned


def _request(pooling: PoolingOptions | None) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", prompt_token_ids=[1, 2], sampling=SamplingOptions(), pooling=pooling
    )


def test_pooling_request_carries_pooling_params_and_no_sampling_params() -> None:
    frames = VllmProtocol().encode_add(_request(PoolingOptions(task="embed")))
    wire = msgspec.msgpack.decode(frames[1])
    assert wire[3] is None  # sampling_params
    assert msgspec.msgpack.encode(wire[4]).hex() == EMBED  # pooling_params, in place
    generate = decode(VllmProtocol().encode_add(_request(None))[1], EngineCoreRequest)
    assert generate.pooling_params is None
    assert generate.sampling_params is not None


def test_pooling_output_from_an_aux_frame_is_read_in_place() -> None:
    data = (np.arange(300, dtype=np.float32) / 7).tobytes()
    frames = [bytes.fromhex(AUX_ENVELOPE), memoryview(data)]
    out = decode_outputs(frames).outputs[0]
    assert out.finish_reason == "stop"
    assert out.pooling.shape == (300,)
    np.testing.assert_array_equal(out.pooling, np.arange(300, dtype=np.float32) / 7)
    assert np.shares_memory(out.pooling, np.frombuffer(data, dtype=np.uint8))  # zero-copy


def test_inline_bfloat16_pooling_output_widens_to_float32() -> None:
    out = decode_outputs([bytes.fromhex(BF16_ENVELOPE)]).outputs[0]
    assert out.pooling.dtype == np.float32
    assert out.pooling.tolist() == [1.5, -2.0]


def _failed(frames: list[bytes]) -> str:
    """The one output of ``frames``: failed alone (the batch decodes), its error message."""
    out = decode_outputs(frames).outputs[0]
    assert out.finish_reason == "error"
    assert out.pooling is None
    assert out.error is not None
    assert out.error.code == "invalid_pooling_output"
    return out.error.message


def test_nan_in_pooling_output_fails_that_request() -> None:
    data = np.array([1.0, np.nan] + [0.0] * 298, dtype=np.float32).tobytes()
    assert "NaN" in _failed([bytes.fromhex(AUX_ENVELOPE), data])
    with pytest.raises(DecodeError, match="NaN"):
        decode_pooling_output(["float32", [2], 1], [b"", data[:8]])


@pytest.mark.parametrize("data", [b"", b"\x00" * 1199, b"\x00" * 1204])
def test_malformed_pooling_frame_fails_that_request(data: bytes) -> None:
    assert "byte length" in _failed([bytes.fromhex(AUX_ENVELOPE), data])


def test_missing_aux_frame_fails_that_request() -> None:
    assert "aux frame index" in _failed([bytes.fromhex(AUX_ENVELOPE)])


def test_tokenspeed_refuses_pooling_by_name() -> None:
    with pytest.raises(UnsupportedField, match="pooling"):
        TokenSpeedProtocol().validate(_request(PoolingOptions(task="embed")))
