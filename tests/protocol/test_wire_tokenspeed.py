"""TokenSpeed wire: the pinned cross-language vectors (wire-spec section 5) and our encoder."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

# the pinned vectors live with the wire conformance runner (one copy; see conformance/vectors.py)
from conformance.vectors import (
    PREFIX_VECTOR,
    PYTHON_OUTPUT_VECTOR,
    PYTHON_OUTPUT_VECTOR_PRE_DP,
    PYTHON_OUTPUT_VECTOR_PRE_LOAD,
    PYTHON_REQUEST_VECTOR,
    SPEC_PREFIX_HEX_AS_PRINTED,
    VEC1_OUTPUT_FIELDS,
)
from smg_trio.codec import encoder
from smg_trio.errors import DecodeError, UnsupportedField, ValidationError
from smg_trio.protocol import GenerateRequest, SamplingOptions, StructuredOutputs
from smg_trio.protocol.tokenspeed import (
    ABORT,
    ADD,
    TOP_K_DISABLED,
    BatchTokenIDOutSlim,
    SamplingParams,
    TokenizedGenerateReqInput,
    TokenizedGenerateReqInputPrefix,
    TokenSpeedProtocol,
    build_sampling_params,
    decode_batch,
    decode_tagged,
)

PROTO = TokenSpeedProtocol()


def vec1_request() -> GenerateRequest:
    return GenerateRequest(
        request_id="vec-1",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingOptions(
            temperature=0.5,
            top_p=0.9,
            max_tokens=8,
            stop_token_ids=[2],
            seed=42,
            logprobs=0,
        ),
        stream=True,
    )


def request(**sampling: Any) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", prompt_token_ids=[1], sampling=SamplingOptions(**sampling)
    )


# -- request vectors -------------------------------------------------------------------------


def test_python_request_vector_decodes_field_for_field() -> None:
    assert len(PYTHON_REQUEST_VECTOR) == 152
    r = decode_tagged(PYTHON_REQUEST_VECTOR, TokenizedGenerateReqInput)
    assert r.rid == "vec-1"
    assert r.http_worker_ipc is None
    assert r.input_text is None
    assert r.input_ids == [1, 2, 3]
    assert r.return_logprob is True
    assert r.logprob_start_len == -1
    assert r.top_logprobs_num == 0
    assert r.token_ids_logprob is None
    assert r.stream is True
    assert r.input_embeds is None
    assert r.session_params is None
    assert r.custom_logit_processor is None
    assert r.return_hidden_states is False
    assert r.created_time == 0.0
    assert r.validation_error is None
    sp = r.sampling_params
    assert sp.max_new_tokens == 8
    assert sp.stop is None
    assert sp.stop_token_ids == [2]
    assert sp.temperature == 0.5
    assert sp.top_p == 0.9
    assert sp.top_k == TOP_K_DISABLED == 1073741824
    assert (sp.min_p, sp.frequency_penalty, sp.presence_penalty) == (0.0, 0.0, 0.0)
    assert sp.repetition_penalty == 1.0
    assert sp.min_new_tokens == 0
    assert (sp.json_schema, sp.regex, sp.ebnf, sp.structural_tag) == (None, None, None, None)
    assert sp.ignore_eos is False
    assert sp.skip_special_tokens is True
    assert sp.spaces_between_special_tokens is True
    assert sp.no_stop_trim is False
    assert sp.seed == 42
    assert sp.logprobs is None
    assert sp.n == 1
    assert sp.stop_strs == []
    assert sp.stop_str_max_len == 0
    assert sp.is_normalized is True


def test_python_request_vector_re_encodes_byte_for_byte() -> None:
    r = decode_tagged(PYTHON_REQUEST_VECTOR, TokenizedGenerateReqInput)
    assert encoder.encode(r) == PYTHON_REQUEST_VECTOR


def test_prefix_vector_is_the_first_eleven_elements_of_the_python_vector() -> None:
    full = msgspec.msgpack.decode(PYTHON_REQUEST_VECTOR)
    assert len(full) == 24
    assert encoder.encode(full[:11]) == PREFIX_VECTOR
    assert len(PREFIX_VECTOR) == 129


def test_encode_add_produces_the_129_byte_prefix_vector() -> None:
    frames = PROTO.encode_add(vec1_request())
    assert frames[0] == ADD == b"\x00"
    assert len(frames) == 2
    assert frames[1] == PREFIX_VECTOR
    # The hex as printed in the spec is a strict prefix of it (see the constant's comment).
    assert frames[1].hex().startswith(SPEC_PREFIX_HEX_AS_PRINTED)


def test_prefix_decodes_as_the_full_struct_with_defaults() -> None:
    r = decode_tagged(PREFIX_VECTOR, TokenizedGenerateReqInput)
    full = decode_tagged(PYTHON_REQUEST_VECTOR, TokenizedGenerateReqInput)
    assert r == full
    short = decode_tagged(PREFIX_VECTOR, TokenizedGenerateReqInputPrefix)
    assert encoder.encode(short) == PREFIX_VECTOR


def test_encoded_prefix_shape() -> None:
    raw = msgspec.msgpack.decode(PROTO.encode_add(vec1_request())[1])
    assert len(raw) == 11
    assert raw[0] == "TokenizedGenerateReqInput"
    assert len(raw[5]) == 29
    sp = raw[5]
    assert sp[0] == 8  # max_new_tokens
    assert sp[2] == [2]  # stop_token_ids
    assert sp[3] == 0.5  # temperature
    assert sp[5] == 1 << 30  # top_k disabled
    assert sp[23] == 42  # seed
    assert sp[26] == []  # stop_strs
    assert sp[28] is True  # is_normalized
    assert raw[6] is True  # return_logprob: logprobs=0 asks for the sampled token's logprob
    assert raw[10] is True  # stream


def test_corrupted_request_tag_is_rejected() -> None:
    # Byte 5 is the "o" of "Tokenized..." (dc 00 18 | b9 | T o ...); byte 4 is the "T".
    for index, original in ((5, b"o"), (4, b"T")):
        bad = bytearray(PYTHON_REQUEST_VECTOR)
        assert bad[index : index + 1] == original
        bad[index] = ord("O")
        with pytest.raises(DecodeError, match="wrong msgspec tag"):
            decode_tagged(bytes(bad), TokenizedGenerateReqInput)
        with pytest.raises(DecodeError, match="wrong msgspec tag"):
            decode_tagged(bytes(bad), TokenizedGenerateReqInputPrefix)


def test_truncated_request_is_missing_a_positional_field() -> None:
    short = encoder.encode(["TokenizedGenerateReqInput", "r1", None, None, [1]])
    with pytest.raises(DecodeError, match="missing positional field"):
        decode_tagged(short, TokenizedGenerateReqInput)


def test_request_with_extra_trailing_elements_decodes() -> None:
    full = msgspec.msgpack.decode(PYTHON_REQUEST_VECTOR)
    longer = encoder.encode([*full, None, "future"])  # TokenSpeed 0.1.1 emits 25 elements
    assert decode_tagged(longer, TokenizedGenerateReqInput).rid == "vec-1"


def test_garbage_request_payload_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_tagged(b"\xc1", TokenizedGenerateReqInput)
    with pytest.raises(DecodeError):
        decode_tagged(encoder.encode({"rid": "x"}), TokenizedGenerateReqInput)


# -- output vectors --------------------------------------------------------------------------


def test_python_output_vector_decodes() -> None:
    batch = decode_batch([PYTHON_OUTPUT_VECTOR])
    assert batch.engine_index == 1
    assert batch.load is not None
    assert batch.load.num_running == 2
    assert batch.load.num_waiting == 5
    assert batch.load.kv_cache_usage == 0.25
    assert batch.finished_request_ids == ["vec-1"]
    [out] = batch.outputs
    assert out.request_id == "vec-1"
    assert out.new_token_ids == [10, 11]
    assert out.finish_reason == "length"
    assert out.prompt_tokens == 3
    assert out.completion_tokens == 2
    assert out.cached_tokens == 1
    assert out.logprobs is not None
    assert out.logprobs.token_ids == [10, 11]
    assert out.logprobs.logprobs == [-0.5, -0.25]


def test_batch_output_re_encodes_byte_for_byte() -> None:
    b = decode_tagged(PYTHON_OUTPUT_VECTOR, BatchTokenIDOutSlim)
    assert encoder.encode(b) == PYTHON_OUTPUT_VECTOR
    built = BatchTokenIDOutSlim(**VEC1_OUTPUT_FIELDS)  # type: ignore[arg-type]
    assert encoder.encode(built) == PYTHON_OUTPUT_VECTOR
    assert len(msgspec.msgpack.decode(PYTHON_OUTPUT_VECTOR)) == 14


def test_pre_load_ten_element_batch_has_no_load() -> None:
    batch = decode_batch([PYTHON_OUTPUT_VECTOR_PRE_LOAD])
    assert batch.engine_index == 1
    assert batch.load is None
    assert batch.outputs[0].new_token_ids == [10, 11]


def test_pre_dp_nine_element_batch_decodes_as_rank_zero() -> None:
    batch = decode_batch([PYTHON_OUTPUT_VECTOR_PRE_DP])
    assert batch.engine_index == 0
    assert batch.load is None
    assert batch.outputs[0].finish_reason == "length"


def test_corrupted_output_tag_is_rejected() -> None:
    bad = bytearray(PYTHON_OUTPUT_VECTOR)
    assert bad[2:3] == b"B"
    bad[2] = ord("X")
    with pytest.raises(DecodeError, match="wrong msgspec tag"):
        decode_batch([bytes(bad)])


def test_appended_trailing_column_still_decodes() -> None:
    raw = msgspec.msgpack.decode(PYTHON_OUTPUT_VECTOR)
    extended = encoder.encode([*raw, [99]])
    assert decode_batch([extended]) == decode_batch([PYTHON_OUTPUT_VECTOR])


def test_extra_aux_frames_are_ignored() -> None:
    assert decode_batch([PYTHON_OUTPUT_VECTOR, b"aux", b"more"]) == decode_batch(
        [PYTHON_OUTPUT_VECTOR]
    )


def test_output_missing_a_required_column_is_rejected() -> None:
    raw = msgspec.msgpack.decode(PYTHON_OUTPUT_VECTOR)
    with pytest.raises(DecodeError, match="missing positional field"):
        decode_batch([encoder.encode(raw[:8])])


def slim(**cols: Any) -> bytes:
    base: dict[str, Any] = {
        "rids": ["a", "b"],
        "output_ids": [[1], [2, 3]],
        "finished_reasons": ["", "stop"],
        "prompt_tokens": [4, 5],
        "completion_tokens": [1, 2],
        "cached_tokens": [0, 2],
        "output_token_logprobs_val": [[], []],
        "output_token_logprobs_idx": [[], []],
    }
    base.update(cols)
    return encoder.encode(BatchTokenIDOutSlim(**base))


def test_columns_split_per_request() -> None:
    batch = decode_batch([slim()])
    a, b = batch.outputs
    assert (a.request_id, a.new_token_ids, a.finish_reason) == ("a", [1], None)
    assert (b.request_id, b.new_token_ids, b.finish_reason) == ("b", [2, 3], "stop")
    assert batch.finished_request_ids == ["b"]
    assert a.cached_tokens is None  # 0 means "not reported"
    assert b.cached_tokens == 2
    assert (a.prompt_tokens, b.prompt_tokens) == (4, 5)
    assert (a.completion_tokens, b.completion_tokens) == (1, 2)
    assert a.logprobs is None  # logprob columns are [] when not requested
    assert b.logprobs is None


def test_zero_prompt_tokens_is_not_reported() -> None:
    batch = decode_batch([slim(prompt_tokens=[0, 0])])
    assert [o.prompt_tokens for o in batch.outputs] == [None, None]


@pytest.mark.parametrize(
    "column",
    [
        "output_ids",
        "finished_reasons",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "output_token_logprobs_val",
        "output_token_logprobs_idx",
    ],
)
def test_ragged_columns_are_rejected(column: str) -> None:
    one = {
        "output_ids": [[1]],
        "finished_reasons": [""],
        "prompt_tokens": [4],
        "completion_tokens": [1],
        "cached_tokens": [0],
        "output_token_logprobs_val": [[]],
        "output_token_logprobs_idx": [[]],
    }
    with pytest.raises(DecodeError, match="ragged columns"):
        decode_batch([slim(**{column: one[column]})])


def test_ragged_logprob_columns_are_rejected() -> None:
    with pytest.raises(DecodeError, match="ragged logprob columns for b"):
        decode_batch(
            [
                slim(
                    output_token_logprobs_val=[[-0.1], [-0.2, -0.3]],
                    output_token_logprobs_idx=[[1], [2]],
                )
            ]
        )


def test_logprob_columns_map_to_token_logprobs() -> None:
    batch = decode_batch(
        [
            slim(
                output_token_logprobs_val=[[-0.1], [-0.2, -0.3]],
                output_token_logprobs_idx=[[1], [2, 3]],
            )
        ]
    )
    lp = batch.outputs[1].logprobs
    assert lp is not None
    assert lp.token_ids == [2, 3]
    assert lp.logprobs == [-0.2, -0.3]


def test_load_is_absent_when_kv_total_pages_is_zero() -> None:
    batch = decode_batch([slim(num_running=3, num_waiting=4, kv_active_pages=5, kv_total_pages=0)])
    assert batch.load is None
    loaded = decode_batch(
        [slim(num_running=3, num_waiting=4, kv_active_pages=5, kv_total_pages=20)]
    )
    assert loaded.load is not None
    assert (loaded.load.num_running, loaded.load.num_waiting) == (3, 4)
    assert loaded.load.kv_cache_usage == 0.25


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("abort", "abort"),
        ("error", "error"),
        ("garbage", "stop"),
    ],
)
def test_finish_reasons_normalize(raw: str, mapped: str) -> None:
    batch = decode_batch([slim(finished_reasons=["", raw])])
    assert batch.outputs[1].finish_reason == mapped
    assert batch.finished_request_ids == ["b"]


def test_empty_batch_decodes() -> None:
    batch = decode_batch(
        [
            slim(
                rids=[],
                output_ids=[],
                finished_reasons=[],
                prompt_tokens=[],
                completion_tokens=[],
                cached_tokens=[],
                output_token_logprobs_val=[],
                output_token_logprobs_idx=[],
            )
        ]
    )
    assert batch.outputs == []
    assert batch.finished_request_ids == []


# -- control frames --------------------------------------------------------------------------


def test_abort_frame_is_a_positional_array_of_rids() -> None:
    frames = PROTO.encode_abort(["req-1"])
    assert frames == [ABORT, bytes.fromhex("91a57265712d31")]
    assert ABORT == b"\x01"


def test_tokenspeed_has_no_waves() -> None:
    assert PROTO.encode_start_wave(3) is None


# -- sampling params -------------------------------------------------------------------------


def test_sampling_params_serialize_as_29_element_array() -> None:
    raw = msgspec.msgpack.decode(encoder.encode(SamplingParams()))
    assert len(raw) == 29
    assert raw[3] == 1.0
    assert raw[5] == -1
    assert raw[25] == 1
    assert raw[28] is False


def test_normalization_of_defaults() -> None:
    sp = build_sampling_params(request())
    assert sp.temperature == 1.0
    assert sp.top_k == TOP_K_DISABLED
    assert sp.stop_token_ids is None
    assert sp.stop_strs == []
    assert sp.stop_str_max_len == 0
    assert sp.is_normalized is True
    assert sp.max_new_tokens is None
    assert sp.n == 1
    assert sp.seed is None
    assert sp.logit_bias is None


def test_greedy_temperature_becomes_top_k_one() -> None:
    sp = build_sampling_params(request(temperature=0.0, top_k=50))
    assert sp.temperature == 1.0
    assert sp.top_k == 1
    tiny = build_sampling_params(request(temperature=1e-7))
    assert (tiny.temperature, tiny.top_k) == (1.0, 1)
    warm = build_sampling_params(request(temperature=0.7, top_k=40))
    assert (warm.temperature, warm.top_k) == (0.7, 40)


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.0}, {"temperature": 0.0, "seed": 9}, {"top_k": 1, "seed": 5}]
)
def test_greedy_requests_pin_the_seed_like_the_engine(sampling: dict[str, Any]) -> None:
    # TokenSpeed 0.1.1's own normalization sets seed 0 whenever top_k == 1.
    assert build_sampling_params(request(**sampling)).seed == 0


def test_sampled_requests_keep_their_seed() -> None:
    assert build_sampling_params(request(temperature=0.7, seed=9)).seed == 9
    assert build_sampling_params(request(top_k=2, seed=9)).seed == 9
    assert build_sampling_params(request()).seed is None


@pytest.mark.parametrize("top_k", [None, -1, 0])
def test_unset_top_k_becomes_the_disabled_sentinel(top_k: int | None) -> None:
    assert build_sampling_params(request(top_k=top_k)).top_k == 1 << 30


def test_empty_stop_token_ids_go_out_as_nil_and_others_dedupe_in_order() -> None:
    assert build_sampling_params(request(stop_token_ids=[])).stop_token_ids is None
    assert build_sampling_params(request(stop_token_ids=[9, 2, 9, 5])).stop_token_ids == [9, 2, 5]


def test_normalize_is_skipped_once_normalized() -> None:
    sp = SamplingParams(temperature=0.0, top_k=-1, stop_token_ids=[], is_normalized=True)
    sp.normalize()
    assert (sp.temperature, sp.top_k, sp.stop_token_ids, sp.stop_strs) == (0.0, -1, [], None)


def test_eos_ids_are_not_folded_into_tokenspeed_requests() -> None:
    req = GenerateRequest(
        request_id="r",
        prompt_token_ids=[1],
        sampling=SamplingOptions(stop_token_ids=[7]),
        eos_token_id=5,
        extra_eos_token_ids=[6],
    )
    assert build_sampling_params(req).stop_token_ids == [7]


def test_logit_bias_travels_with_string_keys() -> None:
    sp = build_sampling_params(request(logit_bias={5: 1.5, 12: -100}))
    assert sp.logit_bias == {"5": 1.5, "12": -100.0}
    raw = msgspec.msgpack.decode(encoder.encode(sp))
    assert raw[22] == {"5": 1.5, "12": -100.0}


def test_passthrough_fields() -> None:
    sp = build_sampling_params(
        request(
            max_tokens=12,
            min_tokens=2,
            top_p=0.5,
            min_p=0.1,
            frequency_penalty=0.2,
            presence_penalty=-0.3,
            repetition_penalty=1.1,
            ignore_eos=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            seed=7,
        )
    )
    assert (sp.max_new_tokens, sp.min_new_tokens) == (12, 2)
    assert (sp.top_p, sp.min_p) == (0.5, 0.1)
    assert (sp.frequency_penalty, sp.presence_penalty, sp.repetition_penalty) == (0.2, -0.3, 1.1)
    assert sp.ignore_eos is True
    assert sp.skip_special_tokens is False
    assert sp.spaces_between_special_tokens is False
    assert sp.seed == 7


def test_return_logprob_follows_logprobs() -> None:
    def flag(**kw: Any) -> bool:
        raw = msgspec.msgpack.decode(PROTO.encode_add(request(**kw))[1])
        return bool(raw[6])

    assert flag() is False
    assert flag(logprobs=0) is True


def test_stream_flag_passes_through() -> None:
    req = request()
    req.stream = False
    assert msgspec.msgpack.decode(PROTO.encode_add(req)[1])[10] is False


@pytest.mark.parametrize(
    ("so", "field", "value"),
    [
        (StructuredOutputs(json={"type": "string"}), "json_schema", '{"type": "string"}'),
        (StructuredOutputs(json='{"type":"integer"}'), "json_schema", '{"type":"integer"}'),
        (StructuredOutputs(json_object=True), "json_schema", '{"type": "object"}'),
        (StructuredOutputs(regex="[a-z]+"), "regex", "[a-z]+"),
        (StructuredOutputs(grammar="root ::= 'x'"), "ebnf", "root ::= 'x'"),
        (StructuredOutputs(structural_tag='{"x":1}'), "structural_tag", '{"x":1}'),
    ],
)
def test_structured_outputs_map_to_one_field(so: StructuredOutputs, field: str, value: str) -> None:
    sp = build_sampling_params(request(structured_outputs=so))
    assert getattr(sp, field) == value
    others = {"json_schema", "regex", "ebnf", "structural_tag"} - {field}
    assert all(getattr(sp, o) is None for o in others)


def test_choice_constraint_is_unsupported() -> None:
    with pytest.raises(UnsupportedField, match="TokenSpeed") as info:
        PROTO.validate(request(structured_outputs=StructuredOutputs(choice=["a", "b"])))
    assert info.value.param == "response_format"


def test_multiple_constraints_are_rejected() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        PROTO.validate(request(structured_outputs=StructuredOutputs(regex="x", grammar="y")))


def test_json_object_false_is_rejected() -> None:
    with pytest.raises(ValidationError, match="json_object"):
        PROTO.validate(request(structured_outputs=StructuredOutputs(json_object=False)))


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 20])
def test_any_top_logprobs_is_rejected_naming_the_field(k: int) -> None:
    with pytest.raises(UnsupportedField, match="top_logprobs") as info:
        PROTO.validate(request(logprobs=k))
    assert info.value.param == "top_logprobs"


def test_sampled_token_logprob_alone_is_allowed() -> None:
    PROTO.validate(request(logprobs=0))


def test_prompt_logprobs_are_rejected() -> None:
    with pytest.raises(UnsupportedField) as info:
        PROTO.validate(request(prompt_logprobs=0))
    assert info.value.param == "prompt_logprobs"


@pytest.mark.parametrize("top_k", [128, 129, 1000])
def test_top_k_at_the_kernel_limit_is_rejected(top_k: int) -> None:
    with pytest.raises(UnsupportedField, match="top_k") as info:
        PROTO.validate(request(top_k=top_k))
    assert info.value.param == "top_k"


@pytest.mark.parametrize("top_k", [None, -1, 1, 127])
def test_top_k_below_the_kernel_limit_is_allowed(top_k: int | None) -> None:
    PROTO.validate(request(top_k=top_k))


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64])
def test_out_of_range_seeds_are_rejected(seed: int) -> None:
    with pytest.raises(ValidationError) as info:
        PROTO.validate(request(seed=seed))
    assert info.value.param == "seed"


@pytest.mark.parametrize("seed", [0, 42, 2**63 - 1])
def test_in_range_seeds_are_accepted_and_encoded(seed: int) -> None:
    PROTO.validate(request(seed=seed))
    raw = msgspec.msgpack.decode(PROTO.encode_add(request(seed=seed))[1])
    assert raw[5][23] == seed
