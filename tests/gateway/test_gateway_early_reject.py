"""A response sent before the request body arrived never wedges the keep-alive connection.

Found by the conformance runner against a real vLLM engine: a 415 answered from the headers,
with the body arriving in a later TCP segment, left the connection open but deaf, so the
client's next request on it timed out (see ``smg_trio/gateway/server/asgi_shield.py``). Every
rejection made from the headers alone has the same shape, so each is covered: 415 (content
type), 401 (API key), 404 (unknown route). The client sends the headers, reads the whole
error response, then sends the body and a second, valid request on the same connection. The
server must either answer it or close the connection; it must never leave it hanging.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio
import trio.testing

from smg_trio.gateway.config import GatewayHttpConfig
from tests.helpers.gateway import HarnessFactory

#: Generous for a loopback round trip on a loaded 2-core machine; a wedged connection never
#: answers at all.
ANSWER_S = 10.0

CHAT = "/v1/chat/completions"


def _request_head(path: str, host: str, length: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Reader:
    """Reads HTTP/1.1 responses (Content-Length bodies) raw off one trio socket."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def _fill(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            return False
        self.buf += data
        return bool(data)

    async def status(self) -> int | None:
        """The next response's status (its body consumed), or None if the server closed."""
        while b"\r\n\r\n" not in self.buf:
            if not await self._fill():
                return None
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self.buf) < length:
            if not await self._fill():
                return None
        self.buf = self.buf[length:]
        return int(lines[0].split(b" ", 2)[1])


BODY = json.dumps(
    {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
).encode()


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        (CHAT, [("content-type", "text/plain")], 415),
        (CHAT, [], 415),
        (CHAT, [("content-type", "application/json"), ("authorization", "Bearer no")], 401),
        ("/v1/no-such-route", [("content-type", "application/json")], 404),
    ],
    ids=["text-plain", "no-content-type", "bad-api-key", "unknown-route"],
)
async def test_early_rejection_then_late_body_never_hangs(
    harness: HarnessFactory, path: str, headers: list[tuple[str, str]], status: int
) -> None:
    config = GatewayHttpConfig(api_key="secret") if status == 401 else None
    good = [("content-type", "application/json")]
    if status == 401:
        good.append(("authorization", "Bearer secret"))
    async with harness(config=config) as h:
        url = httpx.URL(h.base_url)
        host = f"{url.host}:{url.port}"
        assert url.host is not None
        assert url.port is not None
        stream = await trio.open_tcp_stream(url.host, url.port)
        async with stream:
            reader = _Reader(stream)
            with trio.fail_after(ANSWER_S):
                # 1. the headers alone: the gateway rejects from them
                await stream.send_all(_request_head(path, host, len(BODY), headers))
                assert await reader.status() == status
                # let the server settle: its request task has finished with the connection
                await trio.testing.wait_all_tasks_blocked()
                # 2. the body arrives after the response, then a valid request follows
                try:
                    await stream.send_all(BODY + _request_head(CHAT, host, len(BODY), good) + BODY)
                except trio.BrokenResourceError:
                    return  # already closed: the client reconnects, which is fine
                # 3. answered on this connection, or the connection is closed; never silence
                second = await reader.status()
            assert second in (200, None), second


CRASHERS = [
    # an early 415 with Connection: close, then bytes after the body (a malformed follow-up):
    # hypercorn's own 400 for them raced the app's closing write and took the server down
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n\r\n",
    b"POST /v1/completions HTTP/1.0\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\n"
    b"abcGET / HTTP/1.1\r\n\r\n",
]


async def test_rejection_racing_a_protocol_error_never_takes_the_server_down(
    harness: HarnessFactory,
) -> None:
    async with harness() as h:
        url = httpx.URL(h.base_url)
        assert url.host is not None
        assert url.port is not None
        with trio.fail_after(60):
            for i in range(40):
                stream = await trio.open_tcp_stream(url.host, url.port)
                async with stream:
                    await stream.send_all(CRASHERS[i % 2])
                    with trio.move_on_after(2):
                        while await stream.receive_some(65536):
                            pass
                await trio.testing.wait_all_tasks_blocked()
            resp = await h.http.get("/v1/models")
        assert resp.status_code == 200


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
        (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
    ids=["request-line", "content-length", "headers-too-large"],
)
async def test_unparseable_http_gets_the_error_envelope(
    harness: HarnessFactory, raw: bytes, status: int
) -> None:
    """What hypercorn answers before the app runs (h11 cannot parse the request) is still a
    JSON OpenAI envelope, and the connection is closed."""
    async with harness() as h:
        url = httpx.URL(h.base_url)
        assert url.host is not None
        assert url.port is not None
        with trio.fail_after(ANSWER_S):
            async with await trio.open_tcp_stream(url.host, url.port) as stream:
                await stream.send_all(raw)
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status}".encode()), head
        assert b"content-type: application/json" in head.lower()
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "invalid_http_request"
        assert err["type"] == "invalid_request_error"
