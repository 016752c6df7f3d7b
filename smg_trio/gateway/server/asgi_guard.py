"""ASGI front door: what no route may see is refused here, in the OpenAI error envelope.

* A WebSocket handshake (hypercorn hands every ``Upgrade: websocket`` request to the app as a
  ``websocket`` scope; Quart, with no WebSocket routes, answered with a 500 and a logged
  traceback) gets a 400 through the ASGI ``websocket.http.response`` extension, or a plain
  close (hypercorn then answers 403) from a server without it.
* A request with both ``Content-Length`` and ``Transfer-Encoding`` is the request-smuggling
  shape of RFC 9112 section 6.3: a proxy in front may frame it one way and h11 the other. It
  gets a 400 with ``connection: close`` before its body is read, so nothing after it on that
  connection is ever served.

Lives in the app (``create_app``), not in the server, so it holds under any ASGI server and
patches nothing process-wide.
"""

from __future__ import annotations

import trio

from smg_trio.gateway.openai.errors import ApiError
from smg_trio.gateway.server.asgi_shield import ASGIApp, Receive, Scope, Send

__all__ = ["AMBIGUOUS_FRAMING", "DRAIN_MAX_BYTES", "DRAIN_S", "NO_WEBSOCKET", "RequestGuard"]

NO_WEBSOCKET = ApiError(
    400, "WebSocket is not supported by this server; use HTTP", code="websocket_not_supported"
)
AMBIGUOUS_FRAMING = ApiError(
    400,
    "a request may not carry both Content-Length and Transfer-Encoding",
    code="invalid_http_request",
)


#: How much of an ambiguously framed request's body is read (and dropped) before the 400.
DRAIN_MAX_BYTES = 1 << 20
#: How long that read may take (seconds).
DRAIN_S = 1.0


def _headers(body: bytes, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]


def _ambiguous(scope: Scope) -> bool:
    names = {name.lower() for name, _ in scope.get("headers", ())}
    return b"content-length" in names and b"transfer-encoding" in names


async def _drain(receive: Receive) -> bool:
    """Read and drop the request body, at most :data:`DRAIN_MAX_BYTES` for at most
    :data:`DRAIN_S` seconds; False if the client disconnected.

    Why: a ``connection: close`` response makes h11 expect nothing more from the client. If
    hypercorn's reader then parses bytes the client pipelined behind this request while the
    response is being written, it errors and closes the socket mid-response (the 400's body is
    lost; the pipelined request is never served either way). Once the body has been handed
    over, the reader parks (h11 ``PAUSED``) at its next step; the checkpoint lets it get there
    before the response head goes out. A body that is too big or too slow is not waited for:
    the response then goes out with the body unread, and hypercorn closes the connection.
    """
    with trio.move_on_after(DRAIN_S):
        seen = 0
        while seen <= DRAIN_MAX_BYTES:
            message = await receive()
            if message.get("type") != "http.request":
                return False
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
    await trio.lowlevel.checkpoint()
    return True


class RequestGuard:
    """Wrap an ASGI ``app``: refuse WebSocket scopes and ambiguously framed HTTP requests;
    pass everything else (HTTP, lifespan) through unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "websocket":
            await self._refuse_websocket(scope, receive, send)
        elif kind == "http" and _ambiguous(scope):
            if not await _drain(receive):
                return  # the client went away
            body = AMBIGUOUS_FRAMING.body()
            await send(
                {
                    "type": "http.response.start",
                    "status": AMBIGUOUS_FRAMING.status,
                    "headers": _headers(body, (b"connection", b"close")),
                }
            )
            await send({"type": "http.response.body", "body": body})
        else:
            await self.app(scope, receive, send)

    @staticmethod
    async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message.get("type") != "websocket.connect":
            return  # the client went away first
        if "websocket.http.response" not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        body = NO_WEBSOCKET.body()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": NO_WEBSOCKET.status,
                "headers": _headers(body),
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
