"""vLLM 0.32's streamed background response (``background`` with ``stream``): the POST
streams the events the background task records; ``GET /v1/responses/{id}?stream=true``
(``&starting_after=N``) replays them; the client going away does not stop the response
(``responses/serving.py``: ``_run_background_request_stream``,
``responses_background_stream_generator``)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from smg_trio.errors import ValidationError
from smg_trio.gateway.openai.responses_events import EventLog
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory, steps_of
from tests.helpers.raw_sse import RawSSE
from tests.helpers.sse import sse_events

BODY = {"model": "M", "input": "hi", "background": True, "stream": True}


def _events(text: str) -> list[dict[str, Any]]:
    return [e for e in sse_events(text) if isinstance(e, dict)]


async def _poll(h: Any, rid: str) -> dict[str, Any]:
    while True:
        got: dict[str, Any] = (await h.http.get(f"/v1/responses/{rid}")).json()
        if got["status"] not in ("queued", "in_progress"):
            return got
        await trio.sleep(0.01)


async def test_background_stream_and_its_replay(harness: HarnessFactory, tok: Tokenizer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "Hello", " world")) as h:
            res = await h.http.post("/v1/responses", json=BODY)
            assert res.status_code == 200, res.text
            assert res.headers["content-type"].startswith("text/event-stream")
            events = _events(res.text)
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            assert events[0]["type"] == "response.created"
            assert events[-1]["type"] == "response.completed"
            rid = events[-1]["response"]["id"]
            text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert text == "Hello world"
            stored = await _poll(h, rid)
            assert stored["status"] == "completed"
            assert stored["background"] is True
            assert stored["output"][0]["content"][0]["text"] == "Hello world"
            again = await h.http.get(f"/v1/responses/{rid}?stream=true&starting_after=2")
            assert again.status_code == 200, again.text
            assert _events(again.text) == events[3:]
            whole = await h.http.get(f"/v1/responses/{rid}?stream=true")
            assert _events(whole.text) == events


async def test_background_stream_errors(harness: HarnessFactory, tok: Tokenizer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps_of(tok, "ok")) as h:
            missing = await h.http.get("/v1/responses/resp_nope?stream=true")
            assert missing.status_code == 404
            polled = await h.http.post("/v1/responses", json={**BODY, "stream": False})
            rid = polled.json()["id"]
            await _poll(h, rid)
            unknown = await h.http.get(f"/v1/responses/{rid}?stream=true")
            assert unknown.status_code == 400  # vLLM: not a streamed background response
            assert unknown.json()["error"]["param"] == "response_id"
            streamed = _events((await h.http.post("/v1/responses", json=BODY)).text)
            sid = streamed[-1]["response"]["id"]
            bad = await h.http.get(f"/v1/responses/{sid}?stream=true&starting_after=x")
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "starting_after"


async def test_client_leaving_the_stream_does_not_stop_the_response(
    harness: HarnessFactory, tok: Tokenizer
) -> None:
    """The POST's connection closes after the first event; the response runs on to its end
    (stored ``incomplete`` at ``max_output_tokens``), its engine request never ABORTed."""
    steps = [tok.encode("x")] * 300
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps, step_s=0.002) as h:
            body = {**BODY, "max_output_tokens": 300}
            sse = await RawSSE.post(h.base_url, "/v1/responses", body)
            first = await sse.until(lambda evs: len(evs) >= 1)
            await sse.aclose()
            rid = first[0]["response"]["id"]
            done = await _poll(h, rid)
            assert done["status"] == "incomplete", done["error"]
            assert done["usage"]["output_tokens"] == 300
            assert h.engine.aborts == []


async def test_cancel_ends_the_stream(harness: HarnessFactory, tok: Tokenizer) -> None:
    steps = [tok.encode("x")] * 1000
    with trio.fail_after(DEADLINE_S):
        async with harness(plan=lambda r: steps, step_s=0.01) as h:
            sse = await RawSSE.post(
                h.base_url, "/v1/responses", {**BODY, "max_output_tokens": 1000}
            )
            # a text delta: the engine has the request (response.created comes before the ADD)
            first = await sse.until(
                lambda evs: any(e.get("type") == "response.output_text.delta" for e in evs)
            )
            rid = first[0]["response"]["id"]
            res = await h.http.post(f"/v1/responses/{rid}/cancel", json={})
            assert res.status_code == 200, res.text
            assert res.json()["status"] == "cancelled"
            rest = await sse.rest()  # the stream ends (vLLM's would wait forever)
            assert all(e["type"] != "response.completed" for e in rest)
            await sse.aclose()
            await h.wait_aborted([h.engine.requests[-1].request_id])


def test_event_log_keeps_its_bound() -> None:
    log = EventLog(max_bytes=100)
    frames = b"".join(b'event: e\ndata: {"n":%d}\n\n' % i for i in range(20))
    log.extend(frames)
    assert log.size <= 100
    with pytest.raises(ValidationError) as exc:
        log.check_start(None)
    assert exc.value.param == "starting_after"
    assert log.check_start(18) == 19


async def test_a_lagging_follower_gets_an_error_event() -> None:
    log = EventLog(max_bytes=60)
    log.extend(b"event: e\ndata: {}\n\n")
    out: list[bytes] = []
    with trio.fail_after(DEADLINE_S):
        follower = log.follow(0)
        out.append(await follower.__anext__())
        log.extend(b"".join(b'event: e\ndata: {"n":%d}\n\n' % i for i in range(10)))
        log.close()
        out.extend([frame async for frame in follower])
    assert out[-1].startswith(b"event: error\n")
