"""What held up in issue 18's adversarial run, and must keep holding (end to end against the
app over real HTTP): the bearer check, request-id sanitising, the prompt and stop limits, idle
and slowloris connections, HTTP/1.0, pipelining, ``Expect``, bad chunk sizes, h2c and HTTP/2
floods. (Body and ``n`` limits, deep JSON, oversized headers and garbage on the handshake port
are tested where those features are: see docs/security.md, "Bad input".)"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http import call as call_module
from smg_trio.gateway.openai.translate import MAX_STOP_CHARS
from tests.gateway.test_gateway_rejections import assert_envelope, assert_untouched
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, hostport

KEY = "sekret-key"
CHAT_BODY = json.dumps(
    {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
)


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def _request(
    method: str, path: str, body: str = "", version: str = "1.1", extra: str = ""
) -> bytes:
    head = f"{method} {path} HTTP/{version}\r\nHost: x\r\n{extra}"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n" + body).encode()


def _statuses(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", data)]


# -- the bearer check -------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_bearer_scheme_is_case_insensitive(harness: HarnessFactory, scheme: str) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key=KEY)) as h:
            resp = await h.http.get("/v1/models", headers={"authorization": f"{scheme} {KEY}"})
            assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        f"Bearer {KEY}x",
        f"Bearer {KEY[:-1]}",
        f"Bearer{KEY}",
        f"Basic {KEY}",
        f"Token {KEY}",
        KEY,
        f"Bearer {KEY.upper()}",
        f"Bearer {KEY} {KEY}",
    ],
)
async def test_everything_but_the_key_is_refused(
    harness: HarnessFactory, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"authorization": authorization}
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key=KEY)) as h:
            for resp in (
                await h.http.get("/v1/models", headers=headers),
                await h.http.post(
                    "/v1/chat/completions",
                    content=CHAT_BODY,
                    headers={**headers, "content-type": "application/json"},
                ),
            ):
                err = assert_envelope(resp, 401)
                assert err["code"] == "invalid_api_key"
            await assert_untouched(h)


async def test_key_is_compared_in_constant_time(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key goes through ``hmac.compare_digest`` (no early exit on the first differing
    byte), for a right key and a wrong one alike."""
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(call_module.hmac, "compare_digest", spy)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key=KEY)) as h:
            ok = await h.http.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200
            bad = await h.http.get("/v1/models", headers={"authorization": "Bearer xx"})
            assert bad.status_code == 401
    assert (KEY.encode(), KEY.encode()) in seen
    assert (b"xx", KEY.encode()) in seen


# -- request ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["has space", "tab\there", "naïve", "x" * 257, "a\u2028b"],
    ids=["space", "tab", "non-ascii", "too-long", "line-separator"],
)
async def test_unfit_request_id_is_replaced(harness: HarnessFactory, value: str) -> None:
    """A request id that could forge a log line or a header is not echoed: a fresh one is."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw = value.encode("utf-8")
            headers = [(b"x-request-id", raw), (b"content-type", b"application/json")]
            resp = await h.http.post("/v1/chat/completions", content=CHAT_BODY, headers=headers)
            assert resp.status_code == 200, resp.text
            echoed = resp.headers["x-request-id"]
            assert echoed != value
            assert re.fullmatch(r"[0-9a-f]{32}", echoed)
            longest = "y" * 256
            resp = await h.http.get("/v1/models", headers={"x-request-id": longest})
            assert resp.headers["x-request-id"] == longest


# -- prompt and stop limits -------------------------------------------------------------------


async def test_more_prompts_than_max_prompts_is_a_400(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(max_prompts=4)) as h:
            err = assert_envelope(await h.complete(prompt=["a"] * 5, max_tokens=1), 400, "prompt")
            assert "at most 4 prompts" in err["message"]
            await assert_untouched(h)
            assert (await h.complete(prompt=["a"] * 4, max_tokens=1)).status_code == 200


async def test_too_long_stop_string_is_a_400(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.chat(max_tokens=2, stop=["s" * (MAX_STOP_CHARS + 1)])
            assert_envelope(resp, 400)
            await assert_untouched(h)
            assert (await h.chat(max_tokens=2, stop=["s" * MAX_STOP_CHARS])).status_code == 200


# -- idle and slowloris connections ------------------------------------------------------------


async def test_idle_connection_is_closed_and_slowloris_blocks_no_one(
    harness: HarnessFactory,
) -> None:
    """Connections that send nothing, or headers a byte at a time, never hold up other
    clients; one that stays silent is closed by the server (hypercorn's keep-alive timeout),
    not kept forever."""
    with trio.fail_after(4 * DEADLINE_S):
        async with harness() as h:
            host, port = hostport(h.base_url)
            idle = await trio.open_tcp_stream(host, port)
            slow = [await trio.open_tcp_stream(host, port) for _ in range(20)]
            for s in slow:
                await s.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: ")
            for _ in range(3):
                resp = await h.chat(max_tokens=2)
                assert resp.status_code == 200, resp.text
                for s in slow:
                    await s.send_all(b"a")
            assert await _read_all(idle) == b""  # closed by the server
            await idle.aclose()
            for s in slow:
                await s.aclose()


# -- HTTP/1.x framing --------------------------------------------------------------------------


async def test_http_1_0_is_served_and_closed(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(_request("POST", "/v1/chat/completions", CHAT_BODY, "1.0"))
                data = await _read_all(stream)  # HTTP/1.0: the server closes after one
            assert _statuses(data) == [200]
            assert b'"chat.completion"' in data


async def test_pipelined_requests_are_answered_in_order(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw = (
                _request("POST", "/v1/chat/completions", CHAT_BODY)
                + _request("GET", "/v1/nope")
                + _request("GET", "/v1/models", extra="Connection: close\r\n")
            )
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(raw)
                data = await _read_all(stream)
            assert _statuses(data) == [200, 404, 200]
            assert data.index(b'"chat.completion"') < data.index(b'"object":"list"')


@pytest.mark.parametrize("api_key", [None, KEY], ids=["open", "refused"])
async def test_expect_100_continue(harness: HarnessFactory, api_key: str | None) -> None:
    """``Expect: 100-continue``: the body is asked for and the request served; a request that
    is refused before its body (401) gets its answer without the body ever being sent."""
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key=api_key)) as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                head = _request("POST", "/v1/chat/completions", CHAT_BODY)
                head = head[: head.index(b"\r\n\r\n")] + b"\r\nExpect: 100-continue\r\n\r\n"
                await stream.send_all(head)
                data = await stream.receive_some(65536)
                if api_key is None:
                    assert data.startswith(b"HTTP/1.1 100 ")
                    await stream.send_all(CHAT_BODY.encode())
                    while b'"chat.completion"' not in data:
                        data += await stream.receive_some(65536)
                    assert _statuses(data) == [100, 200]
                else:  # refused without the body (hypercorn may say 100 first)
                    while 401 not in _statuses(data):
                        data += await stream.receive_some(65536)
                    assert _statuses(data) in ([401], [100, 401]), data[:200]
            assert len(h.engine.requests) == (0 if api_key else 1)


async def test_an_unknown_transfer_coding_is_a_400_not_a_501(harness: HarnessFactory) -> None:
    """h11 hints 501 for ``Transfer-Encoding: chunked, identity``; it is bad input: a 400."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
                b"2\r\n{}\r\n0\r\n\r\n"
            )
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(raw)
                data = await _read_all(stream)
            assert _statuses(data) == [400], data[:300]
            body = data.partition(b"\r\n\r\n")[2]
            assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "size",
    [b"zz", b"-1", b"0x5", b"", b"5;" + b"x" * 20000],
    ids=["not-hex", "negative", "0x-prefix", "empty", "huge-extension"],
)
async def test_bad_chunk_size_is_a_400_and_a_close(harness: HarnessFactory, size: bytes) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                + size
                + b"\r\n{}\r\n0\r\n\r\n"
                + _request("GET", "/v1/models")
            )
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(raw)
                data = await _read_all(stream)  # the server closes: nothing pipelined served
            assert _statuses(data) == [400], data[:300]
            body = data.partition(b"\r\n\r\n")[2]
            assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
            await assert_untouched(h)


# -- HTTP/2 -----------------------------------------------------------------------------------


async def test_h2c_upgrade_is_answered_never_a_5xx(harness: HarnessFactory) -> None:
    """``Upgrade: h2c`` on HTTP/1.1: answered (as HTTP/1.1, or by switching to HTTP/2), never
    a 5xx or a hang; the server keeps serving."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            extra = (
                "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                "HTTP2-Settings: AAMAAABkAAQAAP__\r\n"
            )
            assert (await h.chat(max_tokens=2)).status_code == 200
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(_request("GET", "/v1/models", extra=extra))
                first = await stream.receive_some(65536)
            status = int(first.split(b" ", 2)[1])
            assert status in (101, 200), first[:200]


async def test_http2_is_off_by_default(harness: HarnessFactory) -> None:
    """Without ``enable_http2`` (``--enable-http2``): a prior-knowledge HTTP/2 preface gets a
    505 envelope and the connection closes; an ``Upgrade: h2c`` is answered in HTTP/1.1 (no
    101). With it, the upgrade switches protocols. (hypercorn's HTTP/2 cannot drop a client
    that never opens its flow-control window, so it is opt-in: docs/security.md.)"""
    upgrade = (
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        "HTTP2-Settings: AAMAAABkAAQAAP__\r\n"
    )
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                answer = b""
                while chunk := await stream.receive_some(65536):
                    answer += chunk  # until the server closes
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 505"), answer[:200]
            assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(_request("GET", "/v1/models", extra=upgrade))
                first = await stream.receive_some(65536)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            assert (await h.chat(max_tokens=2)).status_code == 200
        async with harness(config=GatewayHttpConfig(enable_http2=True)) as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(_request("GET", "/v1/models", extra=upgrade))
                first = await stream.receive_some(65536)
            assert first.startswith(b"HTTP/1.1 101"), first[:200]


async def test_http2_floods_are_bounded_and_others_still_served(harness: HarnessFactory) -> None:
    """A small HTTP/2 flood on one prior-knowledge h2c connection (PINGs, SETTINGS, streams
    opened and reset at once: "rapid reset"): refused (HTTP/2 is off by default), and while
    that connection is open other clients are still served."""
    h2_connection = pytest.importorskip("h2.connection")
    h2_config = pytest.importorskip("h2.config")
    with trio.fail_after(3 * DEADLINE_S):
        async with harness() as h:
            assert (await h.http.get("/v1/models")).status_code == 200  # opens the pool
            conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True))
            conn.initiate_connection()
            for i in range(500):
                conn.ping(i.to_bytes(8, "big"))
                conn.update_settings({})
            headers = [(":method", "GET"), (":path", "/v1/models"), (":scheme", "http")]
            headers.append((":authority", "x"))
            for _ in range(500):
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, headers, end_stream=True)
                conn.reset_stream(sid)
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                try:
                    await stream.send_all(conn.data_to_send())
                    answer = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    answer = b""  # dropped by the server: fine
                # HTTP/2 is off by default: the flood is refused at its preface
                assert answer == b"" or answer.startswith(b"HTTP/1.1 505"), answer[:100]
                # another client is served while the flooding connection is open
                resp = await h.chat(max_tokens=2)
                assert resp.status_code == 200, resp.text
