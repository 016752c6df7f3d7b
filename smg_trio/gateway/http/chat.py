"""``POST /v1/chat/completions``: messages -> chat template -> fan-out -> message or SSE."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgspec import UNSET
from quart import Response

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.http.call import RequestCall
from smg_trio.gateway.http.sse import ChunkFramer, sse_response
from smg_trio.gateway.openai.fanout import SubRequest, run_all, usage_of
from smg_trio.gateway.openai.logprobs import chat_logprobs, merge_runs, prompt_logprobs
from smg_trio.gateway.openai.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessageOut,
    ChunkChoice,
    Delta,
)
from smg_trio.gateway.openai.textgen import ChoiceCollector, ChoicePipeline, TextDelta
from smg_trio.gateway.openai.translate import (
    LogprobRequest,
    build_plan,
    build_requests,
    check_data_parallel_rank,
    check_prompt_fits,
    check_token_budget,
    choice_params,
    reasoning_tags,
    resolve_max_tokens,
)
from smg_trio.tokenizer import Tokenizer

__all__ = ["ChatStreamRenderer", "handle_chat"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _check_messages(messages: Sequence[dict[str, Any]]) -> None:
    if not messages:
        raise ValidationError(
            "messages must contain at least one message", param="messages", code="invalid_value"
        )
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role not in _ROLES:
            raise ValidationError(
                f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}, got {role!r}",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        content = msg.get("content")
        if content is None and role != "assistant":
            raise ValidationError(
                f"messages[{i}].content is required for role {role!r}",
                param=f"messages[{i}].content",
                code="missing_required_parameter",
            )


def _check_chat_fields(body: ChatCompletionRequest) -> None:
    if body.echo:
        raise ValidationError(
            "echo is not supported for chat completions", param="echo", code="unsupported_field"
        )
    choice = body.tool_choice
    if choice is not None and choice not in ("none", "auto"):
        raise ValidationError(
            "tool_choice 'required' or a named function needs constrained tool calling, which "
            "this gateway does not provide; use 'auto' or 'none'",
            param="tool_choice",
            code="unsupported_field",
        )
    if body.top_logprobs and not body.logprobs:
        raise ValidationError(
            "top_logprobs requires logprobs to be true", param="top_logprobs", code="invalid_value"
        )
    if body.stream and body.prompt_logprobs is not None:
        raise ValidationError(
            "prompt_logprobs is not supported with stream=true",
            param="prompt_logprobs",
            code="invalid_value",
        )
    for i, tool in enumerate(body.tools or ()):
        _check_tool(tool, f"tools[{i}]")


def _check_tool(tool: dict[str, Any], param: str) -> None:
    """A tool is ``{"type": "function", "function": {"name": str, ...}}`` (OpenAI's shape);
    anything else would reach the chat template and render nonsense."""
    if tool.get("type") != "function":
        raise ValidationError(
            f"tool type must be 'function', got {tool.get('type')!r}",
            param=f"{param}.type",
            code="invalid_value",
        )
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValidationError(
            "a function tool needs a 'function' object",
            param=f"{param}.function",
            code="invalid_type",
        )
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ValidationError(
            "a function tool needs a non-empty string 'name'",
            param=f"{param}.function.name",
            code="invalid_type",
        )
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ValidationError(
            "function parameters must be a JSON Schema object",
            param=f"{param}.function.parameters",
            code="invalid_type",
        )


class ChatStreamRenderer:
    """``chat.completion.chunk`` frames: a role chunk per choice first, then content and
    ``reasoning_content`` deltas (logprobs riding on the delta that carries their text), the
    finish on each choice's last chunk, then the usage chunk if asked."""

    def __init__(
        self,
        call: RequestCall,
        model: str,
        tokenizer: Tokenizer,
        subs: Sequence[SubRequest],
        *,
        top_logprobs: int | None,
        include_usage: bool,
        continuous_usage: bool,
    ) -> None:
        self._call = call
        self._framer = ChunkFramer(call.response_id, "chat.completion.chunk", call.created, model)
        self._tok = tokenizer
        self._subs = subs
        self._k = top_logprobs
        self._include_usage = include_usage
        self._continuous = continuous_usage

    def start(self) -> bytes:
        usage = usage_of(self._call.prompt_tokens, self._subs) if self._continuous else None
        return b"".join(
            self._framer.frame(ChunkChoice(i, Delta(role="assistant", content="")), usage)
            for i in range(len(self._subs))
        )

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        lp = None
        if self._k is not None and delta.logprobs is not None and len(delta.logprobs):
            lp = chat_logprobs(self._tok, delta.logprobs, self._k)
        finish = delta.finish_reason
        choice = ChunkChoice(
            sub.pipeline.index,
            Delta(
                content=delta.text if delta.text else UNSET,
                reasoning_content=delta.reasoning if delta.reasoning else UNSET,
            ),
            lp,
            finish,
            UNSET if finish is None else delta.stop_reason,
        )
        usage = usage_of(self._call.prompt_tokens, self._subs) if self._continuous else None
        return self._framer.frame(choice, usage)

    def end(self) -> bytes:
        if not self._include_usage:
            return b""
        return self._framer.usage_frame(usage_of(self._call.prompt_tokens, self._subs))


def _result(
    call: RequestCall,
    served: ServedModel,
    subs: Sequence[SubRequest],
    collected: ChoiceCollector,
    *,
    top_logprobs: int | None,
    reasoning: bool,
    prompt_ids: list[int],
    prompt_k: int | None,
) -> ChatCompletion:
    tok = served.tokenizer
    choices = []
    for sub in subs:
        p: ChoicePipeline = sub.pipeline
        i = p.index
        message = ChatMessageOut("assistant", "".join(collected.text[i]))
        if reasoning:
            message.reasoning_content = "".join(collected.reasoning[i]) or None
        lps = None
        if top_logprobs is not None:
            lps = chat_logprobs(tok, merge_runs(collected.logprobs[i]), top_logprobs)
        choices.append(ChatChoice(i, message, lps, p.finish_reason, p.stop_reason))
    out = ChatCompletion(
        id=call.response_id,
        created=call.created,
        model=served.model_id,
        choices=choices,
        usage=usage_of(call.prompt_tokens, subs),
    )
    if prompt_k is not None:
        out.prompt_logprobs = prompt_logprobs(
            tok, subs[0].pipeline.prompt_logprobs, prompt_ids, prompt_k
        )
    return out


async def handle_chat(call: RequestCall) -> Response:
    """Serve one chat request on ``call``; every failure becomes an OpenAI error response
    (4xx for client input, 503 engine unavailable, 500 engine failure)."""
    gw = call.gw
    streaming = False
    try:
        body = await call.read_body(ChatCompletionRequest)
        served = gw.resolve_model(body.model)
        _check_messages(body.messages)
        _check_chat_fields(body)
        k = (body.top_logprobs or 0) if body.logprobs else None
        prompt_k = body.prompt_logprobs
        mct = body.max_completion_tokens
        plan = build_plan(
            body,
            served,
            gw.config,
            max_tokens=mct if mct is not None else body.max_tokens,
            logprobs=LogprobRequest(k=k, param="top_logprobs", prompt_k=prompt_k),
        )
        tok = served.tokenizer

        def prepare() -> tuple[str, list[int]]:
            prompt = tok.apply_chat_template(
                body.messages,
                tools=body.tools,
                documents=body.documents,
                add_generation_prompt=body.add_generation_prompt is not False,
                continue_final_message=bool(body.continue_final_message),
                chat_template_kwargs=body.chat_template_kwargs,
            )
            check_prompt_fits(plan, served, prompt, "messages")
            return prompt, tok.encode(prompt)

        prompt, prompt_ids = await call.tokenize(prepare)
        if not prompt_ids:
            raise ValidationError("the rendered prompt is empty", param="messages")
        engine_max, limit = resolve_max_tokens(plan, served, len(prompt_ids), "messages")
        check_token_budget(
            gw.config,
            served,
            limit * plan.n,
            plan.n,
            "max_completion_tokens" if mct is not None else "max_tokens",
        )
        parser = served.reasoning_parser or gw.config.reasoning_parser
        reasoning = reasoning_tags(parser, prompt)
        base = call.reserve_engine_id()
        requests = build_requests(
            plan,
            served,
            prompt_ids,
            base_id=base,
            first_index=0,
            total=plan.n,
            max_tokens=engine_max,
        )
        params = choice_params(plan, limit, reasoning)
        subs = [
            SubRequest(r, ChoicePipeline(i, tok, params, prompt_ids))
            for i, r in enumerate(requests)
        ]
        call.subs = subs
        call.prompt_tokens = len(prompt_ids)
        lease = call.lease(served.model_id)
        client = lease.client
        check_data_parallel_rank(
            plan.data_parallel_rank,
            [e.index if e.index is not None else s for s, e in enumerate(client.engines)],
        )
        if body.stream:
            opts = body.stream_options
            renderer = ChatStreamRenderer(
                call,
                served.model_id,
                tok,
                subs,
                top_logprobs=k,
                include_usage=bool(opts and opts.include_usage),
                continuous_usage=bool(opts and opts.continuous_usage_stats),
            )
            response = await sse_response(call, client, subs, renderer)
            streaming = True
            return response
        collected = ChoiceCollector(len(subs))
        await call.run_with_retry(
            served.model_id, client, lambda c: run_all(c, subs, collected.on_delta, call.on_batch)
        )
        return call.ok_response(
            _result(
                call,
                served,
                subs,
                collected,
                top_logprobs=k,
                reasoning=reasoning is not None,
                prompt_ids=prompt_ids,
                prompt_k=prompt_k,
            )
        )
    except Exception as exc:
        return call.error_response(exc)
    finally:
        if not streaming:
            call.close(499, "client_disconnected")  # no-op unless cancelled
