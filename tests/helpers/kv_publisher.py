"""A vLLM-shaped KV event publisher for tests: an XPUB (a PUB that also reports its
subscribers, so a test can wait for one instead of sleeping) with a replay ROUTER that keeps
every batch it sent, as ``ZmqEventPublisher`` does."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio
import zmq

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol.handshake import decode_ready_response, encode_ready_response
from smg_trio.protocol.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KVEventBatch,
    decode_seq,
    encode_batch,
    encode_seq,
)
from smg_trio.transport.zsocket import ZmqSocket, zmq_context

__all__ = ["BLOCK", "KvPublisher", "PublishedEngine", "PublishingMock", "kv_publisher", "stored"]

#: The mock engine's registered block size.
BLOCK = 128


def stored(
    hashes: Sequence[int], tokens: Sequence[int], block_size: int, parent: int | None = None
) -> BlockStored:
    """A ``BlockStored`` of GPU blocks."""
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=block_size,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


class KvPublisher:
    """Publishes batches with consecutive sequence numbers (or any frames a test wants)."""

    def __init__(self, pub: ZmqSocket, replay: ZmqSocket | None, topic: str) -> None:
        self.pub = pub
        self.replay = replay
        self.topic = topic.encode()
        self.seq = 0
        self.sent: list[tuple[int, bytes]] = []

    async def wait_subscribed(self) -> None:
        """Until a subscriber's subscription arrived (XPUB reports it as a message)."""
        while True:
            frames = await self.pub.recv_multipart()
            if frames and frames[0][:1] == b"\x01":
                return

    async def publish(self, *events: KvEvent, seq: int | None = None) -> int:
        """Publish one batch (the next sequence number unless ``seq``); returns its number."""
        n = self.seq if seq is None else seq
        self.seq = n + 1
        payload = encode_batch(KVEventBatch(ts=time.time(), events=list(events)))
        self.sent.append((n, payload))
        await self.pub.send_multipart([self.topic, encode_seq(n), payload])
        return n

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    async def serve_replay(self) -> None:
        """Answer replay requests from what was sent (run it in a nursery)."""
        assert self.replay is not None
        while True:
            ident, _, start_frame = await self.replay.recv_multipart()
            start = decode_seq(start_frame)
            for n, payload in self.sent:
                if n >= start:
                    await self.replay.send_multipart(
                        [ident, b"", self.topic, encode_seq(n), payload]
                    )
            await self.replay.send_multipart([ident, b"", b"", END_SEQ, b""])


@asynccontextmanager
async def kv_publisher(
    endpoint: str, *, replay_endpoint: str | None = None, topic: str = "kv", connect: bool = False
) -> AsyncIterator[KvPublisher]:
    """A publisher bound at ``endpoint`` (connecting to it with ``connect``, as vLLM does
    for a tcp endpoint with a host), and a replay ROUTER at ``replay_endpoint``."""
    ctx = zmq_context()
    raw = ctx.socket(zmq.XPUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription, not only the first
    if connect:
        raw.connect(endpoint)
    else:
        raw.bind(endpoint)
    pub = ZmqSocket(raw)
    replay = None
    if replay_endpoint is not None:
        r = ctx.socket(zmq.ROUTER)
        r.setsockopt(zmq.LINGER, 0)
        r.bind(replay_endpoint)
        replay = ZmqSocket(r)
    try:
        await trio.lowlevel.checkpoint()
        yield KvPublisher(pub, replay, topic)
    finally:
        pub.close()
        if replay is not None:
            replay.close()


class PublishingMock(MockEngine):
    """A mock whose registration announces a KV event publisher at ``endpoint`` (the test
    publishes for it what it stores)."""

    def __init__(self, handshake: str, endpoint: str | None) -> None:
        super().__init__(
            handshake, MockEngineConfig(step_s=0.001, max_model_len=8192, block_size=BLOCK)
        )
        self.endpoint = endpoint

    def registration(self) -> bytes:
        resp = decode_ready_response(super().registration())
        if self.endpoint is not None:
            resp.kv_events_config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.endpoint,
                "topic": "kv",
            }
        return encode_ready_response(resp)


class PublishedEngine:
    """One mock engine, its publisher, and the block hashes it has published."""

    def __init__(self, mock: PublishingMock, pub: KvPublisher | None) -> None:
        self.mock = mock
        self.pub = pub
        self.next_hash = 1
        self.held: dict[tuple[int, ...], int] = {}  # a block's tokens so far -> its hash

    async def store(self, prompt: list[int]) -> None:
        """Publish BlockStored for the prompt's full blocks not yet held, as vLLM does."""
        assert self.pub is not None
        parent = None
        hashes, tokens = [], []
        for i in range(len(prompt) // BLOCK):
            prefix = tuple(prompt[: (i + 1) * BLOCK])
            h = self.held.get(prefix)
            if h is not None:
                parent = h
                continue
            h = self.held[prefix] = self.next_hash
            self.next_hash += 1
            hashes.append(h)
            tokens.extend(prompt[i * BLOCK : (i + 1) * BLOCK])
        if hashes:
            await self.pub.publish(stored(hashes, tokens, BLOCK, parent=parent))


__all__ += ["AllBlocksCleared", "BlockRemoved"]
