"""A bare HTTP/1.1 SSE client on one trio socket (h11), for tests that must drop the connection
mid-stream or stop reading."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import h11
import httpx
import trio

from tests.helpers.sse import SseEvents

__all__ = ["RawSSE"]


class RawSSE:
    """A bare HTTP/1.1 client on one trio socket (h11), for tests that must drop the
    connection mid-stream: :meth:`aclose` is a real TCP close, with no client library
    generators left behind."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._conn = h11.Connection(h11.CLIENT)
        self._sse = SseEvents()
        self._ready: list[Any] = []
        self.status: int | None = None
        self.ended = False

    @classmethod
    async def post(
        cls,
        base_url: str,
        path: str,
        body: Any,
        headers: dict[str, str] | None = None,
        *,
        rcvbuf: int | None = None,
    ) -> RawSSE:
        """``rcvbuf`` sets the client socket's ``SO_RCVBUF`` before it connects (a small one
        makes the server's writes block once the client stops reading)."""
        url = httpx.URL(base_url)
        assert url.host is not None
        assert url.port is not None
        if rcvbuf is None:
            stream = await trio.open_tcp_stream(url.host, url.port)
        else:
            sock = trio.socket.socket()
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, rcvbuf)
            await sock.connect((url.host, url.port))
            stream = trio.SocketStream(sock)
        self = cls(stream)
        payload = json.dumps(body).encode()
        hdrs = [
            ("host", f"{url.host}:{url.port}"),
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
            *(headers or {}).items(),
        ]
        c = self._conn
        out = c.send(h11.Request(method="POST", target=path, headers=hdrs))
        out += c.send(h11.Data(data=payload)) + c.send(h11.EndOfMessage())
        await self._stream.send_all(out)
        return self

    async def events(self) -> list[Any]:
        """Wait for at least one complete SSE event (or the end); return those complete."""
        while True:
            if self._ready or self.ended:
                ready, self._ready = self._ready, []
                return ready
            ev = self._conn.next_event()
            if ev is h11.NEED_DATA:
                self._conn.receive_data(await self._stream.receive_some(65536))
            elif isinstance(ev, h11.Response):
                self.status = ev.status_code
            elif isinstance(ev, h11.Data):
                self._ready += self._sse.feed(bytes(ev.data))
            elif isinstance(ev, h11.EndOfMessage):
                self.ended = True

    async def until(self, pred: Callable[[list[Any]], bool]) -> list[Any]:
        """Read events until ``pred(all events so far)`` holds; returns them all."""
        seen: list[Any] = []
        while not pred(seen):
            if self.ended:
                raise AssertionError(f"stream ended early: {seen}")
            seen += await self.events()
        return seen

    async def rest(self) -> list[Any]:
        """Every remaining event, to the end of the response."""
        seen: list[Any] = []
        while not self.ended:
            seen += await self.events()
        return seen

    async def aclose(self) -> None:
        await self._stream.aclose()
