"""Anthropic Messages (``POST /v1/messages``): the request becomes a chat request (system,
content blocks, tools, ``tool_choice``) checked and planned by the chat API itself; its one
choice is rendered as Anthropic's ``message`` or its event stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.calls import Call, call_input, input_json, merge_calls, needs_flags
from smg_trio.gateway.openai.chat import CHAT, ChatDraft, ChatJob, ChatJobView
from smg_trio.gateway.openai.errors import anthropic_envelope, to_api_error
from smg_trio.gateway.openai.fanout import SubRequest, cached_tokens_of
from smg_trio.gateway.openai.messages_schemas import (
    AnthropicMessage,
    AnthropicUsage,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
)
from smg_trio.gateway.openai.schemas import ChatCompletionRequest
from smg_trio.gateway.openai.textgen import ChoiceCollector, TextDelta
from smg_trio.gateway.openai.translate import encode_within_context
from smg_trio.parsers.tools import ToolCallDelta

__all__ = ["MESSAGES", "MessagesApi", "count_tokens", "to_chat_messages"]

_encode = msgspec.json.encode


def _bad(message: str, param: str, code: str = "invalid_value") -> ValidationError:
    return ValidationError(message, param=param, code=code)


def _block_text(block: Any, where: str) -> str:
    """The text of one ``text`` block at ``where`` (a 400 naming its ``type`` or ``text``)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind != "text":
        raise _bad(f"only text blocks are supported here, got {kind!r}", f"{where}.type")
    if not isinstance(block.get("text"), str):
        raise _bad("a text block needs a string text", f"{where}.text", "invalid_type")
    return str(block["text"])


def _text_of(content: Any, param: str) -> str:
    """The text of a string or a list of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of blocks", param, "invalid_type")
    return "".join(_block_text(block, f"{param}[{j}]") for j, block in enumerate(content))


def _user_blocks(content: list[Any], param: str, uses: set[str]) -> list[dict[str, Any]]:
    """A user turn's blocks: ``tool_result`` blocks become ``tool`` messages (first, as
    templates expect them right after the assistant's calls), text the user message. Each
    ``tool_use_id`` must be one of ``uses``, the previous message's ``tool_use`` ids (as
    Anthropic's API checks)."""
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise _bad("tool_result needs a tool_use_id", f"{where}.tool_use_id")
            if block["tool_use_id"] not in uses:
                raise _bad(
                    f"tool_use_id {block['tool_use_id']!r} matches no tool_use block in the "
                    "previous message: each tool_result must answer a tool_use of the "
                    "assistant turn just before it",
                    f"{where}.tool_use_id",
                )
            raw = block.get("content", "")
            text = _text_of(raw, f"{where}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            raise _bad(f"content block type {kind!r} is not supported in a user turn", where)
    out = tools
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant_blocks(content: list[Any], param: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                raise _bad("tool_use needs a string id and name", where)
            if "input" not in block:  # required, as Anthropic's API requires it
                raise _bad("tool_use needs an input object", f"{where}.input")
            if not isinstance(block["input"], dict):
                raise _bad("tool_use input must be an object", f"{where}.input", "invalid_type")
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": json.dumps(block["input"]),
                    },
                }
            )
        else:
            raise _bad(f"content block type {kind!r} is not supported in an assistant turn", where)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        msg["reasoning"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def to_chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic's ``system`` and ``messages`` as chat messages. Raises ``ValidationError``
    (400 naming the block) for a role or block this gateway cannot render."""
    out: list[dict[str, Any]] = []
    if body.system is not None:
        system = _text_of(body.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    if not body.messages:
        raise _bad("messages must contain at least one message", "messages")
    uses: set[str] = set()  # the previous message's tool_use ids
    for i, msg in enumerate(body.messages):
        param = f"messages[{i}]"
        role = msg.get("role")
        content = msg.get("content")
        if role not in ("user", "assistant"):
            raise _bad(f"role must be 'user' or 'assistant', got {role!r}", f"{param}.role")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            uses = set()
        elif isinstance(content, list):
            if role == "user":
                out.extend(_user_blocks(content, f"{param}.content", uses))
                uses = set()
            else:
                turn = _assistant_blocks(content, f"{param}.content")
                out.append(turn)
                uses = {call["id"] for call in turn.get("tool_calls", ())}
        else:
            raise _bad("content must be a string or a list of blocks", f"{param}.content")
    return out


def _chat_tools(body: CountTokensRequest) -> list[dict[str, Any]] | None:
    if not body.tools:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        kind = tool.get("type")
        if kind not in (None, "custom"):  # Anthropic's server tools (web_search, bash...)
            raise _bad(f"tool type {kind!r} is not supported", f"tools[{i}].type")
        fn: dict[str, Any] = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        tools.append({"type": "function", "function": fn})
    return tools


def _parallel(choice: dict[str, Any] | None) -> bool | None:
    """``tool_choice.disable_parallel_tool_use`` as chat's ``parallel_tool_calls``."""
    if choice is None or choice.get("disable_parallel_tool_use") is None:
        return None
    return not choice["disable_parallel_tool_use"]


def _chat_tool_choice(choice: dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Anthropic's ``tool_choice`` in chat's terms: ``auto``, ``none``, ``any`` = required,
    ``tool`` = the named function."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return str(kind)
    if kind == "any":
        return "required"
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _bad("tool_choice type 'tool' needs a name", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(
        f"tool_choice.type must be auto, any, tool or none, got {kind!r}", "tool_choice.type"
    )


def _template_kwargs(thinking: dict[str, Any] | None) -> dict[str, Any] | None:
    """``thinking`` as the chat template's ``enable_thinking`` (Qwen3's and DeepSeek's
    switch); the token budget is not enforced separately (``max_tokens`` bounds both)."""
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise _bad(f"thinking.type must be enabled or disabled, got {kind!r}", "thinking.type")
    return {"enable_thinking": kind != "disabled"}


def count_tokens(body: CountTokensRequest, served: ServedModel) -> CountTokensResponse:
    """The prompt's token count, as ``/v1/messages`` would render and encode it; a prompt
    of more tokens than the context is a 400 naming ``messages``, refused before it is
    encoded whole where its length shows it (:func:`encode_within_context`)."""
    tok = served.tokenizer
    prompt = tok.apply_chat_template(
        to_chat_messages(body),
        tools=_chat_tools(body),
        add_generation_prompt=True,
        chat_template_kwargs=_template_kwargs(body.thinking),
    )
    return CountTokensResponse(len(encode_within_context(served, prompt, "messages")))


def _sse(event: str, payload: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


def _stop(
    finish: str | None, stop_reason: int | str | None, stops: Sequence[str]
) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of Anthropic's message: ``tool_use`` when calls were
    made and the engine stopped (chat's ``tool_calls``); a reply cut short is ``max_tokens``
    even with a (maybe partial) call in it."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(stop_reason, str) and stop_reason in stops:
        return "stop_sequence", stop_reason
    return "end_turn", None


def _tool_use(call: Call) -> dict[str, Any]:
    """A ``tool_use`` block without ``input``; the gateway's ``call_`` ids read ``toolu_``
    (Anthropic's prefix), the same in both modes; a model's own id stays as it is."""
    cid = call.id
    if cid.startswith("call_"):
        cid = "toolu_" + cid.removeprefix("call_")
    return {"type": "tool_use", "id": cid, "name": call.name}


def _signature() -> str:
    """A thinking block's ``signature``: vLLM 0.32 writes a fresh ``uuid4().hex`` (the
    gateway signs nothing; clients that echo thinking blocks back need one present)."""
    return uuid.uuid4().hex


class MessagesApi:
    """``POST /v1/messages``."""

    name = "messages"
    id_prefix = "msg_"
    body_type = MessagesRequest
    #: Errors on this route use Anthropic's envelope, and ``x-api-key`` authenticates.
    envelope = staticmethod(anthropic_envelope)
    x_api_key = True

    def check(
        self, body: MessagesRequest, served: ServedModel, config: GatewayHttpConfig
    ) -> MessagesDraft:
        """The chat request this is, checked by the chat API."""
        chat = ChatCompletionRequest(
            model=body.model,
            messages=to_chat_messages(body),
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop=body.stop_sequences,
            stream=bool(body.stream),
            tools=_chat_tools(body),
            tool_choice=_chat_tool_choice(body.tool_choice),
            parallel_tool_calls=_parallel(body.tool_choice),
            chat_template_kwargs=_template_kwargs(body.thinking),
            cache_salt=body.cache_salt,
        )
        stops = tuple(body.stop_sequences or ())
        try:
            draft = CHAT.check(chat, served, config)
        except ValidationError as exc:
            raise needs_flags(exc, 'tool_choice {"type": "any"}, "tool" and "none"') from None
        # Claude Code asks every model for 32000: the context left clamps it (vLLM 0.32's
        # get_max_tokens, as for chat; above max_model_len it is a 400, build_plan).
        return MessagesDraft(draft, stops)


#: The Anthropic Messages API.
MESSAGES = MessagesApi()


@attrs.frozen
class MessagesDraft:
    """A checked Messages request: the chat draft it wraps."""

    chat: ChatDraft
    stops: tuple[str, ...]

    def tokenize(self) -> tuple[str, list[int]]:
        return self.chat.tokenize()

    def build(self, tokens: tuple[str, list[int]], ids: ResponseIds) -> MessagesJob:
        return MessagesJob(self.chat.build(tokens, ids), self.stops)


@attrs.frozen
class MessagesJob(ChatJobView):
    """A planned Messages request (see :class:`~smg_trio.gateway.openai.api.Job`)."""

    chat: ChatJob
    stops: tuple[str, ...]
    answered: bool = False

    def renderer(self) -> MessagesStreamRenderer:
        return MessagesStreamRenderer(self)

    def result(self, collected: ChoiceCollector | None) -> AnthropicMessage:
        """The ``message``: thinking, text and ``tool_use`` blocks."""
        assert collected is not None
        pipeline = self.subs[0].pipeline
        content: list[dict[str, Any]] = []
        reasoning = "".join(collected.reasoning[0])
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": _signature()})
        text = "".join(collected.text[0])
        calls = merge_calls(collected.tool_calls[0], "toolu_")
        if text or not calls:
            content.append({"type": "text", "text": text})
        for call in calls:
            content.append({**_tool_use(call), "input": call_input(call.arguments)})
        reason, sequence = _stop(pipeline.finish_reason, pipeline.stop_reason, self.stops)
        return AnthropicMessage(
            id=self.chat.ids.response_id,
            model=self.chat.served.model_id,
            content=content,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=_usage(self.chat, pipeline.completion_tokens),
        )


def _usage(chat: ChatJob, output_tokens: int) -> AnthropicUsage:
    """Anthropic's ``usage``. With ``--enable-prompt-tokens-details`` the prompt tokens read
    from the engine's prefix cache are ``cache_read_input_tokens`` and ``input_tokens`` the
    rest, as vLLM's Messages API reports them."""
    if not chat.prompt_tokens_details:
        return AnthropicUsage(chat.prompt_tokens, output_tokens)
    cached = cached_tokens_of(chat.subs)
    return AnthropicUsage(chat.prompt_tokens - cached, output_tokens, cached)


class MessagesStreamRenderer:
    """Anthropic's events: ``message_start`` and ``ping``, then per content block
    ``content_block_start``, its ``content_block_delta``s (``thinking_delta``, ``text_delta``,
    ``input_json_delta``) and ``content_block_stop``, then ``message_delta`` (stop reason,
    output tokens) and ``message_stop``. No ``[DONE]``; an error is an ``error`` event.

    Blocks come in the whole message's order: thinking, text, then the ``tool_use`` blocks,
    sent when the reply ends (calls are the reply's end), each with one ``input_json_delta``
    that parses to the whole message's ``input`` (the SDKs parse every partial buffer, so a
    call's raw fragments, which may not be JSON, are never sent)."""

    done = b""

    def __init__(self, job: MessagesJob) -> None:
        self._job = job
        self._index = -1  # the open block's index
        self._open: str | None = None  # "thinking", "text", "tool_use"
        self._calls: list[ToolCallDelta] = []

    def start(self) -> bytes:
        job = self._job
        message: dict[str, Any] = {
            "id": job.chat.ids.response_id,
            "type": "message",
            "role": "assistant",
            "model": job.chat.served.model_id,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": job.prompt_tokens, "output_tokens": 0},
        }
        return _sse("message_start", {"type": "message_start", "message": message}) + _sse(
            "ping", {"type": "ping"}
        )

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":  # vLLM 0.32: the signature before the block stops
            out = self._delta({"type": "signature_delta", "signature": _signature()})
        self._open = None
        stop = {"type": "content_block_stop", "index": self._index}
        return out + _sse("content_block_stop", stop)

    def _begin(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._open = kind
        event = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + _sse("content_block_start", event)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        event = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return _sse("content_block_delta", event)

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        out: list[bytes] = []
        if delta.reasoning:
            if self._open != "thinking":
                out.append(self._begin("thinking", {"type": "thinking", "thinking": ""}))
            out.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.text:
            if self._open != "text":
                out.append(self._begin("text", {"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": delta.text}))
        self._calls.extend(delta.tool_calls)
        return b"".join(out)

    def end(self) -> bytes:
        job = self._job
        pipeline = job.subs[0].pipeline
        out = self._close()
        calls = merge_calls(self._calls, "toolu_")
        if self._index < 0 and not calls:  # no block at all: an empty text block, as Anthropic
            out = self._begin("text", {"type": "text", "text": ""}) + self._close()
        for call in calls:
            out += self._begin("tool_use", {**_tool_use(call), "input": {}})
            partial = {"type": "input_json_delta", "partial_json": input_json(call.arguments)}
            out += self._delta(partial) + self._close()
        reason, sequence = _stop(pipeline.finish_reason, pipeline.stop_reason, job.stops)
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": pipeline.completion_tokens},
        }
        if job.chat.prompt_tokens_details:  # the cache reads are known now
            usage = _usage(job.chat, pipeline.completion_tokens)
            message_delta["usage"] = {
                "input_tokens": usage.input_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens,
                "output_tokens": usage.output_tokens,
            }
        return (
            out
            + _sse("message_delta", message_delta)
            + _sse("message_stop", {"type": "message_stop"})
        )

    def error_event(self, exc: BaseException) -> bytes:
        return b"event: error\ndata: " + anthropic_envelope(to_api_error(exc)) + b"\n\n"
