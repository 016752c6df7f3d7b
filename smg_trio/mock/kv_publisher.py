"""The mock engine's KV event publisher: vLLM's ``ZmqEventPublisher`` (PUB, replay ROUTER) on trio.

Semantics of vLLM 0.32 ``vllm/distributed/kv_events.py``, which the mock follows:

- the PUB socket BINDS an endpoint that holds ``*`` or ``::`` or is ``ipc://``/``inproc://``
  and CONNECTS to any other (``tcp://HOST:PORT``: a subscriber binds it);
- the endpoint (and ``replay_endpoint``) are offset by the engine's DP rank (a tcp port plus
  the rank; vLLM refuses an ``ipc://`` endpoint for a rank above 0, and so does this);
- each message is ``[topic, seq (8 bytes, big-endian), payload]``, ``seq`` counting from 0;
- the last ``buffer_steps`` payloads are kept for replay: a DEALER sends ``[b"", start_seq]``
  to the ROUTER at ``replay_endpoint`` and gets ``[b"", topic, seq, payload]`` for each kept
  batch with ``seq >= start_seq``, then ``[b"", b"", END_SEQ, b""]``.

``tcp://*:0`` binds a free port on loopback (vLLM binds the node's IP) and the announced
endpoint names it. One task owns each socket: :meth:`KvEventPublisher.run` starts the PUB
owner and, with a replay endpoint, the ROUTER owner; :meth:`KvEventPublisher.publish` only
queues (up to ``max_queue_size`` batches; past it a batch is dropped and counted).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Sequence

import msgspec
import trio
import zmq

from smg_trio.protocol.kv_events import (
    END_SEQ,
    KvEvent,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    encode_seq,
    offset_endpoint_port,
)
from smg_trio.transport.zsocket import ZmqSocket, zmq_context

__all__ = ["KvEventPublisher", "parse_kv_events_config"]

log = logging.getLogger(__name__)


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """``--kv-events-config`` JSON as vLLM reads it (its ``KVEventsConfig`` fields; an unknown
    field is refused). ``publisher`` defaults to ``zmq`` when events are on, else ``null``.
    Raises ``ValueError`` with the reason."""
    try:
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    unknown = sorted(set(raw) - set(KVEventsConfig.__struct_fields__))
    if unknown:
        raise ValueError(f"--kv-events-config: unknown field(s) {', '.join(unknown)}")
    try:
        cfg = msgspec.convert(raw, KVEventsConfig)
    except msgspec.ValidationError as exc:
        raise ValueError(f"--kv-events-config: {exc}") from None
    if cfg.publisher is None:
        cfg.publisher = "zmq" if cfg.enable_kv_cache_events else "null"
    if cfg.publisher not in ("zmq", "null"):
        raise ValueError(f"--kv-events-config: unknown publisher {cfg.publisher!r}")
    for name in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--kv-events-config: {name} must be >= 1")
    return cfg


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _bind(sock: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind ``endpoint``; return it, or with a free port (``:0``, ``:*``) the port bound."""
    sock.bind("tcp://127.0.0.1:0" if endpoint == "tcp://*:0" else endpoint)
    if endpoint.startswith("tcp://") and endpoint.endswith((":0", ":*")):
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return endpoint


class KvEventPublisher:
    """Publishes one engine rank's KV event batches. ``config`` is the ``--kv-events-config``
    as given (the base endpoints); :attr:`config` becomes the resolved one (offset by
    ``data_parallel_rank``, a ``*:0`` port named) once :meth:`run` has started, which is what
    the engine announces in its ready response."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        if not config.zmq_enabled:
            raise ValueError("KvEventPublisher needs enable_kv_cache_events and publisher zmq")
        self.data_parallel_rank = data_parallel_rank
        endpoint = offset_endpoint_port(config.endpoint, data_parallel_rank)
        replay = config.replay_endpoint
        if replay is not None:
            replay = offset_endpoint_port(replay, data_parallel_rank)
        self.config = msgspec.structs.replace(config, endpoint=endpoint, replay_endpoint=replay)
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        send, recv = trio.open_memory_channel[KVEventBatch](math.inf)
        self._send, self._recv = send, recv
        self._queued = 0
        self.next_seq = 0
        #: Batches dropped because ``max_queue_size`` were waiting.
        self.dropped = 0
        #: Set once the sockets are bound or connected.
        self.ready = trio.Event()

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Queue one batch (one engine step's events); nothing for an empty list. Never
        blocks: past ``max_queue_size`` waiting batches the batch is dropped and counted."""
        if not events:
            return
        if self._queued >= self.config.max_queue_size:
            self.dropped += 1
            return
        self._queued += 1
        batch = KVEventBatch(time.time(), list(events), self.data_parallel_rank)
        self._send.send_nowait(batch)

    async def run(
        self, *, task_status: trio.TaskStatus[KVEventsConfig] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the sockets, report the resolved config, then publish until cancelled."""
        ctx = zmq_context()
        raw_pub = ctx.socket(zmq.PUB)
        raw_pub.set_hwm(self.config.hwm)
        raw_replay: zmq.Socket[bytes] | None = None
        try:
            endpoint = self.config.endpoint
            if _binds(endpoint):
                endpoint = _bind(raw_pub, endpoint)
            else:
                raw_pub.connect(endpoint)
            replay_endpoint = self.config.replay_endpoint
            if replay_endpoint is not None:
                raw_replay = ctx.socket(zmq.ROUTER)
                replay_endpoint = _bind(raw_replay, replay_endpoint)
        except zmq.ZMQError as exc:
            raw_pub.close(linger=0)
            if raw_replay is not None:
                raw_replay.close(linger=0)
            raise OSError(f"KV events: cannot open {self.config.endpoint}: {exc}") from None
        self.config = msgspec.structs.replace(
            self.config, endpoint=endpoint, replay_endpoint=replay_endpoint
        )
        pub = ZmqSocket(raw_pub)
        replay = None if raw_replay is None else ZmqSocket(raw_replay)
        try:
            async with trio.open_nursery() as nursery:
                if replay is not None:
                    nursery.start_soon(self._serve_replay, replay)
                self.ready.set()
                task_status.started(self.config)
                await self._publish_loop(pub)
        finally:
            pub.close(linger_ms=0)
            if replay is not None:
                replay.close(linger_ms=0)
            for bound in (endpoint, replay_endpoint):  # libzmq leaves an ipc file behind
                if bound is not None and bound.startswith("ipc://"):
                    with contextlib.suppress(OSError):
                        os.unlink(bound.removeprefix("ipc://"))

    async def _publish_loop(self, pub: ZmqSocket) -> None:
        async for batch in self._recv:
            self._queued -= 1
            seq = self.next_seq
            self.next_seq += 1
            payload = encode_batch(batch)
            # PUB never blocks: past its high-water mark libzmq drops the message.
            await pub.send_multipart([self._topic, encode_seq(seq), payload])
            self._buffer.append((seq, payload))

    async def _serve_replay(self, router: ZmqSocket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("mock KV events: invalid replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await router.send_multipart(
                        [client, b"", self._topic, encode_seq(seq), payload]
                    )
            await router.send_multipart([client, b"", b"", END_SEQ, b""])
