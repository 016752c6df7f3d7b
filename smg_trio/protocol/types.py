"""The engine-neutral seam: requests in, batches out, and the ``EngineProtocol`` both engines implement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal, Protocol

import msgspec

__all__ = [
    "Capabilities",
    "EngineBatch",
    "EngineError",
    "EngineLoad",
    "EngineOutput",
    "EngineProtocol",
    "FinishReason",
    "Frames",
    "GenerateRequest",
    "LoraRequest",
    "PoolingOptions",
    "PoolingTask",
    "SamplingOptions",
    "StructuredOutputs",
    "TokenLogprobs",
    "UtilityReply",
]

#: Frames of one ZMQ multipart message (``bytes`` or zero-copy ``memoryview``/``zmq.Frame`` buffers).
Frames = Sequence[Any]

#: vLLM's pooling tasks (``vllm/tasks.py``), the ones this gateway sends.
PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]

#: Engine-neutral finish reasons. vLLM ``REPETITION`` maps to ``"stop"``.
FinishReason = Literal["stop", "length", "abort", "error"]


class EngineLoad(msgspec.Struct, frozen=True, gc=False):
    """One rank's load snapshot. ``kv_cache_usage`` is a ratio in [0, 1]."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0


class TokenLogprobs(msgspec.Struct, gc=False):
    """Logprobs for the positions of one engine tick (or a cumulative run of ticks).

    Shapes: ``token_ids``/``logprobs``/``ranks`` are ``[positions]`` for the sampled (or actual
    prompt) token; ``top_token_ids``/``top_logprobs`` are ``[positions][k]`` ranked candidates
    (rank 1 first), empty inner lists when no top-k was requested. A ``None`` logprob marks the
    first prompt token, which has none.
    """

    token_ids: list[int]
    logprobs: list[float | None]
    ranks: list[int] | None = None
    top_token_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)


class EngineError(msgspec.Struct, frozen=True, gc=False):
    """A request-level error the engine sent with an ``error`` finish (vLLM 0.33
    ``RequestError``): ``code`` such as ``validation_error`` or ``engine_paused``, a message
    for the client, and whether the request may succeed if sent again."""

    code: str
    message: str
    retryable: bool = False


class EngineOutput(msgspec.Struct, gc=False):
    """One request's slice of one engine step.

    ``new_token_ids`` are the tokens generated this step (a delta). A non-``None``
    ``finish_reason`` makes the output terminal; it may carry the last tokens too.
    ``prompt_tokens``/``cached_tokens`` are set when the engine reports them;
    ``completion_tokens`` is the engine's cumulative count when it reports one (TokenSpeed).
    ``error`` details an ``error`` finish when the engine sent them (vLLM 0.33+).
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    logprobs: TokenLogprobs | None = None
    prompt_logprobs: TokenLogprobs | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    error: EngineError | None = None
    #: vLLM's KV connector parameters for the client (prefill/decode disaggregation).
    kv_transfer_params: Any = None
    #: A pooling request's result (vLLM ``pooling_output``): a numpy array, read in place from
    #: its aux frame where it can be.
    pooling: Any = None


class UtilityReply(msgspec.Struct, frozen=True, gc=False):
    """An engine's answer to one utility call (vLLM ``UtilityOutput``): ``failure_message``
    set when the call failed, else ``result`` (the method's return value, plain msgpack)."""

    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineBatch(msgspec.Struct, gc=False):
    """One decoded output message of one engine.

    ``finished_request_ids`` lists ids finished in this batch, including out-of-band ones
    (vLLM ``finished_requests``). ``load`` is present only when the engine reported one.
    ``wave_complete``/``start_wave`` are vLLM DP wave events (lockstep MoE groups only).
    ``utility`` is the answer to a utility call, when the message carries one.
    """

    engine_index: int
    outputs: list[EngineOutput]
    finished_request_ids: list[str] = []
    load: EngineLoad | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    utility: UtilityReply | None = None
    #: The engine's prefix cache counters of this step, when it reported them (vLLM's
    #: ``PrefixCacheStats``: prompt tokens looked up, and of those found cached).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


class StructuredOutputs(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Exactly one constraint (vLLM ``StructuredOutputsParams`` keys)."""

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    #: The engine's structured-output backend to ask for (vLLM's ``_backend``); ``None``:
    #: the protocol's default.
    backend: str | None = None

    def kinds(self) -> list[str]:
        """The names of the constraints that are set."""
        return [
            k
            for k in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
            if getattr(self, k) is not None
        ]


class SamplingOptions(msgspec.Struct, kw_only=True):
    """Engine-neutral sampling parameters, already validated by the gateway.

    ``None`` means "the engine's default". ``logprobs`` is the number of top candidates per
    position (0 = the sampled token's logprob only; ``None`` = no logprobs).
    ``prompt_logprobs`` likewise for prompt positions. ``seed`` is in [0, 2**63).
    """

    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    seed: int | None = None
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputs | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    #: vLLM's ``kv_transfer_params`` (to its KV connector, in ``extra_args``).
    kv_transfer_params: dict[str, Any] | None = None
    #: vLLM's ``allowed_token_ids``: only these ids may be sampled (in the vocabulary).
    allowed_token_ids: list[int] | None = None
    #: vLLM's ``bad_words`` and the id sequences the gateway tokenized them to (vLLM's
    #: ``update_from_tokenizer``: EngineCore has no tokenizer).
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = None


class LoraRequest(msgspec.Struct, array_like=True, frozen=True):
    """vLLM's ``LoRARequest`` as the EngineCore wire carries it (``vllm/lora/request.py``, 0.32:
    six positional fields, all written). ``lora_int_id`` (>= 1) must be the same for one adapter
    on every engine and from every frontend: the engine caches adapters by it."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class PoolingOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A pooling request's parameters (vLLM ``PoolingParams``' API fields): the task, the
    Matryoshka ``dimensions`` and whether the pooler's activation runs (``None``: its
    default)."""

    task: PoolingTask
    dimensions: int | None = None
    use_activation: bool | None = None
    #: A cross-encoder pair's first token of its second text (vLLM's
    #: ``compressed_token_type_ids``), for models whose tokenizer gives token types.
    token_type_start: int | None = None


class GenerateRequest(msgspec.Struct, kw_only=True):
    """One single-sample generate request (n>1 is fanned out before this point).

    ``eos_token_id`` is the model's primary EOS id and ``extra_eos_token_ids`` the others;
    the vLLM module folds them into the wire (EngineCore has no tokenizer), TokenSpeed ignores
    them (the engine stops on EOS itself).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions
    eos_token_id: int | None = None
    extra_eos_token_ids: list[int] = []
    data_parallel_rank: int | None = None
    stream: bool = True
    arrival_time: float = 0.0
    #: vLLM's request priority: lower is scheduled first under ``--scheduling-policy priority``.
    priority: int = 0
    #: The LoRA adapter the request names (``model`` = an adapter), else the base model.
    lora: LoraRequest | None = None
    #: W3C ``traceparent``/``tracestate`` of the gateway's request span (tracing on only).
    trace_headers: dict[str, str] | None = None
    #: The DP rank the routing policy chose (``cache_aware``: the rank holding the prompt's
    #: prefix): the connector takes it unless ``data_parallel_rank`` pins one or that rank is
    #: down. Gateway-side only, never sent to the engine.
    rank_hint: int | None = None
    #: Set for a pooling request (embeddings, classification, scores): the engine pools the
    #: prompt instead of sampling (``sampling`` is then not sent).
    pooling: PoolingOptions | None = None
    #: vLLM's ``cache_salt``: the engine's prefix-cache blocks are keyed by it (so requests
    #: share cached prefixes only with the same salt); ``cache_aware`` routing keys by it too.
    cache_salt: str | None = None


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What one engine's wire can carry; the gateway rejects the rest with a 400 naming the field.

    This is the single per-engine capability table (rendered into ``docs/capabilities.md``).
    """

    engine: str
    max_top_logprobs: int
    prompt_logprobs: bool
    logit_bias: bool
    structured_outputs: frozenset[str]
    data_parallel_rank: bool
    min_p: bool
    default_max_tokens_is_remaining_context: bool
    seed_min: int
    seed_max: int
    #: The request can name a LoRA adapter (vLLM's ``lora_request``).
    lora_adapters: bool = False
    #: Whether the wire carries pooling requests (embeddings, classify, score, rerank).
    pooling: bool = False


class EngineProtocol(Protocol):
    """One engine dialect. The transport and connector use only this; no runtime dispatch
    happens per token (a client is bound to one protocol object at construction).
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def validate(self, request: GenerateRequest) -> None:
        """Raise :class:`~smg_trio.errors.UnsupportedField` for anything the wire cannot carry."""

    def encode_add(self, request: GenerateRequest) -> list[bytes]:
        """``[type_byte, payload, *aux]`` for an ADD. Raises ``EncodeError``."""

    def encode_abort(self, request_ids: Sequence[str]) -> list[bytes]:
        """``[type_byte, payload]`` for an ABORT of ``request_ids``."""

    def encode_start_wave(self, wave: int) -> list[bytes] | None:
        """``[type_byte, payload]`` for START_DP_WAVE, or ``None`` when the engine has no waves."""

    def encode_utility(self, call_id: int, method: str, args: Sequence[Any]) -> list[bytes] | None:
        """``[type_byte, payload]`` for a utility call, or ``None`` when the engine has none."""

    def decode_batch(self, frames: Frames) -> EngineBatch:
        """Decode one output message (``frames[0]`` payload, aux frames after). Raises
        ``DecodeError``. The caller checks for the death sentinel first."""
