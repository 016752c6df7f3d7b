"""Loud-rejection cases: invalid parameters, unknown models, malformed bodies and content types."""

from __future__ import annotations

from typing import Any

from conformance.case import Case, CaseFailed, fail_if, register
from conformance.cases_http import CHAT, ok_json
from conformance.checks import error_problems
from conformance.client import Context, Reply, json_bytes

__all__ = ["CASES"]

CASES: list[Case] = []
ANY_4XX = frozenset(range(400, 500))
UNKNOWN_MODEL = "conformance-no-such-model"


def _message(reply: Reply) -> str:
    try:
        body = reply.json()
    except CaseFailed:
        return reply.snippet()
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return reply.snippet()


def _rejection(
    name: str,
    behaviour: str,
    why: str,
    extra: dict[str, Any],
    field_name: str,
    *,
    require_named: bool = False,
    require_param: bool = False,
    drop: tuple[str, ...] = (),
) -> None:
    def run(ctx: Context) -> str:
        body = ctx.chat_body(**extra)
        for key in drop:
            body.pop(key, None)
        reply = ctx.post_json(CHAT, body)
        problems, note = error_problems(
            reply,
            {400},
            field_name=field_name,
            require_named=require_named,
            require_param=require_param,
        )
        fail_if(problems)
        return f"400 {_message(reply)!r}" + (f" (note: {note})" if note else "")

    register(CASES, name, behaviour, why)(run)


_rejection(
    "reject_top_logprobs_without_logprobs",
    "chat top_logprobs:2 without logprobs:true -> 400 naming top_logprobs",
    "B15b: OpenAI requires logprobs:true whenever top_logprobs is set; silently ignoring it "
    "hides a client bug.",
    {"top_logprobs": 2},
    "top_logprobs",
    require_named=True,
)
_rejection(
    "reject_top_logprobs_21",
    "chat logprobs:true, top_logprobs:21 -> 400 naming top_logprobs",
    "B15c: OpenAI's range is 0..20.",
    {"logprobs": True, "top_logprobs": 21},
    "top_logprobs",
    require_named=True,
)
_rejection(
    "reject_max_tokens_zero",
    "chat max_tokens:0 -> 400 with error.param 'max_tokens'",
    "B16b: OpenAI says 'expected a value >= 1'; rewriting 0 to 1 leaks a token (vllm#39556).",
    {"max_tokens": 0},
    "max_tokens",
    require_param=True,
)
_rejection(
    "reject_max_tokens_negative",
    "chat max_tokens:-5 -> 400 with error.param 'max_tokens'",
    "B16c: a negative limit must never reach the engine or become a 500.",
    {"max_tokens": -5},
    "max_tokens",
    require_param=True,
)
_rejection(
    "reject_n_zero",
    "chat n:0 -> 400",
    "B18h: n must be >= 1; zero choices is not a valid request.",
    {"n": 0},
    "n",
)
_rejection(
    "reject_temperature_negative",
    "chat temperature:-1 -> 400",
    "B18h: OpenAI's temperature range is 0..2.",
    {"temperature": -1},
    "temperature",
)
_rejection(
    "reject_top_p_above_one",
    "chat top_p:1.5 -> 400",
    "B18h: top_p is a probability mass in (0, 1].",
    {"top_p": 1.5},
    "top_p",
)


@register(
    CASES,
    "logit_bias_honoured_or_rejected",
    "chat logit_bias {'99999999': 5} -> 200 (accepted) or 400 naming logit_bias, never 5xx",
    "smg-reference 2.4: a field the engine cannot carry must be honoured or rejected loudly; a "
    "500 is never acceptable. (Black-box, a 200 cannot prove the bias was applied.)",
)
def logit_bias_honoured_or_rejected(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, ctx.chat_body(logit_bias={"99999999": 5}))
    if reply.status == 200:
        ok_json(reply, "logit_bias")
        return "accepted with 200 (token 99999999 is outside any vocabulary; OpenAI answers 400)"
    problems, _ = error_problems(reply, {400}, field_name="logit_bias", require_named=True)
    fail_if(problems)
    return f"rejected loudly: {_message(reply)!r}"


# -- unknown model -------------------------------------------------------------------------


@register(
    CASES,
    "unknown_model",
    "chat for an unknown model -> 404 JSON error",
    "B20 (smg#2396): an unknown model must be 'model not found' before any tokenizer or engine "
    "work, not a 500 or a 401.",
)
def unknown_model(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, {**ctx.chat_body(), "model": UNKNOWN_MODEL})
    problems, _ = error_problems(reply, {404})
    fail_if(problems)
    return f"404 {_message(reply)!r}"


@register(
    CASES,
    "unknown_model_stream",
    "streaming chat for an unknown model -> plain 404 JSON error, not a 200 SSE stream",
    "B20: the model check happens before the stream is opened, so the client sees the status.",
)
def unknown_model_stream(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, {**ctx.chat_body(stream=True), "model": UNKNOWN_MODEL})
    problems, _ = error_problems(reply, {404})
    if reply.content_type.startswith("text/event-stream"):
        problems.append("the 404 came as text/event-stream")
    fail_if(problems)
    return f"404 {_message(reply)!r}"


# -- malformed bodies ----------------------------------------------------------------------


@register(
    CASES,
    "malformed_json",
    "broken JSON body -> 400 with an OpenAI JSON error",
    "B18c (sglang#3805): invalid JSON gave a plain-text 500.",
)
def malformed_json(ctx: Context) -> str:
    raw = json_bytes(ctx.chat_body())[:-1] + b",x}"
    reply = ctx.request("POST", CHAT, content=raw, headers={"content-type": "application/json"})
    problems, _ = error_problems(reply, {400})
    fail_if(problems)
    return f"400 {_message(reply)!r}"


def _each(ctx: Context, variants: dict[str, bytes], headers: dict[str, str]) -> list[str]:
    problems: list[str] = []
    for label, raw in variants.items():
        reply = ctx.request("POST", CHAT, content=raw, headers=headers)
        found, _ = error_problems(reply, ANY_4XX)
        problems += [f"{label}: {p}" for p in found]
    return problems


@register(
    CASES,
    "non_object_body",
    'JSON bodies [], null, 123, "x" -> 4xx with an OpenAI JSON error',
    "B18b (vllm#42961): non-object JSON bodies reached deep code paths and gave 500.",
)
def non_object_body(ctx: Context) -> str:
    variants = {raw.decode(): raw for raw in (b"[]", b"null", b"123", b'"x"')}
    fail_if(_each(ctx, variants, {"content-type": "application/json"}))
    return "all 4 rejected with 4xx"


@register(
    CASES,
    "empty_messages",
    "chat with messages: [] -> 400 with an OpenAI JSON error",
    "B18a (vllm#17038): an empty message list gave 500.",
)
def empty_messages(ctx: Context) -> str:
    reply = ctx.post_json(CHAT, ctx.chat_body(messages=[]))
    problems, _ = error_problems(reply, {400})
    fail_if(problems)
    return f"400 {_message(reply)!r}"


@register(
    CASES,
    "invalid_message",
    "a user message without content, and role 'robot' -> 4xx with an OpenAI JSON error",
    "B18e/B18f: malformed messages must be rejected by validation, not crash the template.",
)
def invalid_message(ctx: Context) -> str:
    variants = {
        "user message without content": json_bytes(ctx.chat_body(messages=[{"role": "user"}])),
        "role robot": json_bytes(ctx.chat_body(messages=[{"role": "robot", "content": "hi"}])),
    }
    fail_if(_each(ctx, variants, {"content-type": "application/json"}))
    return "both rejected with 4xx"


@register(
    CASES,
    "content_type_rejected",
    "valid JSON with no Content-Type, text/plain or form-urlencoded -> 415 or 400 JSON error",
    "B19 (vllm#11171): curl -d without -H gave a plain-text 500.",
)
def content_type_rejected(ctx: Context) -> str:
    raw = json_bytes(ctx.chat_body())
    problems: list[str] = []
    for label, headers in (
        ("no Content-Type", {}),
        ("text/plain", {"content-type": "text/plain"}),
        ("form-urlencoded", {"content-type": "application/x-www-form-urlencoded"}),
    ):
        reply = ctx.request("POST", CHAT, content=raw, headers=headers)
        found, _ = error_problems(reply, {400, 415})
        problems += [f"{label}: {p}" for p in found]
    fail_if(problems)
    return "all rejected with 400/415"


@register(
    CASES,
    "content_type_charset",
    "Content-Type 'application/json; charset=utf-8' -> 200",
    "B19: media-type parameters are legal; only the media type decides.",
)
def content_type_charset(ctx: Context) -> str:
    reply = ctx.request(
        "POST",
        CHAT,
        content=json_bytes(ctx.chat_body()),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    ok_json(reply, "charset Content-Type")
    return "200"
