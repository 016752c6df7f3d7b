"""``POST /v1/completions``: prompt(s) -> tokens -> fan-out -> text choices or SSE.

A list of prompts is a batch: choice ``index = prompt_index * n + i``, sub-request ids
``{rid}-{index}``, ``usage.prompt_tokens`` summed over the prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from msgspec import UNSET
from quart import Response

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.http.call import SSE_HEADERS, RequestCall
from smg_trio.gateway.http.sse import DONE, ChunkFramer, sse_response
from smg_trio.gateway.openai.fanout import SubRequest, run_all, usage_of
from smg_trio.gateway.openai.logprobs import (
    completion_logprobs,
    echo_logprobs,
    merge_runs,
    prompt_logprobs,
)
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
    build_plan,
    build_requests,
    check_data_parallel_rank,
    check_prompt_fits,
    check_token_budget,
    check_token_ids_fit,
    choice_params,
    resolve_max_tokens,
)
from smg_trio.tokenizer import Tokenizer

__all__ = ["CompletionStreamRenderer", "count_prompts", "handle_completions", "parse_prompts"]


def _bad_prompt(message: str, param: str = "prompt") -> ValidationError:
    return ValidationError(message, param=param, code="invalid_value")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_ids(ids: Sequence[Any], vocab: int, param: str) -> list[int]:
    if not ids:
        raise _bad_prompt("a token prompt must not be empty", param)
    for j, t in enumerate(ids):
        if not _is_int(t) or not 0 <= t < vocab:
            raise _bad_prompt(f"{param}[{j}] = {t!r} is not a token id in [0, {vocab})", param)
    return list(ids)


#: ``fits(prompt, param)``: raises when a text or token-id prompt cannot fit the context,
#: before it is encoded whole (or its ids checked).
FitCheck = Callable[[str | Sequence[Any], str], None]


def _no_check(prompt: str | Sequence[Any], param: str) -> None:
    pass


def count_prompts(raw: Any) -> int:
    """How many prompts ``raw`` holds, without looking at each (for the sequence limit)."""
    if isinstance(raw, list) and raw and not _is_int(raw[0]):
        return len(raw)
    return 1


def parse_prompts(
    raw: Any, tok: Tokenizer, max_prompts: int, fits: FitCheck = _no_check
) -> list[list[int]]:
    """Token ids of each prompt: a string, a list of strings, a list of token ids, or a
    list of lists of token ids. Raises ``ValidationError`` (400, ``param: prompt``) for
    anything else, an empty prompt, an id outside the vocabulary, or more than
    ``max_prompts`` prompts; ``fits`` refuses a prompt too long for the context before it is
    encoded. Text is encoded with the tokenizer's special tokens (BOS)."""
    vocab = tok.vocab_size
    if raw is None:
        raise ValidationError(
            "'prompt' is required", param="prompt", code="missing_required_parameter"
        )
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw and _is_int(raw[0]):
        fits(raw, "prompt")
        if all(_is_int(t) for t in raw):
            return [_check_ids(raw, vocab, "prompt")]
        items = raw
    elif isinstance(raw, list):
        items = raw
    else:
        raise _bad_prompt("prompt must be a string, a list of strings or a list of token ids")
    if not items:
        raise _bad_prompt("prompt must not be empty")
    if len(items) > max_prompts:
        raise _bad_prompt(f"at most {max_prompts} prompts per request, got {len(items)}")
    out: list[list[int]] = []
    for p, item in enumerate(items):
        param = f"prompt[{p}]"
        if isinstance(item, str):
            if not item:
                raise _bad_prompt("a prompt must not be empty", param)
            fits(item, "prompt" if raw is item else param)
            ids = tok.encode(item, add_special_tokens=True)
            if not ids:
                raise _bad_prompt("the prompt encodes to no tokens", param)
            out.append(ids)
        elif isinstance(item, list):
            fits(item, param)
            out.append(_check_ids(item, vocab, param))
        else:
            raise _bad_prompt(
                "prompt must be a string, a list of strings or a list of token ids", param
            )
    return out


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


def _completion(
    call: RequestCall,
    served: ServedModel,
    choices: list[CompletionChoice],
    subs: Sequence[SubRequest],
) -> Completion:
    return Completion(
        id=call.response_id,
        created=call.created,
        model=served.model_id,
        choices=choices,
        usage=usage_of(call.prompt_tokens, subs),
    )


class CompletionStreamRenderer:
    """``text_completion`` chunks: text deltas (the echoed prompt on each choice's first
    chunk), legacy logprobs for exactly the tokens of the chunk, the finish on each choice's
    last chunk, then the usage chunk if asked."""

    def __init__(
        self,
        call: RequestCall,
        model: str,
        tok: Tokenizer,
        subs: Sequence[SubRequest],
        *,
        n: int,
        logprobs: int | None,
        echo: _Echo | None,
        include_usage: bool,
        continuous_usage: bool,
    ) -> None:
        self._call = call
        self._framer = ChunkFramer(call.response_id, "text_completion", call.created, model)
        self._tok = tok
        self._subs = subs
        self._n = n
        self._k = logprobs
        self._echo = echo
        self._echoed = [False] * len(subs)
        self._offset = [0] * len(subs)
        self._include_usage = include_usage
        self._continuous = continuous_usage

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
        usage = usage_of(self._call.prompt_tokens, self._subs) if self._continuous else None
        return self._framer.frame(choice, usage)

    def end(self) -> bytes:
        if not self._include_usage:
            return b""
        return self._framer.usage_frame(usage_of(self._call.prompt_tokens, self._subs))


def _choices(
    subs: Sequence[SubRequest],
    collected: ChoiceCollector | None,
    tok: Tokenizer,
    *,
    n: int,
    k: int | None,
    echo: _Echo | None,
    prompts: list[list[int]],
    prompt_k: int | None,
) -> list[CompletionChoice]:
    out = []
    for sub in subs:
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
        if prompt_k is not None:
            choice.prompt_logprobs = prompt_logprobs(
                tok, p.prompt_logprobs, prompts[i // n], prompt_k
            )
        out.append(choice)
    return out


async def handle_completions(call: RequestCall) -> Response:
    """Serve one completions request on ``call`` (see :func:`~smg_trio.gateway.http.chat.handle_chat`
    for the error mapping)."""
    gw = call.gw
    streaming = False
    try:
        body = await call.read_body(CompletionRequest)
        served: ServedModel = gw.resolve_model(body.model)
        if body.suffix:
            raise ValidationError(
                "suffix is not supported", param="suffix", code="unsupported_field"
            )
        if body.stream and body.prompt_logprobs is not None:
            raise ValidationError(
                "prompt_logprobs is not supported with stream=true",
                param="prompt_logprobs",
                code="invalid_value",
            )
        echo_only = bool(body.echo) and body.max_tokens == 0
        if body.max_tokens == 0 and not echo_only:
            raise ValidationError(
                "max_tokens must be at least 1 (0 is allowed only with echo)",
                param="max_tokens",
                code="invalid_value",
            )
        k = body.logprobs
        if body.prompt_logprobs is not None:
            lpr = LogprobRequest(k=k, param="logprobs", prompt_k=body.prompt_logprobs)
        elif body.echo and k is not None:
            lpr = LogprobRequest(k=k, param="logprobs", prompt_k=k, prompt_param="echo")
        else:
            lpr = LogprobRequest(k=k, param="logprobs")
        plan = build_plan(
            body,
            served,
            gw.config,
            max_tokens=1 if echo_only else body.max_tokens,
            logprobs=lpr,
            prompts=count_prompts(body.prompt),
        )
        tok = served.tokenizer

        def fits(prompt: str | Sequence[Any], param: str) -> None:
            if isinstance(prompt, str):
                check_prompt_fits(plan, served, prompt, param)
            else:
                check_token_ids_fit(plan, served, len(prompt), param)

        prompts = await call.tokenize(
            lambda: parse_prompts(body.prompt, tok, gw.config.max_prompts, fits)
        )
        n = plan.n
        total = len(prompts) * n
        base = call.reserve_engine_id()
        params_cache: dict[int, ChoiceParams] = {}
        subs: list[SubRequest] = []
        budget = 0
        for p, ids in enumerate(prompts):
            engine_max, limit = resolve_max_tokens(plan, served, len(ids), "prompt")
            budget += limit * n
            if echo_only:
                limit = 0
            params = params_cache.get(limit)
            if params is None:
                params = params_cache[limit] = choice_params(plan, limit)
            reqs = build_requests(
                plan,
                served,
                ids,
                base_id=base,
                first_index=p * n,
                total=total,
                max_tokens=engine_max,
            )
            subs += [
                SubRequest(r, ChoicePipeline(p * n + i, tok, params, ids))
                for i, r in enumerate(reqs)
            ]
        check_token_budget(gw.config, served, budget, total, "max_tokens")
        call.subs = subs
        call.prompt_tokens = sum(len(ids) for ids in prompts)
        echo = _Echo(tok, prompts, k) if body.echo else None
        opts = body.stream_options
        include_usage = bool(opts and opts.include_usage)

        if echo_only and lpr.prompt_k is None:
            # Nothing to generate and nothing to ask the engine: answer without it.
            for sub in subs:
                sub.pipeline.finish_reason = "length"
            choices = _choices(subs, None, tok, n=n, k=k, echo=echo, prompts=prompts, prompt_k=None)
            if not body.stream:
                return call.ok_response(_completion(call, served, choices, subs))
            framer = ChunkFramer(call.response_id, "text_completion", call.created, served.model_id)
            frames = [
                framer.frame(CompletionChunkChoice(c.index, c.text, c.logprobs, "length"))
                for c in choices
            ]
            if include_usage:
                frames.append(framer.usage_frame(usage_of(call.prompt_tokens, subs)))
            frames.append(DONE)
            call.close(200)
            return Response(
                b"".join(frames),
                status=200,
                content_type="text/event-stream; charset=utf-8",
                headers={**SSE_HEADERS, "x-request-id": call.request_id},
            )

        lease = call.lease(served.model_id)
        client = lease.client
        check_data_parallel_rank(
            plan.data_parallel_rank,
            [e.index if e.index is not None else s for s, e in enumerate(client.engines)],
        )
        if body.stream:
            renderer = CompletionStreamRenderer(
                call,
                served.model_id,
                tok,
                subs,
                n=n,
                logprobs=k,
                echo=echo,
                include_usage=include_usage,
                continuous_usage=bool(opts and opts.continuous_usage_stats),
            )
            response = await sse_response(call, client, subs, renderer)
            streaming = True
            return response
        collected = ChoiceCollector(len(subs))
        await call.run_with_retry(
            served.model_id, client, lambda c: run_all(c, subs, collected.on_delta, call.on_batch)
        )
        choices = _choices(
            subs,
            collected,
            tok,
            n=n,
            k=k,
            echo=echo,
            prompts=prompts,
            prompt_k=body.prompt_logprobs,
        )
        return call.ok_response(_completion(call, served, choices, subs))
    except Exception as exc:
        return call.error_response(exc)
    finally:
        if not streaming:
            call.close(499, "client_disconnected")  # no-op unless cancelled
