"""The tokenizer threads are shared fairly (docs/security.md, "Shared worker pools"): huge
requests, whose encode may take seconds, and huge whole responses, whose build may, hold at
most ``HUGE_TOKENIZER_THREADS`` of them, so that a smaller request that needs a thread still
gets one while they run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing

from smg_trio.gateway.http import call as call_module
from smg_trio.gateway.http.call import (
    HUGE_TOKENIZE_BYTES,
    HUGE_TOKENIZER_THREADS,
    TOKENIZER_THREADS,
)
from smg_trio.gateway.openai.chat import ChatJob
from smg_trio.tokenizer import Tokenizer
from tests.helpers.gateway import DEADLINE_S, HarnessFactory


async def test_huge_requests_leave_threads_for_the_others(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many huge tokenize requests as there are threads, each held in its encode (a
    stand-in for seconds of work on a long pre-token): only their share encodes at once, and
    a 16 KiB request (in a thread too) is answered meanwhile. Without the share the huge
    ones took every thread and it waited for them."""
    release = threading.Event()
    lock = threading.Lock()
    in_encode = 0
    most = 0
    entered = trio.Event()
    encode = Tokenizer.encode
    token = trio.lowlevel.current_trio_token()

    def held_encode(self: Tokenizer, text: str, *args: Any, **kw: Any) -> list[int]:
        nonlocal in_encode, most
        if len(text) < HUGE_TOKENIZE_BYTES:
            return encode(self, text, *args, **kw)
        with lock:
            in_encode += 1
            most = max(most, in_encode)
        trio.from_thread.run_sync(entered.set, trio_token=token)
        release.wait()
        with lock:
            in_encode -= 1
        return [0]

    monkeypatch.setattr(Tokenizer, "encode", held_encode)
    huge = {"model": "M", "prompt": "a " * HUGE_TOKENIZE_BYTES}
    small = {"model": "M", "prompt": "hello " * (16 * 1024 // 6)}
    statuses: list[int] = []
    with trio.fail_after(DEADLINE_S):
        async with harness(max_model_len=4 * HUGE_TOKENIZE_BYTES) as h:

            async def post_huge() -> None:
                statuses.append((await h.post("/v1/tokenize", huge)).status_code)

            async with trio.open_nursery() as nursery:
                try:
                    for _ in range(TOKENIZER_THREADS):
                        nursery.start_soon(post_huge)
                    await entered.wait()
                    await trio.testing.wait_all_tasks_blocked()
                    resp = await h.post("/v1/tokenize", small)
                    assert resp.status_code == 200, resp.text
                    assert most <= HUGE_TOKENIZER_THREADS
                finally:
                    release.set()
    assert statuses == [200] * TOKENIZER_THREADS
    assert most == HUGE_TOKENIZER_THREADS


async def test_huge_whole_responses_leave_threads_for_the_others(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole responses from ``HUGE_RENDER_TOKENS`` completion tokens on (here 2: the
    thresholds are lowered) are built in the huge requests' share of the threads: four held
    in their build leave two threads, and a 16 KiB tokenize request is answered meanwhile."""
    monkeypatch.setattr(call_module, "RENDER_OFFLOAD_TOKENS", 1)
    monkeypatch.setattr(call_module, "HUGE_RENDER_TOKENS", 2)
    release = threading.Event()
    lock = threading.Lock()
    building = 0
    most = 0
    entered = trio.Event()
    result = ChatJob.result
    token = trio.lowlevel.current_trio_token()

    def held_result(self: ChatJob, collected: Any) -> Any:
        nonlocal building, most
        if threading.current_thread() is threading.main_thread():
            return result(self, collected)
        with lock:
            building += 1
            most = max(most, building)
        trio.from_thread.run_sync(entered.set, trio_token=token)
        release.wait()
        with lock:
            building -= 1
        return result(self, collected)

    monkeypatch.setattr(ChatJob, "result", held_result)
    small = {"model": "M", "prompt": "hello " * (16 * 1024 // 6)}
    statuses: list[int] = []
    with trio.fail_after(DEADLINE_S):
        async with harness(max_model_len=65536) as h:

            async def whole() -> None:
                resp = await h.chat(max_tokens=4, min_tokens=4)
                statuses.append(resp.status_code)

            async with trio.open_nursery() as nursery:
                try:
                    for _ in range(TOKENIZER_THREADS):
                        nursery.start_soon(whole)
                    await entered.wait()
                    await trio.testing.wait_all_tasks_blocked()
                    resp = await h.post("/v1/tokenize", small)
                    assert resp.status_code == 200, resp.text
                    assert most <= HUGE_TOKENIZER_THREADS
                finally:
                    release.set()
    assert statuses == [200] * TOKENIZER_THREADS
    assert most == HUGE_TOKENIZER_THREADS
