"""Cases of the other API shapes: the Responses API, Anthropic Messages (with its error
envelope), and vLLM's tokenize/detokenize. A server that does not serve an endpoint (404) is
skipped, not failed: these are optional surfaces."""

from __future__ import annotations

import json
from typing import Any

from conformance.case import Case, CaseFailed, CaseSkipped, fail_if, register
from conformance.checks import is_int
from conformance.client import Context, Reply
from conformance.sse import SseDecoder

__all__ = ["CASES"]

CASES: list[Case] = []
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
PROMPT = "Count from one to twenty in words."
MAX = 12
STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use"})


def _served(reply: Reply, what: str) -> None:
    """Skip when the server does not serve this endpoint (404 with nothing asked of a model)."""
    if reply.status == 404:
        raise CaseSkipped(f"{what} is not served (404): {reply.snippet(120)!r}")


def _ok(reply: Reply, what: str) -> dict[str, Any]:
    _served(reply, what)
    if reply.status != 200:
        raise CaseFailed(f"{what}: expected HTTP 200, got {reply.status}: {reply.snippet()!r}")
    if not reply.content_type.startswith("application/json"):
        raise CaseFailed(f"{what}: Content-Type is {reply.content_type!r}, not application/json")
    return reply.json_object()


def named_events(reply: Reply, what: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON payloads of a named-event stream (``event: X`` + ``data: {"type": X}``), and
    the problems found: status, Content-Type, framing, an event name that is not the
    payload's ``type``, a ``[DONE]`` (these streams have none)."""
    _served(reply, what)
    if reply.status != 200:
        raise CaseFailed(f"{what}: expected HTTP 200, got {reply.status}: {reply.snippet()!r}")
    problems: list[str] = []
    if not reply.content_type.startswith("text/event-stream"):
        problems.append(f"{what}: Content-Type is {reply.content_type!r}, not text/event-stream")
    decoder = SseDecoder(named=True)
    payloads = decoder.feed(reply.body) + decoder.close()
    problems += decoder.problems
    names = [
        line.removeprefix("event: ")
        for line in reply.body.decode("utf-8", "replace").split("\n")
        if line.startswith("event: ")
    ]
    events: list[dict[str, Any]] = []
    for payload in payloads:
        if payload == "[DONE]":
            problems.append(f"{what}: a data: [DONE] frame (this API's streams have none)")
            continue
        try:
            value = json.loads(payload)
        except ValueError:
            problems.append(f"{what}: payload is not JSON: {payload[:120]!r}")
            continue
        if not isinstance(value, dict):
            problems.append(f"{what}: payload is not an object: {payload[:120]!r}")
            continue
        events.append(value)
    types = [e.get("type") for e in events]
    if names != types:
        problems.append(f"{what}: event names {names[:8]} differ from payload types {types[:8]}")
    if not events:
        raise CaseFailed(f"{what}: the stream carried no events; {problems}")
    return events, problems


def _usage_problems(usage: object, keys: tuple[str, str], limit: int) -> list[str]:
    if not isinstance(usage, dict):
        return [f"usage is not an object: {usage!r}"]
    out: list[str] = []
    for key in keys:
        if not is_int(usage.get(key)) or usage[key] < 0:
            out.append(f"usage.{key} is not a non-negative integer: {usage.get(key)!r}")
    produced = usage.get(keys[1])
    if is_int(produced) and produced > limit:
        out.append(f"usage.{keys[1]} {produced} exceeds the limit {limit}")
    return out


# -- Responses -------------------------------------------------------------------------------


def _responses_body(ctx: Context, **extra: Any) -> dict[str, Any]:
    body = {
        "model": ctx.model,
        "input": PROMPT,
        "temperature": 0,
        "max_output_tokens": MAX,
        "store": False,
    }
    body.update(extra)
    return body


def _output_text(response: dict[str, Any]) -> tuple[str, list[str]]:
    """The concatenated ``output_text`` of the message items, and shape problems."""
    output = response.get("output")
    if not isinstance(output, list):
        return "", [f"output is not a list: {output!r}"]
    problems: list[str] = []
    text = []
    for i, item in enumerate(output):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            problems.append(f"output[{i}] has no string type: {item!r}")
            continue
        if item["type"] != "message":
            continue
        if item.get("role") != "assistant":
            problems.append(f"output[{i}].role is {item.get('role')!r}, expected 'assistant'")
        for part in item.get("content") or []:
            if part.get("type") == "output_text":
                if not isinstance(part.get("text"), str):
                    problems.append(f"output[{i}] output_text without a string text")
                else:
                    text.append(part["text"])
    return "".join(text), problems


def _response_problems(body: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    if body.get("object") != "response":
        problems.append(f"object is {body.get('object')!r}, expected 'response'")
    if not isinstance(body.get("id"), str) or not body["id"]:
        problems.append(f"id is not a non-empty string: {body.get('id')!r}")
    if not is_int(body.get("created_at")):
        problems.append(f"created_at is not an integer: {body.get('created_at')!r}")
    if body.get("status") not in ("completed", "incomplete"):
        problems.append(f"status is {body.get('status')!r}, expected completed or incomplete")
    usage = body.get("usage")
    problems += _usage_problems(usage, ("input_tokens", "output_tokens"), MAX)
    counts: dict[str, Any] = usage if isinstance(usage, dict) else {}
    total, into, out = (counts.get(k) for k in ("total_tokens", "input_tokens", "output_tokens"))
    if is_int(total) and is_int(into) and is_int(out) and total != into + out:
        problems.append(f"usage.total_tokens {total} != input + output")
    return problems


@register(
    CASES,
    "responses_basic",
    "POST /v1/responses: a response object (id, created_at, status), message items with "
    "output_text, usage with input/output/total tokens",
    "OpenAI Responses API, the openai SDK's client.responses and the default model class of "
    "openai-agents; total_tokens = input + output; output_tokens within max_output_tokens.",
)
def responses_basic(ctx: Context) -> str:
    body = _ok(ctx.post_json(RESPONSES, _responses_body(ctx)), "responses")
    text, problems = _output_text(body)
    fail_if(_response_problems(body) + problems)
    return f"status={body['status']} text={text!r:.60}"


@register(
    CASES,
    "responses_stream",
    "streamed /v1/responses: named events, sequence_number 0, 1, 2..., created then "
    "in_progress first, completed/incomplete last, text deltas equal the final and the whole text",
    "The openai SDK's responses.stream parses these events and checks their order; a gap in "
    "sequence_number or a lost delta breaks the accumulated response.",
)
def responses_stream(ctx: Context) -> str:
    whole = _ok(ctx.post_json(RESPONSES, _responses_body(ctx)), "responses")
    whole_text, _ = _output_text(whole)
    events, problems = named_events(
        ctx.post_json(RESPONSES, _responses_body(ctx, stream=True)), "responses stream"
    )
    seqs = [e.get("sequence_number") for e in events]
    if seqs != list(range(len(events))):
        problems.append(f"sequence_number is {seqs[:12]}..., expected 0, 1, 2, ...")
    types = [e.get("type") for e in events]
    if types[:2] != ["response.created", "response.in_progress"]:
        problems.append(f"the stream starts {types[:2]}, expected created then in_progress")
    last = events[-1]
    if last.get("type") not in ("response.completed", "response.incomplete"):
        problems.append(f"the last event is {last.get('type')!r}, not response.completed")
    final = last.get("response") if isinstance(last.get("response"), dict) else {}
    assert isinstance(final, dict)
    deltas = "".join(
        str(e.get("delta", "")) for e in events if e.get("type") == "response.output_text.delta"
    )
    final_text, more = _output_text(final)
    problems += more + _response_problems(final)
    if deltas != final_text:
        problems.append(f"the deltas {deltas!r:.60} differ from the final text {final_text!r:.60}")
    if final_text != whole_text:
        problems.append(f"streamed {final_text!r:.60} differs from whole {whole_text!r:.60}")
    fail_if(problems)
    return f"{len(events)} events, text={final_text!r:.40}"


# -- Anthropic Messages ----------------------------------------------------------------------


def _messages_body(ctx: Context, **extra: Any) -> dict[str, Any]:
    body = {
        "model": ctx.model,
        "max_tokens": MAX,
        "temperature": 0,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    body.update(extra)
    return body


def _message_text(body: dict[str, Any]) -> tuple[str, list[str]]:
    problems: list[str] = []
    if body.get("type") != "message":
        problems.append(f"type is {body.get('type')!r}, expected 'message'")
    if body.get("role") != "assistant":
        problems.append(f"role is {body.get('role')!r}, expected 'assistant'")
    if not isinstance(body.get("id"), str) or not body["id"]:
        problems.append(f"id is not a non-empty string: {body.get('id')!r}")
    if body.get("stop_reason") not in STOP_REASONS:
        problems.append(f"stop_reason {body.get('stop_reason')!r} not in {sorted(STOP_REASONS)}")
    content = body.get("content")
    if not isinstance(content, list):
        return "", [*problems, f"content is not a list: {content!r}"]
    text = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]
    problems += _usage_problems(body.get("usage"), ("input_tokens", "output_tokens"), MAX)
    return "".join(text), problems


@register(
    CASES,
    "messages_basic",
    "POST /v1/messages: a message (id, type, role), content blocks, an Anthropic stop_reason, "
    "usage with input_tokens and output_tokens",
    "Anthropic Messages API, for Claude clients and coding tools pointed at a local model "
    "(the anthropic SDK validates these fields).",
)
def messages_basic(ctx: Context) -> str:
    body = _ok(ctx.post_json(MESSAGES, _messages_body(ctx)), "messages")
    text, problems = _message_text(body)
    fail_if(problems)
    return f"stop_reason={body['stop_reason']} text={text!r:.60}"


@register(
    CASES,
    "messages_stream",
    "streamed /v1/messages: message_start first, message_stop last, message_delta with the "
    "stop_reason before it, balanced content blocks, text deltas equal the whole text",
    "The anthropic SDK's messages.stream accumulates blocks by index from these events; an "
    "unbalanced block or a lost delta corrupts the final message.",
)
def messages_stream(ctx: Context) -> str:
    whole = _ok(ctx.post_json(MESSAGES, _messages_body(ctx)), "messages")
    whole_text, _ = _message_text(whole)
    events, problems = named_events(
        ctx.post_json(MESSAGES, _messages_body(ctx, stream=True)), "messages stream"
    )
    types = [e.get("type") for e in events if e.get("type") != "ping"]
    if types[:1] != ["message_start"] or types[-2:] != ["message_delta", "message_stop"]:
        problems.append(
            f"event order {types[:3]}...{types[-2:]}: expected message_start, ..., "
            "message_delta, message_stop"
        )
    open_block: int | None = None
    started = 0
    text: list[str] = []
    for e in events:
        kind = e.get("type")
        if kind == "content_block_start":
            if open_block is not None or e.get("index") != started:
                problems.append(f"content_block_start index {e.get('index')} out of order")
            open_block, started = e.get("index"), started + 1
        elif kind == "content_block_delta":
            if e.get("index") != open_block:
                problems.append(f"a delta for block {e.get('index')}, open is {open_block}")
            delta = e.get("delta") or {}
            if delta.get("type") == "text_delta":
                text.append(str(delta.get("text", "")))
        elif kind == "content_block_stop":
            if e.get("index") != open_block:
                problems.append(f"content_block_stop for {e.get('index')}, open is {open_block}")
            open_block = None
    if open_block is not None:
        problems.append(f"block {open_block} never stopped")
    reason = next((e for e in events if e.get("type") == "message_delta"), {}).get("delta", {})
    if reason.get("stop_reason") not in STOP_REASONS:
        problems.append(f"message_delta stop_reason {reason.get('stop_reason')!r}")
    if "".join(text) != whole_text:
        problems.append(f"streamed {''.join(text)!r:.60} differs from whole {whole_text!r:.60}")
    fail_if(problems)
    return f"{len(events)} events, {started} block(s)"


@register(
    CASES,
    "messages_error_envelope",
    "/v1/messages without max_tokens -> 400 in Anthropic's envelope "
    "{type: error, error: {type: invalid_request_error, message}} naming max_tokens",
    "Anthropic's API requires max_tokens; the anthropic SDK reads errors from that envelope "
    "(an OpenAI-shaped error leaves the client with no message).",
)
def messages_error_envelope(ctx: Context) -> str:
    body = _messages_body(ctx)
    del body["max_tokens"]
    reply = ctx.post_json(MESSAGES, body)
    _served(reply, "messages")
    problems: list[str] = []
    if reply.status != 400:
        problems.append(f"expected HTTP 400, got {reply.status}: {reply.snippet()!r}")
    out = reply.json()
    error = out.get("error") if isinstance(out, dict) else None
    if not isinstance(out, dict) or out.get("type") != "error" or not isinstance(error, dict):
        raise CaseFailed(f"not Anthropic's error envelope: {reply.snippet()!r}")
    if error.get("type") != "invalid_request_error":
        problems.append(f"error.type is {error.get('type')!r}, expected invalid_request_error")
    message = error.get("message")
    if not isinstance(message, str) or "max_tokens" not in message:
        problems.append(f"error.message does not name max_tokens: {message!r}")
    fail_if(problems)
    return f"400: {message!r:.60}"


# -- tokenize / detokenize -------------------------------------------------------------------


@register(
    CASES,
    "tokenize_detokenize",
    "POST /tokenize {prompt} -> {tokens, count, max_model_len}; /detokenize of those ids gives "
    "the prompt back; an id outside the vocabulary is a 400 in the OpenAI envelope",
    "vLLM's tokenize/detokenize endpoints (clients count tokens and budget context with them); "
    "an out-of-vocabulary id must be a client error, not a 500.",
)
def tokenize_detokenize(ctx: Context) -> str:
    asked = {"model": ctx.model, "prompt": PROMPT, "add_special_tokens": False}
    body = _ok(ctx.post_json(TOKENIZE, asked), "tokenize")
    problems: list[str] = []
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(is_int(t) for t in tokens):
        raise CaseFailed(f"tokens is not a non-empty list of ids: {tokens!r}")
    if body.get("count") != len(tokens):
        problems.append(f"count {body.get('count')!r} != len(tokens) {len(tokens)}")
    if not is_int(body.get("max_model_len")):
        problems.append(f"max_model_len is not an integer: {body.get('max_model_len')!r}")
    back = _ok(ctx.post_json(DETOKENIZE, {"model": ctx.model, "tokens": tokens}), "detokenize")
    if not isinstance(back.get("prompt"), str) or back["prompt"].strip() != PROMPT:
        problems.append(f"detokenize gave {back.get('prompt')!r}, expected {PROMPT!r}")
    bad = ctx.post_json(DETOKENIZE, {"model": ctx.model, "tokens": [2**31 - 1]})
    if bad.status != 400:
        problems.append(f"an id outside the vocabulary: HTTP {bad.status}, expected 400")
    else:
        err = bad.json()
        if not isinstance(err, dict) or not isinstance(err.get("error"), dict):
            problems.append(f"the 400 lacks the OpenAI envelope: {bad.snippet()!r}")
    fail_if(problems)
    return f"{len(tokens)} tokens round-trip"
