"""The KV event feed with a real ZMQ publisher: in-order batches, gaps (replayed or reset),
duplicates, malformed messages, an engine's re-registration and its worker's removal; and
where it may subscribe at all."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import zmq

from smg_trio.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    encode_seq,
)
from smg_trio.routing.blocks import block_keys
from smg_trio.routing.cache_aware import CacheAwareRouter
from smg_trio.routing.index import KvIndex
from smg_trio.transport.tcp import TcpOptions
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.kv_feed import (
    APPLY_SLICE_BLOCKS,
    BURST,
    RESYNC_AFTER,
    EngineFeedStats,
    KvFeed,
    KvTarget,
    plan_subscription,
    run_engine_feed,
)
from tests.helpers.claimant import claimant
from tests.helpers.kv_publisher import KvPublisher, kv_publisher, stored

BS = 4
ENGINE = ("w1", 0)
DEADLINE_S = 10


@pytest.fixture
def sockdir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kv", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


class Feed:
    """run_engine_feed in a nursery, with a wait for a condition re-checked per batch."""

    def __init__(self, index: KvIndex, stats: EngineFeedStats) -> None:
        self.index = index
        self.stats = stats
        self._changed = trio.Event()
        self.warnings: list[tuple[str, str]] = []

    def on_change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, check: Callable[[], bool]) -> None:
        with trio.fail_after(DEADLINE_S):
            while not check():
                await self._changed.wait()


@asynccontextmanager
async def feeding(target: KvTarget, pub: KvPublisher) -> AsyncIterator[Feed]:
    index = KvIndex()
    index.add_engine(ENGINE, block_size=BS)
    feed = Feed(index, EngineFeedStats())
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_engine_feed(
                ENGINE,
                target,
                index,
                feed.stats,
                on_change=feed.on_change,
                warn=lambda kind, text: feed.warnings.append((kind, text)),
                task_status=task_status,
            )
        )
        with trio.fail_after(DEADLINE_S):
            await pub.wait_subscribed()
        yield feed
        nursery.cancel_scope.cancel()


def matched(index: KvIndex, tokens: list[int]) -> int:
    return index.match(block_keys(tokens, BS)).get(ENGINE, 0)


async def test_batches_in_order_feed_the_index(sockdir: str) -> None:
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        prompt = toks(4)
        await pub.publish(stored([1, 2], prompt[:8], BS))
        await pub.publish(stored([3, 4], prompt[8:], BS, parent=2))
        await feed.until(lambda: feed.stats.batches == 2)
        assert matched(feed.index, prompt) == 4
        await pub.publish(BlockRemoved(block_hashes=[3], medium="GPU"))
        await feed.until(lambda: feed.stats.batches == 3)
        assert matched(feed.index, prompt) == 2
        await pub.publish(AllBlocksCleared())
        await feed.until(lambda: feed.stats.batches == 4)
        assert matched(feed.index, prompt) == 0
        assert feed.stats.gaps == 0
        assert feed.stats.lag_s >= 0.0


async def test_a_gap_without_replay_resets_the_engine(sockdir: str) -> None:
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        old, new = toks(2), toks(2, start=100)
        await pub.publish(stored([1, 2], old, BS))
        await feed.until(lambda: feed.stats.batches == 1)
        pub.seq += 1  # one batch lost
        await pub.publish(stored([5, 6], new, BS))
        await feed.until(lambda: feed.stats.batches == 2)
        assert (feed.stats.gaps, feed.stats.resets) == (1, 1)
        assert matched(feed.index, old) == 0  # what the lost batch may have removed
        assert matched(feed.index, new) == 2
        assert ("gap", "sequence 2 after 0") in feed.warnings


async def test_the_start_is_a_gap_filled_by_replay(sockdir: str) -> None:
    """Batches published before the subscriber connected (vLLM's first batch) come back
    from the replay endpoint, so nothing is reset."""
    ep, rep = f"ipc://{sockdir}/kv", f"ipc://{sockdir}/replay"
    async with kv_publisher(ep, replay_endpoint=rep) as pub, trio.open_nursery() as nursery:
        nursery.start_soon(pub.serve_replay)
        prompt = toks(3)
        await pub.publish(stored([1], prompt[:4], BS))  # nobody listens yet: lost
        await pub.publish(stored([2], prompt[4:8], BS, parent=1))
        async with feeding(KvTarget(ep, False, "kv", rep), pub) as feed:
            await pub.publish(stored([3], prompt[8:], BS, parent=2))
            await feed.until(lambda: feed.stats.batches == 3)
            assert matched(feed.index, prompt) == 3
            assert (feed.stats.gaps, feed.stats.replays, feed.stats.resets) == (1, 1, 0)
        nursery.cancel_scope.cancel()


async def test_duplicates_are_dropped(sockdir: str) -> None:
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        await pub.publish(stored([1], toks(1), BS))
        await pub.publish(BlockRemoved(block_hashes=[1], medium="GPU"), seq=0)  # again
        await pub.publish(stored([2], toks(1, start=50), BS))
        await feed.until(lambda: feed.stats.batches == 2)
        assert feed.stats.duplicates == 1
        assert matched(feed.index, toks(1)) == 1  # the duplicate's removal was not applied


async def test_a_publisher_that_starts_over_resets_the_engine(sockdir: str) -> None:
    """Sequence 0 after a longer run: the publisher restarted (its old blocks are gone); its
    new batches are not dropped as duplicates."""
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        await pub.publish(stored([1], toks(1), BS))
        await pub.publish(stored([2], toks(1, start=40), BS))
        await pub.publish(stored([3], toks(1, start=80), BS), seq=0)
        await feed.until(lambda: feed.stats.batches == 3)
        assert (feed.stats.resets, feed.stats.duplicates) == (1, 0)
        assert matched(feed.index, toks(1)) == 0
        assert matched(feed.index, toks(1, start=80)) == 1


async def test_a_flood_yields_to_other_tasks_and_stays_bounded(sockdir: str) -> None:
    """1000 batches sent at once: the feed applies at most BURST messages between two
    checkpoints (a request task keeps running, at least once every two bursts), and the engine's index stays within its
    num_gpu_blocks."""
    ep = f"ipc://{sockdir}/kv"
    ticks = 0
    runs: list[int] = []  # the ticker's count at each applied event
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        feed.index.add_engine(ENGINE, block_size=BS, num_gpu_blocks=100)
        stored_of = feed.index.stored

        def counting(*args: Any, **kw: Any) -> bool:
            runs.append(ticks)
            return stored_of(*args, **kw)

        feed.index.stored = counting  # type: ignore[method-assign]

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            frames = [
                [b"kv", encode_seq(i), encode_batch(KVEventBatch(ts=0.0, events=[ev]))]
                for i, ev in enumerate(
                    stored([i + 1], toks(1, start=10 * i), BS) for i in range(1000)
                )
            ]

            def send_all() -> None:  # faster than the feed applies them: a queue builds up
                for f in frames:
                    pub.pub.raw.send_multipart(f)

            await trio.to_thread.run_sync(send_all)
            await feed.until(lambda: feed.stats.batches == 1000)
            nursery.cancel_scope.cancel()
    longest = max(sum(1 for _ in group) for _, group in itertools.groupby(runs))
    # trio runs a batch's tasks in random order, so two bursts can fall between two ticks
    assert longest <= 2 * BURST < 1000  # far fewer than the flood
    assert feed.index.blocks(ENGINE) == 100


async def test_events_of_an_engine_the_index_does_not_know_are_counted(sockdir: str) -> None:
    """The engine was dropped (its worker removed) while its events still arrive."""
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        feed.index.drop(ENGINE)
        await pub.publish(stored([1], toks(1), BS), AllBlocksCleared())
        await pub.publish(BlockRemoved(block_hashes=[1], medium="GPU"))
        await feed.until(lambda: feed.stats.batches == 2)
        assert feed.index.counters.unknown_engine == 3
        assert len(feed.index) == 0


async def test_malformed_messages_are_counted_and_dropped(sockdir: str) -> None:
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        await pub.send_raw([b"kv", b"\x00" * 8])  # two frames
        await pub.send_raw([b"kv", b"\x01", b"x"])  # a 1-byte sequence
        await pub.send_raw([b"kvx", b"\x00" * 8, b"x"])  # another topic with our prefix
        await pub.send_raw([b"kv", b"\x00" * 8, b"\xc1garbage"])  # not msgpack
        await pub.publish(stored([1], toks(1), BS), seq=1)
        await feed.until(lambda: feed.stats.batches == 1)
        assert feed.stats.malformed == 4
        assert matched(feed.index, toks(1)) == 1
        assert {kind for kind, _ in feed.warnings} >= {"malformed"}


async def test_the_gateway_binds_an_endpoint_the_engine_dials() -> None:
    index = KvIndex()
    index.add_engine(ENGINE, block_size=BS)
    feed = Feed(index, EngineFeedStats())
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_engine_feed(
                ENGINE,
                KvTarget("tcp://127.0.0.1:*", True, ""),
                index,
                feed.stats,
                on_change=feed.on_change,
                task_status=task_status,
            )
        )
        assert endpoint.startswith("tcp://127.0.0.1:")
        async with kv_publisher(endpoint, topic="", connect=True) as pub:
            with trio.fail_after(DEADLINE_S):
                await pub.wait_subscribed()
            await pub.publish(stored([1], toks(1), BS))
            await feed.until(lambda: feed.stats.batches == 1)
        nursery.cancel_scope.cancel()
    assert matched(index, toks(1)) == 1


# -- where to subscribe --------------------------------------------------------------------


def conf(sockdir: str = "/tmp/smg") -> WorkerConfinement:
    return WorkerConfinement(
        socket_dirs=(sockdir,), model_dirs=("/tmp",), engine_hosts=("10.0.0.7",)
    )


def plan(
    cfg: KVEventsConfig | None, host: str | None = "127.0.0.1", can_bind: bool = True
) -> tuple[KvTarget | None, str]:
    return plan_subscription(cfg, engine_host=host, confinement=conf(), can_bind=can_bind)


def kv(endpoint: str, **kw: Any) -> KVEventsConfig:
    return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint, **kw)


def test_plan_connects_to_an_engine_bound_endpoint_on_the_engine_host() -> None:
    target, why = plan(kv("tcp://*:5557", topic="t", replay_endpoint="tcp://*:5558"))
    assert target == KvTarget("tcp://127.0.0.1:5557", False, "t", "tcp://127.0.0.1:5558")
    assert why == ""
    assert plan(kv("ipc:///tmp/smg/kv"))[0] == KvTarget("ipc:///tmp/smg/kv", False, "")


def test_plan_binds_an_endpoint_the_engine_dials_only_when_allowed() -> None:
    assert plan(kv("tcp://127.0.0.1:6000"))[0] == KvTarget("tcp://127.0.0.1:6000", True, "")
    assert plan(kv("tcp://10.0.0.7:6000"))[0] is not None
    target, why = plan(kv("tcp://10.9.9.9:6000"))
    assert target is None
    assert "allowed-engine-hosts" in why
    target, why = plan(kv("tcp://127.0.0.1:6000"), can_bind=False)
    assert target is None
    assert "several frontends" in why


@pytest.mark.parametrize(
    ("endpoint", "host", "reason"),
    [
        ("ipc:///elsewhere/kv", "127.0.0.1", "outside the allowed socket directories"),
        ("tcp://*:5557", None, "host is unknown"),
        ("tcp://*:0", "127.0.0.1", "random port"),
        ("inproc://kv", "127.0.0.1", "not a tcp or ipc endpoint"),
    ],
)
def test_plan_refuses_what_it_may_not_reach(endpoint: str, host: str | None, reason: str) -> None:
    target, why = plan(kv(endpoint), host=host)
    assert target is None
    assert reason in why


def test_plan_of_an_engine_without_events() -> None:
    assert plan(None) == (None, "")
    assert plan(KVEventsConfig()) == (None, "")
    assert plan(KVEventsConfig(enable_kv_cache_events=True, publisher="null")) == (None, "")


# -- a worker's engines over its life ------------------------------------------------------


@attrs.define
class FakeReady:
    kv_events_config: dict[str, Any] | None
    block_size: int = BS
    num_gpu_blocks: int = 100


@attrs.define
class FakeReg:
    index: int | None
    ready: FakeReady


@attrs.define
class FakeClient:
    engines: list[FakeReg]


@attrs.define(eq=False)
class FakeWorker:
    url: str
    worker_id: str = "w1"
    client: FakeClient | None = None
    client_changed: trio.Event = attrs.Factory(trio.Event)

    def set_client(self, client: FakeClient | None) -> None:
        self.client = client
        changed, self.client_changed = self.client_changed, trio.Event()
        changed.set()


async def test_a_worker_feed_resets_on_re_registration_and_drops_on_removal(sockdir: str) -> None:
    ep = f"ipc://{sockdir}/kv"
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": ep, "topic": "kv"}
    router = CacheAwareRouter()
    feed = KvFeed(router, conf(sockdir), can_bind=True)
    worker = FakeWorker(url=f"ipc://{sockdir}/worker")
    # rank 1 publishes nothing: it is routed by the approximate index
    client = FakeClient([FakeReg(0, FakeReady(cfg)), FakeReg(1, FakeReady(None))])

    async def published(pub: KvPublisher, n: int) -> None:
        with trio.fail_after(DEADLINE_S):
            while feed.stats[("w1", 0)].batches < n:
                await feed.changed.wait()

    async with kv_publisher(ep) as pub, trio.open_nursery() as nursery:
        nursery.start_soon(feed.run_worker, worker)
        worker.set_client(client)
        with trio.fail_after(DEADLINE_S):
            await pub.wait_subscribed()
        assert router.has_events(("w1", 0))
        assert router.known(("w1", 1))
        assert not router.has_events(("w1", 1))
        await pub.publish(stored([1, 2], toks(2), BS))
        await published(pub, 1)
        assert router.blocks(("w1", 0)) == 2
        # a restarted engine registers again: what it held is gone
        worker.set_client(None)
        worker.set_client(client)
        with trio.fail_after(DEADLINE_S):
            await pub.wait_subscribed()
        assert router.blocks(("w1", 0)) == 0
        assert router.has_events(("w1", 0))
        nursery.cancel_scope.cancel()  # the worker's nursery ends: removed
    assert not router.known(("w1", 0))
    assert not router.known(("w1", 1))
    assert feed.stats == {}


async def test_a_worker_whose_endpoint_is_refused_falls_back(sockdir: str) -> None:
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://10.9.9.9:1"}
    router = CacheAwareRouter()
    feed = KvFeed(router, conf(sockdir), can_bind=True)
    worker = FakeWorker(url=f"ipc://{sockdir}/worker")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed.run_worker, worker)
        worker.set_client(FakeClient([FakeReg(0, FakeReady(cfg))]))
        with trio.fail_after(DEADLINE_S):
            while not router.known(("w1", 0)):
                await trio.lowlevel.checkpoint()
        assert not router.has_events(("w1", 0))
        nursery.cancel_scope.cancel()


async def test_a_bound_endpoint_refuses_a_local_user_s_publisher() -> None:
    """The SUB the gateway binds for an engine that dials it is on loopback, where any local
    user could connect a PUB and feed the index made-up events (steering every prompt to one
    engine, or a sequence number that makes the engine's real batches duplicates). It is
    guarded as the tcp data plane is (``--allowed-engine-uids``): another uid's connection
    never completes its handshake; the gateway's own uid still publishes."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a publisher as another uid")
    index = KvIndex()
    index.add_engine(ENGINE, block_size=BS)
    feed = Feed(index, EngineFeedStats())
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            endpoint = await nursery.start(
                lambda task_status: run_engine_feed(
                    ENGINE,
                    KvTarget("tcp://127.0.0.1:*", True, ""),
                    index,
                    feed.stats,
                    on_change=feed.on_change,
                    peers=TcpOptions(),
                    task_status=task_status,
                )
            )
            async with claimant(endpoint, b"", 65534, socket_type=zmq.PUB) as intruder:
                assert await intruder.next() == "uid 65534"
                assert await intruder.next() != "attempt handshake-succeeded"
            async with kv_publisher(endpoint, topic="", connect=True) as pub:
                await pub.wait_subscribed()
                await pub.publish(stored([1], toks(1), BS))
                await feed.until(lambda: feed.stats.batches == 1)
            nursery.cancel_scope.cancel()
    assert matched(index, toks(1)) == 1


async def test_a_huge_batch_is_applied_in_slices_that_yield(sockdir: str) -> None:
    """A publisher's batch is only bounded by the message size: one ``BlockStored`` of
    millions of tokens took seconds to index (a 16 MiB batch: 0.4 s to decode and 2.4 s to
    apply), all without a checkpoint, stalling every request of the gateway. Large
    ``BlockStored`` events are applied ``APPLY_SLICE_BLOCKS`` blocks at a time, chained by
    the engine's hashes, with a checkpoint between slices; the result is the same index."""
    ep = f"ipc://{sockdir}/kv"
    n_blocks = 4 * APPLY_SLICE_BLOCKS + 3
    ticks = 0
    runs: list[int] = []
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        stored_of = feed.index.stored

        def counting(*args: Any, **kw: Any) -> bool:
            runs.append(ticks)
            return stored_of(*args, **kw)

        feed.index.stored = counting  # type: ignore[method-assign]

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await pub.publish(stored(range(1, n_blocks + 1), toks(n_blocks), BS))
            await feed.until(lambda: matched(feed.index, toks(n_blocks)) == n_blocks)
            nursery.cancel_scope.cancel()
        assert len(runs) == 5  # four full slices and the rest
        # the ticker ran between slices (trio runs a batch's tasks in random order, so two
        # slices can fall between two ticks)
        assert max(sum(1 for _ in group) for _, group in itertools.groupby(runs)) <= 2
        assert matched(feed.index, toks(n_blocks)) == n_blocks


async def test_a_bogus_high_sequence_number_does_not_stop_the_feed(sockdir: str) -> None:
    """One batch with a sequence number far ahead (a corrupt frame, or a publisher's glitch)
    made every later batch of the real stream a "duplicate": the engine's events were dropped
    for good and its index froze. After ``RESYNC_AFTER`` batches in a row that are behind, the
    feed takes the stream as it is: the engine's index is reset and follows it again."""
    ep = f"ipc://{sockdir}/kv"
    async with kv_publisher(ep) as pub, feeding(KvTarget(ep, False, "kv"), pub) as feed:
        await pub.publish(stored([1], toks(1), BS))
        await pub.publish(stored([2], toks(1, start=40), BS), seq=10**12)
        pub.seq = 1  # the real stream goes on
        n = RESYNC_AFTER + 2
        for i in range(n):
            await pub.publish(stored([100 + i], toks(1, start=1000 + 10 * i), BS))
        last = toks(1, start=1000 + 10 * (n - 1))
        await feed.until(lambda: matched(feed.index, last) == 1)
        assert feed.stats.duplicates == RESYNC_AFTER - 1
        assert matched(feed.index, toks(1, start=40)) == 0  # the bogus batch's state went
