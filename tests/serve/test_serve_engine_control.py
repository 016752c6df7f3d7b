"""Engine control under ``serve --api-server-count 2``: the routes go to the supervisor from any
frontend, and a worker put to sleep there leaves every frontend's routing until woken."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers.frontends import single_frontend
from tests.serve.test_serve_multi_frontend import CHAT, Served, serve_two

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]


async def _chat_status(served: Served, index: int) -> httpx.Response:
    async with served.frontend(index) as c:
        return await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})


async def _wait_status(served: Served, index: int, status: int) -> httpx.Response:
    while True:
        resp = await _chat_status(served, index)
        if resp.status_code == status:
            return resp
        await trio.sleep(0.05)  # polling another process


async def test_sleep_on_one_frontend_holds_every_frontend(sock_dir: str, tmp_path: Path) -> None:
    async with serve_two(sock_dir, tmp_path) as served:
        for index in (1, 2):
            assert (await _chat_status(served, index)).status_code == 200
        async with served.frontend(1) as c:
            resp = await c.post("/sleep", params={"level": "1"})
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"status": "sleeping", "level": 1}
        with trio.fail_after(10):
            for index in (1, 2):
                resp = await _wait_status(served, index, 503)
                assert resp.headers["retry-after"] == "1"
                assert "sleeping" in resp.json()["error"]["message"]
        async with served.frontend(2) as c:
            doc = (await c.get("/is_sleeping")).json()
            assert doc["is_sleeping"] is True
            assert len(doc["engines"]) == 2  # both DP ranks answered
            resp = await c.post("/wake_up")
            assert resp.json() == {"status": "awake", "tags": None}
        with trio.fail_after(10):
            for index in (1, 2):
                await _wait_status(served, index, 200)
