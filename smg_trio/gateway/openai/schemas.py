"""msgspec Structs for the OpenAI request bodies, responses and stream chunks.

Requests ignore unknown fields (clients send vendor extensions). Type and range errors become
400s naming the field (see :func:`decode_body`). ``None`` always means "not set".
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from smg_trio.gateway.openai.errors import ApiError

__all__ = [
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionRequest",
    "ChatLogprobEntry",
    "ChatLogprobs",
    "ChatMessageOut",
    "ChunkChoice",
    "CompletionChoice",
    "CompletionChunkChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "Completion",
    "Delta",
    "FunctionCallOut",
    "FunctionDeltaOut",
    "ModelCard",
    "ModelList",
    "SamplingRequest",
    "StreamOptions",
    "ToolCallDeltaOut",
    "ToolCallOut",
    "TopLogprob",
    "Usage",
    "UsageChunk",
    "convert_body",
    "decode_body",
]

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
#: vLLM's ``priority`` (lower is served first): the wire's signed 64-bit integer.
Priority = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class StreamOptions(msgspec.Struct, kw_only=True):
    """``stream_options``: ``include_usage`` adds a usage chunk (``choices: []``) before
    ``[DONE]``; ``continuous_usage_stats`` (vLLM) adds running usage to every chunk."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingRequest(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions: sampling, stops, fan-out and constraints.

    Ranges: ``temperature`` >= 0, ``top_p`` in (0, 1], ``top_k`` >= -1 (-1 and 0 disable),
    ``min_p`` in [0, 1], penalties in [-2, 2], ``repetition_penalty`` > 0; ``logit_bias``
    values are clamped to [-100, 100] (vLLM). ``seed`` must be in the engine's range (vLLM:
    any int64; TokenSpeed: [0, 2**63 - 1]), checked in translation.
    """

    model: str | None = None
    n: PositiveInt | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Meta(ge=0.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = False
    ignore_eos: bool | None = False
    min_tokens: NonNegInt | None = None
    skip_special_tokens: bool | None = True
    spaces_between_special_tokens: bool | None = True
    logit_bias: dict[str, float] | None = None  # clamped to [-100, 100], as vLLM does
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    data_parallel_rank: NonNegInt | None = None
    prompt_logprobs: NonNegInt | None = None
    priority: Priority | None = 0
    kv_transfer_params: dict[str, Any] | None = None
    #: vLLM's: the answer carries ``prompt_token_ids`` and each choice's ``token_ids``.
    return_token_ids: bool | None = False
    #: vLLM's: keep this many prompt tokens (-1: the context less one), from ``truncation_side``.
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    #: vLLM's: only these token ids may be sampled.
    allowed_token_ids: list[int] | None = None
    #: vLLM's: words the model may not produce (tokenized by the gateway, as vLLM's frontend).
    bad_words: list[str] | None = None
    #: vLLM's: the engine's prefix cache (and ``cache_aware`` routing) key blocks by it.
    cache_salt: str | None = None
    # Known fields this gateway cannot honour: rejected when set, never silently dropped.
    best_of: int | None = None
    use_beam_search: bool | None = False
    user: str | None = None
    #: OpenAI's cache routing key: with ``--policy cache_aware`` it makes routing sticky
    #: (as the ``x-session-id`` header, and ``user`` when neither is set).
    prompt_cache_key: str | None = None


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` wins over the deprecated
    ``max_tokens`` when both are set (vLLM's rule); both must be >= 1."""

    messages: list[dict[str, Any]]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: NonNegInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    echo: bool | None = False
    #: vLLM's: a template variable (and ``enable_thinking`` unless the kwargs set it).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    #: vLLM's: ``false`` leaves the reasoning out of the answer (see ChatJob.hide_reasoning).
    include_reasoning: bool | None = True


class CompletionRequest(SamplingRequest, kw_only=True):
    """``POST /v1/completions``. ``prompt`` is a string, a list of strings (a batch), a list
    of token ids, or a list of lists of token ids. ``max_tokens`` may be 0 only with
    ``echo``. ``logprobs`` is the number of alternatives per token (legacy shape)."""

    prompt: Any = None
    max_tokens: NonNegInt | None = None
    echo: bool | None = False
    logprobs: NonNegInt | None = None
    suffix: str | None = None


# -- responses -------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    """``usage.prompt_tokens_details``."""

    cached_tokens: int = 0


class Usage(msgspec.Struct, omit_defaults=True):
    """Token counts: ``prompt_tokens`` once per prompt, ``completion_tokens`` summed over
    choices."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(msgspec.Struct):
    """One candidate: ``token`` text, natural-log ``logprob``, UTF-8 ``bytes``."""

    token: str
    logprob: float
    bytes: list[int]


class ChatLogprobEntry(msgspec.Struct):
    """One generated token with its ``top_logprobs`` (at most ``top_logprobs`` entries)."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    """``choices[i].logprobs``: one entry per generated token."""

    content: list[ChatLogprobEntry]


class FunctionCallOut(msgspec.Struct):
    """``tool_calls[i].function``: the name and the JSON ``arguments`` text."""

    name: str
    arguments: str


class ToolCallOut(msgspec.Struct, kw_only=True):
    """One tool call of a non-streamed assistant message."""

    id: str
    type: str = "function"
    function: FunctionCallOut


class ChatMessageOut(msgspec.Struct):
    """The assistant message; ``reasoning`` (vLLM 0.32's name, which replaced
    ``reasoning_content``) appears only with a reasoning parser, ``tool_calls`` only when the
    model called tools."""

    role: str
    content: str | None
    reasoning: str | UnsetType | None = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class ChatChoice(msgspec.Struct):
    """A non-streaming chat choice; ``stop_reason`` (vLLM) is the matched stop string or
    stop token id, if any."""

    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids


class ChatCompletion(msgspec.Struct, kw_only=True):
    """``object: chat.completion``. vLLM's ``prompt_logprobs`` is ``null`` unless requested,
    as vLLM 0.32 answers."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list[Any] | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's, with return_token_ids
    kv_transfer_params: dict[str, Any] | None = None


class FunctionDeltaOut(msgspec.Struct, kw_only=True):
    """``delta.tool_calls[i].function``: ``name`` in a call's first delta only."""

    name: str | UnsetType = UNSET
    arguments: str = ""


class ToolCallDeltaOut(msgspec.Struct, kw_only=True):
    """``delta.tool_calls[i]``: ``id`` and ``type`` in a call's first delta only."""

    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionDeltaOut


class Delta(msgspec.Struct):
    """A streamed chat delta; unset fields are omitted."""

    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[ToolCallDeltaOut] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct):
    """One choice of a ``chat.completion.chunk``."""

    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[int] | UnsetType = UNSET  # vLLM's, with return_token_ids


class CompletionLogprobs(msgspec.Struct):
    """Legacy completions logprobs: parallel lists, one entry per token. ``top_logprobs``
    maps token text to logprob (the sampled token plus up to ``logprobs`` alternatives);
    ``text_offset`` is each token's character offset in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    """A non-streaming completion choice (index is prompt-major: ``prompt * n + i``)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    prompt_logprobs: list[Any] | None = None  # null unless requested, as in vLLM 0.32
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids
    prompt_token_ids: list[int] | None = None


class CompletionChunkChoice(msgspec.Struct):
    """One choice of a streamed ``text_completion`` chunk."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[int] | UnsetType = UNSET  # vLLM's, with return_token_ids
    prompt_token_ids: list[int] | UnsetType = UNSET  # on a choice's first chunk


class Completion(msgspec.Struct, kw_only=True):
    """``object: text_completion``."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's, from the engine


class UsageChunk(msgspec.Struct):
    """The final usage chunk of a stream (``choices: []``)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    usage: Usage


class ModelCard(msgspec.Struct, kw_only=True):
    """One ``/v1/models`` entry; ``max_model_len`` is a vLLM extension (tokens)."""

    id: str
    object: str = "model"
    created: int
    owned_by: str
    root: str
    #: vLLM's: the base model of a LoRA adapter, ``null`` for a base model.
    parent: str | None = None
    max_model_len: int


class ModelList(msgspec.Struct, kw_only=True):
    """``GET /v1/models``."""

    object: str = "list"
    data: list[ModelCard]


# -- decoding --------------------------------------------------------------------------------

T = TypeVar("T")

_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")
#: msgspec's messages for a value of the right type outside its constraints (a bound, a
#: length, a pattern, a multiple) or outside a ``Literal``.
_OUT_OF_RANGE = re.compile(
    r"^(Expected `[^`]+` (>=|<=|>|<|of length|matching|that is a multiple)|Invalid enum value)"
)


def _field_error(exc: msgspec.ValidationError) -> ApiError:
    msg = str(exc)
    m = _PATH.search(msg)
    param = m.group(1).replace("[...]", "") if m else ""  # msgspec marks dict values
    text = msg[: m.start()] if m else msg
    missing = _MISSING.search(msg)
    if missing:
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
    elif param:
        text = f"{text} at '{param}'"
    if missing:
        code = "missing_required_parameter"
    else:
        code = "invalid_value" if _OUT_OF_RANGE.match(text) else "invalid_type"
    return ApiError(400, text, param=param or None, code=code)


def convert_body(obj: Any, type_: type[T]) -> T:
    """Validate an already decoded body (plain JSON values) into ``type_``, with
    :func:`decode_body`'s 400s naming the field."""
    try:
        return msgspec.convert(obj, type_)
    except msgspec.ValidationError as exc:
        raise _field_error(exc) from None


def decode_body(data: bytes, type_: type[T]) -> T:
    """Decode a JSON body into ``type_``. Raises :class:`ApiError` 400: ``json_parse_error``
    for malformed JSON; ``invalid_type`` (a value of the wrong type, including a non-object
    body) or ``invalid_value`` (the right type outside its bounds, length or choices), with
    ``param`` set to the field path (``messages[0].role``); and
    ``json_parse_error`` for a body that is not UTF-8 anywhere, even in a field that is ignored
    (msgspec skips unknown fields without checking them; RFC 8259 8.1)."""
    if not data.isascii():  # the common case costs one scan, no copy
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(
                400,
                f"the request body is not valid UTF-8 (byte {exc.start})",
                code="json_parse_error",
            ) from None
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        raise _field_error(exc) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"JSON syntax error: {exc}", code="json_parse_error") from None
    except RecursionError:
        raise ApiError(
            400, "the request JSON is nested too deeply", code="json_parse_error"
        ) from None
