"""Issue 18 item 6: every bad input is a 4xx in the OpenAI envelope, never a 500 or a
traceback (nested JSON strings, undecodable bodies, WebSocket upgrades, ambiguous framing,
405s, unauthenticated requests, log escaping)."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.fastroute import InferenceRoutes
from tests.gateway.test_gateway_rejections import assert_envelope, assert_untouched
from tests.helpers.gateway import DEADLINE_S, HarnessFactory

#: ``"\\ud800"`` inside JSON text: an escaped lone surrogate, valid for Python's json.loads.
LONE = '"\\ud800"'

NESTED_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("guided_json", {"guided_json": '{"enum": [' + LONE + "]}"}, "guided_json"),
    (
        "structured_outputs.json",
        {"structured_outputs": {"json": '{"enum": [' + LONE + "]}"}},
        "structured_outputs.json",
    ),
    (
        "tool_calls arguments",
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": ' + LONE + "}"},
                        }
                    ],
                },
                {"role": "user", "content": "again"},
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
]


def rooted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mount the app under ``/x`` as far as the fast routes can tell, so that the Quart views
    serve the inference routes (see test_gateway_fastroute)."""
    real_call = InferenceRoutes.__call__

    async def call(self: InferenceRoutes, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, "root_path": "/x", "path": "/x" + scope["path"]}
        await real_call(self, scope, receive, send)

    monkeypatch.setattr(InferenceRoutes, "__call__", call)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("case", "fields", "param"), NESTED_CASES, ids=[c[0] for c in NESTED_CASES]
)
async def test_lone_surrogate_in_nested_json_is_a_400(
    harness: HarnessFactory,
    caplog: pytest.LogCaptureFixture,
    case: str,
    fields: dict[str, Any],
    param: str,
) -> None:
    """Finding 7: nested JSON went through json.loads, which accepts ``\\ud800``."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            err = assert_envelope(await h.chat(**fields), 400, param)
            assert err["code"] == "json_parse_error"
            await assert_untouched(h)
    assert not _errors(caplog)


#: Bodies that are not UTF-8 (or carry a lone surrogate) in a field each route reads.
UNDECODABLE: dict[str, list[bytes]] = {
    "/v1/chat/completions": [
        b'{"model": "M", "messages": [{"role": "user", "content": "\xff"}]}',
        b'\xfe\xff{"model": "M", "messages": []}',
        b'{"model": "M", "messages": [{"role": "user", "content": ' + LONE.encode() + b"}]}",
        b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "x": "\xff"}',
    ],
    "/v1/completions": [
        b'{"model": "M", "prompt": "\xff"}',
        b'\xfe\xff{"model": "M", "prompt": "x"}',
        b'{"model": "M", "prompt": ' + LONE.encode() + b"}",
        b'{"model": "M", "prompt": "hi", "vendor": {"x": "\xff"}}',
    ],
}


@pytest.mark.parametrize(
    "which", [0, 1, 2, 3], ids=["non-utf8-string", "bom", "lone-surrogate", "non-utf8-ignored"]
)
@pytest.mark.parametrize("path", sorted(UNDECODABLE))
@pytest.mark.parametrize("quart", [False, True], ids=["fastroute", "quart"])
async def test_undecodable_body_is_a_400(
    harness: HarnessFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    which: int,
    path: str,
    quart: bool,
) -> None:
    """Non-UTF-8 bodies are a 400 on the fast routes and on the Quart views alike."""
    if quart:
        rooted(monkeypatch)
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.http.post(
                path, content=UNDECODABLE[path][which], headers={"content-type": "application/json"}
            )
            err = assert_envelope(resp, 400)
            assert err["code"] == "json_parse_error"
            await assert_untouched(h)
    assert not _errors(caplog)


async def _raw_exchange(base_url: str, raw: bytes) -> bytes:
    """Send ``raw`` on a fresh connection and read until the server closes it (the caller's
    deadline fails the test if it never does)."""
    url = httpx.URL(base_url)
    assert url.host is not None
    assert url.port is not None
    data = b""
    async with await trio.open_tcp_stream(url.host, url.port) as stream:
        await stream.send_all(raw)
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


def _split(data: bytes) -> tuple[bytes, dict[str, Any], bytes]:
    """The first response's head (lower-cased), its JSON error, and what followed it."""
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body, rest = rest[:length], rest[length:]
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return head.lower(), err, rest


def _ws_upgrade(path: str, extra: str = "") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"{extra}\r\n"
    ).encode()


@pytest.mark.parametrize("api_key", [None, "k"], ids=["open", "keyed"])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/health", "/nope", "/"])
async def test_websocket_upgrade_is_a_400_without_a_traceback(
    harness: HarnessFactory, caplog: pytest.LogCaptureFixture, api_key: str | None, path: str
) -> None:
    """Finding 8: every WebSocket upgrade was a 500 with an empty body and a logged
    traceback, with or without --api-key."""
    caplog.set_level(logging.INFO)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key=api_key)) as h:
            head, err, _ = _split(await _raw_exchange(h.base_url, _ws_upgrade(path)))
            assert head.startswith(b"http/1.1 400 "), head
            assert b"content-type: application/json" in head
            assert err["code"] == "websocket_not_supported"
            await assert_untouched(h)
    assert not _errors(caplog)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/models"])
async def test_content_length_and_transfer_encoding_is_a_400_and_a_close(
    harness: HarnessFactory, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """Finding 9: both framings on one request (a smuggling shape) was served on a kept-alive
    connection. Now: a 400, ``connection: close``, the connection really closed, and the
    request pipelined behind it never answered."""
    body = json.dumps({"model": "M", "prompt": "hi", "max_tokens": 1}).encode()
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
        f"{len(body):x}\r\n"
    ).encode()
    raw += body + b"\r\n0\r\n\r\n" + smuggled
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            head, err, rest = _split(await _raw_exchange(h.base_url, raw))
            assert head.startswith(b"http/1.1 400 "), head
            assert b"connection: close" in head
            assert err["code"] == "invalid_http_request"
            assert rest == b""  # closed: the pipelined request was never served
            await assert_untouched(h)
    assert not _errors(caplog)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", {"POST"}),
        ("PUT", "/v1/completions", {"POST"}),
        ("DELETE", "/v1/models", {"GET"}),
        ("POST", "/health", {"GET"}),
    ],
)
async def test_405_carries_allow(
    harness: HarnessFactory, method: str, path: str, allowed: set[str]
) -> None:
    """Finding 9: 405 responses lacked ``Allow`` (RFC 9110 15.5.6 requires it)."""
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            resp = await h.http.request(method, path)
            assert_envelope(resp, 405)
            allow = {m.strip() for m in resp.headers["allow"].split(",")}
            assert allowed <= allow
            assert method not in allow


UNAUTHENTICATED: list[bytes] = [
    b"FOO /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    b"GET http://evil/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: \xff\xfe\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Basic Zm9v\r\n"
    b"Content-Length: 2\r\nContent-Type: application/json\r\n\r\n{}",
    b"GET /v1/models/%ff%00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /workers HTTP/1.1\r\nHost: x\r\n\r\n",
    _ws_upgrade("/v1/models", "Authorization: Bearer wrong\r\n"),
]


@pytest.mark.parametrize("raw", UNAUTHENTICATED, ids=range(len(UNAUTHENTICATED)))
async def test_unauthenticated_requests_never_log_a_traceback(
    harness: HarnessFactory, caplog: pytest.LogCaptureFixture, raw: bytes
) -> None:
    """Odd methods, odd targets and bad keys are answered (4xx, the envelope when there is a
    body) with nothing logged at ERROR and no traceback: no unauthenticated log flood."""
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(api_key="k")) as h:
            if b"Upgrade:" not in raw:  # read to the end: ask for the close
                raw = raw.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
            data = await _raw_exchange(h.base_url, raw)
            status = int(data.split(b" ", 2)[1])
            assert 400 <= status < 500, data
            await assert_untouched(h)
    assert not _errors(caplog)


async def test_logged_request_values_are_escaped(
    harness: HarnessFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """What the gateway logs about a request is validated first (the request id) or escaped
    (the Content-Type), so no header can forge or colour a log line."""
    caplog.set_level(logging.DEBUG, logger="smg_trio.gateway")
    hostile = "application/json; x=\x85\x1b\t\xe9"
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            raw = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Content-Type: {hostile}\r\nx-request-id: forged\x85id\r\n"
                "Content-Length: 2\r\n\r\n{}"
            ).encode("latin-1")
            data = await _raw_exchange(h.base_url, raw)
            assert data.startswith(b"HTTP/1.1 400 "), data
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("smg_trio.gateway")]
    assert any("started" in line for line in lines)
    for line in lines:
        assert line.isprintable(), line
        assert "forged" not in line  # an invalid request id is replaced, never logged


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_draining_refuses_before_reading_the_body(harness: HarnessFactory, path: str) -> None:
    """A draining gateway answers 503 from the headers: it does not wait for (or tokenize) a
    body it will refuse, so requests arriving during a drain cannot keep it busy."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    with trio.fail_after(DEADLINE_S):
        async with harness(config=GatewayHttpConfig(body_timeout_s=3600.0)) as h:
            h.backend.start_draining()
            data = await _raw_exchange(h.base_url, head)  # the body never comes
            head_out, err, _ = _split(data)
            assert head_out.startswith(b"http/1.1 503 "), head_out
            assert err["code"] == "draining"
            assert h.engine.requests == []
