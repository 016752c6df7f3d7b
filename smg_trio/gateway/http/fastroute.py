"""The two inference routes served straight from ASGI, ahead of Quart's per-request machinery.

``POST /v1/chat/completions`` and ``POST /v1/completions`` are where the gateway spends its
per-request CPU, and Quart's request object, contexts, signals and URL routing cost about as
much as the handler itself. :class:`InferenceRoutes` is a Quart ASGI middleware
(``app.asgi_app = InferenceRoutes(app.asgi_app, ...)``) that serves exactly those two routes
with the same handlers and the same response sender (so the same bytes on the wire), and hands
every other request to Quart unchanged. The structured-concurrency contract is quart-trio's: one
nursery per request, a task that owns ``receive``, and a client disconnect (``http.disconnect``)
cancels the handler, which ABORTs every engine request it started.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from quart import Response
from quart.wrappers.response import DataBody
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from smg_trio.connector.client import ABORT_GROUP, AbortGroup
from smg_trio.gateway.http.call import json_response
from smg_trio.gateway.openai.errors import to_api_error
from smg_trio.gateway.server.asgi_shield import Receive, Scope, Send
from smg_trio.gateway.server.direct import SERVER_SEND_KEY, DirectWriter

__all__ = ["AsgiRequest", "InferenceRoutes"]

ASGIApp = Callable[..., Awaitable[None]]
#: A route: the request in, a Quart response out (errors already turned into responses).
Handler = Callable[["AsgiRequest"], Awaitable[Response]]
#: Sends a Quart response for ``scope`` (quart-trio's ``_send_response`` of the app's class).
Sender = Callable[[Scope, Send, Response], Awaitable[None]]


class _Headers(dict[str, str]):
    """Request headers by lower-case name; the first value of a repeated header wins."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)


class AsgiRequest:
    """What the inference handlers read of a request: ``headers``, ``content_type``,
    ``mimetype`` and the body (``await get_data()``), as on a Quart request.

    The body is received by the task that asks for it (no hand-off between tasks); after that
    the request is cancelled when the client goes away: the server tells it where it can
    (:meth:`~smg_trio.gateway.server.direct.DirectWriter.watch_disconnect`, the fast path),
    else a watcher task in ``nursery`` owns ``receive``. ``get_data`` raises
    ``RequestEntityTooLarge`` (413) past ``max_body``
    bytes (checked against ``Content-Length`` first) and ``RequestTimeout`` (408) when the
    body takes longer than ``body_timeout_s`` seconds, like quart-trio.
    """

    __slots__ = (
        "_aborts",
        "_body",
        "_max_body",
        "_nursery",
        "_receive",
        "_server_send",
        "_timeout",
        "_too_large",
        "content_type",
        "headers",
        "mimetype",
    )

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        nursery: trio.Nursery,
        *,
        max_body: int | None,
        body_timeout_s: float | None,
        aborts: AbortGroup | None = None,
    ) -> None:
        self._aborts = aborts
        headers = _Headers()
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            if key not in headers:
                headers[key] = value.decode("latin-1")
        self.headers = headers
        self.content_type: str | None = headers.get("content-type")
        self.mimetype = (self.content_type or "").partition(";")[0].strip().lower()
        self._receive = receive
        self._server_send = (scope.get("extensions") or {}).get(SERVER_SEND_KEY)
        self._nursery = nursery
        self._body: bytes | None = None
        self._max_body = max_body
        self._timeout = body_timeout_s
        self._too_large = False
        length = headers.get("content-length")
        if max_body is not None and length is not None and length.isdigit():
            self._too_large = int(length) > max_body

    async def get_data(
        self, cache: bool = False, *, progress: Callable[[int], None] | None = None
    ) -> bytes:
        """The whole request body (``cache`` is accepted for Quart compatibility);
        ``progress`` is told the bytes received so far after each chunk (it may raise)."""
        if self._too_large:
            raise RequestEntityTooLarge()
        if self._body is None:
            timeout = math.inf if self._timeout is None else self._timeout
            with trio.move_on_after(timeout) as scope:
                self._body = await self._read_body(progress)
            if scope.cancelled_caught:
                raise RequestTimeout()
            direct = DirectWriter.of(self._server_send)
            if direct is None or not direct.watch_disconnect(self._gone):
                self._nursery.start_soon(self._watch_disconnect)
        if self._too_large:
            raise RequestEntityTooLarge()  # answered at once; hypercorn closes the connection
        assert self._body is not None
        return self._body

    async def _read_body(self, progress: Callable[[int], None] | None) -> bytes:
        chunks = bytearray()
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._nursery.cancel_scope.cancel()
                await trio.lowlevel.checkpoint()  # raises Cancelled
            if message["type"] != "http.request":
                continue
            chunks += message.get("body", b"")
            if self._max_body is not None and len(chunks) > self._max_body:
                self._too_large = True
                return b""
            if progress is not None:
                progress(len(chunks))
            if not message.get("more_body", False):
                return bytes(chunks)

    async def _watch_disconnect(self) -> None:
        """Own ``receive`` once the body is in: cancel the request when the client goes away
        (hypercorn also sends ``http.disconnect`` once the response is complete)."""
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._gone()

    def _gone(self) -> None:
        """The client went away (or, under hypercorn, the response is complete): ABORT and
        cancel the request."""
        if self._aborts is not None:
            # ABORT the engine requests first: the cancellation unwinds afterwards, which under
            # a disconnect storm (many handlers at once) takes tens of milliseconds.
            self._aborts.abort_now()
        self._nursery.cancel_scope.cancel()


class InferenceRoutes:
    """ASGI middleware: ``routes`` (``POST`` paths) are served here, the rest by ``app``.

    ``send_response`` sends a handler's response (the app's own sender, so a stream body gets
    the same direct-write treatment); an exception escaping a handler becomes the OpenAI error
    envelope, as the app's error handler would.
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: Mapping[str, Handler],
        send_response: Sender,
        *,
        max_body: int | None,
        body_timeout_s: float | None,
    ) -> None:
        self.app = app
        self._routes = routes
        self._send_response = send_response
        self._max_body = max_body
        self._body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._routes.get(scope["path"])
            if handler is not None:
                await self._serve(handler, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        aborts = AbortGroup()
        token = ABORT_GROUP.set(aborts)  # the generate blocks of this request join it
        try:
            async with trio.open_nursery() as nursery:
                request = AsgiRequest(
                    scope,
                    receive,
                    nursery,
                    max_body=self._max_body,
                    body_timeout_s=self._body_timeout_s,
                    aborts=aborts,
                )
                try:
                    response = await handler(request)
                except Exception as exc:
                    err = to_api_error(exc)
                    response = json_response(err.status, err.body(), headers=err.headers)
                body = response.response
                if type(body) is DataBody:
                    await _send_whole(scope, send, response, body.data)
                else:
                    await self._send_response(scope, send, response)
                nursery.cancel_scope.cancel()
        finally:
            ABORT_GROUP.reset(token)


async def _send_whole(scope: Scope, send: Send, response: Response, data: bytes) -> None:
    """Send a response whose body is all in memory: in one socket write where the connection
    is plain HTTP/1.1 under hypercorn (:meth:`~smg_trio.gateway.server.direct.DirectWriter.send_whole`), else as two ASGI
    messages (the head, then the whole body as the final message), where Quart's sender
    builds a connection object and sends three. The same bytes on the wire either way."""
    headers = [(key.lower().encode(), value.encode()) for key, value in response.headers.items()]
    direct = DirectWriter.of((scope.get("extensions") or {}).get(SERVER_SEND_KEY))
    if direct is not None and await direct.send_whole(response.status_code, headers, data):
        return
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
