"""TokenSpeed wire: tagged ``TokenizedGenerateReqInput`` out, columnar ``BatchTokenIDOutSlim`` in.

Wire source: TokenSpeed 0.1.1 ``python/tokenspeed/runtime/engine/io_struct.py``,
``zmq_msgpack.py``, ``zmq_wire.py`` and ``runtime/sampling/sampling_params.py``; load piggyback
columns from TokenSpeed PR #1079 (present in the 0.1.1 wheel). Every data-plane struct is a
msgspec ``Struct(tag=True, tag_field="_tag", kw_only=True, array_like=True)``: element 0 is the
class name, fields follow in declaration order, append-only. We send the prefix through
``stream`` (tag + 10 fields) as smg 1.13.0 does; the engine defaults the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import msgspec

from smg_trio.codec.msgpack import encoder
from smg_trio.errors import DecodeError, UnsupportedField, ValidationError
from smg_trio.protocol.types import (
    Capabilities,
    EngineBatch,
    EngineLoad,
    EngineOutput,
    FinishReason,
    Frames,
    GenerateRequest,
    TokenLogprobs,
)

__all__ = [
    "ABORT",
    "ADD",
    "TOP_K_DISABLED",
    "BatchTokenIDOutSlim",
    "SamplingParams",
    "TokenSpeedProtocol",
    "TokenizedGenerateReqInput",
    "TokenizedGenerateReqInputPrefix",
    "build_sampling_params",
    "decode_batch",
    "decode_tagged",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

ADD = b"\x00"
ABORT = b"\x01"

#: TokenSpeed's "top-k disabled" sentinel (``1 << 30``).
TOP_K_DISABLED = 1 << 30
_GREEDY_EPS = 1e-6
#: The engine's fused top-k kernel rejects finite top_k >= 128 (``SamplingParams.verify``).
_TOP_K_KERNEL_LIMIT = 128


class SamplingParams(msgspec.Struct, array_like=True, kw_only=True):
    """Untagged, positional, 29 fields, always sent whole and normalized."""

    max_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    thinking_budget: int | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    logprobs: int | None = None
    n: int = 1
    stop_strs: str | list[str] | None = None
    stop_str_max_len: int = 0
    is_normalized: bool = False

    def normalize(self) -> None:
        """Apply the engine's normalization so it skips re-derivation (``is_normalized``)."""
        if self.is_normalized:
            return
        if not self.stop_token_ids:
            self.stop_token_ids = None
        if self.temperature < _GREEDY_EPS:
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == 1:
            # Greedy: TokenSpeed 0.1.1 pins the seed so identical greedy requests break
            # logit ties the same way (its __post_init__, skipped once is_normalized).
            self.seed = 0
        if self.top_k == -1:
            self.top_k = TOP_K_DISABLED
        self.stop_strs = []
        self.stop_str_max_len = 0
        self.is_normalized = True


class TokenizedGenerateReqInputPrefix(
    msgspec.Struct, tag="TokenizedGenerateReqInput", tag_field="_tag", array_like=True, kw_only=True
):
    """The ADD payload as we send it: the tagged prefix through ``stream`` (11 elements)."""

    rid: str | None = None
    http_worker_ipc: str | None = None
    input_text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    stream: bool = False


class TokenizedGenerateReqInput(
    msgspec.Struct, tag="TokenizedGenerateReqInput", tag_field="_tag", array_like=True, kw_only=True
):
    """The full 23-field request (what TokenSpeed's own encoder emits); used by mocks to decode
    either form and by tests to reproduce the pinned 152-byte vector."""

    rid: str | None = None
    http_worker_ipc: str | None = None
    input_text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    stream: bool = False
    input_embeds: Any = None
    session_params: Any = None
    custom_logit_processor: str | None = None
    return_hidden_states: bool = False
    created_time: float = 0.0
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    input_multi_ids: list[list[int]] | None = None
    input_extra_infos: list[dict[str, Any]] | None = None
    input_ids_unpadded: list[int] | None = None
    multimodal_inputs: Any = None
    validation_error: str | None = None


class BatchTokenIDOutSlim(
    msgspec.Struct, tag="BatchTokenIDOutSlim", tag_field="_tag", array_like=True, kw_only=True
):
    """Columnar output batch. 9 elements (pre-DP), 10 (``engine_index``), or 14 (load
    piggyback). Columns 1..8 are required and must all have ``len(rids)`` entries."""

    rids: list[str]
    output_ids: list[list[int]]
    finished_reasons: list[str]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    output_token_logprobs_val: list[list[float]]
    output_token_logprobs_idx: list[list[int]]
    engine_index: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_active_pages: int = 0
    kv_total_pages: int = 0


_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "error",
}


def decode_tagged(payload: Any, type_: type[T]) -> T:
    """Decode a tagged struct; a wrong element 0 raises ``DecodeError("wrong msgspec tag: ...")``
    and a short array ``DecodeError("missing positional field ...")``."""
    try:
        return msgspec.msgpack.decode(payload, type=type_)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if msg.endswith("at `$[0]`"):
            got = msg.split("'")[1] if "'" in msg else "?"
            raise DecodeError(f"wrong msgspec tag: expected {type_.__name__}, got {got}") from exc
        if "at least length" in msg:
            raise DecodeError(f"missing positional field in {type_.__name__}: {msg}") from exc
        raise DecodeError(f"cannot decode {type_.__name__}: {msg}") from exc
    except msgspec.DecodeError as exc:
        raise DecodeError(f"cannot decode {type_.__name__}: {exc}") from exc


def decode_batch(frames: Frames) -> EngineBatch:
    """Decode one ``BatchTokenIDOutSlim`` (frame 0; extra frames ignored).

    ``finished_reasons`` ``""`` means running; unknown non-empty reasons map to ``"stop"`` with a
    warning. Load is reported only when ``kv_total_pages > 0``. Raises ``DecodeError`` for a
    wrong tag, missing columns or ragged columns.
    """
    b = decode_tagged(frames[0], BatchTokenIDOutSlim)
    n = len(b.rids)
    if not (
        len(b.output_ids)
        == len(b.finished_reasons)
        == len(b.prompt_tokens)
        == len(b.completion_tokens)
        == len(b.cached_tokens)
        == len(b.output_token_logprobs_val)
        == len(b.output_token_logprobs_idx)
        == n
    ):
        raise DecodeError("ragged columns in BatchTokenIDOutSlim")
    outputs: list[EngineOutput] = []
    finished: list[str] = []
    for i, rid in enumerate(b.rids):
        raw = b.finished_reasons[i]
        reason: FinishReason | None = None
        if raw:
            reason = _FINISH.get(raw)
            if reason is None:
                log.warning(
                    "unknown TokenSpeed finish reason %r for %s; treating as stop", raw, rid
                )
                reason = "stop"
            finished.append(rid)
        out = EngineOutput(rid, b.output_ids[i], reason)
        vals = b.output_token_logprobs_val[i]
        idxs = b.output_token_logprobs_idx[i]
        if vals or idxs:
            if len(vals) != len(idxs):
                raise DecodeError(f"ragged logprob columns for {rid}")
            out.logprobs = TokenLogprobs(token_ids=idxs, logprobs=list(vals))
        if b.prompt_tokens[i] > 0:
            out.prompt_tokens = b.prompt_tokens[i]
        if b.cached_tokens[i] > 0:
            out.cached_tokens = b.cached_tokens[i]
        out.completion_tokens = b.completion_tokens[i]
        outputs.append(out)
    load = None
    if b.kv_total_pages > 0:
        load = EngineLoad(b.num_running, b.num_waiting, b.kv_active_pages / b.kv_total_pages)
    return EngineBatch(b.engine_index, outputs, finished, load)


def build_sampling_params(req: GenerateRequest) -> SamplingParams:
    """The normalized 29-field ``SamplingParams``. ``max_tokens`` unset = the engine default;
    the engine stops on EOS itself, so EOS ids are not folded in."""
    s = req.sampling
    p = SamplingParams(
        max_new_tokens=s.max_tokens,
        stop_token_ids=list(dict.fromkeys(s.stop_token_ids)) or None,
        temperature=1.0 if s.temperature is None else s.temperature,
        top_p=1.0 if s.top_p is None else s.top_p,
        top_k=-1 if s.top_k is None or s.top_k <= 0 else s.top_k,
        min_p=0.0 if s.min_p is None else s.min_p,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        repetition_penalty=1.0 if s.repetition_penalty is None else s.repetition_penalty,
        min_new_tokens=s.min_tokens,
        ignore_eos=s.ignore_eos,
        skip_special_tokens=s.skip_special_tokens,
        spaces_between_special_tokens=s.spaces_between_special_tokens,
        logit_bias={str(k): float(v) for k, v in s.logit_bias.items()} if s.logit_bias else None,
        seed=s.seed,
    )
    so = s.structured_outputs
    if so is not None:
        kinds = so.kinds()
        if len(kinds) != 1:
            raise ValidationError(
                "exactly one structured output constraint is allowed", param="response_format"
            )
        kind = kinds[0]
        if kind == "json_object" and not so.json_object:
            raise ValidationError("json_object must be true", param="response_format")
        if kind == "json":
            p.json_schema = so.json if isinstance(so.json, str) else json.dumps(so.json)
        elif kind == "json_object":
            p.json_schema = '{"type": "object"}'
        elif kind == "regex":
            p.regex = so.regex
        elif kind == "grammar":
            p.ebnf = so.grammar
        elif kind == "structural_tag":
            p.structural_tag = so.structural_tag
        else:
            raise UnsupportedField("response_format", "TokenSpeed", f"{kind} constraints")
    p.normalize()
    return p


class TokenSpeedProtocol:
    """The TokenSpeed dialect (``EngineProtocol``). No waves, no prompt logprobs, at most the
    sampled token's logprob."""

    name: ClassVar[str] = "tokenspeed"
    capabilities: ClassVar[Capabilities] = Capabilities(
        engine="tokenspeed",
        max_top_logprobs=0,
        prompt_logprobs=False,
        logit_bias=True,
        structured_outputs=frozenset({"json", "json_object", "regex", "grammar", "structural_tag"}),
        data_parallel_rank=True,
        min_p=True,
        default_max_tokens_is_remaining_context=False,
        seed_min=0,
        seed_max=2**63 - 1,
    )

    def validate(self, request: GenerateRequest) -> None:
        """Reject top-k logprobs, prompt logprobs, ``choice`` constraints, finite ``top_k`` >= 128,
        out-of-range seeds and vLLM's ``allowed_token_ids``, ``bad_words``, ``cache_salt``. Raises ``UnsupportedField``/``ValidationError``."""
        if request.pooling is not None:  # its wire has no pooling params nor pooled output
            raise UnsupportedField("pooling", "TokenSpeed", "the engine generates only")
        s = request.sampling
        if s.logprobs is not None and s.logprobs > 0:
            raise UnsupportedField("top_logprobs", "TokenSpeed", "only the sampled token's logprob")
        if s.prompt_logprobs is not None:
            raise UnsupportedField("prompt_logprobs", "TokenSpeed")
        if s.top_k is not None and s.top_k >= _TOP_K_KERNEL_LIMIT:
            raise UnsupportedField(
                "top_k", "TokenSpeed", f"top_k must be below {_TOP_K_KERNEL_LIMIT}"
            )
        if s.seed is not None and not 0 <= s.seed <= self.capabilities.seed_max:
            raise ValidationError("seed must be a non-negative 63-bit integer", param="seed")
        if s.structured_outputs is not None:
            build_sampling_params(request)
        if request.priority:
            raise UnsupportedField("priority", "TokenSpeed", "its request carries no priority")
        for name, value in (
            ("allowed_token_ids", s.allowed_token_ids),
            ("bad_words", s.bad_words),
            ("cache_salt", request.cache_salt),
        ):
            if value:
                raise UnsupportedField(name, "TokenSpeed", "its request has no such field")
        if request.lora is not None:
            raise UnsupportedField(
                "model", "TokenSpeed", "its request carries no LoRA adapter; name the base model"
            )

    def encode_add(self, request: GenerateRequest) -> list[bytes]:
        """``[ADD, TokenizedGenerateReqInput prefix]``."""
        s = request.sampling
        wire = TokenizedGenerateReqInputPrefix(
            rid=request.request_id,
            input_ids=request.prompt_token_ids,
            sampling_params=build_sampling_params(request),
            return_logprob=s.logprobs is not None,
            stream=request.stream,
        )
        return [ADD, encoder.encode(wire)]

    def encode_abort(self, request_ids: Sequence[str]) -> list[bytes]:
        """``[ABORT, msgpack([rids...])]``."""
        return [ABORT, encoder.encode(list(request_ids))]

    def encode_start_wave(self, wave: int) -> list[bytes] | None:
        """TokenSpeed has no wave protocol."""
        return None

    def encode_utility(self, call_id: int, method: str, args: Sequence[Any]) -> list[bytes] | None:
        """TokenSpeed has no utility calls (its input loop takes ADD and ABORT only)."""
        return None

    def decode_batch(self, frames: Frames) -> EngineBatch:
        """See :func:`decode_batch`."""
        return decode_batch(frames)
