"""Wire cases for the vLLM EngineCore protocol: request/abort frames, the EngineCoreRequest
array, and output envelopes (pinned vectors and the captured vLLM 0.32.0 session)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec

from conformance import vectors as V
from conformance.case import Case, CaseFailed, fail_if, register
from conformance.wire_context import WireContext
from smg_trio.codec import encoder
from smg_trio.protocol import GenerateRequest, SamplingOptions
from smg_trio.protocol.vllm import (
    ABORT,
    ADD,
    START_DP_WAVE,
    UTILITY,
    EngineCoreRequest,
    VllmProtocol,
    decode_outputs,
)

__all__ = ["CASES", "captured"]

CASES: list[Case] = []
_INIT = "vllm/v1/engine/__init__.py (vLLM 0.32.0)"
#: What the captured session's four ADDs asked for (the capture's own frontend sent them).
_CAPTURED_ADDS: dict[str, dict[str, Any]] = {
    "greedy-8": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8},
    "seeded-4": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 4, "seed": 42},
    "logprobs-3": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 3, "logprobs": 2},
    "long-200": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 200},
}
_CAPTURED_EOS = 1023


def captured(kind: str) -> list[tuple[bytes, ...]]:
    """The captured vLLM 0.32.0 session's frames of one ``kind`` (``add``, ``output``, ...)."""
    return [frames for k, frames in V.vllm_session() if k == kind]


def _neq(what: str, got: Any, want: Any) -> str:
    return "" if got == want else f"{what}: got {got!r}, want {want!r}"


@register(
    CASES,
    "vllm_control_frames",
    "request-type bytes are 00/01/02/03; ABORT ['req-1'] and START_DP_WAVE [9, nil] payloads "
    "match the pinned bytes",
    f"EngineCoreRequestType in {_INIT}; wire-spec 4.1",
)
def vllm_control_frames(ctx: WireContext) -> str:
    """Type bytes and the two pinned control payloads, byte for byte."""
    proto = VllmProtocol()
    fail_if(
        [
            _neq("type bytes", (ADD, ABORT, START_DP_WAVE, UTILITY), (b"\0", b"\1", b"\2", b"\3")),
            _neq("abort", proto.encode_abort(["req-1"]), [ABORT, bytes.fromhex(V.VLLM_ABORT_HEX)]),
            _neq(
                "start wave",
                proto.encode_start_wave(9),
                [START_DP_WAVE, bytes.fromhex(V.VLLM_START_WAVE_HEX)],
            ),
        ]
    )
    return "4 type bytes, ABORT and START_DP_WAVE byte-exact"


@register(
    CASES,
    "vllm_request_positional_array",
    "EngineCoreRequest is a positional array (22 fields, defaults at their indices); short "
    "(6-element) and longer arrays still decode",
    f"EngineCoreRequest(array_like=True, omit_defaults=True) in {_INIT}; wire-spec 4.2",
)
def vllm_request_positional_array(ctx: WireContext) -> str:
    """The pinned structure test of wire-spec 4.2, plus tolerance of shorter/longer arrays."""
    wire = EngineCoreRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        sampling_params={"max_tokens": 8},
        arrival_time=1234.5,
        client_index=7,
    )
    raw = msgspec.msgpack.decode(encoder.encode(wire))
    if not isinstance(raw, list):
        raise CaseFailed(f"not an array: {type(raw).__name__}")
    problems = [
        _neq("length", len(raw), 22),
        _neq("[0..5]", raw[:6], ["req-1", [1, 2, 3], None, {"max_tokens": 8}, None, 1234.5]),
        _neq("[10..15]", raw[10:16], [None, 7, 0, 0, None, False]),
        _neq("[19], [21]", (raw[19], raw[21]), (False, None)),
    ]
    short = encoder.encode(["req-1", [1, 2], None, {"max_tokens": 2}, None, 1.0])
    s = msgspec.msgpack.decode(short, type=EngineCoreRequest)
    problems.append(_neq("short decode", (s.request_id, s.client_index), ("req-1", 0)))
    longer = msgspec.msgpack.decode(encoder.encode([*raw, "future"]), type=EngineCoreRequest)
    problems.append(_neq("longer decode", longer.request_id, "req-1"))
    fail_if(problems)
    return "22-element array; 6- and 23-element arrays decode"


@register(
    CASES,
    "vllm_captured_adds",
    "the captured ADD frames decode as EngineCoreRequest, and our encoder reproduces them "
    "field for field (arrival time aside)",
    f"real vLLM 0.32.0 session (conformance/data/{V.VLLM_CAPTURE_FILE}); {_INIT}",
)
def vllm_captured_adds(ctx: WireContext) -> str:
    """Decode every captured ADD; build the same request through VllmProtocol and compare."""
    problems: list[str] = []
    adds = captured("add")
    for type_byte, payload in adds:
        theirs = msgspec.msgpack.decode(payload, type=EngineCoreRequest)
        want = _CAPTURED_ADDS.get(theirs.request_id)
        if type_byte != ADD or want is None or theirs.prompt_token_ids is None:
            problems.append(f"unexpected ADD {theirs.request_id!r} type {type_byte.hex()}")
            continue
        req = GenerateRequest(
            request_id=theirs.request_id,
            prompt_token_ids=list(theirs.prompt_token_ids),
            sampling=SamplingOptions(stop_token_ids=[_CAPTURED_EOS], **want),
            eos_token_id=_CAPTURED_EOS,
        )
        ours = msgspec.msgpack.decode(VllmProtocol().encode_add(req)[1], type=EngineCoreRequest)
        for name in EngineCoreRequest.__struct_fields__:
            if name in ("arrival_time", "sampling_params"):
                continue
            problems.append(
                _neq(f"{theirs.request_id}.{name}", getattr(ours, name), getattr(theirs, name))
            )
        problems.append(
            _neq(f"{theirs.request_id}.sampling", ours.sampling_params, theirs.sampling_params)
        )
    problems.append(_neq("ADD count", len(adds), len(_CAPTURED_ADDS)))
    fail_if(problems)
    return f"{len(adds)} captured ADDs decode and re-encode field for field"


@register(
    CASES,
    "vllm_outputs_derived_vectors",
    "the derived 8-element EngineCoreOutputs vectors decode: tokens, finish 'stop', finished "
    "ids, inline logprob tensors (ext 3)",
    f"EngineCoreOutputs / EngineCoreOutput in {_INIT}, tensors per vllm/v1/serial_utils.py "
    "(0.32.0); wire-spec 4.5-4.6",
)
def vllm_outputs_derived_vectors(ctx: WireContext) -> str:
    """The two derived envelopes of wire-spec 4.6."""
    stop = decode_outputs([bytes.fromhex(V.VLLM_OUTPUTS_STOP_HEX)])
    lps = decode_outputs([bytes.fromhex(V.VLLM_OUTPUTS_LOGPROBS_HEX)])
    if len(stop.outputs) != 1 or len(lps.outputs) != 1:
        raise CaseFailed("expected one output in each vector")
    s, lp_out = stop.outputs[0], lps.outputs[0]
    lp = lp_out.logprobs
    fail_if(
        [
            _neq("stop tokens", (s.request_id, s.new_token_ids), ("req-1", [100, 101])),
            _neq("stop finish", (s.finish_reason, stop.finished_request_ids), ("stop", ["req-1"])),
            _neq("logprob tokens", lp_out.new_token_ids, [7]),
            "no logprobs" if lp is None else "",
            ""
            if lp is None
            else _neq(
                "logprobs",
                (lp.token_ids, lp.logprobs, lp.ranks, lp.top_token_ids, lp.top_logprobs),
                ([7], [-0.5], [2], [[8]], [[-2.0]]),
            ),
        ]
    )
    return "stop and inline-logprobs envelopes decode"


@register(
    CASES,
    "vllm_captured_outputs",
    "every captured output envelope (9-element, 18-element outputs) decodes; tokens, finishes, "
    "logprob columns and scheduler load come out as the engine sent them",
    f"real vLLM 0.32.0 session; EngineCoreOutputs in {_INIT}, SchedulerStats in "
    "vllm/v1/metrics/stats.py (0.32.0)",
)
def vllm_captured_outputs(ctx: WireContext) -> str:
    """Decode the whole captured output stream and check what it adds up to."""
    batches = [decode_outputs(list(f)) for f in captured("output")]
    tokens: dict[str, list[int]] = defaultdict(list)
    finish: dict[str, str] = {}
    logprob_rows = 0
    for batch in batches:
        for o in batch.outputs:
            tokens[o.request_id] += o.new_token_ids
            if o.finish_reason is not None:
                finish[o.request_id] = o.finish_reason
            if o.logprobs is not None:
                logprob_rows += len(o.logprobs)
    running = [b.load.num_running if b.load else None for b in batches]
    fail_if(
        [
            _neq("batches", len(batches), 9),
            _neq(
                "finishes", finish, dict.fromkeys(("greedy-8", "seeded-4", "logprobs-3"), "length")
            ),
            _neq("greedy-8", tokens["greedy-8"], [281, 690, 751, 281, 281, 281, 281, 281]),
            _neq("seeded-4", tokens["seeded-4"], [0, 552, 890, 126]),
            _neq("long-200 (aborted)", tokens["long-200"], [281]),
            _neq("logprob rows", logprob_rows, 3),
            _neq("load", running, [4, 3, 2, 1, 1, 1, 1, 0, 0]),
        ]
    )
    abort = captured("abort")
    fail_if([_neq("abort", [list(a) for a in abort], [VllmProtocol().encode_abort(["long-200"])])])
    return f"{len(batches)} envelopes decode; ABORT byte-exact"
