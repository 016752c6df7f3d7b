"""The KV event feed: each engine's published ``KVEventBatch`` stream into ``cache_aware``'s
index, one task per engine publisher, in the worker's own nursery.

For every engine (DP rank) of a worker whose registration announces ``kv_events_config``
with the zmq publisher, :func:`plan_subscription` decides where to listen, from allow-lists
only: an engine-bound endpoint (a wildcard tcp one, on the engine's host; an ``ipc://`` one
under the allowed socket directories) is connected to; a ``tcp://HOST:PORT`` one (the engine
dials it) is bound, when ``HOST`` is loopback or an allowed engine host and this is the only
gateway process (with several frontends every one must hear every event, which only an
engine-bound endpoint gives). vLLM's ready response carries each rank's endpoint already
offset by its DP rank, so it is used as given. Anything else leaves the engine on the
approximate index (logged once per worker and reason).

:func:`run_engine_feed` checks sequence numbers: a duplicate is dropped; a gap (the start
too: vLLM loses the first batch while its PUB connects) is filled from the engine's replay
endpoint when it has one, else that engine's part of the index is reset. A malformed message
is counted and dropped. Nothing here is awaited by a request.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Final

import attrs
import trio

from smg_trio.backend import EngineIndexStats, RoutingSnapshot
from smg_trio.errors import DecodeError, EngineError, SmgError, ValidationError
from smg_trio.protocol.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventsConfig,
    decode_batch,
    decode_kv_events_config,
    decode_seq,
    encode_replay_request,
)
from smg_trio.routing.cache_aware import CacheAwareRouter
from smg_trio.routing.index import EngineKey, KvIndex
from smg_trio.transport.kv_events import open_kv_replay, open_kv_subscriber
from smg_trio.transport.tcp import TcpOptions, is_wildcard_host
from smg_trio.worker.confine import WorkerConfinement, escape
from smg_trio.worker.registry import Worker

__all__ = [
    "APPLY_SLICE_BLOCKS",
    "BURST",
    "BURST_BYTES",
    "REPLAY_TIMEOUT_S",
    "RESYNC_AFTER",
    "EngineFeedStats",
    "KvFeed",
    "KvTarget",
    "plan_subscription",
    "routing_snapshot",
    "run_engine_feed",
]

log = logging.getLogger(__name__)

#: Messages handled per wake-up before the feed yields to other tasks (a flooding
#: publisher cannot monopolise the event loop).
BURST: Final = 64
#: ... and at most this many bytes of them (a message may be up to 4 MiB).
BURST_BYTES: Final = 1 << 20
#: A ``BlockStored`` of more blocks is indexed this many at a time, with a checkpoint between
#: (about 2 ms each; a 16 MiB batch took 2.4 s in one piece).
APPLY_SLICE_BLOCKS: Final = 512
#: Batches in a row behind the expected sequence number after which the feed follows the
#: stream as it is (a bogus high number must not make every later batch a duplicate).
RESYNC_AFTER: Final = 16
#: How long a replay may take before the engine's index is reset instead.
REPLAY_TIMEOUT_S: Final = 2.0


@attrs.frozen
class KvTarget:
    """Where to hear one engine's events: ``endpoint`` (bound when ``bind``), the ``topic``,
    and the replay endpoint to connect to on a gap."""

    endpoint: str
    bind: bool
    topic: str
    replay: str | None = None


@attrs.define
class EngineFeedStats:
    """One engine publisher's counters (Prometheus)."""

    batches: int = 0
    events: int = 0
    gaps: int = 0
    duplicates: int = 0
    resets: int = 0
    replays: int = 0
    malformed: int = 0
    #: Seconds between the batch's timestamp and its arrival (last batch).
    lag_s: float = 0.0
    next_seq: int | None = None
    #: Batches in a row behind ``next_seq`` (dropped as duplicates until RESYNC_AFTER).
    behind: int = 0


def _host_port(endpoint: str) -> tuple[str, str] | None:
    if not endpoint.startswith("tcp://"):
        return None
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), port


def _engine_endpoint(
    endpoint: str, engine_host: str | None, confinement: WorkerConfinement
) -> tuple[str | None, str]:
    """The endpoint to connect to for an engine-bound ``endpoint``, or ``None`` and why not."""
    if endpoint.startswith("ipc://"):
        try:
            confinement.check_url(endpoint)
        except ValidationError as exc:
            return None, str(exc)
        return endpoint, ""
    hp = _host_port(endpoint)
    if hp is None:
        return None, f"{endpoint!r} is not a tcp or ipc endpoint another process can reach"
    host, port = hp
    if port == "0":
        return None, f"{endpoint!r} binds a random port, which the registration does not name"
    if is_wildcard_host(host):
        if engine_host is None:
            return None, "the engine's host is unknown (a tcp:// worker)"
        host = engine_host
    if not confinement.host_allowed(host):
        return None, f"host {host!r} is not loopback or an --allowed-engine-hosts entry"
    return f"tcp://{host}:{port}" if ":" not in host else f"tcp://[{host}]:{port}", ""


def plan_subscription(
    cfg: KVEventsConfig | None,
    *,
    engine_host: str | None,
    confinement: WorkerConfinement,
    can_bind: bool,
) -> tuple[KvTarget | None, str]:
    """Where to subscribe to an engine with ``cfg`` (``None``: it publishes no events, or
    none this gateway may hear; the reason, empty when it simply has none)."""
    if cfg is None or not cfg.zmq_enabled:
        return None, ""
    replay = None
    if cfg.replay_endpoint:
        replay, _ = _engine_endpoint(cfg.replay_endpoint, engine_host, confinement)
    if cfg.engine_binds:
        endpoint, why = _engine_endpoint(cfg.endpoint, engine_host, confinement)
        if endpoint is None:
            return None, why
        return KvTarget(endpoint, False, cfg.topic, replay), ""
    hp = _host_port(cfg.endpoint)
    if hp is None:
        return None, f"{cfg.endpoint!r} is not a tcp endpoint"
    if not can_bind:
        return None, (
            f"the engine connects to {cfg.endpoint!r}, which only one gateway process can "
            "bind; with several frontends give the engines an endpoint they bind (tcp://*:PORT "
            "or ipc://)"
        )
    if not confinement.host_allowed(hp[0]):
        return None, f"host {hp[0]!r} is not loopback or an --allowed-engine-hosts entry"
    return KvTarget(cfg.endpoint, True, cfg.topic, replay), ""


class _EngineFeed:
    """One engine publisher's sequence state and event application."""

    def __init__(
        self,
        engine: EngineKey,
        target: KvTarget,
        index: KvIndex,
        stats: EngineFeedStats,
        on_change: Callable[[], None],
        warn: Callable[[str, str], None],
    ) -> None:
        self.engine = engine
        self.target = target
        self.index = index
        self.stats = stats
        self.on_change = on_change
        self.warn = warn
        self.topic = target.topic.encode("utf-8")

    async def handle(self, frames: list[bytes]) -> None:
        s = self.stats
        if len(frames) != 3 or frames[0] != self.topic:
            s.malformed += 1
            self.warn("malformed", f"a message of {len(frames)} frames or another topic")
            return
        try:
            seq = decode_seq(frames[1])
        except DecodeError as exc:
            s.malformed += 1
            self.warn("malformed", str(exc))
            return
        expected = s.next_seq
        if expected is not None and seq == 0 and expected > 1:
            # the publisher started over (a restarted engine that kept its registration):
            # what it held before is gone
            s.gaps += 1
            self.warn("restart", f"sequence 0 after {expected - 1}")
            self.index.reset(self.engine)
            s.resets += 1
            expected = None
        elif expected is not None and seq < expected:
            s.behind += 1
            if s.behind < RESYNC_AFTER:
                s.duplicates += 1
                self.warn("duplicate", f"sequence {seq} again (expected {expected})")
                return
            # behind for good (the expected number was bogus): follow the stream as it is
            s.gaps += 1
            self.warn("resync", f"{s.behind} batches behind sequence {expected}: at {seq} now")
            self.index.reset(self.engine)
            s.resets += 1
            expected = seq
        s.behind = 0
        if expected is None or seq > expected:
            start = 0 if expected is None else expected
            if seq > start:
                s.gaps += 1
                if expected is not None:
                    self.warn("gap", f"sequence {seq} after {expected - 1}")
                if not await self._replay(start, seq):
                    self.index.reset(self.engine)
                    s.resets += 1
        await self._apply(frames[2])
        s.next_seq = seq + 1

    async def _apply(self, payload: bytes) -> None:
        s = self.stats
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            s.malformed += 1
            self.warn("malformed", str(exc))
            return
        s.batches += 1
        s.events += len(batch.events)
        s.lag_s = max(0.0, time.time() - batch.ts)
        engine, index = self.engine, self.index
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                await self._stored(ev)
            elif isinstance(ev, BlockRemoved):
                index.removed(engine, ev.block_hashes, medium=ev.medium, group_idx=ev.group_idx)
            elif isinstance(ev, AllBlocksCleared):
                index.cleared(engine)
                s.resets += 1
        self.on_change()

    async def _stored(self, ev: BlockStored) -> None:
        """Index a ``BlockStored``, :data:`APPLY_SLICE_BLOCKS` blocks at a time: each slice's
        parent is the previous slice's last hash, and the feed yields between slices."""
        hashes, tokens, extra, size = ev.block_hashes, ev.token_ids, ev.extra_keys, ev.block_size
        parent = ev.parent_block_hash
        step = APPLY_SLICE_BLOCKS
        whole = len(hashes) <= step or size < 1 or len(tokens) != len(hashes) * size
        for start in range(0, len(hashes), step) if not whole else (0,):
            stop = len(hashes) if whole else start + step
            if start:
                await trio.lowlevel.checkpoint()
            ok = self.index.stored(
                self.engine,
                hashes[start:stop] if not whole else hashes,
                parent,
                tokens[start * size : stop * size] if not whole else tokens,
                size,
                ev.lora_name,
                extra[start:stop] if extra is not None and not whole else extra,
                medium=ev.medium,
                group_idx=ev.group_idx,
            )
            if not ok:
                return
            parent = hashes[min(stop, len(hashes)) - 1]

    async def _replay(self, start: int, stop: int) -> bool:
        """Apply the batches ``start .. stop - 1`` from the replay endpoint; whether all came."""
        endpoint = self.target.replay
        if endpoint is None:
            return False
        self.stats.replays += 1
        with trio.move_on_after(REPLAY_TIMEOUT_S):
            try:
                async with open_kv_replay(endpoint) as dealer:
                    await dealer.send(encode_replay_request(start))
                    nxt = start
                    while True:
                        frames = await dealer.receive()
                        if len(frames) != 4 or frames[0] != b"":
                            self.stats.malformed += 1
                            return False
                        if frames[2] == END_SEQ:
                            return nxt >= stop
                        seq = decode_seq(frames[2])
                        if seq < nxt or seq >= stop:
                            continue
                        if seq > nxt:
                            return False  # the publisher's buffer no longer has them
                        await self._apply(frames[3])
                        nxt = seq + 1
            except (EngineError, DecodeError) as exc:
                self.warn("replay", str(exc))
                return False
        self.warn("replay", f"no answer from {endpoint} within {REPLAY_TIMEOUT_S:g} s")
        return False


async def run_engine_feed(
    engine: EngineKey,
    target: KvTarget,
    index: KvIndex,
    stats: EngineFeedStats,
    *,
    on_change: Callable[[], None] = lambda: None,
    warn: Callable[[str, str], None] = lambda kind, text: None,
    peers: TcpOptions | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Subscribe to one engine publisher and feed ``index`` until cancelled. Reports
    (``nursery.start``) the endpoint once subscribed. A tcp endpoint it binds admits only
    the publishers ``peers`` allow (the engines' hosts and uids). Raises ``EngineError`` when
    the socket cannot be connected or bound."""
    feed = _EngineFeed(engine, target, index, stats, on_change, warn)
    async with open_kv_subscriber(
        target.endpoint, target.topic, bind=target.bind, peers=peers
    ) as sub:
        task_status.started(sub.endpoint)
        while True:
            frames: list[bytes] | None = await sub.receive()
            n = nbytes = 0
            while frames is not None:
                await feed.handle(frames)
                n += 1
                nbytes += sum(len(f) for f in frames)
                if n >= BURST or nbytes >= BURST_BYTES:
                    break
                frames = sub.receive_nowait()


def _rank(slot: int, reg: object) -> int:
    index = getattr(reg, "index", None)
    return index if isinstance(index, int) else slot


def _geometry(ready: object) -> tuple[int | None, int | None]:
    """Block size (``prefix_granularity`` for TokenSpeed) and ``num_gpu_blocks``."""
    block_size = getattr(ready, "block_size", None) or getattr(ready, "prefix_granularity", None)
    return block_size, getattr(ready, "num_gpu_blocks", None)


class KvFeed:
    """Keeps ``router``'s engines in step with the workers' engine clients, and runs a feed
    per engine that publishes KV events (:meth:`run_worker`, in each worker's nursery)."""

    def __init__(
        self,
        router: CacheAwareRouter,
        confinement: WorkerConfinement,
        *,
        can_bind: bool,
        tcp: TcpOptions | None = None,
    ) -> None:
        self.router = router
        self.confinement = confinement
        self.can_bind = can_bind
        #: Who may publish to an endpoint this process binds (the tcp engines' peer rules).
        self.tcp = tcp or TcpOptions(allowed_hosts=confinement.engine_hosts)
        #: Per engine publisher (dropped with the engine).
        self.stats: dict[EngineKey, EngineFeedStats] = {}
        self._changed = trio.Event()
        self._warned: set[tuple[str, str]] = set()

    @property
    def changed(self) -> trio.Event:
        """Set after the next applied batch (then replaced): tests wait on it."""
        return self._changed

    def _touch(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _warn_once(self, worker: Worker, kind: str, text: str) -> None:
        if (worker.worker_id, kind) not in self._warned:
            self._warned.add((worker.worker_id, kind))
            log.warning(
                "worker %r: KV events: %s: %s (logged once)", worker.url, kind, escape(text)
            )

    async def run_worker(self, worker: Worker) -> None:
        """For the worker's life: on each engine client (each registration), register its
        engines with the router (resetting what was indexed of them) and subscribe to those
        that publish events; a removed worker's engines are dropped."""
        engines: set[EngineKey] = set()
        try:
            while True:
                changed = getattr(worker, "client_changed", None)
                client = worker.client
                if not isinstance(changed, trio.Event):
                    return
                if client is None or not hasattr(client, "engines"):
                    await changed.wait()
                    continue
                # every engine is known to the router before any subscription starts
                plans = [
                    self._register(worker, (worker.worker_id, _rank(slot, reg)), reg.ready)
                    for slot, reg in enumerate(client.engines)
                ]
                engines.update(key for key, _, _ in plans)
                async with trio.open_nursery() as nursery:
                    for key, target, ready in plans:
                        if target is not None:
                            await self._subscribe(nursery, worker, key, target, ready)
                    await changed.wait()
                    nursery.cancel_scope.cancel()
        finally:
            for key in engines:
                self.router.drop_engine(key)
                self.stats.pop(key, None)
            self._warned = {w for w in self._warned if w[0] != worker.worker_id}

    def _register(
        self, worker: Worker, key: EngineKey, ready: object
    ) -> tuple[EngineKey, KvTarget | None, object]:
        """Add the engine to the router (by its events when it may be subscribed to)."""
        raw = getattr(ready, "kv_events_config", None)
        cfg = decode_kv_events_config(raw)
        if raw is not None and cfg is None:
            self._warn_once(worker, "config", f"unreadable kv_events_config {raw!r:.200}")
        engine_host = "127.0.0.1" if worker.url.startswith("ipc://") else None
        target, why = plan_subscription(
            cfg, engine_host=engine_host, confinement=self.confinement, can_bind=self.can_bind
        )
        if why:
            self._warn_once(worker, "not subscribed", why)
        block_size, num_blocks = _geometry(ready)
        self.router.add_engine(
            key, block_size=block_size, num_gpu_blocks=num_blocks, events=target is not None
        )
        return key, target, ready

    async def _subscribe(
        self, nursery: trio.Nursery, worker: Worker, key: EngineKey, target: KvTarget, ready: object
    ) -> None:
        stats = self.stats[key] = EngineFeedStats()
        try:
            await nursery.start(self._run_engine, worker, key, target, stats)
        except EngineError as exc:
            self._warn_once(worker, "subscribe", str(exc))
            self.stats.pop(key, None)
            block_size, num_blocks = _geometry(ready)
            self.router.add_engine(key, block_size=block_size, num_gpu_blocks=num_blocks)

    async def _run_engine(
        self,
        worker: Worker,
        key: EngineKey,
        target: KvTarget,
        stats: EngineFeedStats,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await run_engine_feed(
                key,
                target,
                self.router.events,
                stats,
                on_change=self._touch,
                warn=lambda kind, text: self._warn_once(worker, kind, text),
                peers=self.tcp,
                task_status=task_status,
            )
        except (SmgError, OSError, trio.ClosedResourceError) as exc:
            # the socket failed: the engine falls back to the prompts routed to it
            self._warn_once(worker, "subscription", f"{type(exc).__name__}: {exc}")
            if key in self.router.events:
                self.router.add_engine(key, block_size=self.router.events.block_size(key))


def routing_snapshot(router: CacheAwareRouter, feed: KvFeed | None) -> RoutingSnapshot:
    """The router's indexes and the feed's counters, per engine (bounded by the engines
    registered: a removed worker's engines leave the snapshot)."""
    engines = []
    stats = feed.stats if feed is not None else {}
    for index, events in ((router.events, True), (router.approx, False)):
        for key in index.engines():
            st = stats.get(key) if events else None
            engines.append(
                EngineIndexStats(
                    worker=key[0],
                    rank=key[1],
                    blocks=index.blocks(key),
                    events=events,
                    events_received=st.events if st else 0,
                    batches=st.batches if st else 0,
                    gaps=st.gaps if st else 0,
                    duplicates=st.duplicates if st else 0,
                    resets=st.resets if st else 0,
                    replays=st.replays if st else 0,
                    malformed=st.malformed if st else 0,
                    lag_s=st.lag_s if st else 0.0,
                )
            )
    dropped: dict[str, int] = {}
    for index in (router.events, router.approx):
        for name, value in dataclasses.asdict(index.counters).items():
            dropped[name] = dropped.get(name, 0) + value
    return RoutingSnapshot(engines, dropped, {str(k): v for k, v in router.decisions.items()})
