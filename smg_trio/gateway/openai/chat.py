"""Chat completions: messages are checked, rendered with the chat template and tokenized
into one sub-request per choice; their deltas become ``chat.completion.chunk`` frames or one
``chat.completion``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from msgspec import UNSET

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.calls import merge_calls
from smg_trio.gateway.openai.fanout import SubRequest, usage_of
from smg_trio.gateway.openai.framing import ChunkFramer, StreamUsage
from smg_trio.gateway.openai.logprobs import chat_logprobs, merge_runs, prompt_logprobs
from smg_trio.gateway.openai.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessageOut,
    ChunkChoice,
    Delta,
    FunctionCallOut,
    FunctionDeltaOut,
    ToolCallDeltaOut,
    ToolCallOut,
)
from smg_trio.gateway.openai.textgen import ChoiceCollector, ChoicePipeline, TextDelta
from smg_trio.gateway.openai.tools import ToolPlan, plan_tools, tool_specs
from smg_trio.gateway.openai.translate import (
    LogprobRequest,
    Plan,
    build_plan,
    build_requests,
    check_prompt_fits,
    check_stream_prompt_logprobs,
    check_token_budget,
    choice_params,
    reasoning_tags,
    resolve_max_tokens,
)

__all__ = [
    "CHAT",
    "ChatApi",
    "ChatDraft",
    "ChatJob",
    "ChatJobView",
    "ChatStreamRenderer",
    "check_chat_input",
]

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
        if msg.get("tool_call_id") is not None and role != "tool":
            raise ValidationError(
                f"messages[{i}].tool_call_id is only allowed on a 'tool' message, not {role!r}",
                param=f"messages[{i}].tool_call_id",
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
    if body.top_logprobs and not body.logprobs:
        raise ValidationError(
            "top_logprobs requires logprobs to be true", param="top_logprobs", code="invalid_value"
        )
    check_stream_prompt_logprobs(body)
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


def check_chat_input(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> None:
    """Chat's checks of ``messages`` (roles, ``tool_call_id``, content) and ``tools`` (each
    a function tool, no name twice) before they reach the template; ``/tokenize`` runs them
    too. Raises ``ValidationError`` (400 naming the field)."""
    _check_messages(messages)
    for i, tool in enumerate(tools or ()):
        _check_tool(tool, f"tools[{i}]")
    tool_specs(tools or ())


class ChatApi:
    """``POST /v1/chat/completions``."""

    name = "chat"
    id_prefix = "chatcmpl-"
    body_type = ChatCompletionRequest

    def check(
        self, body: ChatCompletionRequest, served: ServedModel, config: GatewayHttpConfig
    ) -> ChatDraft:
        """Check the messages and every field that needs no tokenizing."""
        _check_messages(body.messages)
        _check_chat_fields(body)
        tools = plan_tools(
            body.tools,
            body.tool_choice,
            body.parallel_tool_calls,
            parser_name=served.tool_call_parser or config.tool_call_parser,
            enable_auto=config.enable_auto_tool_choice,
        )
        k = (body.top_logprobs or 0) if body.logprobs else None
        mct = body.max_completion_tokens
        plan = build_plan(
            body,
            served,
            config,
            max_tokens=mct if mct is not None else body.max_tokens,
            logprobs=LogprobRequest(k=k, param="top_logprobs", prompt_k=body.prompt_logprobs),
            tool_constraint=tools.constraint,
        )
        return ChatDraft(
            body=body, served=served, config=config, plan=plan, top_logprobs=k, tools=tools
        )


@attrs.frozen(kw_only=True)
class ChatDraft:
    """A checked chat request (see :class:`~smg_trio.gateway.openai.api.Draft`)."""

    body: ChatCompletionRequest
    served: ServedModel
    config: GatewayHttpConfig
    plan: Plan
    top_logprobs: int | None
    tools: ToolPlan = attrs.field(factory=ToolPlan)

    def tokenize(self) -> tuple[str, list[int]]:
        """The rendered chat template and its token ids (refused before encoding when it
        cannot fit the context)."""
        body, tok = self.body, self.served.tokenizer
        prompt = tok.apply_chat_template(
            body.messages,
            tools=body.tools,
            documents=body.documents,
            add_generation_prompt=body.add_generation_prompt is not False,
            continue_final_message=bool(body.continue_final_message),
            chat_template_kwargs=body.chat_template_kwargs,
        )
        check_prompt_fits(self.plan, self.served, prompt, "messages")
        return prompt, tok.encode(prompt)

    def build(self, tokens: tuple[str, list[int]], ids: ResponseIds) -> ChatJob:
        """The ``n`` sub-requests (seed ``+i``; the context left as ``max_tokens`` when
        unset), within the request's token budget."""
        prompt, prompt_ids = tokens
        body, served, config, plan = self.body, self.served, self.config, self.plan
        if not prompt_ids:
            raise ValidationError("the rendered prompt is empty", param="messages")
        engine_max, limit = resolve_max_tokens(plan, served, len(prompt_ids), "messages")
        check_token_budget(
            config,
            served,
            limit * plan.n,
            plan.n,
            "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
        )
        reasoning = reasoning_tags(
            served.reasoning_parser or config.reasoning_parser, prompt, body.chat_template_kwargs
        )
        requests = build_requests(
            plan,
            served,
            prompt_ids,
            base_id=ids.engine_id,
            first_index=0,
            total=plan.n,
            max_tokens=engine_max,
        )
        params = choice_params(plan, limit, reasoning, self.tools)
        tok = served.tokenizer
        opts = body.stream_options
        return ChatJob(
            subs=[
                SubRequest(r, ChoicePipeline(i, tok, params, prompt_ids, whole=not body.stream))
                for i, r in enumerate(requests)
            ],
            prompt_tokens=len(prompt_ids),
            stream=bool(body.stream),
            data_parallel_rank=plan.data_parallel_rank,
            ids=ids,
            served=served,
            top_logprobs=self.top_logprobs,
            include_usage=bool(opts and opts.include_usage),
            continuous_usage=bool(opts and opts.continuous_usage_stats),
            reasoning=reasoning is not None,
            prompt_ids=prompt_ids,
            prompt_k=body.prompt_logprobs,
            prompt_tokens_details=config.enable_prompt_tokens_details,
        )


#: The chat completions API.
CHAT = ChatApi()


@attrs.frozen(kw_only=True)
class ChatJob:
    """A planned chat request (see :class:`~smg_trio.gateway.openai.api.Job`)."""

    subs: list[SubRequest]
    prompt_tokens: int
    stream: bool
    data_parallel_rank: int | None
    ids: ResponseIds
    served: ServedModel
    top_logprobs: int | None
    include_usage: bool
    continuous_usage: bool
    reasoning: bool
    prompt_ids: list[int]
    prompt_k: int | None
    answered: bool = False
    #: Report ``usage.prompt_tokens_details`` (``--enable-prompt-tokens-details``).
    prompt_tokens_details: bool = False
    choices_per_prompt: int = 1

    def renderer(self) -> ChatStreamRenderer:
        """The ``chat.completion.chunk`` renderer of this request's stream."""
        return ChatStreamRenderer(self)

    def result(self, collected: ChoiceCollector | None) -> ChatCompletion:
        """The ``chat.completion``: each choice's text, reasoning and logprobs."""
        assert collected is not None
        tok = self.served.tokenizer
        k = self.top_logprobs
        choices = []
        for sub in self.subs:
            p: ChoicePipeline = sub.pipeline
            i = p.index
            text = "".join(collected.text[i])
            calls = merge_calls(collected.tool_calls[i], "call_")
            message = ChatMessageOut("assistant", text or (None if calls else ""))
            if calls:
                message.tool_calls = [
                    ToolCallOut(id=c.id, function=FunctionCallOut(c.name, c.arguments))
                    for c in calls
                ]
            if self.reasoning:
                message.reasoning_content = "".join(collected.reasoning[i]) or None
            lps = None
            if k is not None:
                lps = chat_logprobs(tok, merge_runs(collected.logprobs[i]), k)
            choices.append(ChatChoice(i, message, lps, p.finish_reason, p.stop_reason))
        out = ChatCompletion(
            id=self.ids.response_id,
            created=self.ids.created,
            model=self.served.model_id,
            choices=choices,
            usage=usage_of(self.prompt_tokens, self.subs, details=self.prompt_tokens_details),
        )
        if self.prompt_k is not None:
            out.prompt_logprobs = prompt_logprobs(
                tok, self.subs[0].pipeline.prompt_logprobs, self.prompt_ids, self.prompt_k
            )
        return out


class ChatJobView:
    """The :class:`~smg_trio.gateway.openai.api.Job` properties of a job that wraps a
    :class:`ChatJob` as ``chat`` (Messages, Responses): its sub-requests, usage and routing."""

    __slots__ = ()
    chat: ChatJob

    @property
    def subs(self) -> list[SubRequest]:
        return self.chat.subs

    @property
    def prompt_tokens(self) -> int:
        return self.chat.prompt_tokens

    @property
    def stream(self) -> bool:
        return self.chat.stream

    @property
    def data_parallel_rank(self) -> int | None:
        return self.chat.data_parallel_rank


def _tool_call_deltas(delta: TextDelta) -> list[ToolCallDeltaOut]:
    """``delta.tool_calls``: ``id``, ``type`` and ``name`` in a call's first delta only."""
    out = []
    for d in delta.tool_calls:
        if d.name is not None:
            out.append(
                ToolCallDeltaOut(
                    index=d.index,
                    id=d.id or UNSET,
                    type="function",
                    function=FunctionDeltaOut(name=d.name, arguments=d.arguments),
                )
            )
        else:
            out.append(
                ToolCallDeltaOut(index=d.index, function=FunctionDeltaOut(arguments=d.arguments))
            )
    return out


class ChatStreamRenderer:
    """``chat.completion.chunk`` frames: a role chunk per choice first, then content and
    ``reasoning_content`` deltas (logprobs riding on the delta that carries their text), the
    finish on each choice's last chunk, then the usage chunk if asked."""

    def __init__(self, job: ChatJob) -> None:
        self._framer = ChunkFramer(
            job.ids.response_id, "chat.completion.chunk", job.ids.created, job.served.model_id
        )
        self._tok = job.served.tokenizer
        self._subs: Sequence[SubRequest] = job.subs
        self._k = job.top_logprobs
        self._usage = StreamUsage(self._framer, job)

    def start(self) -> bytes:
        usage = self._usage.running()
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
                tool_calls=_tool_call_deltas(delta) if delta.tool_calls else UNSET,
            ),
            lp,
            finish,
            UNSET if finish is None else delta.stop_reason,
        )
        usage = self._usage.running()
        return self._framer.frame(choice, usage)

    def end(self) -> bytes:
        return self._usage.final()
