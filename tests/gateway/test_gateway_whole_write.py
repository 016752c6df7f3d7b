"""Whole non-streamed responses in one socket write (``DirectWriter.send_whole``), and the ASGI
fall back where that is not possible: the same answers, keep-alive and pipelining intact."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import trio

from smg_trio.gateway.server.direct import DirectSocket, DirectWriter
from smg_trio.gateway.server.fast_http1 import FastExchange
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, hostport

CHAT = json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def _post(body: str, extra: str = "") -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n{body}"
    ).encode()


def _chunked(body: str) -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n{body}\r\n0\r\n\r\n"
    ).encode()


def _responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split Content-Length-framed HTTP/1.1 responses: (status, headers, body) each."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers["content-length"])
        out.append((status, headers, rest[:length]))
        data = rest[length:]
    return out


class WholeSpy:
    """Counts the responses ``send_whole`` sent itself (on either server's writer)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent = 0

        def spy(cls: type[DirectWriter]) -> None:
            real = cls.send_whole

            async def send_whole(ds: DirectWriter, *args: Any) -> bool:
                done = await real(ds, *args)
                self.sent += done
                return done

            monkeypatch.setattr(cls, "send_whole", send_whole)

        for cls in (DirectSocket, FastExchange):
            spy(cls)


@pytest.fixture
def harness(harness_both: HarnessFactory) -> HarnessFactory:
    """Every test here runs on the fast path and on hypercorn's."""
    return harness_both


async def _exchange(harness: HarnessFactory, raw: bytes) -> bytes:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            async with await trio.open_tcp_stream(*hostport(h.base_url)) as stream:
                await stream.send_all(raw)
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
            assert h.client.inflight_count == 0
    return data


PIPELINED = (
    _post(CHAT)
    + _post("{not json")
    + _chunked(CHAT)
    + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
)


async def test_pipelined_answers_are_whole_writes_in_order(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WholeSpy(monkeypatch)
    answers = _responses(await _exchange(harness, PIPELINED))
    assert [status for status, _, _ in answers] == [200, 400, 200, 200]
    assert spy.sent == 3  # the three inference answers; /v1/models goes through Quart
    for status, headers, body in answers[:3]:
        assert headers["content-type"] == "application/json"
        assert "x-request-id" in headers
        assert "date" in headers
        payload = json.loads(body)
        assert ("error" in payload) == (status == 400)
    assert json.loads(answers[0][2])["object"] == "chat.completion"
    assert answers[3][1]["connection"] == "close"


async def test_the_asgi_fallback_answers_the_same(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a direct socket (TLS, HTTP/2, another server) the answers go through ASGI:
    the same statuses, the same headers, the same JSON shapes."""
    spy = WholeSpy(monkeypatch)
    direct = _responses(await _exchange(harness, PIPELINED))
    assert spy.sent == 3
    monkeypatch.setattr(DirectWriter, "of", staticmethod(lambda send: None))
    fallback = _responses(await _exchange(harness, PIPELINED))
    assert spy.sent == 3  # no more

    def shape(answers: list[tuple[int, dict[str, str], bytes]]) -> list[Any]:
        out = []
        for status, headers, body in answers:
            payload = json.loads(body)
            out.append((status, sorted(headers), sorted(payload), re.sub(rb"\d", b"0", body[:12])))
        return out

    assert shape(direct) == shape(fallback)
