"""Chat completions: messages are checked, rendered with the chat template and tokenized
into one sub-request per choice; their deltas become ``chat.completion.chunk`` frames or one
``chat.completion``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgspec
from msgspec import UNSET

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.calls import merge_calls
from smg_trio.gateway.openai.fanout import SubRequest, usage_of
from smg_trio.gateway.openai.framing import ChunkFramer, StreamUsage
from smg_trio.gateway.openai.grammar_check import check_grammar
from smg_trio.gateway.openai.logprobs import chat_logprobs, merge_runs, prompt_logprobs
from smg_trio.gateway.openai.request_template import (
    check_request_template,
    split_request_template,
)
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
from smg_trio.gateway.openai.template_kwargs import merge_template_kwargs
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
from smg_trio.gateway.openai.truncation import truncate_ids, truncation_limit

__all__ = [
    "CHAT",
    "ChatApi",
    "ChatDraft",
    "ChatJob",
    "ChatJobView",
    "ChatStreamRenderer",
    "check_chat_input",
]


def _check_messages(messages: Sequence[dict[str, Any]]) -> None:
    """Roles are any non-empty string: besides OpenAI's, vLLM 0.32 takes custom roles
    (``CustomChatCompletionMessageParam``) and hands them to the template."""
    if not messages:
        raise ValidationError(
            "messages must contain at least one message", param="messages", code="invalid_value"
        )
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if not isinstance(role, str):
            raise ValidationError(
                f"messages[{i}].role is required and must be a string, got {role!r}",
                param=f"messages[{i}].role",
                code="invalid_type",
            )
        if not role:
            raise ValidationError(
                f"messages[{i}].role must not be empty",
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


def _echo_of(body: ChatCompletionRequest, response_role: str) -> tuple[str, str]:
    """``(role, echoed text)`` as vLLM 0.32's chat serving has them: the reply's role is
    ``--response-role`` (``assistant``) with ``add_generation_prompt``, else the last
    message's (the model continues it); with ``echo`` the last message's text is echoed when
    its role is the reply's."""
    last = body.messages[-1] if body.messages else {}
    role = response_role if body.add_generation_prompt is not False else str(last.get("role"))
    if not body.echo or last.get("role") != role:
        return role, ""
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return role, str(content)


def _check_chat_fields(body: ChatCompletionRequest) -> None:
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
        check_request_template(body, config.trust_request_chat_template)
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
        check_grammar(self.plan.sampling.structured_outputs, self.plan.structured_param)
        template, kwargs = split_request_template(body, tok.content_format)
        kwargs = merge_template_kwargs(
            kwargs,
            reasoning_effort=body.reasoning_effort,
            defaults=self.config.default_chat_template_kwargs,
        )
        prompt = tok.apply_chat_template(
            body.messages,
            tools=body.tools,
            documents=body.documents,
            add_generation_prompt=body.add_generation_prompt is not False,
            continue_final_message=bool(body.continue_final_message),
            chat_template_kwargs=kwargs,
            template=template,
        )
        limit = truncation_limit(body, self.served.max_model_len)
        if limit is None:
            check_prompt_fits(self.served, prompt, "messages")
            return prompt, tok.encode(prompt)
        return prompt, truncate_ids(tok.encode(prompt), limit, body.truncation_side)

    def build(
        self, tokens: tuple[str, list[int]], ids: ResponseIds, first_index: int = 0
    ) -> ChatJob:
        """The ``n`` sub-requests (seed ``+i``; the context left as ``max_tokens`` when
        unset), within the request's token budget; choice indices from ``first_index`` (a
        batch's conversation)."""
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
        parser = served.reasoning_parser or config.reasoning_parser
        kwargs = merge_template_kwargs(
            body.chat_template_kwargs,
            reasoning_effort=body.reasoning_effort,
            defaults=config.default_chat_template_kwargs,
        )
        reasoning = reasoning_tags(parser, prompt, kwargs)
        requests = build_requests(
            plan,
            served,
            prompt_ids,
            base_id=ids.engine_id,
            first_index=first_index,
            total=plan.n if not first_index else first_index + plan.n,
            max_tokens=engine_max,
        )
        params = choice_params(plan, limit, reasoning, self.tools)
        tok = served.tokenizer
        opts = body.stream_options
        return ChatJob(
            subs=[
                SubRequest(r, ChoicePipeline(i, tok, params, prompt_ids, whole=not body.stream))
                for i, r in enumerate(requests, start=first_index)
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
            echo=_echo_of(body, config.response_role),
            hide_reasoning=body.include_reasoning is False and parser is not None,
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
    #: The reply's role and the echoed text (vLLM's ``echo``): see :func:`_echo_of`.
    echo: tuple[str, str] = ("assistant", "")
    answered: bool = False
    #: Report ``usage.prompt_tokens_details`` (``--enable-prompt-tokens-details``).
    prompt_tokens_details: bool = False
    choices_per_prompt: int = 1
    #: vLLM's ``include_reasoning: false`` with a reasoning parser: the answer has no
    #: ``reasoning``, and no ``logprobs`` nor ``token_ids`` (they would show it); a streamed
    #: chunk that carried only reasoning is not sent.
    hide_reasoning: bool = False

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
            role, echoed = self.echo
            text = echoed + text
            message = ChatMessageOut(role, text or (None if calls else ""))
            if calls:
                message.tool_calls = [
                    ToolCallOut(id=c.id, function=FunctionCallOut(c.name, c.arguments))
                    for c in calls
                ]
            if self.reasoning and not self.hide_reasoning:
                message.reasoning = "".join(collected.reasoning[i]) or None
            lps = None
            if k is not None and not self.hide_reasoning:
                lps = chat_logprobs(tok, merge_runs(collected.logprobs[i]), k)
            choice = ChatChoice(i, message, lps, p.finish_reason, p.stop_reason)
            choice.token_ids = None if self.hide_reasoning else p.token_ids
            choices.append(choice)
        out = ChatCompletion(
            id=self.ids.response_id,
            created=self.ids.created,
            model=self.served.model_id,
            choices=choices,
            usage=usage_of(self.prompt_tokens, self.subs, details=self.prompt_tokens_details),
            kv_transfer_params=self.subs[0].pipeline.kv_transfer_params if self.subs else None,
        )
        if self.subs and self.subs[0].pipeline.token_ids is not None:
            out.prompt_token_ids = self.prompt_ids
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
    ``reasoning`` deltas (logprobs riding on the delta that carries their text), the
    finish on each choice's last chunk, then the usage chunk if asked."""

    def __init__(self, job: ChatJob) -> None:
        self._framer = ChunkFramer(
            job.ids.response_id, "chat.completion.chunk", job.ids.created, job.served.model_id
        )
        self._tok = job.served.tokenizer
        self._subs: Sequence[SubRequest] = job.subs
        self._k = job.top_logprobs
        self._usage = StreamUsage(self._framer, job)
        self._prompt_ids = job.prompt_ids
        self._sent = [0] * len(job.subs)  # token ids already sent, per choice
        self._echo = job.echo
        self._hide = job.hide_reasoning

    def start(self) -> bytes:
        usage = self._usage.running()
        role, echoed = self._echo
        frames = [
            self._framer.frame(ChunkChoice(i, Delta(role=role, content="")), usage)
            for i in range(len(self._subs))
        ]
        if echoed:  # vLLM: one chunk per choice with the echoed text, after the role's
            frames += [
                self._framer.frame(ChunkChoice(i, Delta(content=echoed)), usage)
                for i in range(len(self._subs))
            ]
        if frames and self._subs[0].pipeline.token_ids is not None:
            # vLLM: prompt_token_ids at the top of the first chunk
            ids = msgspec.json.encode(self._prompt_ids)
            frames[0] = frames[0][:-3] + b',"prompt_token_ids":' + ids + b"}\n\n"
        return b"".join(frames)

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        hide = self._hide
        finish = delta.finish_reason
        if hide and not delta.text and not delta.tool_calls and finish is None:
            return b""  # vLLM: a reasoning-only delta is not sent with include_reasoning false
        lp = None
        if self._k is not None and delta.logprobs is not None and len(delta.logprobs) and not hide:
            lp = chat_logprobs(self._tok, delta.logprobs, self._k)
        choice = ChunkChoice(
            sub.pipeline.index,
            Delta(
                content=delta.text if delta.text else UNSET,
                reasoning=delta.reasoning if delta.reasoning and not hide else UNSET,
                tool_calls=_tool_call_deltas(delta) if delta.tool_calls else UNSET,
            ),
            lp,
            finish,
            UNSET if finish is None else delta.stop_reason,
        )
        ids = sub.pipeline.token_ids
        if ids is not None and not hide:
            i = sub.pipeline.index
            choice.token_ids, self._sent[i] = ids[self._sent[i] :], len(ids)
        usage = self._usage.running()
        return self._framer.frame(choice, usage)

    def end(self) -> bytes:
        return self._usage.final()
