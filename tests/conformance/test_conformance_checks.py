"""Unit tests of the runner's pure checks: SSE framing, chunk sequences, error envelopes, reports."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import httpx
import pytest

from conformance.case import CaseResult, Result
from conformance.checks import error_problems, names_field, stream_problems, usage_problems
from conformance.client import Reply
from conformance.report import table_row, to_json, to_junit
from conformance.sse import SseDecoder, parse_sse


def _sse(*payloads: object) -> bytes:
    return b"".join(
        f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n".encode() for p in payloads
    )


def _chunk(
    index: int, content: str | None = None, finish: str | None = None, **delta: Any
) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


def test_parse_sse_accepts_openai_stream_with_keepalive() -> None:
    body = b": ping\n\n" + _sse({"a": 1}, {"b": 2}, "[DONE]")
    out = parse_sse(body)
    assert out.problems == []
    assert out.events == [{"a": 1}, {"b": 2}]
    assert out.done_count == 1


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_sse({"a": 1}), "no data: [DONE]"),
        (_sse({"a": 1}, "[DONE]", "[DONE]"), "[DONE] sent 2 times"),
        (_sse("[DONE]", {"a": 1}), "after data: [DONE]"),
        (_sse({"a": 1}, "[DONE]")[:-1], "does not end with a blank line"),
        (b'data: {"a":1}\r\n\r\ndata: [DONE]\r\n\r\n', "carriage return"),
        (b"data: {nope\n\ndata: [DONE]\n\n", "not JSON"),
        (b"data: [1]\n\ndata: [DONE]\n\n", "not a JSON object"),
        (b"event: x\ndata: {}\n\ndata: [DONE]\n\n", "not a single 'data: ' line"),
        (_sse({"error": {"message": "boom"}}, "[DONE]"), "in-stream error"),
        (b"", "empty"),
    ],
)
def test_parse_sse_reports_framing_problems(body: bytes, needle: str) -> None:
    problems = parse_sse(body).problems
    assert any(needle in p for p in problems), problems


def test_sse_decoder_gives_the_same_frames_at_any_split() -> None:
    """Fed byte by byte (a split inside a multi-byte character and between the two newlines
    included), the decoder returns each payload once its frame is complete."""
    body = b": ping\n\n" + _sse({"a": "\u00e9\u4e2d"}, {"b": 2}, "[DONE]")
    decoder = SseDecoder()
    seen: list[str] = []
    for i in range(len(body)):
        seen += decoder.feed(body[i : i + 1])
    decoder.close()
    assert decoder.problems == []
    assert [json.loads(p) for p in seen[:2]] == [{"a": "\u00e9\u4e2d"}, {"b": 2}]
    assert seen[2:] == ["[DONE]"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"event: x\ndata: {}\n\n", "frame 1 is not a single 'data: ' line"),
        (b'data: {"a":1}\r\n\r\n', "carriage return"),
        (b'data: {"a":1}', "does not end with a blank line"),
    ],
)
def test_sse_decoder_reports_framing_problems(body: bytes, needle: str) -> None:
    decoder = SseDecoder()
    decoder.feed(b"data: {}\n\n")
    decoder.feed(body)
    decoder.close()
    assert any(needle in p for p in decoder.problems), decoder.problems


def test_stream_problems_accepts_interleaved_n2_with_usage() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    events = [
        _chunk(1, role="assistant"),
        _chunk(0, "A", role="assistant"),
        _chunk(1, "x"),
        _chunk(0, None, "stop"),
        _chunk(1, None, "length"),
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [],
            "usage": usage,
        },
    ]
    problems, summary = stream_problems(events, kind="chat", n=2, include_usage=True)
    assert problems == []
    assert summary.texts == {0: "A", 1: "x"}
    assert summary.usage == usage


def test_stream_problems_flags_b04_b05_violations() -> None:
    events = [
        _chunk(0, "A", role="assistant"),
        _chunk(0, "x"),
        _chunk(0, None, "stop"),
        _chunk(0, None, "stop"),
    ]
    problems, _ = stream_problems(events, kind="chat", n=2)
    text = " | ".join(problems)
    assert "choice index 1 never appears" in text
    assert "2 finish_reason values" in text


def test_stream_problems_flags_missing_role_and_content_after_finish() -> None:
    events = [_chunk(0, "A"), _chunk(0, None, "stop"), _chunk(0, "late")]
    events[2]["id"] = "other"
    problems, _ = stream_problems(events, kind="chat")
    text = " | ".join(problems)
    assert "role None" in text
    assert "content after its finish_reason" in text
    assert "chunk ids differ" in text


def test_usage_problems() -> None:
    assert usage_problems({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}) == []
    assert (
        "!=" in usage_problems({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 6})[0]
    )
    assert (
        "exceeds"
        in usage_problems(
            {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}, max_completion=8
        )[0]
    )
    assert "missing" in usage_problems(None)[0]


def _reply(status: int, body: object, content_type: str = "application/json") -> Reply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Reply(status, httpx.Headers({"content-type": content_type}), raw, 0.0)


def test_error_problems_envelope_and_naming() -> None:
    good = _reply(
        400,
        {
            "error": {
                "message": "max_tokens must be >= 1",
                "type": "invalid_request_error",
                "param": "max_tokens",
            }
        },
    )
    assert error_problems(good, {400}, field_name="max_tokens", require_param=True) == ([], "")
    flat = _reply(400, {"detail": "nope"})
    assert "envelope" in error_problems(flat, {400})[0][0]
    plain = _reply(500, b"Internal Server Error", "text/plain")
    problems, _ = error_problems(plain, {400})
    assert "expected HTTP 400, got 500" in problems[0]
    assert any("not application/json" in p for p in problems)
    no_param = _reply(400, {"error": {"message": "max_tokens too small", "type": "x"}})
    assert (
        "error.param"
        in error_problems(no_param, {400}, field_name="max_tokens", require_param=True)[0][0]
    )


def test_names_field_matches_whole_words_only() -> None:
    assert names_field({"message": "top_logprobs must be <= 20"}, "top_logprobs")
    assert not names_field({"message": "top_logprobs must be <= 20"}, "logprobs")
    assert names_field({"message": "bad", "param": "n"}, "n")
    assert not names_field({"message": "none of the values"}, "n")


def test_reports_escape_and_shorten() -> None:
    results = [
        CaseResult("a", "does a", "because", Result.PASS, "ok", 0.01),
        CaseResult("b", "does b", "because", Result.FAIL, "bad \x00 <thing> " + "x" * 500, 0.02),
        CaseResult("c", "does c", "because", Result.SKIP, "n/a", 0.0),
    ]
    assert len(table_row(results[1])) < 500
    summary = to_json(results, {"base_url": "u", "model": "m"})
    assert summary["summary"] == {"passed": 1, "failed": 1, "skipped": 1, "total": 3}
    root = ET.fromstring(to_junit(results, {"base_url": "u", "model": "m"}).split("?>", 1)[1])
    cases = {tc.get("name"): tc for tc in root.iter("testcase")}
    failure = cases["b"].find("failure")
    assert failure is not None
    assert "<thing>" in (failure.get("message") or "")
    assert cases["c"].find("skipped") is not None
