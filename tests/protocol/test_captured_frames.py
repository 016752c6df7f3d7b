"""Every captured real frame decodes through our code, and our encoders reproduce what the real
senders sent.

``tests/data/vllm0.32.0_engine_wire.jsonl``: one real session against a headless vLLM 0.32.0
engine (handshake, registration, four ADDs, one ABORT, every output batch).
``tests/data/smg1.13.0_to_*``: what the Rust smg 1.13.0 gateway sent to vLLM and TokenSpeed.
"""

from __future__ import annotations

import ast
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from smg_trio.protocol import GenerateRequest, SamplingOptions
from smg_trio.protocol.handshake import (
    decode_init,
    decode_ready_response,
    decode_status,
    encode_init,
    encode_status,
)
from smg_trio.protocol.tokenspeed import (
    TOP_K_DISABLED,
    TokenizedGenerateReqInput,
    TokenSpeedProtocol,
    decode_tagged,
)
from smg_trio.protocol.vllm import EngineCoreRequest, VllmProtocol, decode_outputs

DATA = Path(__file__).resolve().parents[1] / "data"
VLLM_WIRE = DATA / "vllm0.32.0_engine_wire.jsonl"
SMG_TO_VLLM = DATA / "smg1.13.0_to_vllm_EngineCoreRequest.pyrepr.txt"
SMG_TO_TOKENSPEED = DATA / "smg1.13.0_to_tokenspeed_requests.jsonl"

# The prompt every request of the vLLM capture used (a ChatML prompt, tiny test tokenizer).
PROMPT = [1022, 84, 502, 198, 272, 75, 331, 316, 268, 541, 1023, 198, 1022, 64, 318, 790, 818, 198]
EOS = 1023


def load_vllm_session() -> list[tuple[str, list[bytes]]]:
    records = []
    for line in VLLM_WIRE.read_text().splitlines():
        rec = json.loads(line)
        records.append((rec["kind"], [bytes.fromhex(f) for f in rec["frames_hex"]]))
    return records


SESSION = load_vllm_session()


def frames(kind: str) -> list[list[bytes]]:
    return [f for k, f in SESSION if k == kind]


def test_capture_has_the_expected_shape() -> None:
    kinds = [k for k, _ in SESSION]
    assert kinds[:4] == ["handshake_hello", "handshake_init", "handshake_ready", "registration"]
    assert kinds.count("add") == 4
    assert kinds.count("abort") == 1
    assert kinds.count("output") == 9
    assert len(kinds) == 18


# -- handshake -------------------------------------------------------------------------------


def test_hello_and_ready() -> None:
    [hello] = frames("handshake_hello")
    [ready] = frames("handshake_ready")
    statuses: tuple[tuple[list[bytes], Literal["HELLO", "READY"]], ...] = (
        (hello, "HELLO"),
        (ready, "READY"),
    )
    for msg, status in statuses:
        identity, payload = msg
        assert identity == b"\x00\x00"  # engine index 0, 2 bytes little-endian
        st = decode_status(payload)
        assert st.status == status
        assert st.local is False
        assert st.headless is True
        assert st.parallel_config_hash is None
        assert "parallel_config_hash" not in msgspec.msgpack.decode(payload)
        # Our three-key encoder reproduces vLLM's bytes exactly.
        assert encode_status(status, local=False, with_hash_key=False) == payload


def test_init_decodes_and_our_encoder_matches_it_byte_for_byte() -> None:
    [[payload]] = frames("handshake_init")
    meta = decode_init(payload)
    assert meta.addresses.inputs == ["ipc:///tmp/probe-zmq/engine-in.sock"]
    assert meta.addresses.outputs == ["ipc:///tmp/probe-zmq/engine-out.sock"]
    assert meta.addresses.coordinator_input is None
    assert meta.parallel_config == {}
    assert (
        encode_init("ipc:///tmp/probe-zmq/engine-in.sock", "ipc:///tmp/probe-zmq/engine-out.sock")
        == payload
    )


def test_registration() -> None:
    [[identity, payload]] = frames("registration")
    assert identity == b"\x00\x00"
    r = decode_ready_response(payload)
    assert r.max_model_len == 1024
    assert r.num_gpu_blocks == 8192
    assert r.block_size == 128
    assert r.block_size_tokens == 128
    assert r.dtype == "float32"
    assert r.vllm_version == "0.32.0"
    assert r.world_size == 1
    assert r.data_parallel_size == 1
    assert not r.is_lockstep
    assert (r.tensor_parallel_size, r.pipeline_parallel_size) == (1, 1)
    assert r.decode_context_parallel_size == 1
    assert r.data_parallel_rank == 0
    assert r.max_num_seqs == 128
    assert r.max_num_batched_tokens == 2048
    assert r.instance_id == "1796034281410586022"
    assert r.kv_cache_size_tokens == 1048576
    assert r.kv_cache_max_concurrency == 1024.0
    assert r.kv_events_config is None
    assert r.dp_stats_address is None
    # The real map carries keys we do not model; they must not break decoding.
    raw = msgspec.msgpack.decode(payload)
    assert {"supports_lora", "max_loras", "mamba_block_size", "enable_sleep_mode"} <= set(raw)


# -- ADD / ABORT -----------------------------------------------------------------------------

ADD_EXPECTED: dict[str, dict[str, Any]] = {
    "greedy-8": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8},
    "seeded-4": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 4, "seed": 42},
    "logprobs-3": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 3, "logprobs": 2},
    "long-200": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 200},
}


def decoded_adds() -> dict[str, EngineCoreRequest]:
    out = {}
    for type_byte, payload in frames("add"):
        assert type_byte == b"\x00"
        req = msgspec.msgpack.decode(payload, type=EngineCoreRequest)
        out[req.request_id] = req
    return out


def test_add_frames_decode_as_engine_core_requests() -> None:
    adds = decoded_adds()
    assert set(adds) == set(ADD_EXPECTED)
    for rid, expected in ADD_EXPECTED.items():
        req = adds[rid]
        assert req.prompt_token_ids == PROMPT
        assert req.mm_features is None
        assert req.pooling_params is None
        assert req.client_index == 0
        assert req.data_parallel_rank is None
        assert req.arrival_time > 1.7e9
        sp = req.sampling_params
        assert sp is not None
        for key, value in expected.items():
            assert sp[key] == value, (rid, key)
        assert sp["top_k"] == 0
        assert sp["stop_token_ids"] == [EOS]
        assert sp["_eos_token_id"] == EOS
        assert sp["_all_stop_token_ids"] == [EOS]
    assert "seed" not in adds["greedy-8"].sampling_params  # type: ignore[operator]
    assert "logprobs" not in adds["seeded-4"].sampling_params  # type: ignore[operator]


def test_abort_frame() -> None:
    [[type_byte, payload]] = frames("abort")
    assert type_byte == b"\x01"
    assert msgspec.msgpack.decode(payload, type=list[str]) == ["long-200"]
    assert VllmProtocol().encode_abort(["long-200"]) == [type_byte, payload]


# -- outputs ---------------------------------------------------------------------------------


def decoded_outputs() -> list[Any]:
    return [decode_outputs(f) for f in frames("output")]


def test_every_output_frame_decodes() -> None:
    for batch in decoded_outputs():
        assert batch.engine_index == 0
        assert batch.load is not None  # the engine logs stats on every step
        assert batch.finished_request_ids == []  # 0.32 reports finishes inline only
        assert (batch.wave_complete, batch.start_wave) == (None, None)
        assert all(len(o.new_token_ids) == 1 for o in batch.outputs)


def test_first_output_carries_prefill_stats_and_load() -> None:
    first = decoded_outputs()[0]
    assert [o.request_id for o in first.outputs] == list(ADD_EXPECTED)
    assert [o.new_token_ids for o in first.outputs] == [[281], [0], [281], [281]]
    for o in first.outputs:
        assert o.prompt_tokens == 18
        assert o.cached_tokens == 0
        assert o.finish_reason is None
    assert first.load is not None
    assert first.load.num_running == 4
    assert first.load.num_waiting == 0
    assert first.load.kv_cache_usage == pytest.approx(0.0004883408619216212)
    later = decoded_outputs()[1]
    assert all(o.prompt_tokens is None for o in later.outputs)


def test_requests_run_to_their_limits_and_finish_with_length() -> None:
    tokens: dict[str, list[int]] = defaultdict(list)
    finish: dict[str, str] = {}
    for batch in decoded_outputs():
        for o in batch.outputs:
            assert o.request_id not in finish, "output after the terminal one"
            tokens[o.request_id] += o.new_token_ids
            if o.finish_reason is not None:
                finish[o.request_id] = o.finish_reason
    assert finish == {"greedy-8": "length", "seeded-4": "length", "logprobs-3": "length"}
    assert len(tokens["greedy-8"]) == 8
    assert len(tokens["seeded-4"]) == 4
    assert len(tokens["logprobs-3"]) == 3
    assert tokens["long-200"] == [281]  # aborted after one token; no terminal output
    assert tokens["seeded-4"] == [0, 552, 890, 126]
    assert tokens["greedy-8"] == [281, 690, 751, 281, 281, 281, 281, 281]
    # logprobs-3 is greedy on the same prompt: the same first tokens as greedy-8.
    assert tokens["logprobs-3"] == tokens["greedy-8"][:3]


def test_logprobs_have_k_plus_one_columns() -> None:
    seen = 0
    for batch in decoded_outputs():
        for o in batch.outputs:
            if o.request_id != "logprobs-3":
                assert o.logprobs is None
                continue
            lp = o.logprobs
            assert lp is not None
            seen += 1
            assert lp.token_ids == o.new_token_ids
            assert lp.ranks is not None
            assert lp.top_token_ids is not None
            assert lp.top_logprobs is not None
            assert all(r >= 1 for r in lp.ranks)
            assert [len(row) + 1 for row in lp.top_token_ids] == [3]  # k=2 -> 3 columns
            assert [len(row) + 1 for row in lp.top_logprobs] == [3]
            # Greedy: the sampled token is the rank-1 candidate with the same logprob.
            assert lp.ranks == [1]
            assert lp.top_token_ids[0][0] == lp.token_ids[0]
            assert lp.top_logprobs[0][0] == lp.logprobs[0]
            assert lp.logprobs[0] is not None
            assert lp.logprobs[0] < 0
            assert lp.top_logprobs[0][0] >= lp.top_logprobs[0][1]
    assert seen == 3
    first = decoded_outputs()[0].outputs[2].logprobs
    assert first is not None
    assert first.top_token_ids == [[281, 457]]


def test_load_follows_the_running_count_down_to_the_idle_batch() -> None:
    batches = decoded_outputs()
    running = [b.load.num_running for b in batches if b.load is not None]
    assert running == [4, 3, 2, 1, 1, 1, 1, 0, 0]
    idle = batches[-1]
    assert idle.outputs == []
    assert idle.load is not None
    assert idle.load.kv_cache_usage == 0.0


# -- our encoders against the captured senders -----------------------------------------------


def assert_same_sampling(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Same keys and values; floats may differ by f32 rounding (smg writes f32)."""
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, float):
            assert math.isclose(ours[key], value, rel_tol=1e-6), key
        else:
            assert ours[key] == value, key


def assert_same_request(ours: EngineCoreRequest, theirs: EngineCoreRequest) -> None:
    assert ours.sampling_params is not None
    assert theirs.sampling_params is not None
    assert_same_sampling(ours.sampling_params, theirs.sampling_params)
    skip = {"sampling_params", "arrival_time"}
    for field in EngineCoreRequest.__struct_fields__:
        if field not in skip:
            assert getattr(ours, field) == getattr(theirs, field), field


def vllm_request(rid: str, prompt: list[int], **sampling: Any) -> GenerateRequest:
    # The gateway backstops the tokenizer EOS into stop_token_ids before translation (smg does).
    return GenerateRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingOptions(stop_token_ids=[EOS], **sampling),
        eos_token_id=EOS,
    )


def our_vllm_add(req: GenerateRequest) -> EngineCoreRequest:
    type_byte, payload = VllmProtocol().encode_add(req)
    assert type_byte == b"\x00"
    assert len(msgspec.msgpack.decode(payload)) == 22
    return msgspec.msgpack.decode(payload, type=EngineCoreRequest)


def test_our_vllm_encoder_matches_the_captured_session_adds() -> None:
    adds = decoded_adds()
    for rid, expected in ADD_EXPECTED.items():
        ours = our_vllm_add(vllm_request(rid, PROMPT, **expected))
        assert_same_request(ours, adds[rid])


def smg_vllm_frames() -> list[list[bytes]]:
    out = []
    for line in SMG_TO_VLLM.read_text().splitlines():
        rec = ast.literal_eval(line)
        out.append([bytes.fromhex(f) for f in rec["frames_hex"]])
    return out


def test_smg_engine_core_requests_decode() -> None:
    first, second = smg_vllm_frames()
    for type_byte, payload in (first, second):
        assert type_byte == b"\x00"
        assert len(msgspec.msgpack.decode(payload)) == 21  # smg omits kv_hints
    a = msgspec.msgpack.decode(first[1], type=EngineCoreRequest)
    assert a.request_id.startswith("chatcmpl-")
    assert a.prompt_token_ids == PROMPT
    assert a.kv_hints is None
    assert a.client_index == 0
    sp = a.sampling_params
    assert sp is not None
    assert sp["seed"] == 42
    assert sp["max_tokens"] == 3
    assert sp["temperature"] == pytest.approx(0.7, rel=1e-6)  # f32 on the wire
    assert first[1].find(bytes.fromhex("ab74656d7065726174757265ca")) > 0  # "temperature": f32
    b = msgspec.msgpack.decode(second[1], type=EngineCoreRequest)
    assert b.request_id.startswith("cmpl-")
    assert b.prompt_token_ids == [441, 281, 7, 87, 304]
    assert b.sampling_params is not None
    assert b.sampling_params["max_tokens"] == 2
    assert "seed" not in b.sampling_params


def test_our_vllm_encoder_matches_smg() -> None:
    first, second = smg_vllm_frames()
    a = msgspec.msgpack.decode(first[1], type=EngineCoreRequest)
    ours_a = our_vllm_add(
        vllm_request(a.request_id, PROMPT, temperature=0.7, top_p=0.9, seed=42, max_tokens=3)
    )
    assert_same_request(ours_a, a)
    b = msgspec.msgpack.decode(second[1], type=EngineCoreRequest)
    ours_b = our_vllm_add(vllm_request(b.request_id, [441, 281, 7, 87, 304], max_tokens=2))
    assert_same_request(ours_b, b)


def smg_tokenspeed_frames() -> list[list[bytes]]:
    return [
        [bytes.fromhex(f) for f in json.loads(line)["frames_hex"]]
        for line in SMG_TO_TOKENSPEED.read_text().splitlines()
    ]


def test_smg_tokenspeed_requests_decode_as_the_eleven_element_prefix() -> None:
    decoded = []
    for type_byte, payload in smg_tokenspeed_frames():
        assert type_byte == b"\x00"
        raw = msgspec.msgpack.decode(payload)
        assert len(raw) == 11
        assert raw[0] == "TokenizedGenerateReqInput"
        assert len(raw[5]) == 29
        r = decode_tagged(payload, TokenizedGenerateReqInput)
        sp = r.sampling_params
        assert sp.top_k == TOP_K_DISABLED == 1073741824
        assert sp.stop_strs == []
        assert sp.stop_token_ids is None
        assert sp.is_normalized is True
        assert sp.n == 1
        assert r.logprob_start_len == -1
        assert r.top_logprobs_num == 0
        decoded.append(r)
    a, b = decoded
    assert a.input_ids == PROMPT
    assert a.sampling_params.max_new_tokens == 6
    assert a.sampling_params.seed == 7
    assert a.sampling_params.temperature == pytest.approx(0.7, rel=1e-6)
    assert (a.return_logprob, a.stream) == (True, False)
    assert b.sampling_params.max_new_tokens == 3
    assert b.sampling_params.seed is None
    assert b.sampling_params.temperature == 1.0
    assert (b.return_logprob, b.stream) == (False, True)


def our_tokenspeed_add(rid: str, prompt: list[int], *, stream: bool, **sampling: Any) -> bytes:
    req = GenerateRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingOptions(**sampling),
        eos_token_id=EOS,  # ignored by TokenSpeed: the engine stops on EOS itself
        stream=stream,
    )
    type_byte, payload = TokenSpeedProtocol().encode_add(req)
    assert type_byte == b"\x00"
    return payload


def test_our_tokenspeed_encoder_matches_smg() -> None:
    (_, first), (_, second) = smg_tokenspeed_frames()
    a = decode_tagged(first, TokenizedGenerateReqInput)
    b = decode_tagged(second, TokenizedGenerateReqInput)
    assert a.rid is not None
    assert b.rid is not None
    assert b.input_ids is not None

    # No floats that f32 cannot hold: byte-for-byte what smg sent.
    ours_b = our_tokenspeed_add(b.rid, b.input_ids, stream=True, max_tokens=3)
    assert ours_b == second

    # temperature 0.7: smg widens an f32 to f64, we send the f64 0.7. Otherwise equal.
    ours_a = decode_tagged(
        our_tokenspeed_add(a.rid, PROMPT, stream=False, max_tokens=6, temperature=0.7, seed=7,
                           logprobs=0),
        TokenizedGenerateReqInput,
    )  # fmt: skip
    assert ours_a.sampling_params.temperature == pytest.approx(a.sampling_params.temperature)
    ours_a.sampling_params.temperature = a.sampling_params.temperature
    assert ours_a == a
