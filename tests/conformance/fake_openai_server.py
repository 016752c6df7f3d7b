"""A tiny deterministic OpenAI-compatible ASGI server, with switchable faults, for runner self-tests."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MODEL = "fake-model"
VOCAB = 50_000
LONG = 100  # max_tokens at or above this: slow generation that watches for disconnects
TOKEN_DELAY_S = 0.005  # pace of long generations (a slow engine), not synchronisation
SCRIPT = [
    "One",
    ",",
    " two",
    ",",
    " three",
    ",",
    " four",
    ",",
    " five",
    ",",
    " six",
    ",",
    " seven",
    ".",
]
ROLES = {"system", "developer", "user", "assistant", "tool"}

FAULTS = frozenset(
    {
        "bad_json_500",  # broken JSON -> text/plain 500 (B18)
        "content_type_500",  # missing/wrong Content-Type -> text/plain 500 (B19)
        "double_done",  # every stream ends with two [DONE] frames
        "drop_last_stream_token",  # streams lose their final token (B01)
        "error_detail_only",  # errors are {"detail": ...}, not the OpenAI envelope
        "index_all_zero",  # n>1 stream chunks all carry index 0 (B04)
        "logprobs_null",  # chat logprobs silently null (B15)
        "max_tokens_zero_ok",  # max_tokens 0 accepted (B16)
        "n2_prompt_per_choice",  # prompt_tokens counted once per choice
        "no_request_id",  # x-request-id not echoed
        "role_missing",  # stream never sends delta.role
        "slow_models",  # GET /v1/models never answers
        "stream_unknown_model_200",  # unknown model + stream -> SSE 200 with an error event (B20)
        "usage_total_off",  # total_tokens = prompt + completion + 1
        "wedge_after_long",  # a long request is never aborted and wedges the engine (B22)
        "responses_seq_gap",  # Responses stream events skip a sequence_number
        "messages_openai_errors",  # /v1/messages errors use OpenAI's envelope
    }
)
#: The other API shapes the fake serves (JSON in, a whole reply or a named-event stream out).
APIS = ("/v1/responses", "/v1/messages", "/tokenize", "/detokenize")


class HttpError(Exception):
    """An error reply: status, message, param."""

    def __init__(
        self, status: int, message: str, param: str | None = None, anthropic: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.anthropic = anthropic


class FakeOpenAI:
    """ASGI app: /v1/models, /v1/chat/completions, /v1/completions, /v1/responses,
    /v1/messages, /tokenize and /detokenize, with optional faults."""

    def __init__(self, faults: frozenset[str] = frozenset(), model: str = MODEL) -> None:
        unknown = faults - FAULTS
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self.faults = faults
        self.model = model
        self.wedged = False
        self._ids = itertools.count()

    # -- ASGI plumbing -----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        extra: list[tuple[bytes, bytes]] = []
        rid = headers.get("x-request-id")
        if rid and "no_request_id" not in self.faults:
            extra.append((b"x-request-id", rid.encode()))
        try:
            await self._route(scope, headers, receive, send, extra)
        except HttpError as exc:
            await self._error(send, exc, extra)

    async def _start(
        self, send: Send, status: int, content_type: str, extra: list[tuple[bytes, bytes]]
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type.encode()), *extra],
            }
        )

    async def _json(
        self, send: Send, status: int, obj: object, extra: list[tuple[bytes, bytes]]
    ) -> None:
        await self._start(send, status, "application/json", extra)
        await send({"type": "http.response.body", "body": json.dumps(obj).encode()})

    async def _plain(self, send: Send, status: int, text: str) -> None:
        await self._start(send, status, "text/plain", [])
        await send({"type": "http.response.body", "body": text.encode()})

    async def _error(self, send: Send, exc: HttpError, extra: list[tuple[bytes, bytes]]) -> None:
        if "error_detail_only" in self.faults:
            await self._json(send, exc.status, {"detail": exc.message}, extra)
            return
        if exc.anthropic and "messages_openai_errors" not in self.faults:
            error = {"type": "invalid_request_error", "message": exc.message}
            await self._json(send, exc.status, {"type": "error", "error": error}, extra)
            return
        kind = "NotFoundError" if exc.status == 404 else "invalid_request_error"
        error = {"message": exc.message, "type": kind, "param": exc.param, "code": exc.status}
        await self._json(send, exc.status, {"error": error}, extra)

    # -- routing and validation --------------------------------------------------------------

    async def _route(
        self,
        scope: Scope,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        extra: list[tuple[bytes, bytes]],
    ) -> None:
        method, path = scope["method"], scope["path"]
        if method == "GET" and path == "/v1/models":
            if "slow_models" in self.faults:
                await trio.sleep_forever()
            data = [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}]
            await self._json(send, 200, {"object": "list", "data": data}, extra)
            return
        if method == "POST" and path in APIS:
            await self._api(path, await _read_body(receive), send, extra)
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            raise HttpError(404, f"no route {method} {path}")
        raw = await _read_body(receive)
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            if "content_type_500" in self.faults:
                await self._plain(send, 500, "Internal Server Error")
                return
            raise HttpError(415, "Content-Type must be application/json")
        try:
            body = json.loads(raw)
        except ValueError:
            if "bad_json_500" in self.faults:
                await self._plain(send, 500, "Internal Server Error")
                return
            raise HttpError(400, "JSON syntax error") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the request body must be a JSON object")
        chat = path == "/v1/chat/completions"
        req = self._validate(body, chat=chat)
        if body["model"] != self.model:
            if req["stream"] and "stream_unknown_model_200" in self.faults:
                await self._start(send, 200, "text/event-stream", extra)
                err = {"error": {"message": "model not found", "type": "NotFoundError"}}
                await _frames(send, [json.dumps(err), "[DONE]"], last=True)
                return
            raise HttpError(404, f"The model '{body['model']}' does not exist.", "model")
        if self.wedged:
            raise HttpError(503, "engine busy with an earlier request")
        if req["max_tokens"] >= LONG and "wedge_after_long" in self.faults:
            self.wedged = True
        await self._generate(req, chat=chat, receive=receive, send=send, extra=extra)

    def _validate(self, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        if not isinstance(body.get("model"), str):
            raise HttpError(400, "model is required", "model")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HttpError(400, "messages must be a non-empty list", "messages")
            for m in messages:
                if not isinstance(m, dict) or m.get("role") not in ROLES:
                    raise HttpError(400, f"invalid message role in {m!r}", "messages")
                if m["role"] != "assistant" and not isinstance(m.get("content"), str | list):
                    raise HttpError(400, "message content is required", "messages")
            prompt_tokens = sum(len(str(m.get("content")).split()) + 3 for m in messages) + 1
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise HttpError(400, "prompt must be a non-empty string", "prompt")
            prompt_tokens = len(prompt.split())
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = 16
        zero_ok = "max_tokens_zero_ok" in self.faults and max_tokens == 0
        if not _is_int(max_tokens) or (max_tokens < 1 and not zero_ok):
            raise HttpError(400, "max_tokens must be at least 1", "max_tokens")
        n = body.get("n", 1)
        if not _is_int(n) or not 1 <= n <= 10:
            raise HttpError(400, "n must be between 1 and 10", "n")
        _range(body, "temperature", 0.0, 2.0)
        _range(body, "top_p", 1e-9, 1.0)
        logprobs, top = body.get("logprobs"), body.get("top_logprobs")
        if chat:
            if top is not None and logprobs is not True:
                raise HttpError(400, "top_logprobs requires logprobs: true", "top_logprobs")
            if top is not None and (not _is_int(top) or not 0 <= top <= 20):
                raise HttpError(400, "top_logprobs must be between 0 and 20", "top_logprobs")
        elif logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= 5):
            raise HttpError(400, "logprobs must be between 0 and 5", "logprobs")
        bias = body.get("logit_bias") or {}
        if not isinstance(bias, dict) or any(
            not k.isdigit() or int(k) >= VOCAB for k in bias if isinstance(k, str)
        ):
            raise HttpError(
                400, "logit_bias keys must be token ids in the vocabulary", "logit_bias"
            )
        options = body.get("stream_options") or {}
        return {
            "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "n": n,
            "stream": body.get("stream") is True,
            "include_usage": isinstance(options, dict) and options.get("include_usage") is True,
            "logprobs": logprobs,
            "top": top or 0,
            "model": body["model"],
        }

    # -- generation --------------------------------------------------------------------------

    async def _generate(
        self,
        req: dict[str, Any],
        *,
        chat: bool,
        receive: Receive,
        send: Send,
        extra: list[tuple[bytes, bytes]],
    ) -> None:
        long = req["max_tokens"] >= LONG
        run = self._stream if req["stream"] else self._complete
        if not long:
            await run(req, chat, send, extra)
            return
        async with trio.open_nursery() as nursery:
            if "wedge_after_long" not in self.faults:
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            await run(req, chat, send, extra)
            nursery.cancel_scope.cancel()

    def _tokens(self, index: int, max_tokens: int) -> tuple[list[str], str]:
        if max_tokens >= LONG:
            return [f" w{k}" for k in range(max_tokens)], "length"
        script = SCRIPT if index == 0 else [t.upper() for t in SCRIPT]
        return script[:max_tokens], "length" if max_tokens < len(script) else "stop"

    def _usage(self, req: dict[str, Any], completion: int) -> dict[str, int]:
        prompt = req["prompt_tokens"] * (req["n"] if "n2_prompt_per_choice" in self.faults else 1)
        total = prompt + completion + (1 if "usage_total_off" in self.faults else 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}

    async def _complete(
        self, req: dict[str, Any], chat: bool, send: Send, extra: list[tuple[bytes, bytes]]
    ) -> None:
        choices, completion = [], 0
        for i in range(req["n"]):
            toks, finish = self._tokens(i, req["max_tokens"])
            if req["max_tokens"] >= LONG:
                for _ in toks:
                    await trio.sleep(TOKEN_DELAY_S)
            completion += len(toks)
            text = "".join(toks)
            if chat:
                choice: dict[str, Any] = {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": self._chat_logprobs(req, toks),
                    "finish_reason": finish,
                }
            else:
                choice = {
                    "index": i,
                    "text": text,
                    "logprobs": _completion_logprobs(req, toks),
                    "finish_reason": finish,
                }
            choices.append(choice)
        body = {
            "id": f"fake-{next(self._ids)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": req["model"],
            "choices": choices,
            "usage": self._usage(req, completion),
        }
        await self._json(send, 200, body, extra)

    def _chat_logprobs(self, req: dict[str, Any], toks: list[str]) -> dict[str, Any] | None:
        if req["logprobs"] is not True or "logprobs_null" in self.faults:
            return None

        def entry(tok: str) -> dict[str, Any]:
            return {"token": tok, "logprob": -0.25, "bytes": list(tok.encode())}

        alts = [entry(f"alt{k}") for k in range(req["top"])]
        return {"content": [{**entry(t), "top_logprobs": alts} for t in toks]}

    async def _stream(
        self, req: dict[str, Any], chat: bool, send: Send, extra: list[tuple[bytes, bytes]]
    ) -> None:
        await self._start(send, 200, "text/event-stream; charset=utf-8", extra)
        head = {
            "id": f"fake-{next(self._ids)}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": req["model"],
        }
        plans = [self._tokens(i, req["max_tokens"]) for i in range(req["n"])]
        if "drop_last_stream_token" in self.faults:
            plans = [(toks[:-1], fin) for toks, fin in plans]

        def chunk(index: int, piece: str | None, finish: str | None, role: bool = False) -> str:
            out_index = 0 if "index_all_zero" in self.faults else index
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
                if piece is not None:
                    delta["content"] = piece
                choice: dict[str, Any] = {"index": out_index, "delta": delta}
            else:
                choice = {"index": out_index, "text": piece or "", "logprobs": None}
            choice["finish_reason"] = finish
            return json.dumps({**head, "choices": [choice]})

        if chat and "role_missing" not in self.faults:
            await _frames(send, [chunk(i, None, None, role=True) for i in range(req["n"])])
        completion = 0
        for step in range(max(len(toks) for toks, _ in plans)):
            order = range(req["n"]) if step % 2 == 0 else reversed(range(req["n"]))
            for i in order:
                toks = plans[i][0]
                if step < len(toks):
                    completion += 1
                    await _frames(send, [chunk(i, toks[step], None)])
            if req["max_tokens"] >= LONG:
                await trio.sleep(TOKEN_DELAY_S)
        await _frames(send, [chunk(i, None, plans[i][1]) for i in range(req["n"])])
        tail = []
        if req["include_usage"]:
            if "drop_last_stream_token" not in self.faults:
                completion = sum(
                    len(self._tokens(i, req["max_tokens"])[0]) for i in range(req["n"])
                )
            tail.append(json.dumps({**head, "choices": [], "usage": self._usage(req, completion)}))
        tail.append("[DONE]")
        if "double_done" in self.faults:
            tail.append("[DONE]")
        await _frames(send, tail, last=True)

    # -- the other API shapes ----------------------------------------------------------------

    async def _api(
        self, path: str, raw: bytes, send: Send, extra: list[tuple[bytes, bytes]]
    ) -> None:
        anthropic = path == "/v1/messages"
        try:
            body = json.loads(raw)
        except ValueError:
            raise HttpError(400, "JSON syntax error", anthropic=anthropic) from None
        if not isinstance(body, dict):
            raise HttpError(400, "the request body must be a JSON object", anthropic=anthropic)
        if path == "/tokenize":
            tokens = list(str(body.get("prompt", "")).encode())
            out = {"count": len(tokens), "max_model_len": 4096, "tokens": tokens}
            await self._json(send, 200, out, extra)
            return
        if path == "/detokenize":
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(_is_int(t) and 0 <= t < 256 for t in ids):
                raise HttpError(400, "tokens must be ids in the vocabulary", "tokens")
            await self._json(send, 200, {"prompt": bytes(ids).decode("utf-8", "replace")}, extra)
            return
        if body.get("model") != self.model:
            raise HttpError(404, "model not found", "model", anthropic=anthropic)
        limit = body.get("max_tokens" if anthropic else "max_output_tokens", 16)
        if anthropic and "max_tokens" not in body:
            raise HttpError(400, "max_tokens: Field required", anthropic=True)
        if not _is_int(limit) or limit < 1:
            raise HttpError(400, "the token limit must be at least 1", anthropic=anthropic)
        toks = SCRIPT[:limit]
        cut = limit < len(SCRIPT)
        events = _messages(self, body, toks, cut) if anthropic else _responses(self, toks, cut)
        if body.get("stream") is True:
            await self._start(send, 200, "text/event-stream", extra)
            if anthropic:
                events = [e for e in events if e["type"] != "message"]
            else:
                events = [e for e in events if e["type"] != "response"]
                for seq, e in enumerate(events):
                    gap = "responses_seq_gap" in self.faults and seq > 2
                    e["sequence_number"] = seq + (1 if gap else 0)
            data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
            await send({"type": "http.response.body", "body": data.encode()})
            return
        whole = next(e for e in events if e["type"] in ("message", "response"))
        if anthropic:
            await self._json(send, 200, whole, extra)
        else:
            await self._json(send, 200, whole["response"], extra)


def _messages(
    fake: FakeOpenAI, body: dict[str, Any], toks: list[str], cut: bool
) -> list[dict[str, Any]]:
    """The whole message (type ``message``) and its event stream."""
    text = "".join(toks)
    usage = {"input_tokens": 9, "output_tokens": len(toks)}
    reason = "max_tokens" if cut else "end_turn"
    msg = {
        "id": f"msg_{next(fake._ids)}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": text}],
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": usage,
    }
    start = {**msg, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    return [
        msg,
        {"type": "message_start", "message": start},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *[
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
            for t in toks
        ],
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": len(toks)},
        },
        {"type": "message_stop"},
    ]


def _responses(fake: FakeOpenAI, toks: list[str], cut: bool) -> list[dict[str, Any]]:
    """The whole response (type ``response``) and its event stream."""
    text = "".join(toks)
    rid, item_id = f"resp_{next(fake._ids)}", "msg_0"
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }
    status = "incomplete" if cut else "completed"
    response = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": fake.model,
        "status": status,
        "output": [item],
        "usage": {
            "input_tokens": 9,
            "output_tokens": len(toks),
            "total_tokens": 9 + len(toks),
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    first = {**response, "status": "in_progress", "output": [], "usage": None}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    return [
        {"type": "response", "response": response},
        {"type": "response.created", "response": first},
        {"type": "response.in_progress", "response": first},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
        *[{"type": "response.output_text.delta", **where, "delta": t} for t in toks],
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": f"response.{status}", "response": response},
    ]


def _completion_logprobs(req: dict[str, Any], toks: list[str]) -> dict[str, Any] | None:
    k = req["logprobs"]
    if k is None:
        return None
    offsets = list(itertools.accumulate([0, *(len(t) for t in toks[:-1])]))
    return {
        "tokens": toks,
        "token_logprobs": [-0.25] * len(toks),
        "top_logprobs": [{t: -0.25} if k else {} for t in toks],
        "text_offset": offsets if toks else [],
    }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _range(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise HttpError(400, f"{name} must be between {low:g} and {high:g}", name)


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _frames(send: Send, payloads: list[str], *, last: bool = False) -> None:
    data = "".join(f"data: {p}\n\n" for p in payloads).encode()
    await send({"type": "http.response.body", "body": data, "more_body": not last})


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def start_fake(nursery: trio.Nursery, faults: frozenset[str] = frozenset()) -> str:
    """Serve a fake on 127.0.0.1 (port 0) in ``nursery``; return its base URL."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.2
    config.accesslog = None
    config.errorlog = None
    app: Any = FakeOpenAI(
        faults
    )  # a plain ASGI callable; hypercorn's TypedDict scopes are stricter
    binds: list[str] = await nursery.start(partial(serve, app, config))
    return binds[0]
