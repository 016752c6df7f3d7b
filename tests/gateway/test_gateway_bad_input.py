"""Issue 18 item 6: every bad input is a 4xx in the OpenAI envelope, never a 500 or a
traceback (nested JSON strings, undecodable bodies, WebSocket upgrades, ambiguous framing,
405s, unauthenticated requests, log escaping)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from smg_trio.gateway.fastroute import InferenceRoutes
from tests.gateway.conftest import DEADLINE_S, HarnessFactory
from tests.gateway.test_gateway_rejections import assert_envelope, assert_untouched

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
    ],
    "/v1/completions": [
        b'{"model": "M", "prompt": "\xff"}',
        b'\xfe\xff{"model": "M", "prompt": "x"}',
        b'{"model": "M", "prompt": ' + LONE.encode() + b"}",
    ],
}


@pytest.mark.parametrize("which", [0, 1, 2], ids=["non-utf8-string", "bom", "lone-surrogate"])
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
