"""Issue 25 on real engines: two vLLM CPU engines behind ``serve`` (the lane's shared
:func:`vllm_pair`) publish their KV cache events on the endpoints serve gave them, and a
multi-turn conversation gets its earlier turns' blocks back from the engines' prefix caches,
reported as ``usage.prompt_tokens_details.cached_tokens``.

Which engine stored each turn's blocks is read from the events (``stored_on``); the
``cache_aware`` policy routes by them, so every later turn lands where the first one did.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import trio
import zmq

from smg_trio.protocol.kv_events import BlockStored, decode_batch, decode_seq
from smg_trio.tokenizer import Tokenizer
from tests.e2e.conftest import VllmPair
from tests.helpers.e2e import http_client
from tests.helpers.sockets import raw_socket

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SYSTEM = "You are a careful assistant who answers briefly. " * 14
QUESTIONS = [
    "Tell me about rivers and stones.",
    "And what about clouds over the harbor?",
    "Which of them is older?",
    "Summarise the conversation in one line.",
]
#: The lane's engines are up already: a conversation takes seconds.
DEADLINE_S = 120.0
PROBE_S = 1.0
#: How long a turn's KV events may take to follow its answer.
EVENT_WAIT_S = 10.0
#: vLLM's block size on CPU.
BLOCK = 128


async def _probe_until_subscribed(http: Any, model: str, subs: list[Any]) -> None:
    """Send unrelated prompts until each engine's SUB got a batch: a SUB's subscription
    reaches the engine's PUB a little after it connects, and batches before that are lost."""
    waiting = set(range(len(subs)))
    n = 0
    while waiting:
        n += 1
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"probe {n}: " + "lantern ember " * 80}],
            "max_tokens": 1,
        }
        res = await http.post("/v1/chat/completions", json=body)
        assert res.status_code == 200, res.text
        for i in sorted(waiting):
            with trio.move_on_after(PROBE_S):
                await subs[i].recv_multipart()
                waiting.discard(i)


async def _publish_into(i: int, sub: Any, send: Any) -> None:
    """Forward engine ``i``'s ``BlockStored`` events (checking each message's frames)."""
    while True:
        topic, seq, payload = await sub.recv_multipart()
        assert topic == b""
        assert decode_seq(seq) >= 0
        for ev in decode_batch(payload).events:
            if isinstance(ev, BlockStored):
                assert len(ev.token_ids) == ev.block_size * len(ev.block_hashes)
                await send.send((i, ev))


async def _stored_by(receive: Any, prompt: list[int], cached: int) -> list[int]:
    """The engines that published the turn's new blocks: a ``BlockStored`` whose tokens are the
    prompt's from its cached prefix on (none when no new block filled)."""
    if len(prompt) // BLOCK * BLOCK <= cached:
        return []
    found: list[int] = []
    with trio.move_on_after(EVENT_WAIT_S):
        while not found:
            i, ev = await receive.receive()
            if ev.token_ids == prompt[cached : cached + len(ev.token_ids)]:
                found.append(i)
    return found


async def test_a_conversation_hits_the_engines_prefix_caches_and_events_arrive(
    vllm_pair: VllmPair, tiny_model: Path
) -> None:
    tok = Tokenizer.from_dir(tiny_model)
    send, receive = trio.open_memory_channel[tuple[int, BlockStored]](10_000)
    with trio.fail_after(DEADLINE_S), contextlib.ExitStack() as stack:
        subs = [
            raw_socket(stack, zmq.SUB, connect=ep, SUBSCRIBE=b"") for ep in vllm_pair.kv_endpoints
        ]
        async with http_client(vllm_pair.base_url) as http, trio.open_nursery() as nursery:
            await _probe_until_subscribed(http, vllm_pair.model, subs)
            for i, sub in enumerate(subs):
                nursery.start_soon(_publish_into, i, sub, send)
            messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
            usages, prompts, stored_on = [], [], []
            for question in QUESTIONS:
                messages.append({"role": "user", "content": question})
                prompt = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
                body = {
                    "model": vllm_pair.model,
                    "messages": messages,
                    "max_tokens": 8,
                    "temperature": 0,
                }
                res = await http.post("/v1/chat/completions", json=body)
                assert res.status_code == 200, res.text
                answer = res.json()
                usage = answer["usage"]
                usages.append(usage)
                prompts.append(prompt)
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                stored_on.append(await _stored_by(receive, prompt, cached))
                messages.append(
                    {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
                )
            nursery.cancel_scope.cancel()
    for usage, prompt in zip(usages, prompts, strict=True):
        assert usage["prompt_tokens"] == len(prompt)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert 0 <= cached < len(prompt)
        assert cached % BLOCK == 0
    assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(stored_on[0]) == 1, "the first turn's blocks were not published (once)"
    # Four turns on two engines: at least one later turn reached an engine that had
    # prefilled an earlier one, and found the shared system prompt's blocks there.
    cached_later = [u["prompt_tokens_details"]["cached_tokens"] for u in usages[1:]]
    assert any(c >= BLOCK for c in cached_later), (cached_later, stored_on)
    # cache_aware (the default policy) routes by those events: every later turn lands on the
    # engine that stored the first turn's blocks, and finds at least the system prompt there.
    assert all(s <= stored_on[0] for s in stored_on[1:]), stored_on
    assert all(c >= BLOCK for c in cached_later), (cached_later, stored_on)
