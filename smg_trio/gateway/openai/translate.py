"""OpenAI request fields -> engine-neutral ``GenerateRequest``s, checked against the engine's
``Capabilities``: every field the wire carries is sent, every one it cannot carry is a 400
naming the field (never a silent drop)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import msgspec

from smg_trio import jsontext
from smg_trio.backend import ServedModel
from smg_trio.errors import UnsupportedField, ValidationError
from smg_trio.gateway.config import REQUEST_TOKENS_CONTEXTS, GatewayHttpConfig
from smg_trio.gateway.openai.fanout import SEED_MODULUS, derive_seed, sub_request_id
from smg_trio.gateway.openai.schemas import SamplingRequest
from smg_trio.gateway.openai.textgen import ChoiceParams
from smg_trio.gateway.openai.tools import ToolPlan
from smg_trio.gateway.openai.vocab_filters import (
    allowed_token_ids,
    bad_words_token_ids,
    check_cache_salt,
)
from smg_trio.parsers.reasoning import ReasoningFactory, get_reasoning_format
from smg_trio.protocol.types import (
    Capabilities,
    GenerateRequest,
    SamplingOptions,
    StructuredOutputs,
)
from smg_trio.tokenizer import single_token_stop_ids

__all__ = [
    "LogprobRequest",
    "Plan",
    "build_plan",
    "build_requests",
    "check_data_parallel_rank",
    "check_prompt_fits",
    "check_stream_prompt_logprobs",
    "check_token_budget",
    "check_token_ids_fit",
    "encode_within_context",
    "reasoning_tags",
    "resolve_max_tokens",
]


@attrs.frozen(kw_only=True)
class LogprobRequest:
    """The logprob fields of one endpoint, already normalized.

    ``k``: candidates per generated position (``None``: no logprobs), asked with ``param``.
    ``prompt_k``: candidates per prompt position (``None``: none), asked with
    ``prompt_param``.
    """

    k: int | None = None
    param: str = "top_logprobs"
    prompt_k: int | None = None
    prompt_param: str = "prompt_logprobs"


@attrs.frozen(kw_only=True)
class Plan:
    """A validated request, before the prompt-dependent ``max_tokens`` and per-sub seeds."""

    sampling: SamplingOptions
    n: int
    seed: int | None
    max_tokens: int | None
    stops: tuple[str, ...]
    include_stop_str_in_output: bool
    hidden_stop_ids: frozenset[int]
    data_parallel_rank: int | None
    logprobs: LogprobRequest
    #: vLLM's request priority: lower is served first (by the engine under
    #: ``--scheduling-policy priority``; by the gateway's admission queue always).
    priority: int = 0
    #: The client's field that set ``sampling.structured_outputs`` (``None``: no constraint,
    #: or the gateway's own for ``tool_choice``), for the grammar check's 400.
    structured_param: str | None = None
    #: vLLM's ``return_token_ids``: the answer carries the prompt's and each choice's ids.
    return_token_ids: bool = False
    #: vLLM's ``cache_salt``: sent on each engine request (its prefix-cache key).
    cache_salt: str | None = None


def _bad(message: str, param: str, code: str = "invalid_value") -> ValidationError:
    return ValidationError(message, param=param, code=code)


def _reject_unsupported(body: SamplingRequest) -> None:
    if body.best_of is not None and body.best_of > 1:
        raise _bad("best_of is not supported; use n", "best_of", "unsupported_field")
    n = getattr(body, "n", None)
    if body.best_of is not None and n is not None and body.best_of < n:
        raise _bad(f"best_of ({body.best_of}) must be >= n ({n})", "best_of", "invalid_value")
    if body.use_beam_search:
        raise _bad("beam search is not supported", "use_beam_search", "unsupported_field")


#: Most stop strings per request. OpenAI allows 4 and vLLM sets no limit; each one is matched
#: against every streamed delta, so an unbounded list is a per-token CPU lever for one request.
MAX_STOP_STRINGS = 64
#: Longest stop string, in characters. Real stops are short; the matcher holds back up to this
#: many characters of text, and each stop is tokenized once per request.
MAX_STOP_CHARS = 1024


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    """The non-empty, de-duplicated stop strings; a 400 naming ``stop`` beyond the limits."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if len(items) > MAX_STOP_STRINGS:
        raise _bad(
            f"at most {MAX_STOP_STRINGS} stop strings are accepted, got {len(items)}", "stop"
        )
    for i, item in enumerate(items):
        if len(item) > MAX_STOP_CHARS:
            param = "stop" if isinstance(stop, str) else f"stop[{i}]"
            raise _bad(
                f"a stop string may be at most {MAX_STOP_CHARS} characters, got {len(item)}", param
            )
    return tuple(dict.fromkeys(s for s in items if s))


def _token_ids(values: Sequence[int], vocab: int, param: str) -> list[int]:
    for i, tok in enumerate(values):
        if not 0 <= tok < vocab:
            raise _bad(f"token id {tok} is outside the vocabulary [0, {vocab})", f"{param}[{i}]")
    return list(values)


def _logit_bias(raw: dict[str, float], vocab: int) -> dict[int, float]:
    """Token id -> bias, values clamped to [-100, 100] (vLLM's ``SamplingParams``). One 400
    names every key that is not a token id, else every id outside the vocabulary, as vLLM's
    two checks do."""
    out: dict[int, float] = {}
    not_ids: list[str] = []
    for key, value in raw.items():
        try:
            tok = int(key)
        except ValueError:
            not_ids.append(key)
            continue
        out[tok] = min(100.0, max(-100.0, float(value)))
    if not_ids:
        raise _bad(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: "
            f"{not_ids!r}",
            "logit_bias",
        )
    outside = [tok for tok in out if not 0 <= tok < vocab]
    if outside:
        raise _bad(
            f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab}",
            "logit_bias",
        )
    return out


def _from_response_format(rf: dict[str, Any]) -> StructuredOutputs | None:
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json_object=True)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or spec.get("schema") is None:
            raise _bad(
                "response_format json_schema needs json_schema.schema",
                "response_format.json_schema.schema",
            )
        if not isinstance(spec["schema"], dict):
            raise _bad(
                "response_format json_schema.schema must be a JSON Schema object",
                "response_format.json_schema.schema",
            )
        return StructuredOutputs(json=spec["schema"])
    if kind == "structural_tag":
        return StructuredOutputs(structural_tag=json.dumps(rf))
    raise _bad(
        f"response_format.type must be text, json_object, json_schema or structural_tag, "
        f"got {kind!r}",
        "response_format.type",
    )


def _constraints(body: SamplingRequest) -> list[tuple[str, str, StructuredOutputs]]:
    """``(param, kind, constraint)`` for every constraint the request sets."""
    found: list[tuple[str, str, StructuredOutputs]] = []
    if body.response_format is not None:
        so = _from_response_format(body.response_format)
        if so is not None:
            found.append(("response_format", so.kinds()[0], so))
    if body.structured_outputs is not None:
        try:
            so = msgspec.convert(body.structured_outputs, StructuredOutputs)
        except msgspec.ValidationError as exc:
            raise _bad(f"invalid structured_outputs: {exc}", "structured_outputs") from None
        kinds = so.kinds()
        if len(kinds) != 1:
            raise _bad("structured_outputs must set exactly one constraint", "structured_outputs")
        for key in ("json", "structural_tag"):  # JSON in a string: checked like the body
            text = getattr(so, key)
            if isinstance(text, str):
                jsontext.loads(text, param=f"structured_outputs.{key}")
        found.append((f"structured_outputs.{kinds[0]}", kinds[0], so))
    if body.guided_json is not None:
        schema = body.guided_json
        if isinstance(schema, str):
            schema = jsontext.loads(schema, param="guided_json")
        if not isinstance(schema, dict):
            raise _bad("guided_json must be a JSON Schema object", "guided_json", "invalid_type")
        found.append(("guided_json", "json", StructuredOutputs(json=schema)))
    if body.guided_regex is not None:
        found.append(("guided_regex", "regex", StructuredOutputs(regex=body.guided_regex)))
    if body.guided_choice is not None:
        if not body.guided_choice:
            raise _bad("guided_choice must not be empty", "guided_choice")
        found.append(("guided_choice", "choice", StructuredOutputs(choice=body.guided_choice)))
    if body.guided_grammar is not None:
        found.append(("guided_grammar", "grammar", StructuredOutputs(grammar=body.guided_grammar)))
    return found


def _structured(
    body: SamplingRequest, caps: Capabilities, tool_constraint: StructuredOutputs | None = None
) -> tuple[str | None, StructuredOutputs | None]:
    """The request's one constraint and the field that set it."""
    found = _constraints(body)
    if tool_constraint is not None:  # tool_choice required / a named function
        found.insert(0, ("tool_choice", "json", tool_constraint))
    if not found:
        return None, None
    if len(found) > 1:
        raise _bad(
            "Multiple constraints are not allowed: " + ", ".join(p for p, _, _ in found),
            found[1][0],
        )
    param, kind, so = found[0]
    if kind not in caps.structured_outputs:
        raise UnsupportedField(param, caps.engine, f"{kind} constraints")
    return param, so


def _check_logprobs(lp: LogprobRequest, caps: Capabilities, config: GatewayHttpConfig) -> None:
    for k, param, engine_max, what in (
        (lp.k, lp.param, caps.max_top_logprobs, "candidates per token"),
        (lp.prompt_k, lp.prompt_param, caps.max_top_logprobs, "candidates per prompt token"),
    ):
        if k is None:
            continue
        if k > config.max_top_logprobs:
            raise _bad(f"{param} must be at most {config.max_top_logprobs}, got {k}", param)
        if k > engine_max:
            raise UnsupportedField(param, caps.engine, f"at most {engine_max} {what}")
    if lp.prompt_k is not None and not caps.prompt_logprobs:
        raise UnsupportedField(lp.prompt_param, caps.engine, "prompt logprobs")


def check_stream_prompt_logprobs(body: SamplingRequest) -> None:
    """``prompt_logprobs`` ride on a whole response only: with ``stream`` they are a 400."""
    if body.stream and body.prompt_logprobs is not None:
        raise _bad("prompt_logprobs is not supported with stream=true", "prompt_logprobs")


def _or_default(value: float | None, defaults: dict[str, float], name: str) -> float | None:
    return defaults.get(name) if value is None else value


def build_plan(
    body: SamplingRequest,
    served: ServedModel,
    config: GatewayHttpConfig,
    *,
    max_tokens: int | None,
    logprobs: LogprobRequest,
    prompts: int = 1,
    tool_constraint: StructuredOutputs | None = None,
) -> Plan:
    """Validate the shared fields and map them to ``SamplingOptions``.

    ``max_tokens`` is the endpoint's resolved value (``None``: unset); ``prompts`` the number
    of prompts (``prompts * n`` is held to ``config.max_sequences_per_request``). Raises
    ``ValidationError`` (400, ``param`` set) or ``UnsupportedField`` (400, the engine's wire
    cannot carry the field). ``tool_constraint``: the JSON schema ``tool_choice`` asks for
    (a 400 naming ``tool_choice`` where the wire cannot carry JSON constraints).
    """
    caps = served.protocol.capabilities
    tokenizer = served.tokenizer
    vocab = tokenizer.vocab_size
    _reject_unsupported(body)
    if body.stream_options is not None and not body.stream:
        raise _bad("stream_options can only be set when stream is true", "stream_options")
    n = 1 if body.n is None else body.n
    if n > config.max_n:
        raise _bad(f"n must be at most {config.max_n}, got {n}", "n")
    sequences = prompts * n
    if sequences > config.max_sequences_per_request and prompts <= config.max_prompts:
        shape = f" ({prompts} prompts x n={n})" if prompts > 1 else ""
        raise _bad(
            f"a request may generate at most {config.max_sequences_per_request} sequences "
            f"(prompts x n), got {sequences}{shape}",
            "n",
        )
    seed = body.seed
    seed_max = min(caps.seed_max, SEED_MODULUS - 1)
    if seed is not None and not caps.seed_min <= seed <= seed_max:
        raise _bad(f"seed must be in [{caps.seed_min}, {seed_max}], got {seed}", "seed")
    ctx = served.max_model_len
    if max_tokens is not None and max_tokens > ctx:  # vLLM 0.32's renderer check, its words
        mct = getattr(body, "max_completion_tokens", None)
        param = "max_completion_tokens" if mct is not None else "max_tokens"
        raise _bad(
            f"{param}={max_tokens} cannot be greater than max_model_len={ctx}. "
            "Please request fewer output tokens.",
            param,
        )
    min_tokens = body.min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise _bad(
            f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens"
        )
    if body.min_p is not None and body.min_p > 0 and not caps.min_p:
        raise UnsupportedField("min_p", caps.engine)
    if body.data_parallel_rank is not None and not caps.data_parallel_rank:
        raise UnsupportedField("data_parallel_rank", caps.engine)
    for name in ("kv_transfer_params", "allowed_token_ids", "bad_words", "cache_salt"):
        if getattr(body, name) and caps.engine != "vllm":  # vLLM EngineCore's fields
            raise UnsupportedField(name, caps.engine)
    allowed = allowed_token_ids(body.allowed_token_ids, vocab)
    bad = bad_words_token_ids(body.bad_words, tokenizer)
    cache_salt = check_cache_salt(body.cache_salt)
    logit_bias = None
    if body.logit_bias:
        if not caps.logit_bias:
            raise UnsupportedField("logit_bias", caps.engine)
        logit_bias = _logit_bias(body.logit_bias, vocab)
    _check_logprobs(logprobs, caps, config)
    structured_param, structured = _structured(body, caps, tool_constraint)
    backend = config.structured_outputs_backend
    if structured is not None and backend != "auto":  # the engine's configured backend
        structured = msgspec.structs.replace(structured, backend=backend)

    stops = _stops(body.stop)
    user_ids = _token_ids(body.stop_token_ids or [], vocab, "stop_token_ids")
    stop_ids = list(dict.fromkeys([*user_ids, *single_token_stop_ids(tokenizer, stops)]))
    ignore_eos = bool(body.ignore_eos)
    hidden = set(stop_ids)
    if not ignore_eos:
        if served.eos_token_id is not None:
            hidden.add(served.eos_token_id)
        hidden.update(served.extra_eos_token_ids)

    # vLLM's order: the request's value, else the model's generation_config.json, else the
    # engine's neutral default (None)
    defaults = served.sampling_defaults
    if not caps.min_p:
        defaults = {k: v for k, v in defaults.items() if k != "min_p"}
    top_k = body.top_k if body.top_k is not None else defaults.get("top_k")
    sampling = SamplingOptions(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=_or_default(body.temperature, defaults, "temperature"),
        top_p=_or_default(body.top_p, defaults, "top_p"),
        top_k=None if top_k is None else int(top_k),
        min_p=_or_default(body.min_p, defaults, "min_p"),
        frequency_penalty=_or_default(body.frequency_penalty, defaults, "frequency_penalty") or 0.0,
        presence_penalty=_or_default(body.presence_penalty, defaults, "presence_penalty") or 0.0,
        repetition_penalty=_or_default(body.repetition_penalty, defaults, "repetition_penalty"),
        seed=seed,
        stop_token_ids=stop_ids,
        ignore_eos=ignore_eos,
        logprobs=logprobs.k,
        prompt_logprobs=logprobs.prompt_k,
        logit_bias=logit_bias,
        structured_outputs=structured,
        skip_special_tokens=body.skip_special_tokens is not False,
        spaces_between_special_tokens=body.spaces_between_special_tokens is not False,
        kv_transfer_params=body.kv_transfer_params or None,  # vLLM sends a non-empty one
        allowed_token_ids=allowed,
        bad_words=None if bad is None else bad[0],
        bad_words_token_ids=None if bad is None else bad[1],
    )
    return Plan(
        sampling=sampling,
        n=n,
        seed=seed,
        max_tokens=max_tokens,
        stops=stops,
        include_stop_str_in_output=bool(body.include_stop_str_in_output),
        hidden_stop_ids=frozenset(hidden),
        data_parallel_rank=body.data_parallel_rank,
        logprobs=logprobs,
        priority=body.priority or 0,
        structured_param=None if structured_param == "tool_choice" else structured_param,
        return_token_ids=bool(body.return_token_ids),
        cache_salt=cache_salt,
    )


def resolve_max_tokens(
    plan: Plan, served: ServedModel, prompt_len: int, prompt_param: str
) -> tuple[int | None, int]:
    """``(engine max_tokens, gateway limit)`` for a prompt of ``prompt_len`` tokens.

    vLLM's default is the context left (``max_model_len - prompt_len``); an engine without
    that rule gets ``None`` (its own default). A ``max_tokens`` above the context left is
    clamped to it (vLLM 0.32's ``get_max_tokens``). Raises ``ValidationError`` 400
    ``context_length_exceeded`` when the prompt leaves no room (vLLM: its ``max_tokens`` of
    0 is refused by ``SamplingParams``).
    """
    ctx = served.max_model_len
    room = ctx - prompt_len
    if room <= 0:
        raise ValidationError(
            f"This model's maximum context length is {ctx} tokens, but the prompt has "
            f"{prompt_len} tokens, which leaves no room for a completion.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    mt = plan.max_tokens
    if mt is None:
        default = served.protocol.capabilities.default_max_tokens_is_remaining_context
        return (room if default else None), room
    mt = min(mt, room)
    return mt, mt


def check_prompt_fits(served: ServedModel, prompt: str, prompt_param: str) -> None:
    """Refuse, before encoding it whole, a prompt that cannot fit the context: it has at
    least ``ceil(chars / L)`` tokens, ``L`` the tokenizer's longest token, and a long one at
    least what a bounded prefix of it encodes to (:meth:`Tokenizer.min_tokens`, which caps the
    memory an encode of a prompt that cannot fit may take). Same 400
    ``context_length_exceeded`` as :func:`resolve_max_tokens`; nothing is refused that could
    fit."""
    lower = served.tokenizer.min_tokens(prompt, served.max_model_len)
    _check_fits(served, lower, prompt_param, "at least ")


def _check_fits(served: ServedModel, lower: int, prompt_param: str, qual: str) -> None:
    ctx = served.max_model_len
    if lower >= ctx:
        raise ValidationError(
            f"This model's maximum context length is {ctx} tokens, but the prompt has "
            f"{qual}{lower} tokens, which leaves no room for a completion.",
            param=prompt_param,
            code="context_length_exceeded",
        )


def encode_within_context(
    served: ServedModel, text: str, param: str, *, add_special_tokens: bool = False
) -> list[int]:
    """The ids of ``text``, for the engine-free routes that count a prompt (tokenize,
    ``count_tokens``): a text that cannot have at most the context's ``max_model_len``
    tokens is a 400 ``context_length_exceeded`` naming ``param``, refused from its lower
    bound before it is encoded whole (as :func:`check_prompt_fits`), or from its count after.
    So the work and the answer are bounded by the context, not by the body (vLLM's
    ``/tokenize`` has no bound)."""
    ctx = served.max_model_len
    tok = served.tokenizer
    lower = tok.min_tokens(text, ctx + 1)
    if lower > ctx:
        raise _too_long(ctx, f"at least {lower}", param)
    ids = tok.encode(text, add_special_tokens=add_special_tokens)
    if len(ids) > ctx:
        raise _too_long(ctx, str(len(ids)), param)
    return ids


def _too_long(ctx: int, count: str, param: str) -> ValidationError:
    return ValidationError(
        f"This model's maximum context length is {ctx} tokens, but the text has {count} "
        "tokens; this gateway counts at most that many.",
        param=param,
        code="context_length_exceeded",
    )


def check_token_ids_fit(served: ServedModel, count: int, prompt_param: str) -> None:
    """:func:`check_prompt_fits` for a token-id prompt of ``count`` ids (before checking
    each id)."""
    _check_fits(served, count, prompt_param, "")


def check_token_budget(
    config: GatewayHttpConfig, served: ServedModel, total: int, sequences: int, param: str
) -> None:
    """400 naming ``param`` when a request's sequences may generate more than
    ``config.max_tokens_per_request`` tokens together (``total``: the sum of each sequence's
    limit, its ``max_tokens`` or the context left)."""
    cap = config.max_tokens_per_request
    if cap is None:
        cap = REQUEST_TOKENS_CONTEXTS * served.max_model_len
    if total > cap:
        raise _bad(
            f"this request may generate up to {total} tokens across its {sequences} "
            f"sequence(s), more than the limit of {cap} tokens per request; set a smaller "
            f"{param} or n (without {param}, each sequence may use the rest of the context)",
            param,
        )


def build_requests(
    plan: Plan,
    served: ServedModel,
    prompt_ids: list[int],
    *,
    base_id: str,
    first_index: int,
    total: int,
    max_tokens: int | None,
) -> list[GenerateRequest]:
    """The ``n`` sub-requests of one prompt, choice indices ``first_index ..``; sub ``i``
    gets seed ``(seed + i) mod 2**63``. Each is checked with the engine's ``validate``
    (raises ``UnsupportedField``/``ValidationError``)."""
    now = time.time()
    out: list[GenerateRequest] = []
    for i in range(plan.n):
        sampling = msgspec.structs.replace(
            plan.sampling, seed=derive_seed(plan.seed, i), max_tokens=max_tokens
        )
        req = GenerateRequest(
            request_id=sub_request_id(base_id, first_index + i, total),
            prompt_token_ids=prompt_ids,
            sampling=sampling,
            eos_token_id=served.eos_token_id,
            extra_eos_token_ids=list(served.extra_eos_token_ids),
            data_parallel_rank=plan.data_parallel_rank,
            arrival_time=now,
            priority=plan.priority,
            lora=None if served.lora is None else served.lora.request,
            cache_salt=plan.cache_salt,
        )
        served.protocol.validate(req)
        out.append(req)
    return out


def choice_params(
    plan: Plan,
    limit: int,
    reasoning: ReasoningFactory | None = None,
    tools: ToolPlan | None = None,
) -> ChoiceParams:
    """The text-pipeline parameters of one choice (see :class:`ChoiceParams`); with a tool
    parser whose markers are special tokens, the detokenizer keeps special tokens (EOS is
    still hidden)."""
    s = plan.sampling
    tools = tools or ToolPlan()
    return ChoiceParams(
        limit=limit,
        stops=plan.stops,
        include_stop_str_in_output=plan.include_stop_str_in_output,
        hidden_stop_ids=plan.hidden_stop_ids,
        min_tokens=s.min_tokens,
        skip_special_tokens=s.skip_special_tokens and not tools.keep_special_tokens,
        spaces_between_special_tokens=s.spaces_between_special_tokens,
        reasoning=reasoning,
        logprobs=s.logprobs is not None,
        tool_parser=tools.parser,
        max_tool_calls=tools.max_calls,
        token_ids=plan.return_token_ids,
    )


def check_data_parallel_rank(rank: int | None, ranks: Sequence[int]) -> None:
    """400 ``invalid_data_parallel_rank`` unless ``rank`` is ``None`` or one of ``ranks``
    (the worker's engine indices)."""
    if rank is not None and rank not in ranks:
        raise ValidationError(
            f"data_parallel_rank {rank} is out of range for {len(ranks)} engine(s)",
            param="data_parallel_rank",
            code="invalid_data_parallel_rank",
        )


def reasoning_tags(
    name: str | None, prompt: str, chat_template_kwargs: Mapping[str, Any] | None = None
) -> ReasoningFactory | None:
    """The per-choice reasoning parser factory for parser ``name`` (``None``: no parser), its
    start state chosen from the rendered ``prompt`` and the request's ``chat_template_kwargs``
    (see docs/reasoning.md); ``None`` also when the format's thinking switch is off. Raises
    ``ValueError`` for an unknown parser."""
    if name is None:
        return None
    return get_reasoning_format(name).start(prompt, chat_template_kwargs)
