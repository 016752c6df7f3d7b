"""The KV event SUB's bounds: what a flooding publisher can make libzmq queue in the gateway."""

from __future__ import annotations

import zmq

from smg_trio.transport.kv_events import KV_EVENTS_MAX_QUEUED_BYTES, open_kv_subscriber


async def test_the_subscriber_queue_is_bounded_in_bytes() -> None:
    """libzmq bounds a SUB's queue in messages (``RCVHWM``), each up to ``MAXMSGSIZE``: at
    10000 messages of 16 MiB a publisher that outruns the feed could make the gateway hold
    156 GiB. Their product is at most ``KV_EVENTS_MAX_QUEUED_BYTES`` (1 GiB), and a message
    still holds a large step's events (4 MiB: about 800k token ids)."""
    async with open_kv_subscriber("tcp://127.0.0.1:*", "", bind=True) as sub:
        raw = sub.socket.raw
        hwm, size = raw.getsockopt(zmq.RCVHWM), raw.getsockopt(zmq.MAXMSGSIZE)
    assert isinstance(hwm, int)
    assert isinstance(size, int)
    assert 0 < hwm * size <= KV_EVENTS_MAX_QUEUED_BYTES == 1 << 30
    assert size >= 4 << 20
    assert hwm >= 256
