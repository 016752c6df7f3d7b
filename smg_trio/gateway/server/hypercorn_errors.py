"""hypercorn's own HTTP/1.1 protocol errors answered in the OpenAI error envelope.

When h11 cannot parse a request (a malformed request line or header, headers over h11's
limit, an unsupported HTTP version), hypercorn 0.18 answers from
``H11Protocol._send_error_response`` (``hypercorn/protocol/h11.py``) with the status h11
suggests (400, 431, 505...) and an empty body, before any application code runs. The
replacement sends the same status and ``connection: close``, with the OpenAI envelope as a JSON
body, like every other error of the gateway. Installed once, by :func:`install`, from
:func:`smg_trio.gateway.http.app.serve_http`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from itertools import chain
from typing import Any

import h11
from hypercorn.protocol.h11 import H11Protocol

from smg_trio.gateway.openai.errors import ApiError

__all__ = ["install", "protocol_error_body"]

log = logging.getLogger(__name__)

_MARK = "_smg_trio_error_envelope"


def protocol_error_body(status: int) -> bytes:
    """The OpenAI envelope for an HTTP request hypercorn could not parse."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Bad Request"
    return ApiError(
        status, f"{phrase}: the request is not valid HTTP/1.1", code="invalid_http_request"
    ).body()


def install() -> None:
    """Replace ``H11Protocol._send_error_response`` once per process (idempotent). Logs and
    does nothing if this hypercorn no longer has it."""
    original: Callable[[Any, int], Awaitable[None]] | None = getattr(
        H11Protocol, "_send_error_response", None
    )
    if original is None or getattr(original, _MARK, False):
        return

    async def _send_error_response(self: Any, status_code: int) -> None:
        body = protocol_error_body(status_code)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=list(chain(headers, self.config.response_headers("h11"))),
            )
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    setattr(_send_error_response, _MARK, True)
    H11Protocol._send_error_response = _send_error_response  # type: ignore[method-assign]
    log.debug("hypercorn protocol errors now carry the OpenAI error envelope")
