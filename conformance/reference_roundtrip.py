"""Round-trip frames between the engines' OWN codecs (vLLM 0.32.0, TokenSpeed 0.1.1) and ours.

Runs under an interpreter that has the engines' packages (the peers' ``.peers/vllm/bin/python``,
see ``scripts/setup_peers.sh``) with smg_trio and this package importable, e.g.::

    PYTHONPATH=<repo> .peers/vllm/bin/python -m conformance.reference_roundtrip vllm
    PYTHONPATH=<repo> .peers/vllm/bin/python -m conformance.reference_roundtrip tokenspeed

Needs only the standard library, msgspec, numpy, smg_trio and the engine's packages. It prints
ONE JSON object on the last line of stdout: the values each side decoded, next to the values
that went in. It asserts nothing itself: ``conformance wire`` (``wire_cases_reference.py``) and
``tests/e2e/test_reference_encoders.py`` judge it. ``conformance wire`` also calls
:func:`vllm_cases` / :func:`tokenspeed_cases` in-process when the engines are importable.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
import numpy as np

from smg_trio.protocol import GenerateRequest, SamplingOptions, StructuredOutputs


def as_bytes(frames: Any) -> list[bytes]:
    """Frames as a reference encoder returns them (bytes, memoryview, ...) -> bytes."""
    return [bytes(memoryview(f).cast("B")) for f in frames]


def jsonable(obj: Any) -> Any:
    """Builtins for JSON: sets become sorted lists, dict keys strings, numpy -> lists."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return sorted(jsonable(v) for v in obj)
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, msgspec.Struct):
        return jsonable(msgspec.structs.asdict(obj))
    if isinstance(obj, (bytes, memoryview)):
        return bytes(obj).hex()
    return obj


# --------------------------------------------------------------------------- vLLM


def _expected_logprobs(ids: Any, lps: Any, ranks: Any) -> dict[str, Any]:
    """What our decoder must produce for vLLM logprob arrays ``[positions][1 + k]`` (column 0
    is the sampled token, the rest its top-k candidates) and ``ranks[positions]``."""
    return {
        "token_ids": ids[:, 0].tolist(),
        "logprobs": lps[:, 0].tolist(),
        "ranks": ranks.tolist(),
        "top_token_ids": ids[:, 1:].tolist(),
        "top_logprobs": lps[:, 1:].tolist(),
    }


def vllm_cases() -> dict[str, Any]:
    """Round trips against vLLM's own ``MsgpackEncoder`` / ``MsgpackDecoder`` (both ways)."""
    import torch
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.engine import (
        EngineCoreOutput,
        EngineCoreOutputs,
        EngineCoreRequest,
        EngineCoreRequestType,
        FinishReason,
        UtilityOutput,
    )
    from vllm.v1.metrics.stats import PrefillStats, SchedulerStats
    from vllm.v1.outputs import LogprobsLists, LogprobsTensors
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, UtilityResult

    from smg_trio.protocol import vllm as ours

    result: dict[str, Any] = {"version": _version("vllm")}
    enc = MsgpackEncoder()

    # -- request-type bytes ------------------------------------------------------------
    result["request_types"] = {
        "ADD": [EngineCoreRequestType.ADD.value.hex(), ours.ADD.hex()],
        "ABORT": [EngineCoreRequestType.ABORT.value.hex(), ours.ABORT.hex()],
        "START_DP_WAVE": [
            EngineCoreRequestType.START_DP_WAVE.value.hex(),
            ours.START_DP_WAVE.hex(),
        ],
        "UTILITY": [EngineCoreRequestType.UTILITY.value.hex(), ours.UTILITY.hex()],
    }
    generic = MsgpackDecoder()
    proto = ours.VllmProtocol()
    result["abort_decoded_by_vllm"] = generic.decode(proto.encode_abort(["a", "b"])[1])
    wave = proto.encode_start_wave(9)
    assert wave is not None
    result["start_wave_decoded_by_vllm"] = jsonable(generic.decode(wave[1]))

    # -- vLLM's EngineCoreRequest -> ours ----------------------------------------------
    sp = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=42,
        max_tokens=8,
        min_tokens=1,
        logprobs=2,
        prompt_logprobs=1,
        stop_token_ids=[7, 9],
        logit_bias={5: 1.5},
        structured_outputs=StructuredOutputsParams(regex="[a-z]+"),
    )
    sp.update_from_generation_config({}, eos_token_id=5)
    theirs_req = EngineCoreRequest(
        request_id="ref-1",
        prompt_token_ids=[1, 2, 3],
        mm_features=None,
        sampling_params=sp,
        pooling_params=None,
        arrival_time=123.5,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=1,
        client_index=0,
    )
    frames = as_bytes(enc.encode(theirs_req))
    decoded = msgspec.msgpack.decode(frames[0], type=ours.EngineCoreRequest)
    result["vllm_request_to_ours"] = {
        "frames": len(frames),
        "elements": len(msgspec.msgpack.decode(frames[0])),
        "decoded": jsonable(decoded),
    }

    # -- our EngineCoreRequest -> vLLM's decoder ----------------------------------------
    dec_req = MsgpackDecoder(EngineCoreRequest)
    cases: list[tuple[str, GenerateRequest]] = [
        (
            "full",
            GenerateRequest(
                request_id="ours-1",
                prompt_token_ids=[1, 2, 3, 4],
                sampling=SamplingOptions(
                    temperature=0.7,
                    top_p=0.9,
                    top_k=40,
                    min_p=0.05,
                    seed=42,
                    max_tokens=8,
                    min_tokens=1,
                    frequency_penalty=0.5,
                    presence_penalty=-0.5,
                    repetition_penalty=1.2,
                    logprobs=2,
                    prompt_logprobs=1,
                    stop_token_ids=[7, 9],
                    logit_bias={5: 1.5, 6: -2.0},
                ),
                eos_token_id=5,
                extra_eos_token_ids=[7, 11],
                data_parallel_rank=1,
                arrival_time=1234.5,
            ),
        ),
        (
            "ignore_eos",
            GenerateRequest(
                request_id="ours-2",
                prompt_token_ids=[1],
                sampling=SamplingOptions(max_tokens=4, stop_token_ids=[9], ignore_eos=True),
                eos_token_id=5,
                extra_eos_token_ids=[7],
            ),
        ),
        (
            "greedy_defaults",
            GenerateRequest(
                request_id="ours-3",
                prompt_token_ids=[3, 4],
                sampling=SamplingOptions(temperature=0.0, max_tokens=2),
            ),
        ),
    ]
    so_cases = {
        "json": StructuredOutputs(json={"type": "object"}),
        "regex": StructuredOutputs(regex="[0-9]+"),
        "choice": StructuredOutputs(choice=["yes", "no"]),
        "grammar": StructuredOutputs(grammar='root ::= "a"'),
        "json_object": StructuredOutputs(json_object=True),
        "structural_tag": StructuredOutputs(structural_tag='{"type": "structural_tag"}'),
    }
    for kind, so in so_cases.items():
        cases.append(
            (
                f"structured_{kind}",
                GenerateRequest(
                    request_id=f"so-{kind}",
                    prompt_token_ids=[1],
                    sampling=SamplingOptions(max_tokens=4, structured_outputs=so),
                ),
            )
        )
    ours_to_vllm: dict[str, Any] = {}
    for name, req in cases:
        proto.validate(req)
        type_byte, payload, *aux = proto.encode_add(req)
        r = dec_req.decode([payload, *aux])
        s = r.sampling_params
        so_out = None
        if s.structured_outputs is not None:
            so_obj = s.structured_outputs
            so_out = {
                "json": so_obj.json,
                "regex": so_obj.regex,
                "choice": so_obj.choice,
                "grammar": so_obj.grammar,
                "json_object": so_obj.json_object,
                "structural_tag": so_obj.structural_tag,
                "_backend": so_obj._backend,
            }
        ours_to_vllm[name] = {
            "type_byte": type_byte.hex(),
            "elements": len(msgspec.msgpack.decode(payload)),
            "request_id": r.request_id,
            "prompt_token_ids": r.prompt_token_ids,
            "arrival_time": r.arrival_time,
            "data_parallel_rank": r.data_parallel_rank,
            "client_index": r.client_index,
            "external_req_id": r.external_req_id,
            "prompt_embeds_is_none": r.prompt_embeds is None,
            "mm_features": r.mm_features,
            "sampling": {
                "temperature": s.temperature,
                "top_p": s.top_p,
                "top_k": s.top_k,
                "min_p": s.min_p,
                "seed": s.seed,
                "max_tokens": s.max_tokens,
                "min_tokens": s.min_tokens,
                "frequency_penalty": s.frequency_penalty,
                "presence_penalty": s.presence_penalty,
                "repetition_penalty": s.repetition_penalty,
                "logprobs": s.logprobs,
                "prompt_logprobs": s.prompt_logprobs,
                "stop_token_ids": s.stop_token_ids,
                "eos_token_id": s.eos_token_id,
                "all_stop_token_ids": sorted(s.all_stop_token_ids),
                "ignore_eos": s.ignore_eos,
                "logit_bias": jsonable(s.logit_bias),
                "n": s.n,
                "structured_outputs": so_out,
            },
        }
    result["ours_to_vllm"] = ours_to_vllm

    # -- vLLM's EngineCoreOutputs (with logprobs, inline and aux) -> ours ---------------
    small_ids = np.array([[7, 8, 9]], dtype=np.int32)  # 12 bytes: inline
    small_lps = np.array([[-0.5, -0.25, -2.0]], dtype=np.float32)
    small_ranks = np.array([2], dtype=np.int64)
    big_ids = np.arange(8 * 21, dtype=np.int64).reshape(8, 21)  # 1344 bytes: aux frame
    big_lps = -np.arange(8 * 21, dtype=np.float32).reshape(8, 21) / 8.0  # 672 bytes: aux
    big_ranks = np.arange(1, 9, dtype=np.int64)  # 64 bytes: inline
    prompt_ids = torch.arange(100, 100 + 5 * 21, dtype=torch.int64).reshape(5, 21)  # aux
    prompt_lps = -torch.arange(5 * 21, dtype=torch.float32).reshape(5, 21) / 4.0  # aux
    prompt_ranks = torch.tensor([1, 3, 1, 2, 1], dtype=torch.int64)  # inline
    outputs = EngineCoreOutputs(
        engine_index=1,
        outputs=[
            EngineCoreOutput(
                request_id="a",
                new_token_ids=[7],
                new_logprobs=LogprobsLists(small_ids, small_lps, small_ranks, None),
                prefill_stats=PrefillStats(
                    num_prompt_tokens=18, num_computed_tokens=2, num_cached_tokens=16
                ),
            ),
            EngineCoreOutput(
                request_id="b",
                new_token_ids=list(range(8)),
                new_logprobs=LogprobsLists(big_ids, big_lps, big_ranks, None),
                new_prompt_logprobs_tensors=LogprobsTensors(prompt_ids, prompt_lps, prompt_ranks),
                finish_reason=FinishReason.LENGTH,
            ),
            EngineCoreOutput(
                request_id="c",
                new_token_ids=[9],
                finish_reason=FinishReason.STOP,
                stop_reason="</s>",
            ),
            EngineCoreOutput(
                request_id="d", new_token_ids=[], finish_reason=FinishReason.ERROR, stop_reason=None
            ),
            EngineCoreOutput(
                request_id="e",
                new_token_ids=[3],
                finish_reason=FinishReason.STOP,
                stop_reason=151643,
            ),
        ],
        scheduler_stats=SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25),
        timestamp=5.0,
        finished_requests={"b", "c", "d", "e"},
    )
    frames = as_bytes(enc.encode(outputs))
    raw = msgspec.msgpack.decode(frames[0], ext_hook=lambda code, data: f"ext{code}")
    batch = ours.decode_outputs(frames)
    result["vllm_outputs_to_ours"] = {
        "frames": len(frames),
        "envelope_elements": len(raw),
        "output_elements": [len(o) for o in raw[1]],
        "tensor_data_kinds": {
            "small_ids": raw[1][0][2][0][2],
            "small_dtype": raw[1][0][2][0][0],
            "big_ids": raw[1][1][2][0][2],
            "big_ranks": raw[1][1][2][2][2],
            "prompt_dtype": raw[1][1][3][0][0],
            "prompt_ids": raw[1][1][3][0][2],
        },
        "decoded": jsonable(batch),
        "expected": {
            "a": _expected_logprobs(small_ids, small_lps, small_ranks),
            "b": _expected_logprobs(big_ids, big_lps, big_ranks),
            "b_prompt": _expected_logprobs(prompt_ids, prompt_lps, prompt_ranks),
        },
    }

    # -- control-only envelopes --------------------------------------------------------
    control: dict[str, Any] = {}
    for name, env in {
        "wave_complete": EngineCoreOutputs(engine_index=2, wave_complete=3),
        "start_wave": EngineCoreOutputs(engine_index=0, start_wave=7),
        "utility": EngineCoreOutputs(
            utility_output=UtilityOutput(call_id=1, result=UtilityResult({"ok": True}))
        ),
        "empty": EngineCoreOutputs(),
    }.items():
        f = as_bytes(enc.encode(env))
        control[name] = jsonable(ours.decode_outputs(f))
    result["vllm_control_to_ours"] = control
    return result


# --------------------------------------------------------------------------- TokenSpeed


def tokenspeed_cases() -> dict[str, Any]:
    """Round trips against TokenSpeed's own io_struct / zmq_wire codecs (both ways)."""
    from peers.tokenspeed_peer import install_tokenspeed_stubs

    install_tokenspeed_stubs()
    from tokenspeed.runtime.engine import io_struct, zmq_wire
    from tokenspeed.runtime.sampling.sampling_params import SamplingParams

    from smg_trio.protocol import tokenspeed as ours

    result: dict[str, Any] = {"version": _version("tokenspeed")}

    # -- struct layouts: field names and order are the wire contract --------------------
    result["fields"] = {
        "sampling_params": [
            list(SamplingParams.__struct_fields__),
            list(ours.SamplingParams.__struct_fields__),
        ],
        "request": [
            list(io_struct.TokenizedGenerateReqInput.__struct_fields__),
            list(ours.TokenizedGenerateReqInput.__struct_fields__),
            list(ours.TokenizedGenerateReqInputPrefix.__struct_fields__),
        ],
        "output": [
            list(io_struct.BatchTokenIDOutSlim.__struct_fields__),
            list(ours.BatchTokenIDOutSlim.__struct_fields__),
        ],
    }
    result["request_types"] = {
        "ADD": [zmq_wire.REQ_TYPE_ADD.hex(), ours.ADD.hex()],
        "ABORT": [zmq_wire.REQ_TYPE_ABORT.hex(), ours.ABORT.hex()],
    }

    enc = io_struct.MsgpackEncoder()

    # -- TokenSpeed's request -> ours --------------------------------------------------
    sp = SamplingParams(max_new_tokens=8, stop_token_ids={2}, temperature=0.5, top_p=0.9, seed=42)
    sp.normalize(None)
    theirs = io_struct.TokenizedGenerateReqInput(
        rid="vec-1",
        input_ids=[1, 2, 3],
        sampling_params=sp,
        return_logprob=True,
        stream=True,
    )
    frames = as_bytes(enc.encode(theirs))
    decoded = ours.decode_tagged(frames[0], ours.TokenizedGenerateReqInput)
    result["tokenspeed_request_to_ours"] = {
        "frames": len(frames),
        "elements": len(msgspec.msgpack.decode(frames[0])),
        "theirs_sampling": jsonable(sp),
        "decoded": jsonable(decoded),
        "prefix_of_theirs_equals_ours": _prefix_bytes(frames[0], 11)
        == msgspec.msgpack.encode(
            ours.decode_tagged(frames[0], ours.TokenizedGenerateReqInputPrefix)
        ),
    }

    # -- our requests -> TokenSpeed's decode path (decode, seed, normalize, n check) ----
    proto = ours.TokenSpeedProtocol()
    reqs = {
        "vec1": GenerateRequest(
            request_id="vec-1",
            prompt_token_ids=[1, 2, 3],
            sampling=SamplingOptions(
                temperature=0.5, top_p=0.9, max_tokens=8, stop_token_ids=[2], seed=42, logprobs=0
            ),
            stream=True,
        ),
        "greedy_no_seed": GenerateRequest(
            request_id="g-1",
            prompt_token_ids=[4, 5],
            sampling=SamplingOptions(temperature=0.0, max_tokens=3),
            stream=False,
        ),
        "sampled_no_seed": GenerateRequest(
            request_id="s-1",
            prompt_token_ids=[4, 5],
            sampling=SamplingOptions(temperature=0.8, top_k=20, max_tokens=3),
        ),
        "penalties_bias_json": GenerateRequest(
            request_id="p-1",
            prompt_token_ids=[6],
            sampling=SamplingOptions(
                max_tokens=5,
                min_tokens=2,
                min_p=0.1,
                frequency_penalty=0.5,
                presence_penalty=-0.5,
                repetition_penalty=1.2,
                logit_bias={5: 1.5, 12: -100.0},
                ignore_eos=True,
                skip_special_tokens=False,
                structured_outputs=StructuredOutputs(json={"type": "object"}),
            ),
        ),
    }
    ours_to_ts: dict[str, Any] = {}
    for name, req in reqs.items():
        proto.validate(req)
        frames = proto.encode_add(req)
        [io] = zmq_wire.decode_request_frames(frames)
        s = io.sampling_params
        verify_error = None
        try:
            s.verify(1024)
        except ValueError as exc:
            verify_error = str(exc)
        ours_to_ts[name] = {
            "type": type(io).__name__,
            "rid": io.rid,
            "input_ids": io.input_ids,
            "return_logprob": io.return_logprob,
            "stream": io.stream,
            "logprob_start_len": io.logprob_start_len,
            "validation_error": io.validation_error,
            "verify_error": verify_error,
            "sampling": jsonable(s),
        }
    result["ours_to_tokenspeed"] = ours_to_ts
    abort = zmq_wire.decode_request_frames(proto.encode_abort(["x", "y"]))
    result["abort_decoded_by_tokenspeed"] = [[type(a).__name__, a.rid] for a in abort]

    # -- TokenSpeed's output -> ours ---------------------------------------------------
    theirs_out = io_struct.BatchTokenIDOutSlim(
        rids=["vec-1", "r2", "r3"],
        output_ids=[[10, 11], [12], []],
        finished_reasons=["length", "", "abort"],
        prompt_tokens=[3, 4, 5],
        completion_tokens=[2, 1, 0],
        cached_tokens=[1, 0, 0],
        output_token_logprobs_val=[[-0.5, -0.25], [], []],
        output_token_logprobs_idx=[[10, 11], [], []],
        engine_index=1,
        num_running=2,
        num_waiting=5,
        kv_active_pages=100,
        kv_total_pages=400,
    )
    frames = as_bytes(enc.encode(theirs_out))
    result["tokenspeed_output_to_ours"] = {
        "frames": len(frames),
        "elements": len(msgspec.msgpack.decode(frames[0])),
        "hex": frames[0].hex(),
        "decoded": jsonable(ours.decode_batch(frames)),
    }

    # -- our output struct -> TokenSpeed's decoder (the mock-engine direction) ----------
    mine = ours.BatchTokenIDOutSlim(
        rids=["m"],
        output_ids=[[1, 2]],
        finished_reasons=["stop"],
        prompt_tokens=[7],
        completion_tokens=[2],
        cached_tokens=[0],
        output_token_logprobs_val=[[]],
        output_token_logprobs_idx=[[]],
        engine_index=3,
    )
    back = io_struct.MsgpackDecoder(io_struct.BatchTokenIDOutSlim).decode(
        msgspec.msgpack.encode(mine)
    )
    result["ours_output_to_tokenspeed"] = jsonable(back)
    return result


def _prefix_bytes(payload: bytes, n: int) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.decode(payload)[:n])


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str]) -> int:
    """``reference_roundtrip.py vllm|tokenspeed``: print the JSON result; 2 on bad usage."""
    if len(argv) != 2 or argv[1] not in ("vllm", "tokenspeed"):
        print("usage: reference_roundtrip.py vllm|tokenspeed", file=sys.stderr)
        return 2
    cases = vllm_cases() if argv[1] == "vllm" else tokenspeed_cases()
    print(json.dumps(cases, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
