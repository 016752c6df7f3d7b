"""vLLM EngineCore wire: request frames, the sampling map, output envelopes and logprobs
(wire-spec section 4)."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import numpy as np
import pytest

from smg_trio.codec import encode_tensor_inline, encoder
from smg_trio.errors import DecodeError, UnsupportedField, ValidationError
from smg_trio.protocol import GenerateRequest, SamplingOptions, StructuredOutputs
from smg_trio.protocol.vllm import (
    ABORT,
    ADD,
    START_DP_WAVE,
    UTILITY,
    EngineCoreRequest,
    FinishReasonCode,
    VllmProtocol,
    build_sampling_params,
    decode_outputs,
    resolve_logprobs,
)

PROTO = VllmProtocol()

# wire-spec section 4.6, derived with msgspec (newest 8-element envelope, 17-element outputs).
OUTPUTS_STOP_HEX = (
    "980091dc0011a57265712d31926465c0c0c000c0c0c0c0c0c0c000c0c0c0c0cb3ff8000000000000c091a572"
    "65712d31c0c0"
)
OUTPUTS_LOGPROBS_HEX = (
    "980091dc0011a57265712d3191079493a33c6938920102d8030700000000000000080000000000000093a33c"
    "6634920102d703000000bf000000c093a33c69389101d7030200000000000000c0c0c0c0c0c0c0c0c0c0c000"
    "c0c0c0c0cb3ff8000000000000c0c0c0c0"
)

# vLLM SamplingParams defaults for the keys smg writes (vllm/sampling_params.py, 0.32.0).
VLLM_SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "seed": None,
    "max_tokens": 16,
    "min_tokens": 0,
    "logprobs": None,
    "prompt_logprobs": None,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "stop_token_ids": [],
    "_eos_token_id": None,
    "_all_stop_token_ids": [],
}


def request(
    *, eos: int | None = None, extra_eos: list[int] | None = None, **sampling: Any
) -> GenerateRequest:
    return GenerateRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingOptions(**sampling),
        eos_token_id=eos,
        extra_eos_token_ids=extra_eos or [],
    )


def output(request_id: str = "req-1", tokens: list[int] | None = None, **fields: Any) -> list[Any]:
    """A 16-element EngineCoreOutput array (smg's model) with selected fields set."""
    order = [
        "request_id", "new_token_ids", "new_logprobs", "new_prompt_logprobs_tensors",
        "pooling_output", "finish_reason", "stop_reason", "events", "kv_transfer_params",
        "ec_transfer_params", "trace_headers", "prefill_stats", "routed_experts",
        "num_nans_in_logits", "mm_cache_miss_hashes", "new_sampling_mask",
    ]  # fmt: skip
    row: list[Any] = [None] * len(order)
    row[0] = request_id
    row[1] = tokens if tokens is not None else []
    row[13] = 0
    for name, value in fields.items():
        row[order.index(name)] = value
    return row


def envelope(outputs: list[Any], **fields: Any) -> list[Any]:
    """An 8-element EngineCoreOutputs array."""
    order = [
        "engine_index", "outputs", "scheduler_stats", "timestamp", "utility_output",
        "finished_requests", "wave_complete", "start_wave",
    ]  # fmt: skip
    row: list[Any] = [0, outputs, None, 1.5, None, None, None, None]
    for name, value in fields.items():
        row[order.index(name)] = value
    return row


def frames_of(env: list[Any], *aux: bytes) -> list[bytes]:
    return [encoder.encode(env), *aux]


def logprobs_inline(ids: list[list[int]], lps: list[list[float]], ranks: list[int]) -> list[Any]:
    return [
        encode_tensor_inline(np.array(ids, dtype="<i8").reshape(len(ids), -1)),
        encode_tensor_inline(np.array(lps, dtype="<f4").reshape(len(lps), -1)),
        encode_tensor_inline(np.array(ranks, dtype="<i8")),
        None,
    ]


# -- control frames --------------------------------------------------------------------------


def test_request_type_bytes() -> None:
    assert (ADD, ABORT, START_DP_WAVE, UTILITY) == (b"\x00", b"\x01", b"\x02", b"\x03")


def test_abort_frame() -> None:
    assert PROTO.encode_abort(["req-1"]) == [b"\x01", bytes.fromhex("91a57265712d31")]
    assert msgspec.msgpack.decode(PROTO.encode_abort(["req-abort"])[1]) == ["req-abort"]


def test_start_wave_encodes_a_nil_excluded_rank() -> None:
    frames = PROTO.encode_start_wave(9)
    assert frames == [b"\x02", bytes.fromhex("9209c0")]


# -- EngineCoreRequest -----------------------------------------------------------------------


def test_engine_core_request_serializes_as_a_full_positional_array() -> None:
    wire = EngineCoreRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        sampling_params={"max_tokens": 8},
        arrival_time=1234.5,
        client_index=7,
    )
    raw = msgspec.msgpack.decode(encoder.encode(wire))
    assert isinstance(raw, list)
    assert len(raw) == 22
    assert raw[0] == "req-1"
    assert raw[1] == [1, 2, 3]
    assert raw[2] is None
    assert raw[3] == {"max_tokens": 8}
    assert raw[4] is None
    assert raw[5] == 1234.5
    assert raw[10] is None
    assert raw[11] == 7
    assert raw[12:16] == [0, 0, None, False]
    assert raw[19] is False
    assert raw[21] is None


def test_encode_add_frames() -> None:
    req = request(max_tokens=8)
    req.arrival_time = 99.25
    req.data_parallel_rank = 1
    frames = PROTO.encode_add(req)
    assert frames[0] == b"\x00"
    assert len(frames) == 2
    raw = msgspec.msgpack.decode(frames[1])
    assert len(raw) == 22
    assert raw[0] == "req-1"
    assert raw[1] == [1, 2, 3]
    assert raw[3]["max_tokens"] == 8
    assert raw[5] == 99.25
    assert raw[8] == 1  # data_parallel_rank
    assert raw[9] is None  # prompt_embeds
    assert raw[11] == 0  # client_index
    assert raw[16] is None  # external_req_id: the id goes out as-is


def test_short_real_engine_style_request_decodes_with_a_sparse_sampling_map() -> None:
    sparse = {"stop_token_ids": [151643], "skip_reading_prefix_cache": False}
    payload = encoder.encode(["req-1", [1, 2], None, sparse, None, 1.0])
    req = msgspec.msgpack.decode(payload, type=EngineCoreRequest)
    assert req.request_id == "req-1"
    assert req.prompt_token_ids == [1, 2]
    assert req.arrival_time == 1.0
    assert req.client_index == 0
    assert req.kv_hints is None
    # A map decode keeps exactly what was sent; absent keys take vLLM's defaults.
    assert req.sampling_params == sparse
    effective = {**VLLM_SAMPLING_DEFAULTS, **req.sampling_params}
    assert effective["temperature"] == 1.0
    assert effective["top_p"] == 1.0
    assert effective["top_k"] == 0
    assert effective["seed"] is None
    assert effective["max_tokens"] == 16
    assert effective["min_tokens"] == 0
    assert effective["min_p"] == 0.0
    assert effective["repetition_penalty"] == 1.0
    assert effective["logprobs"] is None
    assert effective["_eos_token_id"] is None
    assert effective["_all_stop_token_ids"] == []


def test_longer_request_arrays_decode() -> None:
    raw = msgspec.msgpack.decode(encoder.encode(EngineCoreRequest(request_id="x")))
    req = msgspec.msgpack.decode(encoder.encode([*raw, "future"]), type=EngineCoreRequest)
    assert req.request_id == "x"


# -- sampling map ----------------------------------------------------------------------------


def test_sampling_map_always_writes_the_non_optional_keys_in_order() -> None:
    p = build_sampling_params(request(max_tokens=8))
    assert list(p) == [
        "temperature", "top_p", "top_k", "max_tokens", "min_tokens", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "stop_token_ids",
        "_all_stop_token_ids",
    ]  # fmt: skip
    assert p["temperature"] == 1.0
    assert p["top_p"] == 1.0
    assert p["top_k"] == 0
    assert p["max_tokens"] == 8
    assert p["repetition_penalty"] == 1.0
    assert p["stop_token_ids"] == []
    assert p["_all_stop_token_ids"] == []


def test_optional_keys_appear_only_when_set() -> None:
    p = build_sampling_params(
        request(seed=5, logprobs=2, prompt_logprobs=0, logit_bias={3: 1, 9: -2.5})
    )
    assert p["seed"] == 5
    assert p["logprobs"] == 2
    assert p["prompt_logprobs"] == 0
    assert p["logit_bias"] == {3: 1.0, 9: -2.5}
    assert all(isinstance(k, int) for k in p["logit_bias"])
    assert "structured_outputs" not in p
    assert "n" not in p
    assert "stop" not in p
    assert "ignore_eos" not in p


@pytest.mark.parametrize("top_k", [None, -1])
def test_unset_top_k_is_zero(top_k: int | None) -> None:
    assert build_sampling_params(request(top_k=top_k))["top_k"] == 0


def test_eos_folding_with_stops() -> None:
    p = build_sampling_params(request(eos=5, extra_eos=[7], stop_token_ids=[7, 9]))
    assert p["_eos_token_id"] == 5
    assert p["stop_token_ids"] == [7, 9]
    assert p["_all_stop_token_ids"] == [5, 7, 9]


def test_eos_folding_with_ignore_eos() -> None:
    p = build_sampling_params(request(eos=5, extra_eos=[7], stop_token_ids=[9], ignore_eos=True))
    assert "_eos_token_id" not in p
    assert p["stop_token_ids"] == [9]
    assert p["_all_stop_token_ids"] == [5, 7, 9]


def test_eos_extras_join_stops_without_duplicates() -> None:
    assert build_sampling_params(request(eos=1, extra_eos=[999], stop_token_ids=[7]))[
        "stop_token_ids"
    ] == [7, 999]
    assert build_sampling_params(request(eos=1, extra_eos=[999], stop_token_ids=[999]))[
        "stop_token_ids"
    ] == [999]
    assert build_sampling_params(request(stop_token_ids=[4, 4, 2]))["stop_token_ids"] == [4, 2]


def test_all_stop_ids_are_sorted() -> None:
    p = build_sampling_params(request(eos=50, extra_eos=[3], stop_token_ids=[9, 1]))
    assert p["_all_stop_token_ids"] == [1, 3, 9, 50]


# -- structured outputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("so", "key", "value", "backend"),
    [
        (StructuredOutputs(json={"type": "object"}), "json", {"type": "object"}, "guidance"),
        (StructuredOutputs(regex="a+"), "regex", "a+", "guidance"),
        (StructuredOutputs(choice=["y", "n"]), "choice", ["y", "n"], "guidance"),
        (StructuredOutputs(grammar="root ::= x"), "grammar", "root ::= x", "guidance"),
        (StructuredOutputs(json_object=True), "json_object", True, "guidance"),
        (StructuredOutputs(structural_tag='{"s":1}'), "structural_tag", '{"s":1}', "xgrammar"),
    ],
)
def test_structured_outputs_carry_exactly_one_constraint(
    so: StructuredOutputs, key: str, value: Any, backend: str
) -> None:
    PROTO.validate(request(structured_outputs=so))
    p = build_sampling_params(request(structured_outputs=so))
    assert p["structured_outputs"] == {key: value, "_backend": backend}


def test_structured_outputs_reject_missing_constraint() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        PROTO.validate(request(structured_outputs=StructuredOutputs()))


def test_structured_outputs_reject_multiple_constraints() -> None:
    with pytest.raises(ValidationError, match="json, regex") as info:
        PROTO.validate(request(structured_outputs=StructuredOutputs(json={}, regex="x")))
    assert info.value.param == "response_format"


def test_structured_outputs_reject_json_object_false() -> None:
    with pytest.raises(ValidationError, match="json_object must be true"):
        PROTO.validate(request(structured_outputs=StructuredOutputs(json_object=False)))


# -- validation ------------------------------------------------------------------------------


def test_top_logprobs_above_twenty_is_rejected() -> None:
    PROTO.validate(request(logprobs=20))
    with pytest.raises(UnsupportedField, match="top_logprobs") as info:
        PROTO.validate(request(logprobs=21))
    assert info.value.param == "top_logprobs"


@pytest.mark.parametrize("seed", [-1, 2**63, -(2**63)])
def test_out_of_range_seeds_are_rejected(seed: int) -> None:
    with pytest.raises(ValidationError) as info:
        PROTO.validate(request(seed=seed))
    assert info.value.param == "seed"


@pytest.mark.parametrize("seed", [0, 2**63 - 1])
def test_edge_seeds_are_accepted(seed: int) -> None:
    PROTO.validate(request(seed=seed))
    assert build_sampling_params(request(seed=seed))["seed"] == seed


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p"])
def test_non_finite_floats_are_rejected(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        PROTO.validate(request(**{name: float("nan")}))  # type: ignore[arg-type]
    assert info.value.param == name


# -- EngineCoreOutputs -----------------------------------------------------------------------


def test_derived_stop_example_decodes() -> None:
    batch = decode_outputs([bytes.fromhex(OUTPUTS_STOP_HEX)])
    assert batch.engine_index == 0
    [out] = batch.outputs
    assert out.request_id == "req-1"
    assert out.new_token_ids == [100, 101]
    assert out.finish_reason == "stop"
    assert out.logprobs is None
    assert batch.finished_request_ids == ["req-1"]
    assert batch.load is None
    assert (batch.wave_complete, batch.start_wave) == (None, None)


def test_derived_inline_logprobs_example_decodes() -> None:
    batch = decode_outputs([bytes.fromhex(OUTPUTS_LOGPROBS_HEX)])
    [out] = batch.outputs
    assert out.new_token_ids == [7]
    assert out.finish_reason is None
    lp = out.logprobs
    assert lp is not None
    assert lp.token_ids == [7]
    assert lp.logprobs == [-0.5]
    assert lp.ranks == [2]
    assert lp.top_token_ids == [[8]]
    assert lp.top_logprobs == [[-2.0]]
    assert batch.finished_request_ids == []


def test_output_and_envelope_longer_than_the_struct_decode() -> None:
    row = [*output(tokens=[5], finish_reason=1), None, None, None, "future"]  # 20 elements
    env = [*envelope([row], finished_requests=["req-1"]), "default"]  # 9 elements
    assert len(row) == 20
    assert len(env) == 9
    batch = decode_outputs(frames_of(env))
    assert batch.outputs[0].new_token_ids == [5]
    assert batch.outputs[0].finish_reason == "length"
    assert batch.finished_request_ids == ["req-1"]


def test_output_and_envelope_shorter_than_vllm_032_decode() -> None:
    row = output(tokens=[6])
    env = envelope([row])
    assert (len(row), len(env)) == (16, 8)
    batch = decode_outputs(frames_of(env))
    assert batch.outputs[0].new_token_ids == [6]
    very_short = decode_outputs([encoder.encode([3, [["r", [1]]]])])
    assert very_short.engine_index == 3
    assert very_short.outputs[0].request_id == "r"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (FinishReasonCode.STOP, "stop"),
        (FinishReasonCode.LENGTH, "length"),
        (FinishReasonCode.ABORT, "abort"),
        (FinishReasonCode.ERROR, "error"),
        (FinishReasonCode.REPETITION, "stop"),
    ],
)
def test_finish_reasons_map_to_strings(code: int, reason: str) -> None:
    batch = decode_outputs(frames_of(envelope([output(finish_reason=code)])))
    assert batch.outputs[0].finish_reason == reason


@pytest.mark.parametrize("stop_reason", [151643, "</s>", None])
def test_stop_reason_passes_through(stop_reason: int | str | None) -> None:
    env = envelope([output(finish_reason=0, stop_reason=stop_reason)])
    assert decode_outputs(frames_of(env)).outputs[0].stop_reason == stop_reason


def test_prefill_stats_give_prompt_and_cached_tokens() -> None:
    stats = {"num_prompt_tokens": 18, "num_computed_tokens": 18, "num_cached_tokens": 16}
    out = decode_outputs(frames_of(envelope([output(prefill_stats=stats)]))).outputs[0]
    assert (out.prompt_tokens, out.cached_tokens) == (18, 16)
    none = decode_outputs(frames_of(envelope([output()]))).outputs[0]
    assert (none.prompt_tokens, none.cached_tokens) == (None, None)


def test_scheduler_stats_become_load_and_other_keys_are_skipped() -> None:
    stats = {
        "num_running_reqs": 4,
        "num_waiting_reqs": 2,
        "kv_cache_usage": 0.5,
        "prefix_cache_stats": {"hits": 0, "hits_by_source": {}},
        "num_kv_fetch_reqs_by_stage": {"in_progress": 0},
        "iteration_details": None,
    }
    batch = decode_outputs(frames_of(envelope([], scheduler_stats=stats)))
    assert batch.load is not None
    assert (batch.load.num_running, batch.load.num_waiting) == (4, 2)
    assert batch.load.kv_cache_usage == 0.5
    assert batch.outputs == []


def test_scheduler_stats_carry_the_prefix_cache_counters() -> None:
    stats = {
        "num_running_reqs": 1,
        "num_waiting_reqs": 0,
        "kv_cache_usage": 0.1,
        "prefix_cache_stats": {
            "reset": False, "requests": 2, "queries": 80, "hits": 32, "preempted_requests": 0,
            "preempted_queries": 0, "preempted_hits": 0, "hits_by_source": {},
        },
    }  # fmt: skip
    batch = decode_outputs(frames_of(envelope([], scheduler_stats=stats)))
    assert (batch.prefix_cache_queries, batch.prefix_cache_hits) == (80, 32)
    del stats["prefix_cache_stats"]
    batch = decode_outputs(frames_of(envelope([], scheduler_stats=stats)))
    assert (batch.prefix_cache_queries, batch.prefix_cache_hits) == (0, 0)


def test_deferred_waiting_requests_count_as_waiting() -> None:
    """vLLM 0.32's ``vllm:num_requests_waiting`` is ``num_waiting_reqs`` plus the requests
    deferred by LoRA budget or KV transfer (``num_skipped_waiting_reqs``); so is ours."""
    stats = {
        "num_running_reqs": 1,
        "num_waiting_reqs": 2,
        "num_skipped_waiting_reqs": 3,
        "kv_cache_usage": 0.25,
    }
    batch = decode_outputs(frames_of(envelope([], scheduler_stats=stats)))
    assert batch.load is not None
    assert batch.load.num_waiting == 5


def test_utility_only_envelope_is_an_empty_batch() -> None:
    batch = decode_outputs(frames_of(envelope([], utility_output=[1, None, [None, 7]])))
    assert batch.outputs == []
    assert batch.load is None


def test_all_empty_envelope_is_an_empty_batch() -> None:
    # smg rejects this shape ("invalid wire shape"); we treat it as a no-op.
    batch = decode_outputs(frames_of(envelope([])))
    assert batch.outputs == []
    assert batch.finished_request_ids == []
    assert (batch.wave_complete, batch.start_wave) == (None, None)


def test_wave_notifications() -> None:
    done = decode_outputs(frames_of(envelope([], engine_index=1, wave_complete=3)))
    assert (done.engine_index, done.wave_complete, done.start_wave) == (1, 3, None)
    start = decode_outputs(frames_of(envelope([], start_wave=7)))
    assert (start.wave_complete, start.start_wave) == (None, 7)


def test_error_output_with_no_tokens() -> None:
    env = envelope([output(finish_reason=3)], finished_requests=["req-1"])
    batch = decode_outputs(frames_of(env))
    assert batch.outputs[0].new_token_ids == []
    assert batch.outputs[0].finish_reason == "error"
    assert batch.finished_request_ids == ["req-1"]


@pytest.mark.parametrize("payload", [b"\xc1", b"\x80", encoder.encode(["x"]), b""])
def test_garbage_envelopes_are_decode_errors(payload: bytes) -> None:
    with pytest.raises(DecodeError, match="EngineCoreOutputs"):
        decode_outputs([payload])


# -- logprobs --------------------------------------------------------------------------------


def test_logprobs_resolve_from_aux_frames() -> None:
    ids = struct.pack("<4q", 7, 8, 9, 7)
    lps = struct.pack("<4f", -0.5, -2.0, -0.25, -0.75)
    ranks = struct.pack("<2q", 2, 1)
    wire = [["<i8", [2, 2], 1], ["<f4", [2, 2], 2], ["<i8", [2], 3], None]
    env = envelope([output(tokens=[7, 9], new_logprobs=wire)])
    batch = decode_outputs([encoder.encode(env), ids, lps, ranks])
    lp = batch.outputs[0].logprobs
    assert lp is not None
    assert lp.token_ids == [7, 9]
    assert lp.logprobs == [-0.5, -0.25]
    assert lp.ranks == [2, 1]
    assert lp.top_token_ids == [[8], [7]]
    assert lp.top_logprobs == [[-2.0], [-0.75]]


def test_logprobs_with_torch_dtype_names_and_int32_ids() -> None:
    wire = [
        encode_tensor_inline(np.array([[5, 5, 6]], dtype="<i4"), torch_names=True),
        encode_tensor_inline(np.array([[-0.5, -0.5, -1.0]], dtype="<f4"), torch_names=True),
        encode_tensor_inline(np.array([1], dtype="<i8"), torch_names=True),
    ]
    assert wire[0][0] == "int32"
    back = msgspec.msgpack.decode(encoder.encode(wire), ext_hook=lambda c, d: d)
    lp = resolve_logprobs(back, [b""])
    assert lp.token_ids == [5]
    assert lp.top_token_ids == [[5, 6]]
    assert lp.top_logprobs == [[-0.5, -1.0]]


def test_prompt_logprobs_resolve() -> None:
    wire = logprobs_inline([[2, 9], [3, 3]], [[-1.0, -0.5], [-0.1, -0.1]], [3, 1])
    env = envelope([output(new_prompt_logprobs_tensors=wire)])
    out = decode_outputs(frames_of(env)).outputs[0]
    assert out.prompt_logprobs is not None
    assert out.prompt_logprobs.token_ids == [2, 3]
    assert out.prompt_logprobs.ranks == [3, 1]
    assert out.logprobs is None


def test_zero_position_logprobs_are_valid() -> None:
    wire = [
        encode_tensor_inline(np.zeros((0, 3), dtype="<i8")),
        encode_tensor_inline(np.zeros((0, 3), dtype="<f4")),
        encode_tensor_inline(np.zeros((0,), dtype="<i8")),
        None,
    ]
    out = decode_outputs(frames_of(envelope([output(new_logprobs=wire)]))).outputs[0]
    assert out.logprobs is not None
    assert len(out.logprobs) == 0


def test_three_element_logprobs_without_cu_are_accepted() -> None:
    wire = logprobs_inline([[4]], [[-0.1]], [1])[:3]
    out = decode_outputs(frames_of(envelope([output(new_logprobs=wire)]))).outputs[0]
    assert out.logprobs is not None
    assert out.logprobs.token_ids == [4]


def test_non_nil_cu_num_generated_tokens_is_rejected() -> None:
    wire = logprobs_inline([[4]], [[-0.1]], [1])
    wire[3] = [0, 1]
    with pytest.raises(DecodeError, match="cu_num_generated_tokens"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))


def test_zero_sampled_rank_is_rejected() -> None:
    wire = logprobs_inline([[4, 4]], [[-0.1, -0.1]], [0])
    with pytest.raises(DecodeError, match="rank must be >= 1"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))


def test_negative_token_ids_are_rejected() -> None:
    wire = logprobs_inline([[4, -1]], [[-0.1, -0.2]], [1])
    with pytest.raises(DecodeError, match="negative token id"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))


def test_ragged_logprob_tensors_are_rejected() -> None:
    wire = logprobs_inline([[4, 5], [6, 7]], [[-0.1, -0.2]], [1, 1])
    with pytest.raises(DecodeError, match="ragged logprobs"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))
    wire = logprobs_inline([[4, 5]], [[-0.1, -0.2]], [1, 1])
    with pytest.raises(DecodeError, match="ragged logprobs"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))


def test_rows_with_zero_columns_are_rejected() -> None:
    wire = [
        encode_tensor_inline(np.zeros((1, 0), dtype="<i8")),
        encode_tensor_inline(np.zeros((1, 0), dtype="<f4")),
        encode_tensor_inline(np.array([1], dtype="<i8")),
        None,
    ]
    with pytest.raises(DecodeError, match="zero columns"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))


def test_wrong_tensor_rank_is_rejected() -> None:
    wire = logprobs_inline([[4]], [[-0.1]], [1])
    wire[0] = encode_tensor_inline(np.array([4], dtype="<i8"))
    with pytest.raises(DecodeError, match="2/2/1"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))


@pytest.mark.parametrize("wire", [None, [], [1, 2], "x"])
def test_malformed_logprobs_container(wire: Any) -> None:
    with pytest.raises(DecodeError, match="logprobs must be"):
        resolve_logprobs(wire, [b""])


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        (["<i8", [1, 1], 1], "byte length"),  # aux frame of the wrong size
        (["<i8", [1, 1], 4], "aux frame index"),  # no such frame
        (["<c8", [1, 1], 1], "dtype"),
        (["<f8", [1, 1], 1], "dtype"),
    ],
)
def test_tensor_errors_surface_through_the_envelope(tensor: list[Any], match: str) -> None:
    good = logprobs_inline([[4]], [[-0.1]], [1])
    wire = [tensor, good[1], good[2], None]
    with pytest.raises(DecodeError, match=match):
        decode_outputs([encoder.encode(envelope([output(new_logprobs=wire)])), b"\x00" * 4])


@pytest.mark.parametrize("code", [1, 2, 7])
def test_non_raw_view_ext_codes_in_outputs_are_rejected(code: int) -> None:
    wire = logprobs_inline([[4]], [[-0.1]], [1])
    wire[0] = ["<i8", [1, 1], msgspec.msgpack.Ext(code, b"\x04" + b"\x00" * 7)]
    with pytest.raises(DecodeError, match=f"ext type {code}"):
        decode_outputs(frames_of(envelope([output(new_logprobs=wire)])))
