"""Completions: prompts (text, a batch, token ids) are tokenized into ``n`` sub-requests
each; their deltas become ``text_completion`` chunks or one ``text_completion``.

A list of prompts is a batch: choice ``index = prompt_index * n + i``, sub-request ids
``{rid}-{index}``, ``usage.prompt_tokens`` summed over the prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from msgspec import UNSET

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.fanout import SubRequest, usage_of
from smg_trio.gateway.openai.framing import ChunkFramer, StreamUsage
from smg_trio.gateway.openai.grammar_check import check_grammar
from smg_trio.gateway.openai.logprobs import (
    completion_logprobs,
    echo_logprobs,
    merge_runs,
    prompt_logprobs,
)
from smg_trio.gateway.openai.prompts import count_prompts, parse_prompts
from smg_trio.gateway.openai.schemas import (
    Completion,
    CompletionChoice,
    CompletionChunkChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from smg_trio.gateway.openai.textgen import ChoiceCollector, ChoiceParams, ChoicePipeline, TextDelta
from smg_trio.gateway.openai.translate import (
    LogprobRequest,
    Plan,
    build_plan,
    build_requests,
    check_prompt_fits,
    check_stream_prompt_logprobs,
    check_token_budget,
    check_token_ids_fit,
    choice_params,
    resolve_max_tokens,
)
from smg_trio.gateway.openai.truncation import truncate_all, truncation_limit
from smg_trio.tokenizer import Tokenizer

__all__ = [
    "COMPLETIONS",
    "CompletionDraft",
    "CompletionJob",
    "CompletionStreamRenderer",
    "CompletionsApi",
]


class _Echo:
    """Per-prompt echo text and (lazily, once the engine sent them) echo logprobs."""

    def __init__(self, tok: Tokenizer, prompts: list[list[int]], k: int | None) -> None:
        self.tok = tok
        self.prompts = prompts
        self.texts = [tok.decode(ids, skip_special_tokens=False) for ids in prompts]
        self.k = k

    def logprobs(self, prompt: int, pipeline: ChoicePipeline) -> tuple[CompletionLogprobs, int]:
        assert self.k is not None
        return echo_logprobs(self.tok, pipeline.prompt_logprobs, self.prompts[prompt], self.k)


def _concat(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        a.tokens + b.tokens,
        a.token_logprobs + b.token_logprobs,
        a.top_logprobs + b.top_logprobs,
        a.text_offset + b.text_offset,
    )


def _check_fields(body: CompletionRequest) -> bool:
    """Refuse what completions cannot serve; whether the request only echoes its prompts
    (``echo`` with ``max_tokens: 0``)."""
    if body.suffix:
        raise ValidationError("suffix is not supported", param="suffix", code="unsupported_field")
    check_stream_prompt_logprobs(body)
    echo_only = bool(body.echo) and body.max_tokens == 0
    if body.max_tokens == 0 and not echo_only:
        raise ValidationError(
            "max_tokens must be at least 1 (0 is allowed only with echo)",
            param="max_tokens",
            code="invalid_value",
        )
    return echo_only


def _logprob_request(body: CompletionRequest) -> LogprobRequest:
    """``logprobs`` per generated token; per prompt token for ``prompt_logprobs``, or for
    ``echo`` with ``logprobs`` (the echoed prompt carries its logprobs)."""
    k = body.logprobs
    if body.prompt_logprobs is not None:
        return LogprobRequest(k=k, param="logprobs", prompt_k=body.prompt_logprobs)
    if body.echo and k is not None:
        return LogprobRequest(k=k, param="logprobs", prompt_k=k, prompt_param="echo")
    return LogprobRequest(k=k, param="logprobs")


class CompletionsApi:
    """``POST /v1/completions``."""

    name = "completions"
    id_prefix = "cmpl-"
    body_type = CompletionRequest

    def check(
        self, body: CompletionRequest, served: ServedModel, config: GatewayHttpConfig
    ) -> CompletionDraft:
        """Check every field that needs no tokenizing."""
        echo_only = _check_fields(body)
        lpr = _logprob_request(body)
        plan = build_plan(
            body,
            served,
            config,
            max_tokens=1 if echo_only else body.max_tokens,
            logprobs=lpr,
            prompts=count_prompts(body.prompt),
        )
        return CompletionDraft(
            body=body,
            served=served,
            config=config,
            plan=plan,
            echo_only=echo_only,
            prompt_k=lpr.prompt_k,
        )


@attrs.frozen(kw_only=True)
class CompletionDraft:
    """A checked completions request (see :class:`~smg_trio.gateway.openai.api.Draft`)."""

    body: CompletionRequest
    served: ServedModel
    config: GatewayHttpConfig
    plan: Plan
    echo_only: bool
    prompt_k: int | None

    def tokenize(self) -> list[list[int]]:
        """Each prompt's token ids (see :func:`~smg_trio.gateway.openai.prompts.parse_prompts`)."""
        plan, served = self.plan, self.served
        check_grammar(plan.sampling.structured_outputs, plan.structured_param)
        limit = truncation_limit(self.body, served.max_model_len)

        def fits(prompt: str | Sequence[Any], param: str) -> None:
            if limit is not None:  # truncated after encoding: it fits by then
                return
            if isinstance(prompt, str):
                check_prompt_fits(served, prompt, param)
            else:
                check_token_ids_fit(served, len(prompt), param)

        prompts = parse_prompts(self.body.prompt, served.tokenizer, self.config.max_prompts, fits)
        return truncate_all(prompts, limit, self.body.truncation_side)

    def build(self, prompts: list[list[int]], ids: ResponseIds) -> CompletionJob:
        """``n`` sub-requests per prompt, within the request's token budget. An echo-only
        request that needs no prompt logprobs is answered: its choices are finished."""
        body, served, plan, echo_only = self.body, self.served, self.plan, self.echo_only
        tok = served.tokenizer
        n = plan.n
        total = len(prompts) * n
        params_cache: dict[int, ChoiceParams] = {}
        subs: list[SubRequest] = []
        budget = 0
        for p, prompt_ids in enumerate(prompts):
            engine_max, limit = resolve_max_tokens(plan, served, len(prompt_ids), "prompt")
            budget += limit * n
            if echo_only:
                limit = 0
            params = params_cache.get(limit)
            if params is None:
                params = params_cache[limit] = choice_params(plan, limit)
            reqs = build_requests(
                plan,
                served,
                prompt_ids,
                base_id=ids.engine_id,
                first_index=p * n,
                total=total,
                max_tokens=engine_max,
            )
            subs += [
                SubRequest(
                    r, ChoicePipeline(p * n + i, tok, params, prompt_ids, whole=not body.stream)
                )
                for i, r in enumerate(reqs)
            ]
        check_token_budget(self.config, served, budget, total, "max_tokens")
        answered = echo_only and self.prompt_k is None
        if answered:  # nothing to generate and nothing to ask the engine
            for sub in subs:
                sub.pipeline.finish_reason = "length"
        opts = body.stream_options
        return CompletionJob(
            subs=subs,
            prompt_tokens=sum(len(p) for p in prompts),
            stream=bool(body.stream),
            data_parallel_rank=plan.data_parallel_rank,
            answered=answered,
            ids=ids,
            served=served,
            n=n,
            logprobs=body.logprobs,
            echo=_Echo(tok, prompts, body.logprobs) if body.echo else None,
            prompts=prompts,
            prompt_k=body.prompt_logprobs,
            include_usage=bool(opts and opts.include_usage),
            continuous_usage=bool(opts and opts.continuous_usage_stats),
            prompt_tokens_details=self.config.enable_prompt_tokens_details,
        )


#: The completions API.
COMPLETIONS = CompletionsApi()


@attrs.frozen(kw_only=True)
class CompletionJob:
    """A planned completions request (see :class:`~smg_trio.gateway.openai.api.Job`)."""

    subs: list[SubRequest]
    prompt_tokens: int
    stream: bool
    data_parallel_rank: int | None
    answered: bool
    ids: ResponseIds
    served: ServedModel
    n: int
    logprobs: int | None
    echo: _Echo | None
    prompts: list[list[int]]
    prompt_k: int | None
    include_usage: bool
    continuous_usage: bool
    #: Report ``usage.prompt_tokens_details`` (``--enable-prompt-tokens-details``).
    prompt_tokens_details: bool = False

    @property
    def choices_per_prompt(self) -> int:
        """The sub-requests of each prompt (``n``): its cached tokens count once."""
        return self.n

    def framer(self) -> ChunkFramer:
        """The chunk framer of this request's stream."""
        ids = self.ids
        return ChunkFramer(ids.response_id, "text_completion", ids.created, self.served.model_id)

    def renderer(self) -> CompletionStreamRenderer | _AnsweredRenderer:
        """The ``text_completion`` chunk renderer (of the whole stream when ``answered``)."""
        if self.answered:
            return _AnsweredRenderer(self)
        return CompletionStreamRenderer(self)

    def result(self, collected: ChoiceCollector | None) -> Completion:
        """The ``text_completion``: each choice's (echoed and) generated text and logprobs."""
        return Completion(
            id=self.ids.response_id,
            created=self.ids.created,
            model=self.served.model_id,
            choices=self.choices(collected),
            usage=usage_of(
                self.prompt_tokens,
                self.subs,
                details=self.prompt_tokens_details,
                per_prompt=self.n,
            ),
            # vLLM answers the first prompt's (completion/serving.py)
            kv_transfer_params=self.subs[0].pipeline.kv_transfer_params if self.subs else None,
        )

    def choices(self, collected: ChoiceCollector | None) -> list[CompletionChoice]:
        """Every choice of the result (``collected``: ``None``, nothing was generated)."""
        tok = self.served.tokenizer
        n, k, echo, prompt_k = self.n, self.logprobs, self.echo, self.prompt_k
        out = []
        for sub in self.subs:
            p = sub.pipeline
            i = p.index
            text = "".join(collected.text[i]) if collected is not None else ""
            lps: CompletionLogprobs | None = None
            offset = 0
            if echo is not None:
                text = echo.texts[i // n] + text
                if k is not None:
                    lps, offset = echo.logprobs(i // n, p)
            if k is not None:
                runs = collected.logprobs[i] if collected is not None else []
                gen, _ = completion_logprobs(tok, merge_runs(runs), k, offset)
                lps = gen if lps is None else _concat(lps, gen)
            choice = CompletionChoice(i, text, lps, p.finish_reason, p.stop_reason)
            if p.token_ids is not None:  # vLLM's return_token_ids
                choice.token_ids = p.token_ids
                choice.prompt_token_ids = self.prompts[i // n]
            if prompt_k is not None:
                choice.prompt_logprobs = prompt_logprobs(
                    tok, p.prompt_logprobs, self.prompts[i // n], prompt_k
                )
            out.append(choice)
        return out


class CompletionStreamRenderer:
    """``text_completion`` chunks: text deltas (the echoed prompt on each choice's first
    chunk), legacy logprobs for exactly the tokens of the chunk, the finish on each choice's
    last chunk, then the usage chunk if asked."""

    def __init__(self, job: CompletionJob) -> None:
        subs = job.subs
        self._framer = job.framer()
        self._tok = job.served.tokenizer
        self._n = job.n
        self._k = job.logprobs
        self._echo = job.echo
        self._echoed = [False] * len(subs)
        self._offset = [0] * len(subs)
        self._usage = StreamUsage(self._framer, job)
        self._prompts = job.prompts
        self._sent = [0] * len(subs)  # token ids already sent, per choice
        self._prompted = [False] * len(subs)

    def start(self) -> bytes:
        return b""

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        p = sub.pipeline
        i = p.index
        text = delta.text
        lp: CompletionLogprobs | None = None
        echo = self._echo
        if echo is not None and not self._echoed[i]:
            self._echoed[i] = True
            text = echo.texts[i // self._n] + text
            if self._k is not None:
                lp, self._offset[i] = echo.logprobs(i // self._n, p)
        if self._k is not None and delta.logprobs is not None and len(delta.logprobs):
            gen, self._offset[i] = completion_logprobs(
                self._tok, delta.logprobs, self._k, self._offset[i]
            )
            lp = gen if lp is None else _concat(lp, gen)
        finish = delta.finish_reason
        choice = CompletionChunkChoice(
            i, text, lp, finish, UNSET if finish is None else delta.stop_reason
        )
        if p.token_ids is not None:  # vLLM: prompt ids on a choice's first chunk
            if not self._prompted[i]:
                self._prompted[i] = True
                choice.prompt_token_ids = self._prompts[i // self._n]
            choice.token_ids, self._sent[i] = p.token_ids[self._sent[i] :], len(p.token_ids)
        usage = self._usage.running()
        return self._framer.frame(choice, usage)

    def end(self) -> bytes:
        return self._usage.final()


class _AnsweredRenderer:
    """The stream of a request answered without the engine: every choice's echoed prompt
    with finish ``length`` first, then the usage chunk if asked."""

    def __init__(self, job: CompletionJob) -> None:
        self._job = job
        self._framer = job.framer()

    def start(self) -> bytes:
        return b"".join(
            self._framer.frame(CompletionChunkChoice(c.index, c.text, c.logprobs, "length"))
            for c in self._job.choices(None)
        )

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        raise AssertionError("an answered request has no engine output")

    def end(self) -> bytes:
        return StreamUsage(self._framer, self._job).final()
