"""Wire cases for the TokenSpeed protocol: the pinned TokenizedGenerateReqInput and
BatchTokenIDOutSlim vectors, byte-exact re-encoding, and the tolerant-decoding rules."""

from __future__ import annotations

from typing import Any

import msgspec

from conformance import vectors as V
from conformance.case import Case, CaseFailed, fail_if, register
from conformance.vectors import VEC1_OUTPUT_FIELDS
from conformance.wire_context import WireContext
from smg_trio.codec import encoder
from smg_trio.errors import DecodeError
from smg_trio.protocol import GenerateRequest, SamplingOptions
from smg_trio.protocol.tokenspeed import (
    ADD,
    TOP_K_DISABLED,
    BatchTokenIDOutSlim,
    TokenizedGenerateReqInput,
    TokenizedGenerateReqInputPrefix,
    TokenSpeedProtocol,
    decode_batch,
    decode_tagged,
)

__all__ = ["CASES"]

CASES: list[Case] = []
_IO = "python/tokenspeed/runtime/engine/io_struct.py (TokenSpeed 0.1.1)"
_SMG = "smg 1.13.0 crates/engine_zmq_client tokenspeed tests"


def _neq(what: str, got: Any, want: Any) -> str:
    return "" if got == want else f"{what}: got {got!r}, want {want!r}"


def _raises(what: str, match: str, fn: Any, *args: Any) -> str:
    try:
        fn(*args)
    except DecodeError as exc:
        return "" if match in str(exc) else f"{what}: error {exc!s} lacks {match!r}"
    return f"{what}: decoded, want DecodeError {match!r}"


def _vec1_output() -> BatchTokenIDOutSlim:
    return BatchTokenIDOutSlim(**VEC1_OUTPUT_FIELDS)  # type: ignore[arg-type]


@register(
    CASES,
    "tokenspeed_request_vector",
    "the pinned 152-byte TokenizedGenerateReqInput (tag + 23 fields, nested 29-field "
    "SamplingParams) decodes field for field and re-encodes byte for byte",
    f"TokenizedGenerateReqInput / SamplingParams in {_IO} and "
    "runtime/sampling/sampling_params.py; PYTHON_REQUEST_VECTOR of wire-spec 5.6",
)
def tokenspeed_request_vector(ctx: WireContext) -> str:
    """Decode, check fields, re-encode."""
    vec = V.PYTHON_REQUEST_VECTOR
    r = decode_tagged(vec, TokenizedGenerateReqInput)
    sp = r.sampling_params
    fail_if(
        [
            _neq("length", len(vec), 152),
            _neq(
                "request",
                (r.rid, r.input_ids, r.return_logprob, r.stream),
                ("vec-1", [1, 2, 3], True, True),
            ),
            _neq("logprob_start_len", r.logprob_start_len, -1),
            _neq(
                "sampling",
                (sp.max_new_tokens, sp.stop_token_ids, sp.temperature, sp.top_p, sp.top_k, sp.seed),
                (8, [2], 0.5, 0.9, TOP_K_DISABLED, 42),
            ),
            _neq("normalized", (sp.n, sp.stop_strs, sp.is_normalized), (1, [], True)),
            _neq("re-encoded", encoder.encode(r).hex(), vec.hex()),
        ]
    )
    return "152 bytes decode and re-encode byte-exact"


@register(
    CASES,
    "tokenspeed_request_prefix_vector",
    "smg's 11-element prefix (tag + fields through stream, 129 bytes) is the pinned vector's "
    "first 11 elements; our encoder sends exactly it; it decodes to the full struct's values",
    f"{_IO} (append-only, defaults fill the rest); wire-spec 5.6 (its printed hex lacks the "
    "last 4 bytes ff00c0c3)",
)
def tokenspeed_request_prefix_vector(ctx: WireContext) -> str:
    """Prefix bytes from three directions."""
    req = GenerateRequest(
        request_id="vec-1",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingOptions(
            temperature=0.5, top_p=0.9, max_tokens=8, stop_token_ids=[2], seed=42, logprobs=0
        ),
        stream=True,
    )
    frames = TokenSpeedProtocol().encode_add(req)
    full = msgspec.msgpack.decode(V.PYTHON_REQUEST_VECTOR)
    prefix = decode_tagged(V.PREFIX_VECTOR, TokenizedGenerateReqInputPrefix)
    fail_if(
        [
            _neq("length", len(V.PREFIX_VECTOR), 129),
            _neq(
                "first 11 of the full vector",
                encoder.encode(full[:11]).hex(),
                V.PREFIX_VECTOR.hex(),
            ),
            _neq("encode_add", [f.hex() for f in frames], [ADD.hex(), V.PREFIX_VECTOR.hex()]),
            _neq(
                "as full struct",
                decode_tagged(V.PREFIX_VECTOR, TokenizedGenerateReqInput),
                decode_tagged(V.PYTHON_REQUEST_VECTOR, TokenizedGenerateReqInput),
            ),
            _neq("prefix re-encoded", encoder.encode(prefix).hex(), V.PREFIX_VECTOR.hex()),
        ]
    )
    return "129-byte prefix byte-exact"


@register(
    CASES,
    "tokenspeed_output_vector",
    "the pinned 14-element BatchTokenIDOutSlim decodes (columns split per request, load "
    "100/400 pages) and our struct encodes to exactly its bytes",
    f"BatchTokenIDOutSlim in {_IO} (load columns from TokenSpeed PR #1079); "
    "PYTHON_OUTPUT_VECTOR of wire-spec 5.6",
)
def tokenspeed_output_vector(ctx: WireContext) -> str:
    """Decode to a batch, then re-encode both the decoded and a built struct."""
    vec = V.PYTHON_OUTPUT_VECTOR
    batch = decode_batch([vec])
    if len(batch.outputs) != 1 or batch.load is None:
        raise CaseFailed(f"want 1 output and a load, got {batch!r}")
    out, load = batch.outputs[0], batch.load
    lp = out.logprobs
    fail_if(
        [
            _neq("elements", len(msgspec.msgpack.decode(vec)), 14),
            _neq("engine_index", batch.engine_index, 1),
            _neq("load", (load.num_running, load.num_waiting, load.kv_cache_usage), (2, 5, 0.25)),
            _neq(
                "output",
                (out.request_id, out.new_token_ids, out.finish_reason),
                ("vec-1", [10, 11], "length"),
            ),
            _neq(
                "counts", (out.prompt_tokens, out.completion_tokens, out.cached_tokens), (3, 2, 1)
            ),
            _neq(
                "logprobs",
                None if lp is None else (lp.token_ids, lp.logprobs),
                ([10, 11], [-0.5, -0.25]),
            ),
            _neq(
                "re-encoded",
                encoder.encode(decode_tagged(vec, BatchTokenIDOutSlim)).hex(),
                vec.hex(),
            ),
            _neq("built", encoder.encode(_vec1_output()).hex(), vec.hex()),
        ]
    )
    return "14-element batch decodes and encodes byte-exact"


@register(
    CASES,
    "tokenspeed_older_output_vectors",
    "the 10-element (pre-load) and 9-element (pre-DP) batches decode: no load, rank 0 when "
    "engine_index is absent",
    f"{_IO} is append-only; {_SMG} (pre_dp_nine_element..., pre_load_ten_element...)",
)
def tokenspeed_older_output_vectors(ctx: WireContext) -> str:
    """Shorter senders still decode."""
    pre_load = decode_batch([V.PYTHON_OUTPUT_VECTOR_PRE_LOAD])
    pre_dp = decode_batch([V.PYTHON_OUTPUT_VECTOR_PRE_DP])
    fail_if(
        [
            _neq("pre-load", (pre_load.engine_index, pre_load.load), (1, None)),
            _neq("pre-DP", (pre_dp.engine_index, pre_dp.load), (0, None)),
            _neq("pre-DP tokens", [o.new_token_ids for o in pre_dp.outputs], [[10, 11]]),
        ]
    )
    return "10- and 9-element batches decode"


@register(
    CASES,
    "tokenspeed_wrong_tag_fails",
    "a corrupted tag (request byte 5 'o'->'O', output byte 2 'B'->'X') is a decode error "
    "'wrong msgspec tag'",
    f"msgspec tagged structs (tag_field '_tag') in {_IO}; {_SMG} decode_rejects_wrong_tag",
)
def tokenspeed_wrong_tag_fails(ctx: WireContext) -> str:
    """Both tags are checked."""
    bad_req = bytearray(V.PYTHON_REQUEST_VECTOR)
    bad_req[5] = ord("O")
    bad_out = bytearray(V.PYTHON_OUTPUT_VECTOR)
    bad_out[2] = ord("X")
    fail_if(
        [
            _raises(
                "request",
                "wrong msgspec tag",
                decode_tagged,
                bytes(bad_req),
                TokenizedGenerateReqInput,
            ),
            _raises(
                "prefix",
                "wrong msgspec tag",
                decode_tagged,
                bytes(bad_req),
                TokenizedGenerateReqInputPrefix,
            ),
            _raises("output", "wrong msgspec tag", decode_batch, [bytes(bad_out)]),
        ]
    )
    return "both corrupted tags rejected"


@register(
    CASES,
    "tokenspeed_extra_column_tolerated",
    "an appended output column [99] decodes to the same batch; a longer request array (0.1.1 "
    "appends data_parallel_rank) decodes",
    f"append-only structs in {_IO}; {_SMG} decode_tolerates_appended_trailing_columns",
)
def tokenspeed_extra_column_tolerated(ctx: WireContext) -> str:
    """Trailing elements are ignored."""
    raw = msgspec.msgpack.decode(V.PYTHON_OUTPUT_VECTOR)
    extended = decode_batch([encoder.encode([*raw, [99]])])
    full = msgspec.msgpack.decode(V.PYTHON_REQUEST_VECTOR)
    longer = decode_tagged(encoder.encode([*full, None, "future"]), TokenizedGenerateReqInput)
    fail_if(
        [
            _neq("extended batch", extended, decode_batch([V.PYTHON_OUTPUT_VECTOR])),
            _neq("longer request", longer.rid, "vec-1"),
        ]
    )
    return "extra trailing elements ignored"


@register(
    CASES,
    "tokenspeed_missing_field_fails",
    "a 5-element request (tag, 'r1', nil, nil, [1]) and an 8-element output (a required "
    "column missing) are decode errors 'missing positional field'",
    f"required fields of {_IO}; {_SMG} decode_rejects_truncated_prefix",
)
def tokenspeed_missing_field_fails(ctx: WireContext) -> str:
    """Truncated arrays are rejected."""
    short = encoder.encode(["TokenizedGenerateReqInput", "r1", None, None, [1]])
    raw = msgspec.msgpack.decode(V.PYTHON_OUTPUT_VECTOR)
    fail_if(
        [
            _raises(
                "request",
                "missing positional field",
                decode_tagged,
                short,
                TokenizedGenerateReqInput,
            ),
            _raises("output", "missing positional field", decode_batch, [encoder.encode(raw[:8])]),
        ]
    )
    return "truncated request and output rejected"
