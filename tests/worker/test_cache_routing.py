"""cache_aware end to end: over HTTP, through a WorkerManager, two mock engines; each
conversation's later turns land on the engine that holds its prefix (told by the engines' KV
events, or, without events, by the prompts routed there); two gateways hearing the same
events route a session alike."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.routing.cache_aware import CacheAwareRouter, EngineCandidate, RouteRequest
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.kv_feed import KvFeed
from smg_trio.worker.manager import WorkerManager, WorkerSpec, WorkerState
from tests.helpers.ipc import IpcNamespace, free_handshake_address
from tests.helpers.kv_publisher import (
    BLOCK,
    PublishedEngine,
    PublishingMock,
    kv_publisher,
)

DEADLINE_S = 30.0


@asynccontextmanager
async def gateway(
    ns: IpcNamespace, *, events: bool
) -> AsyncIterator[tuple[Any, list[PublishedEngine]]]:
    conf = WorkerConfinement(
        socket_dirs=(ns.directory, tempfile.gettempdir()),
        model_dirs=(str(default_tiny_model_dir()),),
    )
    async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, ready_timeout_s=5.0, confinement=conf)
        engines = []
        for name in ("a", "b"):
            hs = free_handshake_address()
            endpoint = f"ipc://{ns.directory}/kv-{name}" if events else None
            pub = None
            if endpoint is not None:
                pub = await stack.enter_async_context(kv_publisher(endpoint))
            mock = PublishingMock(hs, endpoint)
            nursery.start_soon(mock.run)
            spec = WorkerSpec(
                url=ns.worker_url(name),
                model_path=str(default_tiny_model_dir()),
                model_id="m",
                zmq_handshake_address=hs,
            )
            await manager.register(spec)
            if pub is not None:
                await pub.wait_subscribed()
            engines.append(PublishedEngine(mock, pub))
        app = create_app(manager)
        binds = await nursery.start(partial(serve_http, app, "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=binds[0], timeout=30.0) as http:
            yield (manager, http), engines
        nursery.cancel_scope.cancel()


async def scrape(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/metrics")
    assert r.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def samples(fams: dict[str, Any], name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """``{label values: value}`` of the samples named ``name`` (family looked up by its
    name without ``_total``)."""
    family = fams[name.removesuffix("_total")]
    keys = labels or ("worker", "rank")
    return {tuple(sm.labels[k] for k in keys): sm.value for sm in family.samples if sm.name == name}


async def turn(http: httpx.AsyncClient, engines: list[PublishedEngine], prompt: list[int]) -> int:
    """Send one turn; returns the index of the engine that served it."""
    before = [len(e.mock.requests) for e in engines]
    r = await http.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200, r.text
    served = [i for i, e in enumerate(engines) if len(e.mock.requests) > before[i]]
    assert len(served) == 1
    return served[0]


def conversation(session: int, turns: int) -> list[list[int]]:
    """Each turn's prompt: a shared system prompt (2 blocks), then the session's history."""
    system = [7] * (2 * BLOCK)
    history: list[int] = []
    out = []
    for t in range(turns):
        history += [100 + session] * BLOCK + [300 + t] * 40
        out.append(system + history)
    return out


async def test_turns_follow_the_engine_that_published_their_blocks(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with gateway(ns, events=True) as ((manager, http), engines):
            feed = manager.kv_feed
            assert feed is not None
            homes: dict[int, int] = {}
            for t in range(4):
                for s in range(6):
                    prompt = conversation(s, 4)[t]
                    where = await turn(http, engines, prompt)
                    if t == 0:
                        homes[s] = where
                    assert where == homes[s], f"session {s} turn {t}"
                    before = sum(st.batches for st in feed.stats.values())
                    await engines[where].store(prompt)
                    while sum(st.batches for st in feed.stats.values()) == before:
                        await feed.changed.wait()
            # the sessions were spread over both engines
            assert sorted(list(homes.values()).count(i) for i in range(2)) == [3, 3]
            fams = await scrape(http)
    blocks = samples(fams, "smg_kv_index_blocks")
    assert len(blocks) == 2  # one per engine (worker, rank)
    assert sum(blocks.values()) > 0
    assert set(samples(fams, "smg_kv_index_from_events").values()) == {1.0}
    assert sum(samples(fams, "smg_kv_event_batches_total").values()) == 4 * 6
    assert samples(fams, "smg_kv_event_gaps_total") == dict.fromkeys(blocks, 0.0)
    decisions = samples(fams, "smg_router_cache_aware_decisions_total", "reason")
    # the first turns were placed (the second session's followed the first to the engine
    # holding the system prompt: no fork yet), the later turns chosen by cache
    assert decisions[("placement",)] == 5
    assert decisions[("cache",)] == 24 - 5


async def test_without_events_turns_follow_the_prompts_routed(ns: IpcNamespace) -> None:
    with trio.fail_after(DEADLINE_S):
        async with gateway(ns, events=False) as ((manager, http), engines):
            homes: dict[int, int] = {}
            for t in range(3):
                for s in range(4):
                    where = await turn(http, engines, conversation(s, 3)[t])
                    homes.setdefault(s, where)
                    assert where == homes[s]
            assert sorted(list(homes.values()).count(i) for i in range(2)) == [2, 2]
            w = manager.workers[0]
            assert isinstance(w, WorkerState)


@pytest.mark.parametrize(
    ("headers", "fields"),
    [({"x-session-id": "alice"}, {}), ({}, {"prompt_cache_key": "alice"}), ({}, {"user": "al"})],
)
async def test_a_session_key_is_sticky(
    ns: IpcNamespace, headers: dict[str, str], fields: dict[str, str]
) -> None:
    """Unrelated prompts with one session key (header, prompt_cache_key or user) go to one
    engine; without a key the same prompts spread over both."""
    with trio.fail_after(DEADLINE_S):
        async with gateway(ns, events=False) as ((_, http), engines):
            for keyed in (True, False):
                where = set()
                for i in range(6):
                    before = [len(e.mock.requests) for e in engines]
                    body = {"model": "m", "prompt": [9 + i] * 10, "max_tokens": 2}
                    r = await http.post(
                        "/v1/completions",
                        json={**body, **fields} if keyed else body,
                        headers=headers if keyed else {},
                    )
                    assert r.status_code == 200, r.text
                    where |= {j for j, e in enumerate(engines) if len(e.mock.requests) > before[j]}
                assert len(where) == (1 if keyed else 2)


async def test_two_gateways_hearing_the_same_events_route_a_session_alike(
    ns: IpcNamespace,
) -> None:
    """What --api-server-count N relies on: every frontend subscribes to the engine-bound
    endpoints itself (PUB fans out), so each has the same index and picks the same engine
    for a session's next turn, whichever frontend the turn reaches."""
    routers = [CacheAwareRouter(), CacheAwareRouter()]
    conf = WorkerConfinement(socket_dirs=(ns.directory,), model_dirs=("/tmp",))
    feeds = [KvFeed(r, conf, can_bind=False) for r in routers]

    class Ready:
        block_size = BLOCK
        num_gpu_blocks = 1000

        def __init__(self, endpoint: str) -> None:
            self.kv_events_config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": endpoint,
                "topic": "kv",
            }

    class Reg:
        def __init__(self, endpoint: str) -> None:
            self.index = 0
            self.ready = Ready(endpoint)

    class Client:
        def __init__(self, endpoint: str) -> None:
            self.engines = [Reg(endpoint)]

    class FakeWorker:
        def __init__(self, worker_id: str, endpoint: str) -> None:
            self.worker_id = worker_id
            self.url = ns.worker_url(worker_id)
            self.client = Client(endpoint)
            self.client_changed = trio.Event()

    with trio.fail_after(DEADLINE_S):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            engines = {}
            for wid in ("a", "b"):
                endpoint = f"ipc://{ns.directory}/kv-{wid}"
                pub = await stack.enter_async_context(kv_publisher(endpoint))
                for feed in feeds:
                    nursery.start_soon(feed.run_worker, FakeWorker(wid, endpoint))
                for _ in feeds:
                    await pub.wait_subscribed()
                engines[wid] = PublishedEngine(PublishingMock("tcp://127.0.0.1:1", None), pub)
            cands = [EngineCandidate(("a", 0), 0.0), EngineCandidate(("b", 0), 0.0)]
            for s in range(4):
                prompts = conversation(s, 3)
                first = routers[s % 2].choose(RouteRequest(prompts[0]), cands, 0.0).engine
                for t, prompt in enumerate(prompts):
                    before = [sum(st.batches for st in f.stats.values()) for f in feeds]
                    await engines[first[0]].store(prompt)
                    for f, b in zip(feeds, before, strict=True):
                        while sum(st.batches for st in f.stats.values()) == b:
                            await f.changed.wait()
                    if t + 1 < len(prompts):
                        nxt = prompts[t + 1]
                        picks = {r.choose(RouteRequest(nxt), cands, 0.0).engine for r in routers}
                        assert picks == {first}
            nursery.cancel_scope.cancel()
