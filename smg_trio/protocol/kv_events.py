"""vLLM's KV cache event wire: the publisher's multipart frames and its ``KVEventBatch`` structs.

Wire source: vLLM 0.32.0 ``vllm/distributed/kv_events.py`` (``ZmqEventPublisher``,
``KVEventBatch``, ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) and
``vllm/config/kv_events.py`` (``KVEventsConfig``). A message on the PUB socket is
``[topic, seq (8 bytes, big-endian), payload]``; ``payload`` is msgpack of ``KVEventBatch``
(``array_like``: ``[ts, events, data_parallel_rank]``) whose events are tagged maps
(``"type"`` = the class name, ``omit_defaults``). Replay: a DEALER sends ``[b"", start_seq]``
to the publisher's ROUTER, which answers ``[b"", topic, seq, payload]`` per buffered batch and
ends with ``[b"", b"", END_SEQ, b""]``.

Decoding is tolerant the way the rest of the wire is: unknown fields are ignored, an event of an
unknown type is skipped and counted (:attr:`DecodedBatch.unknown`), and a malformed message
raises :class:`~smg_trio.errors.DecodeError` for the caller to count and drop.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from smg_trio.errors import DecodeError

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "DecodedBatch",
    "ExternalBlockHash",
    "KVEventBatch",
    "KVEventsConfig",
    "KvEvent",
    "decode_batch",
    "decode_kv_events_config",
    "decode_seq",
    "encode_batch",
    "encode_replay_request",
    "encode_seq",
    "offset_endpoint_port",
]

#: A block hash as the engine publishes it: bytes or an integer (``ExternalBlockHash``).
ExternalBlockHash = bytes | int

#: The replay stream's end marker (``-1`` as 8 signed big-endian bytes).
END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Full blocks an engine stored: their hashes, the parent of the first, and all their
    tokens concatenated (``len(token_ids) == len(block_hashes) * block_size``)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated upstream; kept for field order
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Blocks an engine evicted, by hash."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The engine dropped its whole prefix cache (``reset_prefix_cache``)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One published batch: a timestamp, the events, and the publisher's DP rank."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class DecodedBatch(msgspec.Struct, gc=False):
    """A decoded batch: the events of known types, and how many were skipped as unknown."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None
    unknown: int = 0


class KVEventsConfig(msgspec.Struct, kw_only=True):
    """``kv_events_config`` of an engine's ready response (vLLM's ``KVEventsConfig``): the
    publisher's resolved settings, its endpoint already offset by the engine's DP rank."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def zmq_enabled(self) -> bool:
        """Events are on and published over ZMQ (the only publisher a gateway can read)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @property
    def engine_binds(self) -> bool:
        """The engine binds ``endpoint`` (a wildcard, ``ipc://`` or ``inproc://``), so a
        subscriber connects; otherwise the engine CONNECTS and a subscriber must bind it
        (vLLM's ``_is_bind_endpoint``)."""
        ep = self.endpoint
        return "*" in ep or "::" in ep or ep.startswith(("ipc://", "inproc://"))


_batch_decoder: Final = msgspec.msgpack.Decoder(_RawBatch)
_event_decoder: Final = msgspec.msgpack.Decoder(KvEvent)
_tag_decoder: Final = msgspec.msgpack.Decoder(dict[str, Any])
_encoder: Final = msgspec.msgpack.Encoder()
_KNOWN_TAGS: Final = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


def decode_batch(payload: bytes | memoryview) -> DecodedBatch:
    """Decode one ``KVEventBatch`` payload. Events of an unknown ``type`` are skipped and
    counted; a malformed batch or a malformed event of a known type raises ``DecodeError``."""
    try:
        raw = _batch_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"malformed KV event batch: {exc}") from None
    except RecursionError:  # msgspec's answer to arrays nested past the interpreter's limit
        raise DecodeError("malformed KV event batch: nested too deeply") from None
    events: list[KvEvent] = []
    unknown = 0
    for item in raw.events:
        try:
            events.append(_event_decoder.decode(item))
        except msgspec.ValidationError as exc:
            try:
                tag = _tag_decoder.decode(item).get("type")
            except (msgspec.DecodeError, msgspec.ValidationError):
                tag = None
            if isinstance(tag, str) and tag not in _KNOWN_TAGS:
                unknown += 1
                continue
            raise DecodeError(f"malformed KV event: {exc}") from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed KV event: {exc}") from None
        except RecursionError:
            raise DecodeError("malformed KV event: nested too deeply") from None
    return DecodedBatch(raw.ts, events, raw.data_parallel_rank, unknown)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload frame of ``batch``, as vLLM's publisher encodes it (the mock engine's)."""
    return _encoder.encode(batch)


def encode_seq(seq: int) -> bytes:
    """A sequence number frame: 8 bytes, big-endian."""
    return seq.to_bytes(8, "big", signed=seq < 0)


def decode_seq(frame: bytes | memoryview) -> int:
    """The sequence number of a frame (``-1`` for :data:`END_SEQ`); ``DecodeError`` unless it
    is exactly 8 bytes."""
    data = bytes(frame)
    if len(data) != 8:
        raise DecodeError(f"KV event sequence frame of {len(data)} bytes, expected 8")
    return int.from_bytes(data, "big", signed=data == END_SEQ)


def encode_replay_request(start_seq: int) -> list[bytes]:
    """A replay request from a DEALER: ``[b"", start_seq]``."""
    return [b"", encode_seq(start_seq)]


def decode_kv_events_config(value: object) -> KVEventsConfig | None:
    """The ready response's ``kv_events_config`` (a map), or ``None`` when absent or not one
    that can be read (logged by the caller)."""
    if value is None:
        return None
    try:
        return msgspec.convert(value, KVEventsConfig)
    except msgspec.ValidationError:
        return None


def offset_endpoint_port(endpoint: str, data_parallel_rank: int) -> str:
    """The endpoint of DP rank ``data_parallel_rank`` given the base one, as vLLM's
    ``ZmqEventPublisher.offset_endpoint_port`` derives it: a tcp port plus the rank (port 0
    left alone), an ``inproc`` name with ``_dp{rank}``. vLLM raises for ``ipc://`` with a rank
    above 0; so does this (``ValueError``)."""
    if data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        base, sep, port = endpoint.rpartition(":")
        if not sep or not port.isdigit():
            return endpoint
        if int(port) == 0:
            return endpoint
        return f"{base}:{int(port) + data_parallel_rank}"
    raise ValueError(f"endpoint {endpoint!r} cannot be offset by DP rank (needs tcp or inproc)")
