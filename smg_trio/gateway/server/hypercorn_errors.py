"""hypercorn's own HTTP/1.1 protocol errors answered in the OpenAI error envelope.

When h11 cannot parse a request (a malformed request line or header, headers over h11's
limit, an unsupported HTTP version), hypercorn 0.18 answers from
``H11Protocol._send_error_response`` (``hypercorn/protocol/h11.py``) with the status h11
suggests (400, 431, 505...) and an empty body, before any application code runs.
:class:`EnvelopeH11Protocol` sends the same status and ``connection: close``, with the OpenAI
envelope as a JSON body, like every other error of the gateway. It is built only by
:class:`EnvelopeProtocolWrapper`, the protocol of the servers smg_trio starts
(:mod:`smg_trio.gateway.server.serve`); hypercorn's own classes stay as they ship.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from itertools import chain
from typing import Any, Final

import h11
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from smg_trio.gateway.openai.errors import ApiError
from smg_trio.gateway.server import faults
from smg_trio.gateway.server.asgi_guard import NO_WEBSOCKET
from smg_trio.gateway.server.fixes import Fix, missing_attrs, probe_config

__all__ = [
    "FIX",
    "EnvelopeH11Protocol",
    "EnvelopeProtocolWrapper",
    "protocol_error",
    "protocol_error_body",
]


def protocol_error_body(status: int) -> bytes:
    """The OpenAI envelope for an HTTP request hypercorn could not parse."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Bad Request"
    return ApiError(
        status, f"{phrase}: the request is not valid HTTP/1.1", code="invalid_http_request"
    ).body()


def _close_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]


def protocol_error(status: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of a protocol error's answer (the connection then closes)."""
    body = protocol_error_body(status)
    return _close_headers(body), body


#: The attribute of hypercorn's ``Config`` that says whether cleartext HTTP/2 is served
#: (:func:`smg_trio.gateway.http.app.hyper_config`; absent: not served).
HTTP2_ENABLED_ATTR: Final = "smg_trio_enable_http2"


class _Refused(Exception):
    """The request was answered by the protocol itself and the connection closed."""


class _Dead:
    """The h11 connection of a connection closed on a fault: it reads nothing more (the
    reader task ends) and sends nothing (quietly: ``their_state`` is ``ERROR``)."""

    our_state = h11.ERROR
    their_state = h11.ERROR
    they_are_waiting_for_100_continue = False
    trailing_data = (b"", False)

    def receive_data(self, data: bytes) -> None:
        pass

    def next_event(self) -> h11.ConnectionClosed:
        return h11.ConnectionClosed()

    def send(self, event: Any) -> bytes:
        raise h11.LocalProtocolError("the connection was closed on a fault")

    def start_next_cycle(self) -> None:
        raise h11.LocalProtocolError("the connection was closed on a fault")


def _is_websocket(request: h11.Request) -> bool:
    """hypercorn 0.18's test (``H11Protocol._create_stream``) for a WebSocket handshake."""
    upgrade = connection = ""
    for name, value in request.headers:
        key = name.decode("latin1").strip().lower()
        if key == "upgrade":
            upgrade = value.decode("latin1").strip()
        elif key == "connection":
            connection = value.decode("latin1").strip()
    return (
        any(token.strip() == "upgrade" for token in connection.lower().split(","))
        and upgrade.lower() == "websocket"
        and request.method.upper() == b"GET"
    )


class EnvelopeH11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, whose protocol errors carry the OpenAI envelope, and
    which hands over to HTTP/2 only when the server enables it (``--enable-http2``).

    A WebSocket handshake is refused here, before any stream or app task exists (the
    :class:`~smg_trio.gateway.server.asgi_guard.RequestGuard` refusal stays for other
    servers): hypercorn's ``WSStream`` answered bytes sent after the handshake with a 400 of
    its own while the app's refusal was being written, and the two responses' h11 events
    raised ``LocalProtocolError`` out of the connection, which took the server down (issue
    28 item 3). Any ``LocalProtocolError`` while sending now closes its connection, with one
    rate-limited line (:mod:`~smg_trio.gateway.server.faults`), and nobody sees it raised.
    """

    _refused = False

    async def handle(self, event: Event) -> None:
        try:
            await super().handle(event)
        except _Refused:
            pass

    async def _send_h11_event(self, event: Any) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError as error:
            if self.connection.their_state == h11.ERROR:
                return  # hypercorn's own rule: the client broke the protocol first
            faults.note("HTTP/1.1", error)
            self.connection = _Dead()  # type: ignore[assignment]
            await self.can_read.set()  # a reader parked (h11 PAUSED) wakes and ends
            await self.send(Closed())
        else:
            await self.send(RawData(data=data))

    async def _check_protocol(self, event: h11.Request) -> None:
        if getattr(self.config, HTTP2_ENABLED_ATTR, False):
            await super()._check_protocol(event)
            return
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            # a prior-knowledge HTTP/2 preface: not served; answer in HTTP/1.1 and close
            self._refused = True
            await self._send_error_response(505)
            await self.send(Closed())
        # an ``Upgrade: h2c`` is ignored: the request is answered in HTTP/1.1 (RFC 9110 7.8)

    async def _create_stream(self, request: h11.Request) -> None:
        if self._refused:
            return
        if _is_websocket(request):
            await self._send_error(NO_WEBSOCKET.status, NO_WEBSOCKET.body())
            await self.send(Closed())
            raise _Refused
        await super()._create_stream(request)

    async def _send_error_response(self, status_code: int) -> None:
        if status_code == 501:  # h11's hint for a transfer coding it does not know: bad input
            status_code = 400
        await self._send_error(status_code, protocol_error_body(status_code))

    async def _send_error(self, status_code: int, body: bytes) -> None:
        headers = _close_headers(body)
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=list(chain(headers, self.config.response_headers("h11"))),
            )
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class EnvelopeProtocolWrapper(ProtocolWrapper):
    """hypercorn 0.18's ``ProtocolWrapper``, with :class:`EnvelopeH11Protocol` for HTTP/1.1
    (HTTP/2, by ALPN or by upgrade, is hypercorn's own ``H2Protocol``)."""

    def __init__(
        self,
        app: Any,
        config: Config,
        context: Any,
        task_group: Any,
        state: ConnectionState,
        ssl: bool,
        client: tuple[str, int] | None,
        server: tuple[str, int] | None,
        send: Callable[[Event], Awaitable[None]],
        alpn_protocol: str | None = None,
    ) -> None:
        # ProtocolWrapper.__init__ stores these and builds the protocol; only the class differs
        self.app = app
        self.config = config
        self.context = context
        self.task_group = task_group
        self.ssl = ssl
        self.client = client
        self.server = server
        self.send = send
        self.state = state
        protocol = H2Protocol if alpn_protocol == "h2" else EnvelopeH11Protocol
        self.protocol: H11Protocol | H2Protocol = protocol(
            app, config, context, task_group, state, ssl, client, server, send
        )


#: ``ProtocolWrapper.__init__``'s parameters in hypercorn 0.18 (replicated above).
_WRAPPER_PARAMETERS: Final = (
    "app",
    "config",
    "context",
    "task_group",
    "state",
    "ssl",
    "client",
    "server",
    "send",
    "alpn_protocol",
)


def _probe() -> list[str]:
    proto = H11Protocol(
        None,  # type: ignore[arg-type]
        probe_config(),
        WorkerContext(None),
        None,  # type: ignore[arg-type]
        ConnectionState({}),
        False,
        None,
        None,
        None,  # type: ignore[arg-type]
    )
    missing = missing_attrs(proto, ("config", "connection", "send"))
    init = ProtocolWrapper.__init__.__code__
    names = init.co_varnames[1 : init.co_argcount]
    if names != _WRAPPER_PARAMETERS:
        missing.append(f"ProtocolWrapper.__init__ with these parameters (it has {names})")
    return missing


FIX: Final = Fix(
    name="protocol errors in the OpenAI envelope (gateway/server/hypercorn_errors.py)",
    verified={"hypercorn": "0.18"},
    targets=(
        "hypercorn.protocol.h11:H11Protocol._send_error_response",
        "hypercorn.protocol.h11:H11Protocol._send_h11_event",
        "hypercorn.protocol.h11:H11Protocol._check_protocol",
        "hypercorn.protocol.h11:H11Protocol._create_stream",
        "hypercorn.protocol.h2:H2Protocol",
        "hypercorn.protocol:ProtocolWrapper.handle",
        "hypercorn.config:Config.response_headers",
    ),
    probe=_probe,
)
