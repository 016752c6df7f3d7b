"""Embedding: the hypercorn fixes live only in the servers smg_trio starts.

A host program that embeds smg_trio and serves its own app with plain ``hypercorn.trio.serve``
in the same process keeps hypercorn exactly as it ships: its connections are hypercorn's own
classes with their own methods, and its protocol errors are hypercorn's empty-bodied answers.
smg_trio's server, next to it, has every fix in place (each fix's subclass on the connection,
each overridden method the fix's own) and answers a protocol error in the OpenAI envelope.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import pytest
import trio
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.tcp_server import TCPServer

from smg_trio.gateway.http.app import serve_http
from smg_trio.gateway.server.direct import SERVER_SEND_KEY

DEADLINE_S = 10.0

#: The hypercorn methods smg_trio's fixes replace in its own servers.
HYPERCORN_METHODS = {
    TCPServer: ("run", "protocol_send", "_close"),
    H11Protocol: ("_send_error_response",),
}


class _App:
    """A bare ASGI app that records the objects behind each request's ``send``."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, object]] = []  # (H11Protocol, TCPServer) per request

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        # hypercorn's HTTPStream.app_send (smg_trio's server wraps it, and leaves it here)
        server_send = (scope.get("extensions") or {}).get(SERVER_SEND_KEY, send)
        stream = server_send.__self__
        proto = stream.send.__self__
        self.seen.append((proto, proto.send.__self__))
        body = b"ok"
        head = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _servers() -> AsyncIterator[tuple[tuple[str, _App], tuple[str, _App]]]:
    """smg_trio's server and, in the same process, a host's plain hypercorn server."""
    ours, theirs = _App(), _App()
    async with trio.open_nursery() as nursery:
        our_binds = await nursery.start(serve_http, ours, "127.0.0.1", 0)
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        their_binds = await nursery.start(hypercorn_serve, theirs, config)
        yield (our_binds[0], ours), (their_binds[0], theirs)
        nursery.cancel_scope.cancel()


async def _exchange(base_url: str, raw: bytes) -> tuple[bytes, bytes]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
            if raw.endswith(b"close\r\n\r\n") and data.endswith(b"ok"):
                break
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


GET = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


def _is_hypercorns(cls: type, name: str) -> bool:
    func = getattr(cls, name)
    return bool(func.__module__ == cls.__module__ and func.__qualname__ == f"{cls.__name__}.{name}")


async def test_a_host_hypercorn_app_in_the_same_process_is_untouched() -> None:
    with trio.fail_after(DEADLINE_S):
        async with _servers() as ((our_url, _), (their_url, theirs)):
            assert (await _exchange(our_url, GET))[1] == b"ok"
            assert (await _exchange(their_url, GET))[1] == b"ok"
            # hypercorn's classes, as shipped, after smg_trio's server started
            for cls, names in HYPERCORN_METHODS.items():
                for name in names:
                    assert _is_hypercorns(cls, name), f"{cls.__name__}.{name} was replaced"
            [(proto, tcp)] = theirs.seen
            assert type(proto) is H11Protocol
            assert type(tcp) is TCPServer
            # hypercorn's own protocol error: an empty body, not smg_trio's envelope
            head, body = await _exchange(their_url, b"GARBAGE\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), head
            assert body == b""
            assert b"content-length: 0" in head.lower()


async def test_every_fix_is_in_place_in_the_server_smg_trio_starts() -> None:
    with trio.fail_after(DEADLINE_S):
        async with _servers() as ((our_url, ours), _):
            assert (await _exchange(our_url, GET))[1] == b"ok"
            [(proto, tcp)] = ours.seen
            for obj in (proto, tcp):
                for base, names in HYPERCORN_METHODS.items():
                    if not isinstance(obj, base):
                        continue
                    for name in names:
                        assert getattr(type(obj), name) is not getattr(base, name), name
            head, body = await _exchange(our_url, b"GARBAGE\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), head
            assert json.loads(body)["error"]["code"] == "invalid_http_request"


@pytest.mark.parametrize("data", [b"x", b"data: {}\n\n" * 300])
def test_direct_chunk_framing_is_h11s(data: bytes) -> None:
    """:meth:`DirectSocket.try_write` frames a chunk by hand; the bytes are h11's."""
    from smg_trio.gateway.server.direct import frame_chunk

    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    conn.send(h11.Response(status_code=200, headers=[]))
    assert conn.send(h11.Data(data=data)) == frame_chunk(data)
