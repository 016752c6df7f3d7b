"""vLLM's ``--enable-log-requests``: one INFO line per inference request."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from smg_trio.gateway.http.call import RequestCall

__all__ = ["log_request"]

log = logging.getLogger("smg_trio.requests")


def log_request(call: RequestCall, body: Any, model_id: str) -> None:
    """``Received request ID: endpoint, model, body`` (the decoded body as JSON, cut to
    ``--max-log-len`` characters), once the request is tokenized."""
    text = msgspec.json.encode(body).decode()
    limit = call.gw.config.max_log_len
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    log.info(
        "Received request %s: endpoint %s, model %r, body %s",
        call.request_id, call.endpoint, model_id, text,
    )  # fmt: skip
