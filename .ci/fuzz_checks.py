"""schemathesis hooks for .ci/fuzz.sh: every error response is in its API's error envelope
(OpenAI's; Anthropic's on ``/v1/messages``)."""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis


def envelope_problem(status: int, body: bytes) -> str | None:
    """Why ``body`` (of an error response) is not ``{"error": {"message", "type", "param",
    "code"}}`` with string message/type and string-or-null param/code; ``None`` if it is."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{status} body is not JSON: {body[:200]!r}"
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return f"{status} body has no error object: {body[:200]!r}"
    for name in ("message", "type"):
        if not isinstance(err.get(name), str):
            return f"{status} error.{name} is not a string: {body[:200]!r}"
    for name in ("param", "code"):
        if name not in err or not (err[name] is None or isinstance(err[name], str)):
            return f"{status} error.{name} is not a string or null: {body[:200]!r}"
    return None


def anthropic_envelope_problem(status: int, body: bytes) -> str | None:
    """Why ``body`` is not Anthropic's ``{"type": "error", "error": {"type", "message"}}``
    with string type/message; ``None`` if it is."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{status} body is not JSON: {body[:200]!r}"
    if not isinstance(doc, dict) or doc.get("type") != "error":
        return f"{status} body is not an Anthropic error: {body[:200]!r}"
    err = doc.get("error")
    if not isinstance(err, dict):
        return f"{status} body has no error object: {body[:200]!r}"
    for name in ("type", "message"):
        if not isinstance(err.get(name), str):
            return f"{status} error.{name} is not a string: {body[:200]!r}"
    return None


def api_envelope_problem(path: str, status: int, body: bytes) -> str | None:
    """The envelope check for the API at ``path``: Anthropic's under ``/v1/messages``."""
    if path.startswith("/v1/messages"):
        return anthropic_envelope_problem(status, body)
    return envelope_problem(status, body)


@schemathesis.check
def openai_error_envelope(ctx: Any, response: Any, case: Any) -> bool | None:
    """4xx/5xx responses carry their API's error envelope (application/json): Anthropic's on
    the Messages routes, OpenAI's everywhere else."""
    if response.status_code < 400:
        return None
    path = getattr(getattr(case, "operation", None), "path", "")
    problem = api_envelope_problem(path, response.status_code, response.content)
    if problem is not None:
        raise AssertionError(problem)
    return None


#: The served model's id (set by .ci/fuzz.sh): most generated bodies name it, so they get past
#: the model lookup into tokenization, translation and the engine.
SERVED_MODEL = os.environ.get("SMG_TRIO_FUZZ_MODEL")


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    """Point three in four generated ``model`` strings of the OpenAI routes at the served
    model (the fourth keeps the generated one, for the 404 path)."""
    operation = getattr(context, "operation", None)
    path = getattr(operation, "path", "")
    if SERVED_MODEL and path.startswith("/v1/") and isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and len(model) % 4 != 3:
            body = {**body, "model": SERVED_MODEL}
    return body
