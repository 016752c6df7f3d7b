"""Robustness cases: request-id echo and staying healthy after clients disconnect."""

from __future__ import annotations

import time
import uuid

import httpx

from conformance.case import Case, CaseFailed, fail_if, register
from conformance.cases_http import CHAT, ok_json
from conformance.client import Context, json_bytes

__all__ = ["CASES"]

CASES: list[Case] = []
LONG_MAX_TOKENS = 200


@register(
    CASES,
    "request_id_echo",
    "a request's x-request-id header is echoed on the response (plain and streaming)",
    "smg-reference 1.1: the gateway echoes x-request-id so logs on both sides can be joined.",
)
def request_id_echo(ctx: Context) -> str:
    problems: list[str] = []
    for stream in (False, True):
        rid = f"conformance-{uuid.uuid4().hex}"
        reply = ctx.post_json(CHAT, ctx.chat_body(stream=stream), headers={"x-request-id": rid})
        label = "streaming" if stream else "non-streaming"
        if reply.status != 200:
            problems.append(f"{label}: HTTP {reply.status}: {reply.snippet()!r}")
        elif reply.headers.get("x-request-id") != rid:
            problems.append(
                f"{label}: x-request-id {reply.headers.get('x-request-id')!r}, sent {rid!r}"
            )
    fail_if(problems)
    return "echoed on both"


def _fresh_request_served(ctx: Context, after: str) -> str:
    started = time.monotonic()
    try:
        reply = ctx.post_json(CHAT, ctx.chat_body())
    except httpx.TimeoutException as exc:
        raise CaseFailed(
            f"after {after}, a fresh request timed out after {ctx.timeout_s:g}s ({exc!r})"
        ) from None
    if reply.status != 200:
        raise CaseFailed(
            f"after {after}, a fresh request got HTTP {reply.status}: {reply.snippet()!r}"
        )
    ok_json(reply, f"fresh request after {after}")
    return f"fresh request served in {time.monotonic() - started:.2f}s"


@register(
    CASES,
    "disconnect_stream",
    "a client that closes a long stream after 2 chunks leaves the server serving new requests",
    "B22 spirit / smg-reference 1.4: a disconnect must abort the engine request; a leaked "
    "request keeps its slot and KV cache and stalls everyone else.",
)
def disconnect_stream(ctx: Context) -> str:
    client = ctx.new_client()
    seen = 0
    deadline = time.monotonic() + ctx.timeout_s
    try:
        with ctx.open_stream(
            CHAT, ctx.chat_body(stream=True, max_tokens=LONG_MAX_TOKENS), client=client
        ) as resp:
            if resp.status_code != 200:
                resp.read()
                raise CaseFailed(f"long stream: HTTP {resp.status_code}: {resp.text[:200]!r}")
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen >= 2 or time.monotonic() > deadline:
                    break
    finally:
        client.close()
    if seen < 2:
        raise CaseFailed(f"the long stream produced {seen} frame(s) before ending or timing out")
    return "closed after 2 chunks; " + _fresh_request_served(ctx, "a stream disconnect")


@register(
    CASES,
    "disconnect_nonstream",
    "a client that abandons a long non-streaming request leaves the server serving new requests",
    "B22 (ROCm/ATOM#1562, litellm#37140): a non-streaming handler must notice the disconnect "
    "and abort the engine request instead of generating to max_tokens.",
)
def disconnect_nonstream(ctx: Context) -> str:
    client = ctx.new_client(timeout_s=ctx.abandon_after_s)
    body = json_bytes(ctx.chat_body(max_tokens=LONG_MAX_TOKENS))
    note = f"abandoned after {ctx.abandon_after_s:g}s"
    try:
        reply = ctx.request(
            "POST",
            CHAT,
            content=body,
            headers={"content-type": "application/json"},
            timeout_s=ctx.abandon_after_s,
            client=client,
        )
        note = f"finished (HTTP {reply.status}) before the {ctx.abandon_after_s:g}s abandon"
    except httpx.TimeoutException:
        pass
    finally:
        client.close()
    return f"{note}; " + _fresh_request_served(ctx, "an abandoned request")
