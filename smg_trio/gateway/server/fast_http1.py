"""The fenced HTTP/1.1 fast path: plain requests on plain-TCP connections, served without h11.

hypercorn turns every request into h11 events, an ``HTTPStream``, a task of its own and a memory
channel for ``receive``, and every response into three locked writes through its send stack.
On the gateway's hot routes that costs about as much CPU as the handler. A
:class:`FastHttp1` connection reads the request head itself and, when the request is a plain
one, runs the same ASGI app in the connection's own task, with a ``receive`` that reads the
body from the socket and a ``send`` that frames the response as h11 would (the same bytes on
the wire) and writes it with one locked, shielded ``send_all``.

A request is plain when its head is well formed HTTP/1.1 with CRLF line ends, one ``Host``,
at most one ``Content-Length`` of digits, no ``Transfer-Encoding``, ``Expect``, ``Upgrade``
or ``HTTP2-Settings``, and a method other than ``HEAD`` and ``CONNECT``. Anything else
(chunked or ``100-continue`` bodies, HTTP/1.0, an HTTP/2 preface or ``h2c`` upgrade, a head
past ``h11_max_incomplete_size``, a malformed line) is **handed over**: the connection, with
every byte read so far replayed (:class:`ReplayStream`), goes to hypercorn's connection for
the rest of its life, and h11 answers it as it always did. TLS listeners never come here.

The connection is one of the server's :class:`~smg_trio.gateway.server.hypercorn_close.Connections`,
so the stuck-write sweeps and the write timeout cover it; its exchange is the request's
:class:`~smg_trio.gateway.server.direct.DirectWriter`, so streamed chunks still skip ASGI.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final
from urllib.parse import unquote

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import build_and_validate_headers, parse_socket_addr

from smg_trio.gateway.server import faults
from smg_trio.gateway.server.asgi_shield import ASGIApp, Message, Scope
from smg_trio.gateway.server.direct import GONE, LAST_CHUNK, DirectWriter, frame_chunk
from smg_trio.gateway.server.fixes import Fix, missing_attrs, probe_config
from smg_trio.gateway.server.hypercorn_close import CLOSE_LOCK_WAIT_S, Connections
from smg_trio.gateway.server.hypercorn_errors import protocol_error

__all__ = ["FIX", "FastHttp1", "Head", "ReplayStream", "parse_head"]


MAX_RECV: Final = 1 << 16

#: The bytes a header name (an RFC 9110 token) may hold.
_TOKEN: Final = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: The bytes a request target may hold (visible ASCII).
_TARGET: Final = bytes(range(0x21, 0x7F))
#: The bytes a header value may hold (h11's: HTAB, visible ASCII, obs-text).
_VALUE: Final = b"\t" + bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))
#: The most digits a ``Content-Length`` may have (h11's limit; past it h11 answers 400, and
#: ``int()`` would refuse past 4300 digits).
MAX_LENGTH_DIGITS: Final = 20
#: Request headers that send a connection to hypercorn: framing and protocol switches.
_HANDED_OVER: Final = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"http2-settings"})
_DISCONNECT: Final = {"type": "http.disconnect"}
_NO_BODY_STATUS: Final = frozenset({204, 304})


@attrs.define(slots=True)
class Head:
    """A plain request's head: what the ASGI scope and the body framing need."""

    method: bytes
    target: bytes
    #: ``(lower-case name, value)`` in order, as h11 gives them to hypercorn.
    headers: list[tuple[bytes, bytes]]
    #: The body's ``Content-Length`` (0 without one).
    length: int
    #: The client sent ``Connection: close``.
    close: bool


def parse_head(data: bytes) -> Head | None:
    """The head (``data``: the bytes before the blank line) of a plain request, else ``None``
    (the connection is handed to hypercorn, which parses the same bytes)."""
    lines = data.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    method, target = parts[0], parts[1]
    if (
        not method
        or method.translate(None, _TOKEN)
        or method in (b"HEAD", b"CONNECT")
        or not target.startswith(b"/")
        or target.translate(None, _TARGET)
    ):
        return None
    headers: list[tuple[bytes, bytes]] = []
    hosts = 0
    length: int | None = None
    close = False
    for raw in lines[1:]:
        name, colon, value = raw.partition(b":")
        if not colon or not name or name.translate(None, _TOKEN):
            return None  # obs-fold (a leading space), a bad name, no colon...
        value = value.strip(b" \t")
        if value.translate(None, _VALUE):
            return None  # a control byte (a bare LF among them)
        name = name.lower()
        if name in _HANDED_OVER:
            return None
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > MAX_LENGTH_DIGITS:
                return None
            length = int(value)
        elif name == b"host":
            hosts += 1
        elif name == b"connection":
            tokens = {token.strip().lower() for token in value.split(b",")}
            if b"upgrade" in tokens:
                return None
            close = close or b"close" in tokens
        headers.append((name, value))
    if hosts != 1:
        return None
    return Head(method, target, headers, length or 0, close)


class ReplayStream:
    """A connection's ``trio.SocketStream`` with the bytes already read from it in front:
    what a handed-over connection gives hypercorn (``trio.SocketStream`` cannot be
    subclassed). Has no ``do_handshake``, so hypercorn treats it as plain TCP."""

    def __init__(self, stream: trio.SocketStream, ahead: bytes) -> None:
        self._stream = stream
        self._ahead = ahead
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._ahead:
            data, self._ahead = self._ahead, b""
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


#: Builds hypercorn's connection for a handed-over stream (``GatewayTCPServer`` bound to the
#: server's app, config, context and state).
HandOver = Callable[[Any], Awaitable[None]]


class FastHttp1:
    """The plain-TCP connection handler of one server: ``await fast.serve(stream)`` per
    accepted connection (``trio.serve_listeners``' handler)."""

    def __init__(
        self,
        app: ASGIApp,
        config: Config,
        context: WorkerContext,
        state: dict[str, Any],
        connections: Connections,
        hand_over: HandOver,
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.state = state
        self.connections = connections
        self.hand_over = hand_over
        #: A head longer than this is hypercorn's to refuse (h11's incomplete-event limit).
        self.max_head: int = config.h11_max_incomplete_size
        #: The cancel scopes of connections waiting for a request (closed when stopping).
        self.idle: set[trio.CancelScope] = set()
        self._access = config.log.access_logger is not None
        self._date_at = -1
        self._headers: list[tuple[bytes, bytes]] = []

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        """``config.response_headers("h11")`` (``date``, ``server``), the date formatted once
        per second rather than once per response."""
        config = self.config
        if config.alt_svc_headers or not config.include_date_header:
            return config.response_headers("h11")
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._headers = config.response_headers("h11")
        return list(self._headers)

    def close_idle(self) -> None:
        """The server is stopping: connections waiting for a request close now (those in a
        request close once it is answered)."""
        for scope in list(self.idle):
            scope.cancel()

    async def serve(self, stream: trio.SocketStream) -> None:
        with faults.connection_scope():
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        await self._serve(_Connection(self, stream, nursery))
                    finally:
                        nursery.cancel_scope.cancel()  # the connection's reader, if any
            except BaseException as exc:  # its faults end here; Cancelled goes on
                faults.contain("HTTP/1.1 fast path", exc)

    async def _serve(self, conn: _Connection) -> None:
        stream = conn.stream
        self.connections.add(conn)
        handed_over = False
        try:
            sock = stream.socket
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            served = 0
            while not self.context.terminated.is_set():
                head = await conn.read_head()
                if head is None:
                    return
                if head is _HAND_OVER:
                    handed_over = True
                    self.connections.discard(conn)
                    conn.stop_reading()  # hypercorn reads the socket from here on
                    await self.hand_over(ReplayStream(stream, bytes(conn.buf)))
                    return
                assert isinstance(head, Head)
                served += 1
                if not await conn.exchange(head, served, client, server):
                    return
        except OSError:
            pass
        except Exception as exc:  # a fault of this connection must not take the server down
            faults.note("HTTP/1.1 fast path", exc)
        finally:
            if not handed_over:
                self.connections.discard(conn)
                await conn.close()


#: ``read_head``'s answer for a request the fast path does not serve.
_HAND_OVER: Final = object()


class _Connection:
    """One plain-TCP connection on the fast path; the ``Served`` of the stuck-write sweeps."""

    __slots__ = (
        "_moved",
        "_nursery",
        "_reader",
        "_room",
        "buf",
        "closing",
        "eof",
        "on_gone",
        "send_lock",
        "server",
        "stream",
        "write_since",
    )

    def __init__(self, server: FastHttp1, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        self.server = server
        self.stream = stream
        self._nursery = nursery
        #: The reader task's scope once one runs (:meth:`watch`): from then on it alone reads
        #: the socket, and the connection's task waits on ``_moved`` for what it read.
        self._reader: trio.CancelScope | None = None
        self._moved = trio.lowlevel.ParkingLot()  # the reader added bytes, or saw the end
        self._room = trio.lowlevel.ParkingLot()  # bytes were consumed: read ahead again
        #: The request in progress asked to hear of the client going away (:meth:`watch`).
        self.on_gone: Callable[[], None] | None = None
        self.send_lock = trio.Lock()
        self.closing = False
        self.write_since: float | None = None
        #: Bytes read and not yet consumed: the next request (pipelined or in progress).
        self.buf = bytearray()
        #: The client closed its side (or the socket broke).
        self.eof = False

    async def read_head(self) -> Head | object | None:
        """The next request's head: a :class:`Head`, :data:`_HAND_OVER`, or ``None`` when the
        connection is done (closed by the client, idle past the keep-alive timeout, the
        server stopping)."""
        found = self._find_head()
        if found is not None:
            return found
        server = self.server
        with trio.move_on_after(server.config.keep_alive_timeout) as idle:
            server.idle.add(idle)
            try:
                while found is None:
                    if len(self.buf) > server.max_head or self.eof:
                        return _HAND_OVER if self.buf else None
                    await self.fill()
                    found = self._find_head()
                return found
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            finally:
                server.idle.discard(idle)
        return None

    def _find_head(self) -> Head | object | None:
        buf = self.buf
        end = buf.find(b"\n\r\n")
        bare = buf.find(b"\n\n")
        if bare >= 0 and (end < 0 or bare < end):
            return _HAND_OVER  # LF-only line ends: h11 reads those
        if end < 0:
            return None
        if end == 0 or buf[end - 1] != 0x0D or end - 1 > self.server.max_head:
            return _HAND_OVER
        head = parse_head(bytes(buf[: end - 1]))
        if head is None:
            return _HAND_OVER
        del buf[: end + 3]
        self.consumed()
        return head

    async def exchange(self, head: Head, served: int, client: Any, server_addr: Any) -> bool:
        """Run the app for one request; whether the connection may serve the next one."""
        server = self.server
        config = server.config
        path, _, query = head.target.partition(b"?")
        scope: Scope = {
            "type": "http",
            "http_version": "1.1",
            "asgi": {"spec_version": "2.1", "version": "3.0"},
            "method": head.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query,
            "root_path": config.root_path,
            "headers": head.headers,
            "client": client,
            "server": server_addr,
            "state": server.state.copy(),
            "extensions": {},
        }
        keep_alive = not head.close and served < config.keep_alive_max_requests
        ex = FastExchange(
            self, head, keep_alive, limit_close=served >= config.keep_alive_max_requests
        )
        await server.context.mark_request()
        start = time.time()
        try:
            await server.app(scope, ex.receive, ex.send)
        except Exception:
            await config.log.exception("Error in ASGI Framework")
        finally:
            self.on_gone = None
        if not ex.head_sent and not ex.broken:  # the app ended without answering
            # a client that closed its side mid-body sent an incomplete request (h11: 400)
            await ex.send_error(400 if self.eof and not ex.body_read else 500)
        if server._access:
            response = {"status": ex.status or 500, "headers": ex.headers}
            await config.log.access(scope, response, time.time() - start)  # type: ignore[arg-type]
        return ex.reusable()

    async def fill(self) -> None:
        """Wait for more bytes in ``buf``, or for ``eof``: read them here, or, once a reader
        task runs, wait for it to read them."""
        if self._reader is not None:
            if not self.eof:
                await self._moved.park()
            return
        try:
            data = await self.recv()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        self._took(data)

    def _took(self, data: bytes) -> None:
        """Bytes read into ``buf``; ``b""`` is the end of the connection."""
        if data:
            self.buf += data
        else:
            self.gone()

    def consumed(self) -> None:
        """Bytes were taken off ``buf``: a reader held back by a full buffer reads again."""
        if self._reader is not None:
            self._room.unpark_all()

    def watch(self, on_gone: Callable[[], None]) -> None:
        """Call ``on_gone()`` when the client goes away during the request in progress: the
        connection's reader task (started on the first call, then kept for the connection's
        life: no task per request) reads ahead and sees the end."""
        self.on_gone = on_gone
        if self._reader is None:
            self._reader = trio.CancelScope()
            self._nursery.start_soon(self._read_ahead, self._reader)

    def stop_reading(self) -> None:
        """Stop the reader now (the connection is handed over: its new owner reads)."""
        if self._reader is not None:
            self._reader.cancel()

    async def _read_ahead(self, scope: trio.CancelScope) -> None:
        with scope:
            while not self.eof:
                if len(self.buf) > self.server.max_head:
                    await self._room.park()  # enough read ahead: wait for it to be used
                    continue
                try:
                    await trio.lowlevel.wait_readable(self.stream.socket)
                    if scope.cancel_called:  # stopped while runnable: read nothing more
                        return
                    data = self.read_ready()  # no wait in between: a stop reads nothing
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if data is not None:
                    self._took(data)
                    self._moved.unpark_all()

    def gone(self) -> None:
        """The client is gone: tell the request in progress, if it asked (:meth:`watch`)."""
        self.eof = True
        on_gone, self.on_gone = self.on_gone, None
        if on_gone is not None:
            on_gone()

    async def recv(self) -> bytes:
        """The next bytes from the socket (``b""`` at the client's EOF): one ``read(2)`` when
        data is waiting, else a wait for it. Unlike ``SocketStream.receive_some`` this is a
        schedule point only when it has to wait (raises ``ClosedResourceError`` once the
        socket is closed, ``BrokenResourceError`` when the peer reset it)."""
        sock = self.stream.socket
        while True:
            data = self.read_ready()
            if data is not None:
                return data
            await trio.lowlevel.wait_readable(sock)

    def read_ready(self) -> bytes | None:
        """One ``read(2)``: the bytes waiting (``b""`` at EOF), or ``None`` when there are
        none yet; never waits (raises as :meth:`recv`)."""
        fd = self.stream.socket.fileno()  # re-read: -1 once closed (a cached fd may be reused)
        if fd < 0:
            raise trio.ClosedResourceError
        try:
            return os.read(fd, MAX_RECV)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise trio.BrokenResourceError from exc

    async def write(self, data: bytes, ex: FastExchange) -> None:
        """Write ``data`` under the send lock, shielded (a write must finish or fail whole);
        a client that is gone marks ``ex`` broken. When the lock is free and the socket takes
        it all, that is one ``write(2)`` and no schedule point."""
        lock = self.send_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            fd = self.stream.socket.fileno()
            if fd >= 0:
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    pass
                except OSError as exc:
                    if exc.errno in GONE:
                        ex.gone()
                        return
                    raise
                if not data:
                    return
            self.write_since = trio.current_time()
            try:
                with trio.CancelScope(shield=True):
                    await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                ex.gone()
            finally:
                self.write_since = None
        finally:
            lock.release()

    async def close(self) -> None:
        """Close the socket after any write in progress (waited for at most
        ``CLOSE_LOCK_WAIT_S``: longer, it is stuck on a client that stopped reading). Before
        the client's end was read, ``shutdown(SHUT_WR)`` comes first: a ``close(2)`` with
        unread bytes would send a reset, which can destroy the answer still in flight. Once
        the end was read (the common case: the client closed first) nothing is left unread,
        and ``close(2)`` alone sends the FIN; a connection found broken has no answer to keep."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_LOCK_WAIT_S):
                async with self.send_lock:
                    self.closing = True
                    if not self.eof:
                        try:
                            await self.stream.send_eof()
                        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            pass
                    await self.stream.aclose()
                    return
            await self.stream.aclose()


class FastExchange(DirectWriter):
    """One request and its response on a fast-path connection: the ASGI ``receive`` and
    ``send``, and the response's direct writer."""

    __slots__ = (
        "_body_left",
        "_chunked",
        "_conn",
        "_identity_left",
        "_keep_alive",
        "_last_sent",
        "_limit_close",
        "_request",
        "_wake",
        "body_read",
        "broken",
        "finished",
        "head_sent",
        "headers",
        "status",
    )

    def __init__(self, conn: _Connection, request: Head, keep_alive: bool, *, limit_close: bool):
        self._conn = conn
        self._request = request
        self._keep_alive = keep_alive
        self._limit_close = limit_close
        self._body_left = request.length
        self.body_read = False
        self.head_sent = False
        self._chunked = False
        self._identity_left: int | None = None
        self._last_sent = False  # the body's last chunk went out with a direct write
        self._wake: trio.CancelScope | None = None
        self.broken = False
        self.finished = False
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []

    def reusable(self) -> bool:
        """The response is complete, the request body was read whole, and neither side asked
        for the connection to close: the next request may follow."""
        return (
            self.finished
            and self.body_read
            and self._keep_alive
            and not self.broken
            and not self._conn.eof
            and not self._identity_left
        )

    def gone(self) -> None:
        """The client is gone (a write failed): the app learns it from ``receive``, or from
        the callback it gave :meth:`watch_disconnect`."""
        self.broken = True
        if self._wake is not None:
            self._wake.cancel()
        self._conn.gone()

    def watch_disconnect(self, on_gone: Callable[[], None]) -> bool:
        conn = self._conn
        if self.finished:
            return True  # answered already: nothing left to cancel
        if self.broken or conn.eof:
            on_gone()
            return True
        conn.watch(on_gone)
        return True

    # -- ASGI ---------------------------------------------------------------------------

    async def receive(self) -> Message:
        conn = self._conn
        if not self.body_read:
            if self._body_left == 0:
                self.body_read = True
                return {"type": "http.request", "body": b"", "more_body": False}
            buf = conn.buf
            while not buf:
                if conn.eof:
                    return dict(_DISCONNECT)
                await conn.fill()
            take = min(len(buf), self._body_left)
            body = bytes(buf[:take])
            del buf[:take]
            conn.consumed()
            self._body_left -= take
            more = self._body_left > 0
            self.body_read = not more
            return {"type": "http.request", "body": body, "more_body": more}
        # The body is in: wait for the client to go away, or the response to end (ASGI's
        # ``http.disconnect`` either way). Bytes read meanwhile are the next request's.
        if self.finished or self.broken or conn.eof:
            return dict(_DISCONNECT)
        with trio.CancelScope() as wake:
            self._wake = wake
            try:
                while not conn.eof:
                    if len(conn.buf) > conn.server.max_head:
                        await trio.sleep_forever()  # enough read ahead; wait for the end
                    await conn.fill()
            finally:
                self._wake = None
        return dict(_DISCONNECT)

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.status is not None:
                raise RuntimeError("http.response.start sent twice")
            self.status = int(message["status"])
            self.headers = list(message.get("headers", ()))
        elif kind == "http.response.body":
            if self.status is None:
                raise RuntimeError("http.response.body before http.response.start")
            await self._body(bytes(message.get("body", b"")), bool(message.get("more_body")))

    async def _body(self, body: bytes, more: bool) -> None:
        if self.finished or self.broken:
            return
        data = b""
        if not self.head_sent:
            data = self._head()
        if body and self.status not in _NO_BODY_STATUS:
            if self._chunked:
                data += frame_chunk(body)
            else:
                data += body
                if self._identity_left is not None:
                    self._identity_left -= len(body)
        if not more:
            if self._chunked and not self._last_sent:
                data += LAST_CHUNK
            self.finished = True
            self._conn.on_gone = None  # complete: a later end is not this request's
            if self._wake is not None:
                self._wake.cancel()
        if data:
            await self._conn.write(data, self)

    def _head(self) -> bytes:
        """The status line and headers, byte for byte what h11 writes for hypercorn."""
        self.head_sent = True
        status = self.status
        assert status is not None
        headers = build_and_validate_headers(self.headers)
        headers.extend(self._conn.server.response_headers())
        if self._limit_close:
            headers.append((b"connection", b"close"))
        connection: set[bytes] = set()
        length: int | None = None
        framing = False  # a Content-Length or Transfer-Encoding the app gave
        for name, value in headers:
            lower = name.lower()
            if lower == b"connection":
                connection.update(t.strip().lower() for t in value.split(b","))
            elif lower == b"content-length":
                framing = True
                if value.isdigit():
                    length = int(value)
            elif lower == b"transfer-encoding":
                framing = True
        if b"close" in connection:
            self._keep_alive = False
        if status in _NO_BODY_STATUS or status < 200:
            pass
        elif length is not None:
            self._identity_left = length
        else:  # h11: no framing given to an HTTP/1.1 client means chunked
            if framing:
                headers = [
                    (n, v)
                    for n, v in headers
                    if n.lower() not in (b"content-length", b"transfer-encoding")
                ]
            headers.append((b"Transfer-Encoding", b"chunked"))
            self._chunked = True
        unread = not self.body_read
        if unread and len(self._conn.buf) >= self._body_left:
            # answered before reading a body that has arrived whole: skip it, keep the
            # connection (hypercorn's h11 reads it meanwhile and recycles too)
            del self._conn.buf[: self._body_left]
            self._body_left = 0
            self.body_read = True
            unread = False
        if self._request.close or (unread and b"close" not in connection):
            # h11 answers a client's close with its own; a body still on its way cannot be
            # told from the next request, so the connection closes after this answer and
            # says so (hypercorn closes without saying)
            self._keep_alive = False
            connection.discard(b"keep-alive")
            connection.add(b"close")
            if any(n.lower() == b"connection" for n, _ in headers):
                headers = [(n, v) for n, v in headers if n.lower() != b"connection"]
            headers.extend((b"Connection", token) for token in sorted(connection))
        return b"HTTP/1.1 %d \r\n%b\r\n" % (
            status,
            b"".join([b"%b: %b\r\n" % header for header in headers]),
        )

    async def send_error(self, status: int) -> None:
        """The app ended without a response: answer ``status`` in the OpenAI envelope, as
        hypercorn does, and close."""
        headers, body = protocol_error(status)
        await self._answer(status, headers, body)

    async def _answer(
        self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> None:
        """Send a whole response (head and body), shielded like a final ASGI message."""
        self.status = status
        self.headers = list(headers)
        with trio.CancelScope(shield=True):
            await self._body(body, False)

    # -- DirectWriter ------------------------------------------------------------------

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._conn.stream.socket

    def chunked(self) -> bool:
        return self.head_sent and self._chunked and not self.finished

    def try_write(self, data: bytes) -> bytes | None:
        return self._try_write(data, last=False)

    def try_write_last(self, data: bytes) -> bytes | None:
        return self._try_write(data, last=True)

    def _try_write(self, data: bytes, *, last: bool) -> bytes | None:
        conn = self._conn
        if self.broken or conn.eof:
            self.broken = True
            return None
        if self.finished or self._last_sent:
            return None
        tail = self._write_now(conn.send_lock, conn.stream.socket, data, last=last)
        if last and tail is not None:
            self._last_sent = True  # written, or its tail is sent (send_raw) before the end
        return tail

    def _found_gone(self) -> None:
        # Tell the request now: the reader may not see the end itself (it stops reading
        # while a pipelined request fills the buffer).
        self._conn.gone()

    async def send_whole(
        self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> bool:
        if self.status is not None or not 200 <= status < 600 or status in _NO_BODY_STATUS:
            return False
        await self._answer(status, headers, body)
        return True

    async def send_raw(self, data: bytes) -> None:
        await self._conn.write(data, self)


def _probe() -> list[str]:
    config = probe_config()
    return [
        *missing_attrs(
            config,
            (
                "h11_max_incomplete_size",
                "keep_alive_timeout",
                "keep_alive_max_requests",
                "root_path",
            ),
        ),
        *missing_attrs(config.log, ("access_logger",)),
        *missing_attrs(WorkerContext(None), ("terminated",)),
    ]


FIX: Final = Fix(
    name="the HTTP/1.1 fast path (gateway/server/fast_http1.py)",
    verified={"hypercorn": "0.18"},
    targets=(
        "hypercorn.config:Config.response_headers",
        "hypercorn.logging:Logger.access",
        "hypercorn.logging:Logger.exception",
        "hypercorn.trio.worker_context:WorkerContext.mark_request",
        "hypercorn.utils:build_and_validate_headers",
        "hypercorn.utils:parse_socket_addr",
    ),
    probe=_probe,
)
