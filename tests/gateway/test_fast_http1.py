"""The HTTP/1.1 fast path (``smg_trio/gateway/server/fast_http1.py``): plain requests answered
byte for byte as hypercorn answers them, everything else handed to hypercorn with the bytes
already read, and the connection rules (keep-alive, pipelining, bodies in pieces, answers
before the body, shutdown) kept."""

from __future__ import annotations

import json
import os
import re
import socket
import types
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from smg_trio.codec.msgpack import encoder
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import gateway_of
from smg_trio.gateway.server import direct, fast_http1
from smg_trio.gateway.server.fast_http1 import ReplayStream, parse_head
from smg_trio.protocol import vllm
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, hostport, steps_of, steps_per_message

CHAT = json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
STREAM = json.dumps(
    {
        "model": "M",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
)


def _long_chat(max_tokens: int, *, stream: bool) -> str:
    """A chat body asking for ``max_tokens`` (the engine's plan decides how many come)."""
    return json.dumps(
        {
            "model": "M",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )


def _post(body: str, path: str = "/v1/chat/completions", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body.encode())}\r\n{extra}\r\n{body}"
    ).encode()


class HandOvers:
    """Counts the connections the fast path handed to hypercorn."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = ReplayStream.__init__

        def init(stream: ReplayStream, *args: Any) -> None:
            self.count += 1
            real(stream, *args)

        monkeypatch.setattr(ReplayStream, "__init__", init)


async def _talk(h: Any, raw: bytes | Sequence[bytes], *, pause: float = 0.0) -> bytes:
    """Send ``raw`` (pieces, ``pause`` apart) on one connection; read until the server
    closes it."""
    pieces = [raw] if isinstance(raw, bytes) else list(raw)
    async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
        for piece in pieces:
            await stream.send_all(piece)
            if pause:
                await trio.sleep(pause)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


def _normal(data: bytes) -> bytes:
    """Responses with what differs from run to run blanked: dates, ids, timestamps."""
    data = re.sub(rb"date: [^\r]*", b"date: D", data)
    data = re.sub(rb"x-request-id: [^\r]*", b"x-request-id: R", data)
    data = re.sub(rb'"(id|created|system_fingerprint)": ?("[^"]*"|\d+)', rb'"\1": X', data)
    data = re.sub(rb"(chatcmpl|cmpl)-[0-9a-zA-Z-]+", rb"\1-X", data)
    return data


#: One connection's worth of plain requests, the last one closing it.
PLAIN = (
    _post(CHAT)
    + _post(STREAM)
    + _post("{not json")
    + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    + b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
    + b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"
    + _post(json.dumps({"model": "M", "prompt": "hi", "max_tokens": 4}), path="/v1/completions")
    + _post(CHAT, extra="Connection: close\r\n")
)


async def test_plain_requests_get_hypercorns_bytes(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same pipelined requests on the fast path and on hypercorn's: the same bytes back,
    down to header order and casing, chunk framing and the closing ``Connection: close``."""
    hand_overs = HandOvers(monkeypatch)
    steps = steps_of(tok, "one ", "two ", "three ", "four ")
    answers = {}
    for fast in (True, False):
        with trio.fail_after(DEADLINE_S):
            async with harness(plan=lambda r: steps, fast_http1=fast) as h:
                answers[fast] = _normal(await _talk(h, PLAIN))
                assert h.client.inflight_count == 0
    assert hand_overs.count == 0  # all of it plain
    assert answers[True].count(b"HTTP/1.1 ") == 8
    assert b"Transfer-Encoding: chunked" in answers[True]
    assert answers[True].endswith(b"}")  # the closing answer is the last thing sent
    assert answers[True] == answers[False]


async def test_keep_alive_serves_many_requests_on_one_connection(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    hand_overs = HandOvers(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with httpx.AsyncClient(base_url=h.base_url) as client:
                for _ in range(5):
                    resp = await client.post(
                        "/v1/chat/completions",
                        content=CHAT,
                        headers={"content-type": "application/json"},
                    )
                    assert resp.status_code == 200, resp.text
                    assert resp.json()["object"] == "chat.completion"
                    assert (await client.get("/v1/models")).status_code == 200
            assert h.client.inflight_count == 0
    assert hand_overs.count == 0


HANDED_OVER = [
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n"
        % (len(CHAT), CHAT.encode()),
        200,
        id="chunked-body",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT.encode()),
        200,
        id="http-1.0",
    ),
    pytest.param(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, id="h2-prior-knowledge"),
    pytest.param(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: close\r\n\r\n",
        200,
        id="h2c-upgrade",
    ),
    pytest.param(b"GET /v1/models HTTP/1.1\nHost: x\nConnection: close\n\n", 200, id="bare-lf"),
    pytest.param(b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n", 400, id="no-host"),
    pytest.param(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
        + b"a" * 20000
        + b"\r\n\r\n",
        200,
        id="long-head",
    ),
    pytest.param(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\nConnection: close\r\n\r\n",
        200,
        id="obs-fold",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
        b"Content-Length: 2\r\n\r\nab",
        400,
        id="two-content-lengths",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        id="cl-and-te",
    ),
    # found by the break-it pass: int() refuses past 4300 digits, which took the server down
    pytest.param(
        b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"0" * 4301 + b"\r\n\r\n",
        400,
        id="4301-digit-content-length",
    ),
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"0" * 21 + b"5"
        b'\r\n\r\n{"model"',
        400,
        id="21-digit-content-length",
    ),
]


@pytest.mark.parametrize(("raw", "status"), HANDED_OVER)
async def test_what_is_not_plain_goes_to_hypercorn(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch, raw: bytes, status: int
) -> None:
    """Each shape the fast path does not serve is handed over, bytes and all, and answered as
    hypercorn (and the gateway's own guards) answer it; errors in the OpenAI envelope."""
    hand_overs = HandOvers(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            data = await _talk(h, raw)
            assert h.client.inflight_count == 0
    assert hand_overs.count == 1
    assert int(data.split(b" ", 2)[1]) == status, data[:300]
    if status >= 400:
        body = data.partition(b"\r\n\r\n")[2]
        assert "error" in json.loads(body)


async def test_expect_100_continue_is_handed_over(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that waits for ``100 Continue`` before its body gets it (from hypercorn)."""
    hand_overs = HandOvers(monkeypatch)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(CHAT)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    ).encode()
    with trio.fail_after(DEADLINE_S):
        async with harness() as h, await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
            await stream.send_all(head)
            interim = await stream.receive_some(65536)
            assert interim.startswith(b"HTTP/1.1 100 ")
            await stream.send_all(CHAT.encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    assert hand_overs.count == 1
    assert data.startswith(b"HTTP/1.1 200 ")


async def test_a_connection_is_handed_over_after_plain_requests(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain requests first (fast path), then a chunked one: it and what follows it on the
    connection are hypercorn's, in order."""
    hand_overs = HandOvers(monkeypatch)
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n"
        % (len(CHAT), CHAT.encode())
    )
    raw = _post(CHAT) + _post(CHAT) + chunked + _post(CHAT, extra="Connection: close\r\n")
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            data = await _talk(h, raw)
    assert hand_overs.count == 1
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"200"] * 4
    assert (
        data.count(b'"object":"chat.completion"') + data.count(b'"object": "chat.completion"') == 4
    )


async def test_a_body_in_pieces_is_read_whole(harness: HarnessFactory) -> None:
    raw = _post(CHAT, extra="Connection: close\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    pieces = [head[:20], head[20:] + b"\r\n\r\n", body[:10], body[10:30], body[30:]]
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            data = await _talk(h, pieces, pause=0.02)
    assert data.startswith(b"HTTP/1.1 200 ")
    assert b"chat.completion" in data


async def test_an_answer_before_the_body_closes_and_says_so(harness: HarnessFactory) -> None:
    """A 401 from the headers alone, while the body is still on its way: the answer says
    ``Connection: close`` (the rest of the body cannot be told from a next request) and the
    connection closes after it."""
    raw = _post(CHAT)
    head, _, body = raw.partition(b"\r\n\r\n")
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key="k" * 32)) as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(head + b"\r\n\r\n" + body[:5])
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
            assert h.client.inflight_count == 0
    assert data.startswith(b"HTTP/1.1 401 ")
    assert b"\r\nConnection: close\r\n" in data


async def test_an_answer_before_a_body_that_arrived_keeps_the_connection(
    harness: HarnessFactory,
) -> None:
    """The same 401, with the whole body already read: the body is skipped and the next
    request on the connection is served."""
    raw = _post(CHAT) + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key="k" * 32)) as h:
            data = await _talk(h, raw)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"401", b"200"]


async def test_stopping_closes_idle_keep_alive_connections(harness: HarnessFactory) -> None:
    """A stopping server does not wait for idle keep-alive connections: the client sees the
    connection close at once."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            stream = await trio.open_tcp_stream(*hostport(h.base_url))
            await stream.send_all(_post(CHAT))
            first = await stream.receive_some(65536)
            assert first.startswith(b"HTTP/1.1 200 ")
        # the harness (and its server) has stopped: the connection is closed
        assert await stream.receive_some(65536) == b""
        await stream.aclose()


async def test_a_client_that_ends_mid_body_gets_hypercorns_answer(harness: HarnessFactory) -> None:
    """The client closes its side after part of the body: both servers answer the same 400
    (an incomplete request), and nothing is left in flight."""
    raw = _post(CHAT)[:-10]
    answers = {}
    for fast in (True, False):
        with trio.fail_after(DEADLINE_S):
            async with harness(fast_http1=fast) as h:
                async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                    await stream.send_all(raw)
                    await stream.send_eof()
                    data = b""
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                answers[fast] = _normal(data)
                assert h.client.inflight_count == 0
    assert answers[True].startswith(b"HTTP/1.1 400 ")
    assert answers[True] == answers[False]


# -- parse_head ------------------------------------------------------------------------


def test_parse_head_reads_a_plain_head() -> None:
    head = parse_head(
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
        b"X-Thing:  spaced value \t\r\nConnection: keep-alive, close"
    )
    assert head is not None
    assert (head.method, head.target, head.length, head.close) == (
        b"POST",
        b"/v1/chat/completions?x=1",
        12,
        True,
    )
    assert head.headers[2] == (b"x-thing", b"spaced value")


@pytest.mark.parametrize(
    "data",
    [
        b"HEAD / HTTP/1.1\r\nHost: a",
        b"CONNECT a:1 HTTP/1.1\r\nHost: a",
        b"GET / HTTP/1.0\r\nHost: a",
        b"GET  / HTTP/1.1\r\nHost: a",
        b"GET * HTTP/1.1\r\nHost: a",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b",
        b"GET / HTTP/1.1",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"1" * 21,
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\nb",
        b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue",
        b"GET / HTTP/1.1\r\nHost: a\r\nupgrade: websocket\r\nConnection: upgrade",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade",
        b"GET /\xff HTTP/1.1\r\nHost: a",
    ],
)
def test_parse_head_hands_over_the_rest(data: bytes) -> None:
    assert parse_head(data) is None


def test_the_fix_targets_are_present() -> None:
    fast_http1.FIX.check()


async def test_a_fault_in_one_connection_does_not_take_the_server_down(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Defence in depth (the break-it pass found one such fault): an unexpected exception
    while serving a connection closes that connection, is logged, and the server serves on."""
    real = fast_http1.parse_head

    def faulty(data: bytes) -> fast_http1.Head | None:
        if b"X-Boom" in data:
            raise ValueError("boom")
        return real(data)

    monkeypatch.setattr(fast_http1, "parse_head", faulty)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            data = await _talk(h, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Boom: 1\r\n\r\n")
            assert data == b""  # that connection closed, unanswered
            assert (await h.http.get("/health")).status_code == 200
    assert "fast path: connection failed" in caplog.text


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_gone_mid_answer_aborts_without_a_watcher_task(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """On the fast path the connection's reader sees the client go (no task per request to
    watch ``receive``, as under hypercorn): the engine gets ABORT, nothing stays in flight, and
    the next connection is served. After an answered request the reader keeps serving the
    connection's next request."""
    from smg_trio.gateway.http.fastroute import AsgiRequest

    watchers = 0
    real = AsgiRequest._watch_disconnect

    async def counted(request: AsgiRequest) -> None:
        nonlocal watchers
        watchers += 1
        await real(request)

    monkeypatch.setattr(AsgiRequest, "_watch_disconnect", counted)
    steps = steps_of(tok, "a ") + [tok.encode("z")] * 5000
    body = _long_chat(4000, stream=stream)
    for fast in (True, False):
        with trio.fail_after(DEADLINE_S):
            async with harness(plan=lambda r: steps, step_s=0.002, fast_http1=fast) as h:
                # a whole answer first, on the same connection: the reader then serves the rest
                async with await trio.open_tcp_stream(*hostport(h.base_url)) as conn:
                    await conn.send_all(_post(CHAT))
                    data = b""
                    while data.count(b"chat.completion") < 1 or not data.endswith(b"}"):
                        data += await conn.receive_some(65536)
                    await conn.send_all(_post(body))
                    while not h.engine.requests[1:]:
                        await h.engine.request_event.wait()
                    if stream:  # the first chunk is out: the client goes mid-stream
                        while b"data: " not in data.partition(b"text/event-stream")[2]:
                            data += await conn.receive_some(65536)
                rid = h.engine.requests[1].request_id
                await h.wait_aborted([rid])
                assert h.client.inflight_count == 0  # retired before its ABORT went out
                assert (await h.chat(max_tokens=2)).status_code == 200
        assert watchers == (0 if fast else 3), fast  # hypercorn: one per request
        watchers = 0


async def test_a_reset_behind_a_full_read_ahead_still_ends_the_stream(
    harness: HarnessFactory, tok: Any
) -> None:
    """A stream runs; the client pipelines a request bigger than the read-ahead limit, so the
    connection stops reading, then resets: the failed write still ends the request (ABORT,
    nothing in flight), as under hypercorn. (The fast path once left it in flight forever:
    found by the break-it pass.)"""
    import socket
    import struct

    steps = steps_of(tok, "a ") + [tok.encode("z")] * 20000
    body = _long_chat(15000, stream=True)
    big = json.dumps({"model": "M", "messages": [{"role": "user", "content": "q" * 40000}]})
    for fast in (True, False):
        with trio.fail_after(DEADLINE_S):
            async with harness(
                plan=lambda r: steps, step_s=0.001, fast_http1=fast, max_model_len=65536
            ) as h:
                conn = await trio.open_tcp_stream(*hostport(h.base_url))
                await conn.send_all(_post(body))
                while not h.engine.requests:
                    await h.engine.request_event.wait()
                await conn.send_all(_post(big))
                # Time for the server to read it ahead (the engine steps all along, so no
                # "all tasks blocked" moment comes). Too short, and the reader sees the reset
                # itself: the test passes without covering the case, it cannot flake.
                await trio.sleep(0.2)
                conn.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.socket.close()  # RST
                await h.wait_aborted([h.engine.requests[0].request_id])
                assert h.client.inflight_count == 0
                registry = gateway_of(h.app).metrics.registry
                await trio.testing.wait_all_tasks_blocked()  # the handler has unwound
                assert registry.get_sample_value("smg_router_requests_in_flight") == 0
                assert (
                    registry.get_sample_value(
                        "smg_router_requests_total", {"endpoint": "chat", "status": "499"}
                    )
                    == 1
                )
                assert (await h.chat(max_tokens=2)).status_code == 200


#: How a stream's answer ends: its last frames, then the body's last chunk.
_END = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def _patch_write(
    monkeypatch: pytest.MonkeyPatch, write: Any, modules: Sequence[Any] = (direct, fast_http1)
) -> None:
    """Route ``os.write`` of ``modules`` (the direct writer's and the fast path's) through
    ``write``."""
    fake = types.SimpleNamespace(**{**vars(os), "write": write})
    for module in modules:
        monkeypatch.setattr(module, "os", fake)


class SocketWrites:
    """Every ``os.write`` the fast path and its direct writer make, and every
    ``shutdown(SHUT_WR)`` of a fast-path connection."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[bytes] = []
        self.shutdowns = 0

        def write(fd: int, data: bytes) -> int:
            n = os.write(fd, data)
            self.writes.append(bytes(data[:n]))
            return n

        _patch_write(monkeypatch, write)
        real_eof = trio.SocketStream.send_eof

        async def send_eof(stream: trio.SocketStream) -> None:
            self.shutdowns += 1
            await real_eof(stream)

        monkeypatch.setattr(trio.SocketStream, "send_eof", send_eof)


async def test_a_stream_ends_in_the_write_of_its_last_data(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body's last chunk goes with the stream's last frames (``[DONE]``): one write per
    SSE event and none for the end alone; the bytes are hypercorn's all the same."""
    steps = steps_of(tok, "one ", "two ", "three ")
    spy = SocketWrites(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps) as h:
            answer = await _talk(h, _post(STREAM, extra="Connection: close\r\n"))
            assert h.client.inflight_count == 0
    assert answer.endswith(_END)
    assert spy.writes, "the fast path wrote nothing"
    assert spy.writes[-1].endswith(_END)
    assert b"0\r\n\r\n" not in spy.writes[:-1]
    assert b'"finish_reason":"length"' in spy.writes[-1]  # with the last step's event
    # the head with the role chunk, at most one write per content step (fewer where the
    # gateway found several steps waiting at once), and none for the end alone
    assert len(spy.writes) <= 1 + len(steps)


async def test_a_connection_the_client_closed_is_closed_without_a_shutdown(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the client's end was read nothing is left unread, so ``close(2)`` alone ends the
    connection (no reset can follow); a connection the server closes first shuts down its
    side first (``Connection: close``)."""
    spy = SocketWrites(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(_post(CHAT))
                data = b""
                while not data.endswith(b"}"):  # the whole answer
                    data += await stream.receive_some(65536)
                stream.socket.shutdown(socket.SHUT_WR)  # the client's end, between requests
                assert await stream.receive_some(65536) == b""  # the server closed
            assert data.startswith(b"HTTP/1.1 200 ")
            assert spy.shutdowns == 0
            answer = await _talk(h, _post(CHAT, extra="Connection: close\r\n"))
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert spy.shutdowns == 1


async def test_a_partial_last_write_still_ends_the_body_once(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the socket takes only part of the last frames and the body's end, the request's
    task sends the rest, and the final ASGI message adds no second end."""
    cut: list[bytes] = []

    def write(fd: int, data: bytes) -> int:
        if data.endswith(_END):
            cut.append(data)
            return os.write(fd, data[: len(data) // 2])  # the socket is nearly full
        return os.write(fd, data)

    _patch_write(monkeypatch, write, [direct])  # the direct write; the tail is sent whole
    steps = steps_of(tok, "one ", "two ", "three ")
    answers = {}
    for fast in (True, False):
        with trio.fail_after(DEADLINE_S):
            async with harness(plan=lambda r: steps, fast_http1=fast) as h:
                answers[fast] = _normal(
                    await _talk(h, _post(STREAM, extra="Connection: close\r\n"))
                )
                assert h.client.inflight_count == 0
    assert len(cut) == 1  # the fast path's last write (hypercorn's writes the end apart)
    assert answers[True].endswith(_END)
    assert answers[True].count(b"\r\n0\r\n\r\n") == 1
    assert answers[True] == answers[False]


def _contents(events: Sequence[bytes]) -> dict[int, list[tuple[bytes, bytes]]]:
    """Each choice's (text, running completion_tokens) per content event."""
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for event in events:
        for index, text in re.findall(
            rb'"index":(\d+),(?:"delta":\{"content"|"text"):"([^"]+)"', event
        ):
            used = re.findall(rb'"completion_tokens":(\d+)', event)
            out.setdefault(int(index), []).append((text, used[0] if used else b""))
    return out


@pytest.mark.parametrize(
    ("path", "n"),
    [("/v1/chat/completions", 1), ("/v1/chat/completions", 2), ("/v1/completions", 1)],
)
async def test_steps_taken_together_go_in_one_write_as_one_event(
    harness: HarnessFactory, tok: Any, monkeypatch: pytest.MonkeyPatch, path: str, n: int
) -> None:
    """A stream that takes several engine steps at once (it fell behind the engine) sends
    them as one SSE event per choice, in one socket write, as vLLM's output collector merges
    the deltas its consumer has not taken yet: the same text in fewer events, the running
    usage of each event the count after its last step. So for each choice of ``n``."""
    steps = steps_of(tok, "one ", "two ", "three ", "four ")
    body: dict[str, Any] = {"model": "M", "max_tokens": 64, "n": n, "stream": True}
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if path == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    events = {}
    writes: dict[bool, list[bytes]] = {}
    for together in (False, True):
        spy = SocketWrites(monkeypatch)
        with trio.fail_after(DEADLINE_S):
            async with harness(plan=lambda r: steps) as h:
                if together:
                    steps_per_message(h.engine, monkeypatch, 2)
                raw = _post(json.dumps(body), path, extra="Connection: close\r\n")
                answer = await _talk(h, raw)
                assert h.client.inflight_count == 0
        events[together] = re.findall(rb"data: [^\n]*\n\n", _normal(answer))
        writes[together] = spy.writes
    for index in range(n):
        kept_up = _contents(events[False])[index]
        merged = _contents(events[True])[index]
        assert [t for t, _ in kept_up] == [b"one ", b"two ", b"three ", b"four "]
        assert [t for t, _ in merged] == [b"one two ", b"three four "]
        if n == 1:  # (with n > 1 the running usage sums the choices as their tasks run)
            assert [u for _, u in merged] == [kept_up[1][1], kept_up[3][1]]
    if n > 1:
        return
    for text in (b'"one two "', b'"three four "'):
        assert any(text in w for w in writes[True]), (text, writes[True])


@pytest.mark.parametrize("stream", [True, False])
async def test_an_output_and_an_out_of_band_end_in_one_message_end_the_answer(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """An engine output and the same request in ``finished_requests`` (ended without a
    terminal output) arriving together: the request is woken once, and still learns that
    its stream ended. The stream ends with the error event and ``[DONE]``; the whole answer
    is an error. Neither hangs."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            h.engine.stall()  # only the message below reaches the gateway
            arrived = h.engine.request_event
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as conn:
                raw = _post(_long_chat(8, stream=stream), extra="Connection: close\r\n")
                await conn.send_all(raw)
                await arrived.wait()
                rid = h.engine.requests[-1].request_id
                env = vllm.EngineCoreOutputs(
                    engine_index=0,
                    outputs=[vllm.EngineCoreOutput(request_id=rid, new_token_ids=[300])],
                    finished_requests=[rid],
                )
                await h.engine._push([encoder.encode(env)])
                answer = b""
                while data := await conn.receive_some(65536):
                    answer += data
            assert h.client.inflight_count == 0
    assert b"engine_aborted" in answer
    if stream:
        assert answer.endswith(_END)
    else:
        assert answer.startswith(b"HTTP/1.1 5")
