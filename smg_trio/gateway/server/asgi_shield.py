"""ASGI wrapper: a response's last message is sent shielded, so its connection never wedges.

With hypercorn 0.18 and quart-trio 0.12, sending the last ``http.response.body`` message makes
hypercorn finish the HTTP/1.1 cycle *in the sending task* (``H11Protocol._maybe_recycle`` in
``hypercorn/protocol/h11.py``): it queues ``http.disconnect`` for the app, then either recycles
the keep-alive connection or, when the request body has not been fully received yet, closes
it. quart-trio reacts to that ``http.disconnect`` by cancelling the request's nursery, which
includes the sending task, and the cancel lands inside the close (``TCPServer._close``). The
socket then stays open with a parser that can never start the next cycle: the client's next
request on that connection is read and never answered.

It happens whenever a handler answers before the body arrived: 401, 404, 413 and 415 answered
from the headers alone, with a client that sends the body in a second segment (seen with
``httpx`` against a busy gateway). Shielding that one send lets the close finish; it is short
(hypercorn already shields its socket writes) and the connection is closed cleanly, as HTTP/1.1
requires when a request body was not read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from smg_trio.gateway.server.direct import SERVER_SEND_KEY

__all__ = ["ShieldedFinish"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ShieldedFinish:
    """Wrap an ASGI ``app``: HTTP responses send their final body message under a shield.

    Other messages and non-HTTP scopes pass through unchanged. The server's own ``send`` is
    left in ``scope["extensions"]`` under ``SERVER_SEND_KEY`` (for
    :meth:`smg_trio.gateway.server.direct.DirectWriter.of`).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        extensions = scope.get("extensions")
        if extensions is not None:
            extensions[SERVER_SEND_KEY] = send

        async def shielded_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await self.app(scope, receive, shielded_send)
