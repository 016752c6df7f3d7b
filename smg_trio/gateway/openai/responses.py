"""The OpenAI Responses API (``POST /v1/responses``): input items, instructions and the
stored conversation of ``previous_response_id`` become a chat request checked and planned by
the chat API itself; its one choice renders as ``reasoning``, ``message`` and
``function_call`` output items, or their event stream (each event with its
``sequence_number``). Stored responses live in a :class:`ResponseStoreLike`."""

from __future__ import annotations

import secrets
from typing import Any

import attrs
import msgspec

from smg_trio.backend import ServedModel
from smg_trio.errors import ValidationError
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.calls import merge_calls, needs_flags, new_call_id
from smg_trio.gateway.openai.chat import CHAT, ChatDraft, ChatJob, ChatJobView
from smg_trio.gateway.openai.errors import to_api_error
from smg_trio.gateway.openai.fanout import SubRequest
from smg_trio.gateway.openai.logprobs import chat_logprobs, merge_runs
from smg_trio.gateway.openai.responses_background import BackgroundResponses
from smg_trio.gateway.openai.responses_schemas import ResponseObject, ResponsesRequest
from smg_trio.gateway.openai.responses_store import ResponseStoreLike, StoredResponse
from smg_trio.gateway.openai.schemas import ChatCompletionRequest
from smg_trio.gateway.openai.textgen import ChoiceCollector, LogprobRun, TextDelta
from smg_trio.parsers.tools import ToolCallDelta
from smg_trio.tokenizer import Tokenizer

__all__ = ["BUILTIN_TOOLS", "ResponsesApi", "to_chat_messages"]

_encode = msgspec.json.encode

#: OpenAI's built-in tools: a 400 naming the type (only function tools run here).
BUILTIN_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "computer_use_preview",
        "computer_use",
        "code_interpreter",
        "mcp",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "custom",
    }
)


def _bad(message: str, param: str, code: str = "invalid_value") -> ValidationError:
    return ValidationError(message, param=param, code=code)


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of parts", param, "invalid_type")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise _bad(f"content part type {kind!r} is not supported", f"{param}[{j}].type")
        if not isinstance(part.get("text"), str):
            raise _bad(
                f"text is required: a {kind!r} part needs a string text",
                f"{param}[{j}].text",
                "invalid_type",
            )
        parts.append(part["text"])
    return "".join(parts)


def to_chat_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as chat messages: messages (``input_text``/``output_text`` parts),
    ``function_call`` (an assistant turn's tool call) and ``function_call_output`` (a tool
    message) items; ``reasoning`` items are accepted and not rendered (templates drop past
    reasoning). Raises ``ValidationError`` (400 naming the item) for any other item."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise _bad("input must not be empty", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"role {role!r} is not supported", f"{param}.role")
            text = _content_text(item.get("content"), f"{param}.content")
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "")
            if not isinstance(name, str) or not isinstance(args, str):
                raise _bad("a function_call needs a string name and arguments", param)
            call = {
                "id": item.get("call_id") or new_call_id("call_"),
                "type": "function",
                "function": {"name": name, "arguments": args or "{}"},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = _content_text(output, f"{param}.output")
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad("a function_call_output needs a call_id", f"{param}.call_id")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise _bad(f"input item type {kind!r} is not supported", f"{param}.type")
    if not out:  # only reasoning items: nothing to render
        raise _bad(
            "input must contain a message, function_call or function_call_output item "
            "(reasoning items are not rendered)",
            "input",
        )
    return out


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            what = "built-in tool" if kind in BUILTIN_TOOLS else "tool type"
            raise _bad(f"{what} {kind!r} is not supported (function tools only)", f"tools[{i}]")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(
        f"tool_choice {choice.get('type')!r} is not supported (auto, none, required or a function)",
        "tool_choice",
    )


#: OpenAI's bounds on ``metadata``: it is echoed and kept in the store with every response,
#: so an unbounded one would let a client fill memory (1000 stored responses x the body limit).
METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512


def _check_metadata(metadata: dict[str, Any] | None) -> None:
    """OpenAI's rule: at most 16 pairs, string keys of at most 64 characters, string values
    of at most 512."""
    if not metadata:
        return
    if len(metadata) > METADATA_MAX_PAIRS:
        raise _bad(
            f"metadata has {len(metadata)} pairs; at most {METADATA_MAX_PAIRS} are allowed",
            "metadata",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise _bad(f"metadata keys are at most {METADATA_MAX_KEY} characters", "metadata")
        if not isinstance(value, str):
            raise _bad(f"metadata[{key!r}] must be a string", "metadata", "invalid_type")
        if len(value) > METADATA_MAX_VALUE:
            raise _bad(f"metadata values are at most {METADATA_MAX_VALUE} characters", "metadata")


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (a structured-output constraint)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format must be an object with a 'type'", "text.format", "invalid_type")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise _bad(f"text.format.type {kind!r} is not supported", "text.format.type")


@attrs.frozen
class ResponsesApi:
    """``POST /v1/responses`` over ``store`` (``None``: nothing is stored or found)."""

    store: ResponseStoreLike | None = None
    #: Where ``background: true`` responses run (``None``: refused with a 400).
    background: BackgroundResponses | None = None
    name = "responses"
    id_prefix = "resp_"
    #: Its responses are stored objects: their ids are the server's, never the client's.
    server_ids = True
    body_type = ResponsesRequest

    def check(
        self, body: ResponsesRequest, served: ServedModel, config: GatewayHttpConfig
    ) -> ResponsesDraft:
        """The chat request this is (with the stored conversation before it)."""
        if body.background:
            if self.background is None or self.store is None:
                raise _bad(
                    "background responses are not available here (no responses store)",
                    "background",
                    "unsupported_field",
                )
            if body.store is False:  # vLLM 0.32's rule and words
                raise _bad("background can only be used when `store` is true", "background")
        if body.n not in (None, 1):
            raise _bad(
                "n is not supported: a response has one output (send one request per output)",
                "n",
                "unsupported_field",
            )
        if body.truncation not in (None, "disabled"):
            raise _bad("truncation 'auto' is not supported", "truncation", "unsupported_field")
        _check_metadata(body.metadata)
        history: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            entry = None if self.store is None else self.store.get(body.previous_response_id)
            if entry is None:
                raise ValidationError(
                    f"Previous response with id '{body.previous_response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = entry.history()
        turn = to_chat_messages(body.input)
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        effort = (body.reasoning or {}).get("effort")
        logprobs = "message.output_text.logprobs" in (body.include or ())
        chat = ChatCompletionRequest(
            model=body.model,
            messages=[*system, *history, *turn],
            logprobs=logprobs,
            top_logprobs=(body.top_logprobs or 0) if logprobs else None,
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            stream=bool(body.stream),
            tools=_chat_tools(body.tools),
            tool_choice=_chat_tool_choice(body.tool_choice),
            parallel_tool_calls=body.parallel_tool_calls,
            response_format=_response_format(body.text),
            reasoning_effort=effort,  # vLLM: a template variable, with enable_thinking
            cache_salt=body.cache_salt,
            include_reasoning=body.include_reasoning,
        )
        ctx, mot = served.max_model_len, body.max_output_tokens
        if mot is not None and mot > ctx:  # vLLM 0.32's renderer check, under this API's name
            raise _bad(
                f"max_output_tokens={mot} cannot be greater than max_model_len={ctx}. "
                "Please request fewer output tokens.",
                "max_output_tokens",
            )
        try:
            draft = CHAT.check(chat, served, config)
        except ValidationError as exc:
            raise needs_flags(exc, 'tool_choice "required", a named function and "none"') from None
        store = self.store if body.store is not False else None
        background = self.background if body.background else None
        return ResponsesDraft(draft, body, [*history, *turn], store, background)


@attrs.frozen
class ResponsesDraft:
    """A checked Responses request: the chat draft it wraps."""

    chat: ChatDraft
    body: ResponsesRequest
    history: list[dict[str, Any]]
    store: ResponseStoreLike | None
    background: BackgroundResponses | None = None

    def tokenize(self) -> tuple[str, list[int]]:
        return self.chat.tokenize()

    def build(self, tokens: tuple[str, list[int]], ids: ResponseIds) -> ResponsesJob:
        job = self.chat.build(tokens, ids)
        return ResponsesJob(job, self.body, self.history, self.store, self.background)


def _item_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


@attrs.frozen
class ResponsesJob(ChatJobView):
    """A planned Responses request (see :class:`~smg_trio.gateway.openai.api.Job`)."""

    chat: ChatJob
    body: ResponsesRequest
    history: list[dict[str, Any]]
    store: ResponseStoreLike | None
    #: Set for ``background: true``: the handler hands the job to :meth:`run_background`.
    background: BackgroundResponses | None = None
    answered: bool = False

    def renderer(self) -> ResponsesStreamRenderer:
        return ResponsesStreamRenderer(self)

    def response(
        self, status: str, output: list[dict[str, Any]], reasoning: str = ""
    ) -> ResponseObject:
        """The ``response`` object with ``output`` (usage once the choice finished)."""
        body = self.body
        pipeline = self.subs[0].pipeline
        usage = incomplete = None
        if status != "in_progress":
            tok: Tokenizer = self.chat.served.tokenizer
            out_tokens = pipeline.completion_tokens
            usage = {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": pipeline.cached_tokens or 0},
                "output_tokens": out_tokens,
                "output_tokens_details": {
                    "reasoning_tokens": min(len(tok.encode(reasoning)), out_tokens)
                    if reasoning
                    else 0
                },
                "total_tokens": self.prompt_tokens + out_tokens,
            }
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens"}
        return ResponseObject(
            id=self.chat.ids.response_id,
            created_at=self.chat.ids.created,
            model=self.chat.served.model_id,
            status=status,
            output=output,
            usage=usage,
            incomplete_details=incomplete,
            instructions=body.instructions,
            tools=body.tools or [],
            tool_choice=body.tool_choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls is not False,
            temperature=body.temperature,
            top_p=body.top_p,
            max_output_tokens=body.max_output_tokens,
            previous_response_id=body.previous_response_id,
            text=body.text or {"format": {"type": "text"}},
            reasoning=body.reasoning,
            store=self.store is not None,
            metadata=body.metadata or {},
            background=self.background is not None,
        )

    def put(self, status: str, error: dict[str, Any] | None = None) -> ResponseObject:
        """Store the response as ``status`` with no output yet (``queued``) or none at all
        (``cancelled``, ``failed``), keeping its conversation for ``previous_response_id``."""
        response = self.response(status, [])
        response.error = error
        if status == "queued":
            response.usage = None
        if self.store is not None:
            self.store.put(response.id, StoredResponse.encode(response, self.history))
        return response

    def status(self) -> str:
        """``incomplete`` when the output hit ``max_output_tokens`` (or the context)."""
        return "incomplete" if self.subs[0].pipeline.finish_reason == "length" else "completed"

    def finish(self, output: list[dict[str, Any]], reasoning: str) -> ResponseObject:
        """The final response; stored (with its conversation) when ``store`` is on."""
        response = self.response(self.status(), output, reasoning)
        if self.store is not None:
            said: dict[str, Any] = {"role": "assistant", "content": ""}
            for item in output:
                if item["type"] == "message":
                    said["content"] += "".join(p["text"] for p in item["content"])
                elif item["type"] == "function_call":
                    said.setdefault("tool_calls", []).append(
                        {
                            "id": item["call_id"],
                            "type": "function",
                            "function": {"name": item["name"], "arguments": item["arguments"]},
                        }
                    )
            self.store.put(response.id, StoredResponse.encode(response, [*self.history, said]))
        return response

    def logprobs(self, runs: list[LogprobRun]) -> list[dict[str, Any]]:
        """``output_text.logprobs`` of ``runs`` (vLLM's entries: token, logprob, bytes,
        top_logprobs), ``[]`` unless ``include`` asks for them."""
        k = self.chat.top_logprobs
        if k is None or not runs or self.chat.hide_reasoning:  # vLLM hides them with it
            return []
        entries = chat_logprobs(self.chat.served.tokenizer, merge_runs(runs), k).content
        out: list[dict[str, Any]] = msgspec.to_builtins(entries)
        return out

    def result(self, collected: ChoiceCollector | None) -> ResponseObject:
        """The response: ``reasoning``, ``message`` and ``function_call`` items."""
        assert collected is not None
        output: list[dict[str, Any]] = []
        reasoning = "".join(collected.reasoning[0])
        if reasoning and not self.chat.hide_reasoning:
            output.append(_reasoning_item(_item_id("rs_"), reasoning, "completed"))
        text = "".join(collected.text[0])
        calls = merge_calls(collected.tool_calls[0], "call_")
        if text or not calls:
            output.append(_message_item(_item_id("msg_"), text, "completed"))
            output[-1]["content"][0]["logprobs"] = self.logprobs(collected.logprobs[0])
        for call in calls:
            output.append(
                _call_item(_item_id("fc_"), call.id, call.name, call.arguments, "completed")
            )
        return self.finish(output, reasoning)


def _reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call_id: str, name: str, args: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }


class ResponsesStreamRenderer:
    """The Responses event stream: ``response.created`` and ``response.in_progress``, then
    per output item ``response.output_item.added``, its deltas
    (``response.reasoning_text.delta``, ``response.content_part.added`` and
    ``response.output_text.delta``, ``response.function_call_arguments.delta``), their
    ``.done`` events and ``response.output_item.done``, then ``response.completed`` (or
    ``response.incomplete``; ``response.failed`` after an error). No ``[DONE]``.

    Items come in the whole response's order: reasoning, the message, then the
    ``function_call`` items, sent when the reply ends (calls are the reply's end) with each
    call's argument fragments as the model wrote them."""

    done = b""

    def __init__(self, job: ResponsesJob) -> None:
        self._job = job
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open: str | None = None  # "reasoning", "message", "function_call"
        self._text: list[str] = []  # the open item's text or arguments
        self._reasoning: list[str] = []  # all reasoning text (for reasoning_tokens)
        self._calls: list[ToolCallDelta] = []  # sent when the reply ends
        self._runs: list[LogprobRun] = []  # the open message's logprobs (with include)

    def _event(self, kind: str, payload: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(payload) + b"\n\n"

    def _response_event(self, kind: str, response: ResponseObject) -> bytes:
        return self._event(kind, {"response": msgspec.to_builtins(response)})

    def start(self) -> bytes:
        first = self._job.response("in_progress", [])
        return self._response_event("response.created", first) + self._response_event(
            "response.in_progress", first
        )

    @property
    def _index(self) -> int:
        return len(self._output) - 1

    def _close(self) -> bytes:
        kind, self._open = self._open, None
        if kind is None:
            return b""
        item = self._output[-1]
        text = "".join(self._text)
        self._text = []
        where = {"item_id": item["id"], "output_index": self._index}
        out = b""
        if kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            out = self._event(
                "response.reasoning_text.done", {**where, "content_index": 0, "text": text}
            )
        elif kind == "message":
            part = _text_part(text)
            part["logprobs"] = self._job.logprobs(self._runs)
            self._runs = []
            item["content"] = [part]
            out = self._event(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": part["logprobs"]},
            ) + self._event(
                "response.content_part.done", {**where, "content_index": 0, "part": part}
            )
        else:
            item["arguments"] = text
            out = self._event(
                "response.function_call_arguments.done",
                {**where, "name": item["name"], "arguments": text},
            )
        item["status"] = "completed"
        return out + self._event(
            "response.output_item.done", {"output_index": self._index, "item": item}
        )

    def _begin(self, kind: str, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._open = kind
        self._output.append(item)
        added = {"output_index": self._index, "item": {**item}}
        out += self._event("response.output_item.added", added)
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            where = {"item_id": item["id"], "output_index": self._index, "content_index": 0}
            out += self._event("response.content_part.added", {**where, "part": part})
        return out

    def delta(self, sub: SubRequest, delta: TextDelta) -> bytes:
        out: list[bytes] = []
        if delta.reasoning and self._job.chat.hide_reasoning:
            self._reasoning.append(delta.reasoning)  # counted in usage, never sent
        elif delta.reasoning:
            if self._open != "reasoning":
                out.append(
                    self._begin("reasoning", _reasoning_item(_item_id("rs_"), None, "in_progress"))
                )
            self._text.append(delta.reasoning)
            self._reasoning.append(delta.reasoning)
            item_id = self._output[-1]["id"]
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    {
                        "item_id": item_id,
                        "output_index": self._index,
                        "content_index": 0,
                        "delta": delta.reasoning,
                    },
                )
            )
        if delta.text:
            if self._open != "message":
                out.append(
                    self._begin("message", _message_item(_item_id("msg_"), None, "in_progress"))
                )
            self._text.append(delta.text)
            runs = [delta.logprobs] if delta.logprobs is not None and len(delta.logprobs) else []
            self._runs.extend(runs)
            out.append(
                self._event(
                    "response.output_text.delta",
                    {
                        "item_id": self._output[-1]["id"],
                        "output_index": self._index,
                        "content_index": 0,
                        "delta": delta.text,
                        "logprobs": self._job.logprobs(runs),
                    },
                )
            )
        self._calls.extend(delta.tool_calls)
        return b"".join(out)

    def _function_calls(self) -> bytes:
        """The ``function_call`` items, after the reasoning and the message as in the whole
        response: each call's argument fragments as the model wrote them, then ``.done``."""
        out: list[bytes] = []
        fragments: dict[int, list[str]] = {}
        for d in self._calls:
            fragments.setdefault(d.index, []).append(d.arguments)
        for call in merge_calls(self._calls, "call_"):
            item = _call_item(_item_id("fc_"), call.id, call.name, "", "in_progress")
            out.append(self._begin("function_call", item))
            for fragment in fragments[call.index]:
                if fragment:
                    self._text.append(fragment)
                    where = {"item_id": item["id"], "output_index": self._index}
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta", {**where, "delta": fragment}
                        )
                    )
        return b"".join(out)

    def end(self) -> bytes:
        out = self._close() + self._function_calls()
        out += self._close()
        if not self._output:  # nothing generated: one empty message, as the whole result has
            out += self._begin("message", _message_item(_item_id("msg_"), None, "in_progress"))
            out += self._close()
        response = self._job.finish(self._output, "".join(self._reasoning))
        kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
        return out + self._response_event(kind, response)

    def error_event(self, exc: BaseException) -> bytes:
        err = to_api_error(exc)
        failed = self._job.response("failed", self._output)
        failed.error = {"code": err.detail.code or "server_error", "message": err.detail.message}
        return self._response_event("response.failed", failed)
