"""The mock engine's KV event publisher, read as a gateway reads vLLM's: the ready response's
``kv_events_config``, live ``[topic, seq, payload]`` messages decoded with
``protocol.kv_events.decode_batch`` (chained ``BlockStored``, ``BlockRemoved`` on eviction,
``AllBlocksCleared``), the replay ROUTER, vLLM's bind-or-connect rule and DP port offset."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio
import zmq

from smg_trio.connector import EngineClient
from smg_trio.mock.cli import main as mock_main
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.kv_publisher import KvEventPublisher, parse_kv_events_config
from smg_trio.mock.prefix_cache import block_hashes
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodedBatch,
    KVEventsConfig,
    decode_batch,
    decode_kv_events_config,
    decode_seq,
    encode_replay_request,
)
from smg_trio.transport.zsocket import ZmqSocket
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import request, serving, wait_until
from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import raw_socket

BS = 16
#: How long one probe waits for a live message before it sends another (a SUB's subscription
#: reaches the PUB some time after it connects; messages before that are not delivered).
PROBE_S = 0.2


@pytest.fixture
def sockets() -> Iterator[Callable[..., ZmqSocket]]:
    with contextlib.ExitStack() as stack:

        def make(kind: int, **kwargs: object) -> ZmqSocket:
            return raw_socket(stack, kind, **kwargs)  # type: ignore[arg-type]

        yield make


def _events_config(endpoint: str, **extra: object) -> KVEventsConfig:
    return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint, **extra)  # type: ignore[arg-type]


def _prompt(tag: int, n: int = 40) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


async def _generate(client: EngineClient, rid: str, prompt: list[int]) -> None:
    async with client.generate(request(rid, max_tokens=2, prompt=prompt)) as stream:
        async for _ in stream:
            pass


async def _first_live(sub: ZmqSocket, probe: Callable[[int], Awaitable[None]]) -> list[bytes]:
    """Probe until a message arrives (the first ones are lost while the subscription travels)."""
    for i in range(1000):
        await probe(i)
        with trio.move_on_after(PROBE_S):
            return await sub.recv_multipart()
    raise AssertionError("no KV event arrived")


def _decode(frames: list[bytes]) -> tuple[bytes, int, DecodedBatch]:
    topic, seq, payload = frames
    return topic, decode_seq(seq), decode_batch(payload)


async def test_ready_response_announces_the_resolved_config(
    addresses: WorkerAddresses, ipc: IpcNamespace
) -> None:
    endpoint = f"ipc://{ipc.directory}/kv"
    cfg = _events_config(endpoint, replay_endpoint="tcp://127.0.0.1:0", topic="kv")
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(kv_events=cfg)) as (client, _):
            announced = decode_kv_events_config(client.ready_responses[0].kv_events_config)
            assert await trio.Path(ipc.directory, "kv").exists()
    assert not await trio.Path(ipc.directory, "kv").exists()  # the engine removed its file
    assert announced is not None
    assert announced.zmq_enabled
    assert announced.engine_binds
    assert announced.endpoint == endpoint
    assert announced.topic == "kv"
    assert announced.replay_endpoint is not None
    assert announced.replay_endpoint.startswith("tcp://127.0.0.1:")
    assert not announced.replay_endpoint.endswith(":0")


async def test_live_events_chain_blocks_and_report_evictions(
    addresses: WorkerAddresses, ipc: IpcNamespace, sockets: Callable[..., ZmqSocket]
) -> None:
    cfg = _events_config(f"ipc://{ipc.directory}/kv", topic="kv")
    config = MockEngineConfig(block_size=BS, num_gpu_blocks=4, cache_seed=7, kv_events=cfg)
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, config) as (client, (engine,)):
            announced = decode_kv_events_config(client.ready_responses[0].kv_events_config)
            assert announced is not None
            sub = sockets(zmq.SUB, connect=announced.endpoint, SUBSCRIBE=b"kv")

            async def probe(i: int) -> None:
                await _generate(client, f"probe-{i}", _prompt(100 + i))

            topic, seq, batch = _decode(await _first_live(sub, probe))
            assert topic == b"kv"
            assert batch.data_parallel_rank == 0
            prompt = _prompt(1, 50)
            await _generate(client, "x", prompt)
            events = list(batch.events)
            stored: BlockStored | None = None
            while stored is None:
                topic, next_seq, batch = _decode(await sub.recv_multipart())
                assert next_seq == seq + 1  # no gap once subscribed
                seq = next_seq
                events += batch.events
                for ev in batch.events:
                    if isinstance(ev, BlockStored) and ev.token_ids == prompt[:48]:
                        stored = ev
    assert stored.block_hashes == block_hashes(7, prompt, BS)
    assert stored.parent_block_hash is None
    assert (stored.block_size, stored.medium, stored.lora_name) == (BS, "GPU", None)
    # Four blocks hold two probes at most: storing x's three evicted the probes' blocks.
    removed = [h for ev in events if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert removed
    assert not set(removed) & set(stored.block_hashes)
    assert all(h not in engine.cache for h in removed[-3:])


async def test_replay_answers_buffered_batches_then_end_seq(
    addresses: WorkerAddresses, ipc: IpcNamespace, sockets: Callable[..., ZmqSocket]
) -> None:
    cfg = _events_config(
        f"ipc://{ipc.directory}/kv", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=3
    )
    config = MockEngineConfig(block_size=BS, cache_seed=3, kv_events=cfg)
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, config) as (client, (engine,)):
            publisher = engine.publisher
            assert publisher is not None
            for i in range(4):  # one batch each (the prefill's BlockStored)
                await _generate(client, f"r{i}", _prompt(i))
            engine.reset_prefix_cache()
            await wait_until(lambda: publisher.next_seq == 5)
            replay_endpoint = publisher.config.replay_endpoint
            assert replay_endpoint is not None
            dealer = sockets(zmq.DEALER, connect=replay_endpoint)
            await dealer.send_multipart([b"junk"])  # a bad request is ignored
            await dealer.send_multipart(encode_replay_request(0))
            got = []
            while (frames := await dealer.recv_multipart())[2] != END_SEQ:
                empty, topic, seq, payload = frames
                assert (empty, topic) == (b"", b"")
                got.append((decode_seq(seq), decode_batch(payload)))
            assert frames == [b"", b"", END_SEQ, b""]
            await dealer.send_multipart(encode_replay_request(4))
            last = await dealer.recv_multipart()
            assert await dealer.recv_multipart() == [b"", b"", END_SEQ, b""]
    # buffer_steps=3 keeps seqs 2..4; the last is the reset.
    assert [seq for seq, _ in got] == [2, 3, 4]
    assert got[-1][1].events == [AllBlocksCleared()]
    first = got[0][1].events[0]
    assert isinstance(first, BlockStored)
    assert first.token_ids == _prompt(2)[:32]
    assert decode_seq(last[2]) == 4
    assert len(engine.cache) == 0


async def test_a_host_endpoint_is_dialled_with_the_dp_rank_offset(
    sockets: Callable[..., ZmqSocket],
) -> None:
    sub = sockets(zmq.SUB, bind="tcp://127.0.0.1:*", SUBSCRIBE=b"")
    port = int(sub.raw.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
    publisher = KvEventPublisher(_events_config(f"tcp://127.0.0.1:{port - 1}"), 1)
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            resolved = await nursery.start(publisher.run)
            assert resolved.endpoint == f"tcp://127.0.0.1:{port}"
            assert not resolved.engine_binds

            async def probe(i: int) -> None:
                publisher.publish([AllBlocksCleared()])
                await trio.lowlevel.checkpoint()

            _, seq, batch = _decode(await _first_live(sub, probe))
            assert batch.data_parallel_rank == 1
            assert batch.events == [AllBlocksCleared()]
            nursery.cancel_scope.cancel()
    assert seq < publisher.next_seq


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"enable_kv_cache_events": true, "endpointt": "x"}', "unknown field"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "unknown publisher"),
        ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps"),
    ],
)
def test_bad_kv_events_config_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kv_events_config(text)


def test_config_defaults_follow_vllm() -> None:
    on = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert (on.publisher, on.endpoint, on.buffer_steps) == ("zmq", "tcp://*:5557", 10_000)
    assert parse_kv_events_config("{}").publisher == "null"


def test_cli_refuses_an_ipc_endpoint_above_rank_0(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = '{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}'
    with pytest.raises(SystemExit) as exc:
        mock_main(["--handshake", "tcp://127.0.0.1:1", "--engine-index", "1",
                   "--kv-events-config", cfg])  # fmt: skip
    assert exc.value.code == 2
    assert "cannot be offset" in capsys.readouterr().err


def test_events_are_off_without_the_config() -> None:
    engine = MockEngine("tcp://127.0.0.1:1", MockEngineConfig())
    assert engine.publisher is None
    engine.cache.store(_prompt(1))
    assert engine.cache.take_events() == []


def test_cli_fails_cleanly_when_the_endpoint_cannot_be_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = f'{{"enable_kv_cache_events": true, "endpoint": "ipc://{tmp_path}/missing/kv"}}'
    assert mock_main(["--handshake", "tcp://127.0.0.1:1", "--kv-events-config", cfg]) == 1
    assert "KV events: cannot open" in caplog.text


def test_a_full_queue_drops_and_counts_batches() -> None:
    publisher = KvEventPublisher(_events_config("tcp://*:0", max_queue_size=2))
    for _ in range(3):
        publisher.publish([AllBlocksCleared()])
    publisher.publish([])  # an empty step publishes nothing
    assert publisher.dropped == 1
