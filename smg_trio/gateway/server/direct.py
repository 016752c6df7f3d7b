"""Direct writes: an SSE chunk goes from the engine output loop straight to the client socket.

Through ASGI, every chunk costs a wake-up of the request's task and the whole send stack
(quart-trio, hypercorn ``HTTPStream``/``H11Protocol``, h11, ``TCPServer.protocol_send``: a lock,
a shield and two scheduler checkpoints). :class:`DirectSocket` lets the task that receives the
engine batch write each stream's chunk itself, with one non-blocking ``write(2)``, when that
cannot block anything: the connection is plain HTTP/1.1 with chunked framing, the response
headers are out, nobody else is writing, and the socket has room. Whatever cannot be written at
once goes back to the request's task and the ordinary (blocking, backpressured) ASGI path, so a
slow client still never stalls the output loop.

A non-streamed answer goes the same way in one piece (:meth:`DirectSocket.send_whole`): head
and body through the connection's own h11 state machine and one locked socket write, then the
stream closes as hypercorn closes it; hypercorn's ASGI path sends three writes through its
whole send stack for the same bytes.

This reaches into hypercorn's connection objects and h11's body writer (verified against
hypercorn 0.18 and h11 0.16; :data:`FIX` names what it relies on, checked when smg_trio's
server starts). Each assumption is checked when a response is attached; when any fails (TLS,
HTTP/2, an HTTP/1.0 client, another server) :meth:`DirectSocket.of` returns ``None`` and the
stream uses the ASGI path only. h11's private ``_writers`` module is imported on first use,
not at import time.
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import time
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Final, Literal

import h11
import trio
from hypercorn.events import RawData
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import build_and_validate_headers

from smg_trio.gateway.server.fixes import Fix, missing_attrs, unset_attrs

__all__ = [
    "FIX",
    "GONE",
    "LAST_CHUNK",
    "SERVER_SEND_KEY",
    "DirectSocket",
    "DirectWriter",
    "frame_chunk",
    "write_now",
]

#: ``scope["extensions"]`` key under which the ASGI wrapper leaves the server's own ``send``.
SERVER_SEND_KEY = "smg_trio.server_send"


def frame_chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk, byte for byte what h11's ``ChunkedWriter`` writes
    (``data`` must not be empty: an empty chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


@functools.cache
def _chunked_writer() -> type:
    """h11's (private) chunked body writer class, imported on first use."""
    writer: type = importlib.import_module("h11._writers").ChunkedWriter
    return writer


#: The chunk that ends a chunked body (no trailers).
LAST_CHUNK: Final = b"0\r\n\r\n"


def write_now(
    lock: trio.Lock, socket: trio.socket.SocketType, data: bytes, *, last: bool = False
) -> bytes | Literal[False] | None:
    """Write ``data`` as one HTTP/1.1 chunk with one non-blocking ``write(2)``; not a checkpoint.
    With ``last``, the body's last chunk (:data:`LAST_CHUNK`) goes in the same write.

    Returns ``b""`` when the whole chunk was written, the unwritten tail of the framed chunk
    after a partial write, ``None`` when nothing was written (``lock``, the connection's send
    lock, is held, or the socket is full or closed) and ``False`` when the peer is gone.
    """
    if lock.locked():
        return None
    fd = socket.fileno()  # re-read: -1 once closed (a cached fd may be reused)
    if fd < 0:
        return None
    frame = frame_chunk(data)
    if last:
        frame += LAST_CHUNK
    try:
        sent = os.write(fd, frame)
    except OSError as exc:  # EAGAIN, EPIPE, ECONNRESET...: the ASGI path handles each
        return False if exc.errno in GONE else None
    return frame[sent:]


class DirectWriter:
    """What a stream body may do past ASGI on the connection under one response.

    :class:`DirectSocket` is it for a hypercorn connection; the fast path's exchange
    (:mod:`smg_trio.gateway.server.fast_http1`) is it for its own.
    """

    #: The client is gone: a write failed with ``EPIPE``/``ECONNRESET``, or the server saw
    #: the connection close. The output loop learns it here, before the request's task
    #: has been woken and unwound.
    broken: bool

    @staticmethod
    def of(server_send: object) -> DirectWriter | None:
        """The direct writer behind the server's ASGI ``send`` for one request, or ``None``
        when that connection is not plain-TCP HTTP/1.1 (under hypercorn's trio worker or the
        fast path)."""
        owner = getattr(server_send, "__self__", None)
        if isinstance(owner, DirectWriter):
            return owner
        return DirectSocket.of_hypercorn(owner)

    @property
    def socket(self) -> trio.socket.SocketType:
        """The connection's socket."""
        raise NotImplementedError

    def watch_disconnect(self, on_gone: Callable[[], None]) -> bool:
        """Have ``on_gone()`` called once, synchronously, if the client goes away before this
        response is complete (called at once if it already has). ``False`` when the server
        has no way to: the caller then owns ``receive`` in a task of its own, as ASGI has it
        (the fast path's connection reader does it without a task per request)."""
        return False

    def chunked(self) -> bool:
        """True once the response head is out and its body uses chunked framing: only then
        may :meth:`try_write` be used (call it after the first body message was sent)."""
        raise NotImplementedError

    def try_write(self, data: bytes) -> bytes | None:
        """Write ``data`` as one HTTP/1.1 chunk without blocking; not a checkpoint.

        Returns ``b""`` when the whole chunk was written; the unwritten tail of the framed
        chunk (raw bytes, to be sent with :meth:`send_raw` before anything else) after a partial
        write; ``None`` when nothing was written (another writer holds the connection, the
        socket is full, closed or broken): then ``data`` is still unframed and the caller sends
        it through ASGI, which also reports a broken connection the usual way.
        """
        raise NotImplementedError

    def try_write_last(self, data: bytes) -> bytes | None:
        """:meth:`try_write` for the body's last data: where the server can, the chunk that
        ends the body goes in the same ``write(2)`` (one write fewer per stream), and the
        final ASGI body message then writes nothing more. Returns as :meth:`try_write`; by
        default it is :meth:`try_write` (the final ASGI message ends the body)."""
        return self.try_write(data)

    async def send_whole(
        self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> bool:
        """Send a whole response (head and ``Content-Length`` body) in one socket write, in
        place of the ASGI ``http.response.start`` and final ``http.response.body`` messages;
        ``False``, having sent nothing, when that cannot be done (then use ASGI)."""
        raise NotImplementedError

    async def send_raw(self, data: bytes) -> None:
        """Send already-framed bytes (a partial chunk's tail) through the connection's own
        locked, shielded socket write, which waits for room and handles a broken connection."""
        raise NotImplementedError

    def _write_now(
        self, lock: trio.Lock, socket: trio.socket.SocketType, data: bytes, *, last: bool = False
    ) -> bytes | None:
        """:func:`write_now` for :meth:`try_write`; a peer found gone sets :attr:`broken`
        and calls :meth:`_found_gone`."""
        done = write_now(lock, socket, data, last=last)
        if done is False:
            self.broken = True
            self._found_gone()
            return None
        return done

    def _found_gone(self) -> None:
        """A direct write found the client gone (a server that can, tells the request)."""


class DirectSocket(DirectWriter):
    """The socket under one hypercorn HTTP/1.1 response, for chunk writes that skip ASGI.

    Use :meth:`DirectWriter.of` to get one; it is only valid for the response whose ``send``
    it came from.
    """

    __slots__ = ("_proto", "_socket", "_stream", "_tcp", "broken")

    def __init__(
        self, stream: HTTPStream, proto: H11Protocol, tcp: TCPServer, socket: trio.SocketStream
    ) -> None:
        self._stream = stream
        self._proto = proto
        self._tcp = tcp
        self._socket = socket
        #: The client is gone: a write failed with ``EPIPE``/``ECONNRESET``, or hypercorn saw
        #: the connection close. The output loop learns it here, before the request's task
        #: has been woken and unwound.
        self.broken = False

    @classmethod
    def of_hypercorn(cls, stream: object) -> DirectSocket | None:
        """The direct socket of hypercorn's ``HTTPStream`` ``stream`` (the owner of its ASGI
        ``send``), or ``None`` when its connection is not plain-TCP HTTP/1.1."""
        if not isinstance(stream, HTTPStream):
            return None
        proto = getattr(stream.send, "__self__", None)
        if not isinstance(proto, H11Protocol):
            return None
        tcp = getattr(proto.send, "__self__", None)
        # hypercorn annotates ``stream`` as an SSLStream; a plain connection has a SocketStream
        # (or the fast path's replay of one, which has its ``socket``).
        sock_stream: object = getattr(tcp, "stream", None)
        if not isinstance(tcp, TCPServer) or not isinstance(
            getattr(sock_stream, "socket", None), trio.socket.SocketType
        ):
            return None
        return cls(stream, proto, tcp, sock_stream)  # type: ignore[arg-type]

    def chunked(self) -> bool:
        """True once the response head is out and its body uses chunked framing: only then
        may :meth:`try_write` be used (call it after the first body message was sent)."""
        conn = self._proto.connection
        return conn.our_state is h11.SEND_BODY and isinstance(
            getattr(conn, "_writer", None), _chunked_writer()
        )

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._socket.socket

    def try_write(self, data: bytes) -> bytes | None:
        if self._stream.closed:  # hypercorn saw the connection close (read side)
            self.broken = True
            return None
        return self._write_now(self._tcp.send_lock, self._socket.socket, data)

    async def send_whole(
        self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> bool:
        """Send a whole response (head and ``Content-Length`` body) in one socket write, in
        place of the ASGI ``http.response.start`` and final ``http.response.body`` messages.

        The same h11 events as hypercorn's ASGI path go through the same h11 connection
        (``Response`` with hypercorn's own response headers, ``Data``, ``EndOfMessage``), and
        the stream then closes as hypercorn closes it (access log, ``StreamClosed``, which
        recycles the connection for the next request), so keep-alive, pipelining and
        ``Connection: close`` behave the same; only the three locked writes become one.
        Returns ``False``, having sent nothing, when the response has already started or
        the connection is not in a state to take it: then the caller sends it through ASGI.
        The write is shielded, like the final body message of the ASGI path.
        """
        stream, proto = self._stream, self._proto
        conn = proto.connection
        if (
            stream.closed
            or stream.state is not ASGIHTTPState.REQUEST
            or conn.our_state is not h11.SEND_RESPONSE
            or conn.their_state is h11.ERROR
            or not 200 <= status < 600
            or status in (204, 304)
        ):
            return False
        validated = build_and_validate_headers(headers)
        config = proto.config
        head = list(chain(validated, config.response_headers("h11")))
        if proto.keep_alive_requests >= config.keep_alive_max_requests:
            head.append((b"connection", b"close"))
        stream.response = {"type": "http.response.start", "status": status, "headers": headers}
        stream.state = ASGIHTTPState.RESPONSE
        data = conn.send(h11.Response(status_code=status, headers=head))
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        with trio.CancelScope(shield=True):
            await self._tcp.protocol_send(RawData(data=data))
            stream.state = ASGIHTTPState.CLOSED
            await config.log.access(stream.scope, stream.response, time.time() - stream.start_time)
            await stream.send(StreamClosed(stream_id=stream.stream_id))
        return True

    async def send_raw(self, data: bytes) -> None:
        """Send already-framed bytes (a partial chunk's tail) through hypercorn's own locked,
        shielded socket write, which waits for room and handles a broken connection."""
        await self._tcp.protocol_send(RawData(data=data))


#: ``write(2)`` errors that mean the peer is gone (not "try again").
GONE: Final = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN})


def _probe() -> list[str]:
    return [
        *missing_attrs(h11.Connection(h11.SERVER), ("_writer",)),
        *unset_attrs(HTTPStream, ("send", "closed", "state", "config", "stream_id")),
        *unset_attrs(H11Protocol, ("send", "connection", "config", "keep_alive_requests")),
        *unset_attrs(TCPServer, ("send_lock", "stream")),
    ]


FIX: Final = Fix(
    name="direct chunk writes (gateway/server/direct.py)",
    verified={"hypercorn": "0.18", "h11": "0.16"},
    targets=(
        "h11._writers:ChunkedWriter",
        "hypercorn.protocol.http_stream:HTTPStream.app_send",
        "hypercorn.protocol.h11:H11Protocol.stream_send",
        "hypercorn.trio.tcp_server:TCPServer.protocol_send",
        "hypercorn.events:RawData",
        "hypercorn.protocol.events:StreamClosed",
        "hypercorn.protocol.http_stream:ASGIHTTPState.REQUEST",
        "hypercorn.protocol.http_stream:HTTPStream._send_closed",
        "hypercorn.utils:build_and_validate_headers",
        "hypercorn.config:Config.response_headers",
    ),
    probe=_probe,
)
