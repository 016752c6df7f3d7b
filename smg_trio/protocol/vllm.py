"""vLLM EngineCore wire: ``EngineCoreRequest`` out, ``EngineCoreOutputs`` in (vLLM 0.32-0.33, tolerant).

Wire source: ``vllm/v1/engine/__init__.py`` (``EngineCoreRequest``, ``EngineCoreOutput(s)``,
``FinishReason``, ``EngineCoreRequestType``), ``vllm/sampling_params.py``,
``vllm/v1/outputs.py`` (``LogprobsLists``/``LogprobsTensors``), ``vllm/v1/serial_utils.py``
(tensor triple) and ``vllm/v1/metrics/stats.py`` (``SchedulerStats``), vLLM 0.32.0; field order
as decoded by smg 1.13.0 ``crates/engine_zmq_client/src/protocol/vllm``. vLLM 0.33.0 (read from
its wheel: ``vllm/v1/engine/__init__.py``, ``vllm/outputs.py``) appends ``error`` to
``EngineCoreOutput``. Positional structs are append-only upstream: decoders default missing
trailing fields and ignore extra ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec

from smg_trio.codec.msgpack import decode, encoder
from smg_trio.codec.tensor import decode_tensor
from smg_trio.errors import DecodeError, UnsupportedField, ValidationError
from smg_trio.protocol.pooling import PoolingParams, decode_pooling_output
from smg_trio.protocol.types import (
    Capabilities,
    EngineBatch,
    EngineError,
    EngineLoad,
    EngineOutput,
    FinishReason,
    Frames,
    GenerateRequest,
    LoraRequest,
    SamplingOptions,
    StructuredOutputs,
    TokenLogprobs,
    UtilityReply,
)

__all__ = [
    "ABORT",
    "ADD",
    "START_DP_WAVE",
    "UTILITY",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "FinishReasonCode",
    "PrefillStats",
    "RequestError",
    "SchedulerStats",
    "VllmProtocol",
    "build_sampling_params",
    "decode_outputs",
    "decode_utility_output",
    "resolve_logprobs",
]

log = logging.getLogger(__name__)

# EngineCoreRequestType: one raw byte, its own frame ahead of the payload.
ADD = b"\x00"
ABORT = b"\x01"
START_DP_WAVE = b"\x02"
UTILITY = b"\x03"


class FinishReasonCode:
    """vLLM ``FinishReason`` (IntEnum)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4


_FINISH: dict[int, FinishReason] = {0: "stop", 1: "length", 2: "abort", 3: "error", 4: "stop"}


class EngineCoreRequest(msgspec.Struct, array_like=True, kw_only=True):
    """The ADD payload: 22 positional fields (newest layout; 0.32 engines accept all 22)."""

    request_id: str
    prompt_token_ids: list[int] | None = None
    mm_features: Any = None
    sampling_params: dict[str, Any] | None = None
    pooling_params: Any = None
    arrival_time: float = 0.0
    lora_request: LoraRequest | None = None
    cache_salt: str | None = None
    data_parallel_rank: int | None = None
    prompt_embeds: Any = None
    prompt_is_token_ids: Any = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: Any = None


class PrefillStats(msgspec.Struct, gc=False):
    """``prefill_stats`` map on the first output of a scheduled prefill (token counts)."""

    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0


class PrefixCacheStats(msgspec.Struct, gc=False):
    """``prefix_cache_stats`` of the scheduler stats: one step's prompt tokens looked up in
    the prefix cache (``queries``) and found there (``hits``); other keys are skipped."""

    queries: int = 0
    hits: int = 0


class SchedulerStats(msgspec.Struct, gc=False):
    """``scheduler_stats`` map, decoded leniently: only the load fields are modelled, every
    other key (there are many, and they change between versions) is skipped. Waiting counts
    ``num_waiting_reqs`` plus ``num_skipped_waiting_reqs`` (deferred), as vLLM 0.32's
    ``vllm:num_requests_waiting`` does."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    num_skipped_waiting_reqs: int = 0
    prefix_cache_stats: PrefixCacheStats | None = None


class RequestError(msgspec.Struct, gc=False):
    """vLLM 0.33 ``vllm.outputs.RequestError``: a frozen dataclass, so a MAP on the wire
    (``{code, message, retryable}``), sent with finish reason ERROR."""

    code: str
    message: str
    retryable: bool = False


class EngineCoreOutput(msgspec.Struct, array_like=True, gc=False):
    """One request's output of one step: 18 fields in vLLM 0.32, 19 in 0.33 (``error``); shorter
    and longer arrays are tolerated. ``finish_reason`` non-nil makes it terminal (it may carry
    the last tokens). ``error`` is decoded leniently (see :func:`_request_error`)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    trace_headers: Any = None
    prefill_stats: PrefillStats | None = None
    routed_experts: Any = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: Any = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: Any = None
    error: Any = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, gc=False):
    """The output envelope (8 fields; vLLM 0.32 appends ``weight_version`` as a 9th)."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    utility_output: Any = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: Any = None


def resolve_logprobs(wire: Any, frames: Sequence[Any]) -> TokenLogprobs:
    """Resolve ``LogprobsLists``/``LogprobsTensors`` ``[ids, logprobs, ranks, cu?]``.

    ``ids``/``logprobs`` are ``[positions, k+1]`` tensors: column 0 is the sampled (or actual
    prompt) token with vocab rank ``ranks[row]`` (>= 1), columns 1..k the top-k candidates in
    rank order. Raises ``DecodeError`` for a non-nil ``cu_num_generated_tokens``, a rank < 1,
    ragged row counts, or zero columns with rows.
    """
    if not isinstance(wire, (list, tuple)) or len(wire) < 3:
        raise DecodeError("logprobs must be [token_ids, logprobs, ranks, cu_num_generated_tokens?]")
    if len(wire) > 3 and wire[3] is not None:
        raise DecodeError("per-request logprobs must have nil cu_num_generated_tokens")
    ids = decode_tensor(wire[0], frames)
    lps = decode_tensor(wire[1], frames)
    ranks = decode_tensor(wire[2], frames)
    if ids.ndim != 2 or lps.ndim != 2 or ranks.ndim != 1:
        raise DecodeError(f"logprobs ranks must be 2/2/1, got {ids.ndim}/{lps.ndim}/{ranks.ndim}")
    rows = ids.shape[0]
    if lps.shape != ids.shape or ranks.shape[0] != rows:
        raise DecodeError(
            f"ragged logprobs: ids {ids.shape}, logprobs {lps.shape}, ranks {ranks.shape}"
        )
    if rows and ids.shape[1] == 0:
        raise DecodeError("logprobs have rows but zero columns")
    if rows and int(ranks.min()) < 1:
        raise DecodeError("sampled token rank must be >= 1")
    if rows and int(ids.min()) < 0:
        raise DecodeError("negative token id in logprobs")
    id_rows: list[list[int]] = ids.tolist()
    lp_rows: list[list[float]] = lps.tolist()
    return TokenLogprobs(
        token_ids=[r[0] for r in id_rows],
        logprobs=[r[0] for r in lp_rows],
        ranks=ranks.tolist(),
        top_token_ids=[r[1:] for r in id_rows],
        top_logprobs=[r[1:] for r in lp_rows],
    )


def _request_error(wire: Any) -> EngineError | None:
    """The ``error`` element as an :class:`EngineError`; ``None`` when absent. A malformed one
    is logged and dropped (the ERROR finish still fails the request), never a batch error."""
    if wire is None:
        return None
    try:
        err = msgspec.convert(wire, RequestError)
    except msgspec.ValidationError as exc:
        log.warning("ignoring a malformed engine request error %r: %s", wire, exc)
        return None
    return EngineError(err.code, err.message, err.retryable)


def _output(o: EngineCoreOutput, frames: Frames) -> EngineOutput:
    fr = o.finish_reason
    reason: FinishReason | None = None if fr is None else _FINISH.get(fr, "error")
    out = EngineOutput(o.request_id, o.new_token_ids, reason, o.stop_reason)
    if o.error is not None:
        out.error = _request_error(o.error)
    if o.kv_transfer_params is not None:
        out.kv_transfer_params = o.kv_transfer_params
    if o.new_logprobs is not None:
        out.logprobs = resolve_logprobs(o.new_logprobs, frames)
    if o.new_prompt_logprobs_tensors is not None:
        out.prompt_logprobs = resolve_logprobs(o.new_prompt_logprobs_tensors, frames)
    if o.pooling_output is not None:
        try:
            out.pooling = decode_pooling_output(o.pooling_output, frames)
        except DecodeError as exc:  # this request's fault, not the batch's: fail it alone
            out.finish_reason = "error"
            out.error = EngineError("invalid_pooling_output", f"the engine's pooling output: {exc}")
    ps = o.prefill_stats
    if ps is not None:
        out.prompt_tokens = ps.num_prompt_tokens
        out.cached_tokens = ps.num_cached_tokens
    return out


def decode_utility_output(wire: Any) -> UtilityReply:
    """vLLM ``UtilityOutput`` ``[call_id, failure_message, result]``, where ``result`` is
    ``UtilityResult`` as vLLM's encoder writes it, ``[type_info, value]`` (``type_info`` is nil
    unless the engine allows insecure serialization; the value is kept as plain msgpack
    either way). Raises ``DecodeError``."""
    if not isinstance(wire, (list, tuple)) or not wire or not isinstance(wire[0], int):
        raise DecodeError(f"utility_output must be [call_id, failure, result], got {wire!r:.80}")
    failure = wire[1] if len(wire) > 1 else None
    if failure is not None and not isinstance(failure, str):
        raise DecodeError("utility_output failure_message must be a string or nil")
    result = wire[2] if len(wire) > 2 else None
    value = None
    if result is not None:
        if not isinstance(result, (list, tuple)) or len(result) != 2:
            raise DecodeError("utility_output result must be [type_info, value]")
        value = result[1]
    return UtilityReply(wire[0], failure, value)


def decode_outputs(frames: Frames) -> EngineBatch:
    """Decode one ``EngineCoreOutputs`` message (frame 0, aux tensor frames after).

    An envelope with ``utility_output`` carries it as the batch's ``utility``. Raises
    ``DecodeError``.
    """
    env = decode(frames[0], EngineCoreOutputs)
    stats = env.scheduler_stats
    load = (
        None
        if stats is None
        else EngineLoad(
            stats.num_running_reqs,
            stats.num_waiting_reqs + stats.num_skipped_waiting_reqs,
            stats.kv_cache_usage,
        )
    )
    outputs = [_output(o, frames) for o in env.outputs]
    batch = EngineBatch(
        env.engine_index,
        outputs,
        env.finished_requests or [],
        load,
        env.wave_complete,
        env.start_wave,
        None if env.utility_output is None else decode_utility_output(env.utility_output),
    )
    pcs = None if stats is None else stats.prefix_cache_stats
    if pcs is not None:
        batch.prefix_cache_queries = pcs.queries
        batch.prefix_cache_hits = pcs.hits
    return batch


def _structured(so: StructuredOutputs) -> dict[str, Any]:
    kinds = so.kinds()
    if len(kinds) != 1:
        raise ValidationError(
            "exactly one structured output constraint is allowed"
            + (f", got {', '.join(kinds)}" if kinds else ""),
            param="response_format",
        )
    kind = kinds[0]
    if kind == "json_object" and not so.json_object:
        raise ValidationError("json_object must be true", param="response_format")
    value = getattr(so, kind)
    backend = so.backend or ("xgrammar" if kind == "structural_tag" else "guidance")
    return {kind: value, "_backend": backend}


def build_sampling_params(req: GenerateRequest) -> dict[str, Any]:
    """The ``SamplingParams`` map (named keys, defaults omitted where vLLM allows).

    EngineCore has no tokenizer: the primary EOS id goes in ``_eos_token_id`` and the extra EOS
    ids join ``stop_token_ids``, both withheld with ``ignore_eos``; ``_all_stop_token_ids`` is
    always the union (vLLM uses it to mask stops under ``min_tokens``). ``max_tokens`` must be
    set by the caller (the gateway defaults it to the remaining context).
    """
    s: SamplingOptions = req.sampling
    p: dict[str, Any] = {
        "temperature": 1.0 if s.temperature is None else s.temperature,
        "top_p": 1.0 if s.top_p is None else s.top_p,
        "top_k": 0 if s.top_k is None or s.top_k < 0 else s.top_k,
    }
    if s.seed is not None:
        p["seed"] = s.seed
    p["max_tokens"] = 16 if s.max_tokens is None else s.max_tokens
    p["min_tokens"] = s.min_tokens
    if s.logprobs is not None:
        p["logprobs"] = s.logprobs
    if s.prompt_logprobs is not None:
        p["prompt_logprobs"] = s.prompt_logprobs
    p["min_p"] = 0.0 if s.min_p is None else s.min_p
    p["frequency_penalty"] = s.frequency_penalty
    p["presence_penalty"] = s.presence_penalty
    p["repetition_penalty"] = 1.0 if s.repetition_penalty is None else s.repetition_penalty
    stops = list(dict.fromkeys(s.stop_token_ids))
    eos_all = [] if req.eos_token_id is None else [req.eos_token_id]
    eos_all += req.extra_eos_token_ids
    if not s.ignore_eos:
        for e in req.extra_eos_token_ids:
            if e not in stops:
                stops.append(e)
    p["stop_token_ids"] = stops
    if req.eos_token_id is not None and not s.ignore_eos:
        p["_eos_token_id"] = req.eos_token_id
    p["_all_stop_token_ids"] = sorted(set(stops) | set(eos_all))
    if s.logit_bias:
        p["logit_bias"] = {int(k): float(v) for k, v in s.logit_bias.items()}
    if s.structured_outputs is not None:
        p["structured_outputs"] = _structured(s.structured_outputs)
    if s.kv_transfer_params is not None:  # vLLM's request model puts it in extra_args
        p["extra_args"] = {"kv_transfer_params": s.kv_transfer_params}
    if s.allowed_token_ids is not None:
        p["allowed_token_ids"] = s.allowed_token_ids
    if s.bad_words:  # vLLM's frontend tokenizes them into _bad_words_token_ids
        p["bad_words"] = s.bad_words
        p["_bad_words_token_ids"] = s.bad_words_token_ids or []
    return p


class VllmProtocol:
    """The vLLM EngineCore dialect (``EngineProtocol``)."""

    name: ClassVar[str] = "vllm"
    capabilities: ClassVar[Capabilities] = Capabilities(
        engine="vllm",
        max_top_logprobs=20,
        prompt_logprobs=True,
        logit_bias=True,
        structured_outputs=frozenset(
            {"json", "regex", "choice", "grammar", "json_object", "structural_tag"}
        ),
        data_parallel_rank=True,
        min_p=True,
        default_max_tokens_is_remaining_context=True,
        seed_min=-(2**63),  # vLLM 0.32 takes any int64 seed
        seed_max=2**63 - 1,
        lora_adapters=True,
        pooling=True,
    )

    def __init__(self, client_index: int = 0) -> None:
        #: This frontend's index in INIT's address lists: the engine sends the outputs of
        #: every request this protocol object encodes to ``outputs[client_index]``.
        self.client_index = client_index

    def validate(self, request: GenerateRequest) -> None:
        """Reject what the EngineCore wire cannot carry. Raises ``UnsupportedField`` or
        ``ValidationError``."""
        s = request.sampling
        caps = self.capabilities
        if s.logprobs is not None and s.logprobs > caps.max_top_logprobs:
            raise UnsupportedField(
                "top_logprobs", "vLLM", f"at most {caps.max_top_logprobs} candidates"
            )
        if s.seed is not None and not caps.seed_min <= s.seed <= caps.seed_max:
            raise ValidationError(
                f"seed must be in [{caps.seed_min}, {caps.seed_max}]", param="seed"
            )
        if s.structured_outputs is not None:
            _structured(s.structured_outputs)
        for name, value in (("temperature", s.temperature), ("top_p", s.top_p), ("min_p", s.min_p)):
            if value is not None and not math.isfinite(value):
                raise ValidationError(f"{name} must be finite", param=name)

    def encode_add(self, request: GenerateRequest) -> list[bytes]:
        """``[ADD, EngineCoreRequest]``. ``data_parallel_rank`` is carried as given. A pooling
        request carries ``pooling_params`` and no ``sampling_params``."""
        pooling = request.pooling
        wire = EngineCoreRequest(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=None if pooling is not None else build_sampling_params(request),
            pooling_params=None if pooling is None else PoolingParams.of(pooling),
            arrival_time=request.arrival_time,
            data_parallel_rank=request.data_parallel_rank,
            client_index=self.client_index,
            priority=request.priority,
            lora_request=request.lora,
            cache_salt=request.cache_salt,
            trace_headers=request.trace_headers,
        )
        return [ADD, encoder.encode(wire)]

    def encode_abort(self, request_ids: Sequence[str]) -> list[bytes]:
        """``[ABORT, msgpack([ids...])]``."""
        return [ABORT, encoder.encode(list(request_ids))]

    def encode_start_wave(self, wave: int) -> list[bytes] | None:
        """``[START_DP_WAVE, msgpack([wave, nil])]`` (no excluded rank)."""
        return [START_DP_WAVE, encoder.encode([wave, None])]

    def encode_utility(self, call_id: int, method: str, args: Sequence[Any]) -> list[bytes]:
        """``[UTILITY, msgpack([client_index, call_id, method, args])]``: the engine answers on
        this client's output socket with a ``utility_output`` of ``call_id``."""
        return [UTILITY, encoder.encode((self.client_index, call_id, method, tuple(args)))]

    def decode_batch(self, frames: Frames) -> EngineBatch:
        """See :func:`decode_outputs`."""
        return decode_outputs(frames)
