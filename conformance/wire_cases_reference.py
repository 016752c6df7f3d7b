"""Reference round-trip cases: frames encoded by vLLM's and TokenSpeed's OWN codecs decode with
ours, and ours decode with theirs (run by conformance/reference_roundtrip.py; skipped, with the
reason, when no interpreter with the engines' packages is at hand)."""

from __future__ import annotations

from typing import Any

from conformance.case import Case, fail_if, register
from conformance.vectors import REFERENCE_BATCH_FIELDS
from conformance.wire_context import WireContext
from smg_trio.codec import encoder
from smg_trio.protocol.tokenspeed import TOP_K_DISABLED, BatchTokenIDOutSlim

__all__ = ["CASES"]

CASES: list[Case] = []
_VLLM = "vllm/v1/engine/__init__.py + vllm/v1/serial_utils.py (vLLM 0.32.0)"
_TS = "python/tokenspeed/runtime/engine/io_struct.py + zmq_wire.py (TokenSpeed 0.1.1)"


def _neq(what: str, got: Any, want: Any) -> str:
    return "" if got == want else f"{what}: got {got!r}, want {want!r}"


@register(
    CASES,
    "reference_vllm_control",
    "vLLM's own EngineCoreRequestType bytes equal ours; vLLM's decoder reads our ABORT and "
    "START_DP_WAVE payloads",
    f"EngineCoreRequestType, MsgpackDecoder in {_VLLM}",
)
def reference_vllm_control(ctx: WireContext) -> str:
    """Request-type bytes and control payloads against vLLM itself."""
    r = ctx.reference("vllm")
    problems = [_neq("version", str(r["version"])[:6], "0.32.0")]
    problems += [_neq(k, ours, theirs) for k, (theirs, ours) in r["request_types"].items()]
    problems.append(_neq("abort", r["abort_decoded_by_vllm"], ["a", "b"]))
    problems.append(_neq("start wave", r["start_wave_decoded_by_vllm"], [9, None]))
    fail_if(problems)
    return f"vLLM {r['version']}: 4 type bytes, ABORT, START_DP_WAVE"


@register(
    CASES,
    "reference_vllm_request_both_ways",
    "an EngineCoreRequest from vLLM's encoder decodes with ours (22 elements), and vLLM's "
    "decoder reads every request we encode (sampling, EOS folding, structured outputs)",
    f"EngineCoreRequest, SamplingParams (vllm/sampling_params.py) in {_VLLM}",
)
def reference_vllm_request_both_ways(ctx: WireContext) -> str:
    """Requests: theirs -> ours and ours -> theirs."""
    r = ctx.reference("vllm")
    theirs = r["vllm_request_to_ours"]
    d, sp = theirs["decoded"], theirs["decoded"]["sampling_params"]
    problems = [
        _neq(
            "their request",
            (theirs["elements"], d["request_id"], d["prompt_token_ids"]),
            (22, "ref-1", [1, 2, 3]),
        ),
        _neq("their sampling", (sp["temperature"], sp["top_k"], sp["_eos_token_id"]), (0.7, 40, 5)),
    ]
    ours = r["ours_to_vllm"]
    for name, case in ours.items():
        problems.append(
            _neq(f"{name} type/elements", (case["type_byte"], case["elements"]), ("00", 22))
        )
    full = ours["full"]["sampling"]
    problems.append(
        _neq(
            "full",
            (
                full["stop_token_ids"],
                full["eos_token_id"],
                full["all_stop_token_ids"],
                full["logit_bias"],
            ),
            ([7, 9, 11], 5, [5, 7, 9, 11], {"5": 1.5, "6": -2.0}),
        )
    )
    ignore = ours["ignore_eos"]["sampling"]
    problems.append(
        _neq(
            "ignore_eos", (ignore["eos_token_id"], ignore["all_stop_token_ids"]), (None, [5, 7, 9])
        )
    )
    for kind in ("json", "regex", "choice", "grammar", "json_object", "structural_tag"):
        so = ours[f"structured_{kind}"]["sampling"]["structured_outputs"]
        problems.append("" if so and so[kind] is not None else f"structured {kind}: lost")
    fail_if(problems)
    return f"1 vLLM request decoded by us, {len(ours)} of ours decoded by vLLM"


@register(
    CASES,
    "reference_vllm_outputs",
    "EngineCoreOutputs from vLLM's encoder (inline and aux-frame tensors, prompt logprobs, "
    "every finish reason, scheduler stats, control-only envelopes) decode with ours",
    f"EngineCoreOutputs, LogprobsLists/Tensors (vllm/v1/outputs.py), MsgpackEncoder in {_VLLM}",
)
def reference_vllm_outputs(ctx: WireContext) -> str:
    """Outputs: theirs -> ours."""
    r = ctx.reference("vllm")
    case = r["vllm_outputs_to_ours"]
    batch, expected = case["decoded"], case["expected"]
    a, b, c, d, e = batch["outputs"]
    ctl = r["vllm_control_to_ours"]
    fail_if(
        [
            _neq("frames", case["frames"], 5),
            _neq(
                "load", batch["load"], {"num_running": 3, "num_waiting": 2, "kv_cache_usage": 0.25}
            ),
            _neq("a logprobs", a["logprobs"], expected["a"]),
            _neq("b logprobs (aux)", b["logprobs"], expected["b"]),
            _neq("b prompt logprobs", b["prompt_logprobs"], expected["b_prompt"]),
            _neq(
                "finishes",
                [o["finish_reason"] for o in (a, b, c, d, e)],
                [None, "length", "stop", "error", "stop"],
            ),
            _neq("stop reasons", (c["stop_reason"], e["stop_reason"]), ("</s>", 151643)),
            _neq("wave complete", ctl["wave_complete"]["wave_complete"], 3),
            _neq("start wave", ctl["start_wave"]["start_wave"], 7),
            _neq("utility/empty", (ctl["utility"]["outputs"], ctl["empty"]["outputs"]), ([], [])),
        ]
    )
    return "5 outputs + 4 control envelopes decode"


@register(
    CASES,
    "reference_tokenspeed_layouts",
    "TokenSpeed's own struct field lists equal ours (SamplingParams 29, BatchTokenIDOutSlim 13, "
    "request prefix through stream) and its request-type bytes equal ours",
    f"__struct_fields__ of {_TS} and runtime/sampling/sampling_params.py",
)
def reference_tokenspeed_layouts(ctx: WireContext) -> str:
    """Field order is the wire contract for array_like structs."""
    r = ctx.reference("tokenspeed")
    f = r["fields"]
    theirs_req, ours_req, ours_prefix = f["request"]
    problems = [
        _neq("version", r["version"], "0.1.1"),
        _neq("SamplingParams", f["sampling_params"][1], f["sampling_params"][0]),
        _neq("request", ours_req, theirs_req[: len(ours_req)]),
        _neq("prefix", ours_prefix, theirs_req[:10]),
        _neq("BatchTokenIDOutSlim", f["output"][1], f["output"][0]),
    ]
    problems += [_neq(k, ours, theirs) for k, (theirs, ours) in r["request_types"].items()]
    fail_if(problems)
    return f"TokenSpeed {r['version']}: layouts and type bytes match"


@register(
    CASES,
    "reference_tokenspeed_request_both_ways",
    "a request from TokenSpeed's encoder decodes with ours; TokenSpeed's decode path accepts "
    "every request we encode (normalized, verify() passes, our ABORT decodes)",
    f"TokenizedGenerateReqInput, zmq_wire.decode_request_frames in {_TS}",
)
def reference_tokenspeed_request_both_ways(ctx: WireContext) -> str:
    """Requests: theirs -> ours and ours -> theirs."""
    r = ctx.reference("tokenspeed")
    theirs = r["tokenspeed_request_to_ours"]
    d = theirs["decoded"]
    problems = [
        _neq("their request", (d["rid"], d["input_ids"], d["stream"]), ("vec-1", [1, 2, 3], True)),
        _neq("their sampling", d["sampling_params"], theirs["theirs_sampling"]),
        _neq("top_k", d["sampling_params"]["top_k"], TOP_K_DISABLED),
        _neq("prefix of theirs == ours", theirs["prefix_of_theirs_equals_ours"], True),
    ]
    for name, c in r["ours_to_tokenspeed"].items():
        problems.append(
            _neq(
                f"{name}",
                (c["type"], c["validation_error"], c["verify_error"]),
                ("TokenizedGenerateReqInput", None, None),
            )
        )
        problems.append(_neq(f"{name} normalized", c["sampling"]["is_normalized"], True))
    problems.append(
        _neq("abort", r["abort_decoded_by_tokenspeed"], [["AbortReq", "x"], ["AbortReq", "y"]])
    )
    fail_if(problems)
    return f"1 TokenSpeed request decoded by us, {len(r['ours_to_tokenspeed'])} of ours accepted"


@register(
    CASES,
    "reference_tokenspeed_output_both_ways",
    "a BatchTokenIDOutSlim from TokenSpeed's encoder decodes with ours and is byte-identical to "
    "our encoding of the same batch; TokenSpeed decodes our struct",
    f"BatchTokenIDOutSlim, MsgpackEncoder/Decoder in {_TS}",
)
def reference_tokenspeed_output_both_ways(ctx: WireContext) -> str:
    """Outputs both ways, byte for byte."""
    r = ctx.reference("tokenspeed")
    case = r["tokenspeed_output_to_ours"]
    ours = BatchTokenIDOutSlim(**REFERENCE_BATCH_FIELDS)  # type: ignore[arg-type]
    b = case["decoded"]
    back = r["ours_output_to_tokenspeed"]
    fail_if(
        [
            _neq("elements", case["elements"], 14),
            _neq("bytes", encoder.encode(ours).hex(), case["hex"]),
            _neq("finished", b["finished_request_ids"], ["vec-1", "r3"]),
            _neq("finishes", [o["finish_reason"] for o in b["outputs"]], ["length", None, "abort"]),
            _neq(
                "ours decoded by TokenSpeed",
                (back["rids"], back["output_ids"], back["engine_index"]),
                (["m"], [[1, 2]], 3),
            ),
        ]
    )
    return "14-element batch byte-identical both ways"
