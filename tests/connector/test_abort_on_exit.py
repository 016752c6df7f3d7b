"""Abort-on-exit (the trio replacement for Rust's ``Drop``), explicit aborts, and late outputs
for retired ids."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from smg_trio.connector import aborts as aborts_mod
from smg_trio.errors import RequestStreamClosed
from smg_trio.mock.engine import MockEngineConfig
from smg_trio.protocol.addresses import WorkerAddresses
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import (
    PROTOCOLS,
    ProtocolName,
    RawEngine,
    raw_serving,
    request,
    serving,
    vllm_output,
    wait_until,
)

ADD = b"\x00"
ABORT = b"\x01"


class _Boom(Exception):
    pass


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_cancelling_a_generate_block_aborts_the_request(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol=proto)) as (client, (engine,)):
            aborted = engine.abort_event
            with trio.CancelScope() as scope:
                async with client.generate(request("ab", max_tokens=100_000)) as stream:
                    await stream.__anext__()  # mid-stream
                    scope.cancel()
                    await trio.sleep_forever()
            assert scope.cancelled_caught
            # Retired at once, before the engine even hears of it.
            assert client.inflight_count == 0
            assert all(not s for s in client._router.inflight)
            await aborted.wait()
            assert "ab" in engine.aborts
            assert "ab" not in engine.active
            # The client is healthy. (Not reusing "ab" here: TokenSpeed answers ABORT with a
            # terminal "abort" output that may still be in flight.)
            async with client.generate(request("ab2", max_tokens=2)) as stream:
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "length"
            assert client.alive


async def test_an_exception_in_the_block_aborts_and_propagates(
    addresses: WorkerAddresses,
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            aborted = engine.abort_event

            async def fail_mid_stream() -> None:
                async with client.generate(request("boom", max_tokens=100_000)) as stream:
                    await stream.__anext__()
                    raise _Boom

            with pytest.raises(_Boom):
                await fail_mid_stream()
            assert client.inflight_count == 0
            await aborted.wait()
            assert engine.aborts == ["boom"]


async def test_finished_requests_are_not_aborted(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            async with client.generate(request("done", max_tokens=3)) as stream:
                await trio.testing.wait_all_tasks_blocked()
                while not stream.finished:
                    await stream.receive_some()
                # Leaving after the terminal output (even unread) needs no abort.
            async with client.generate(request("after", max_tokens=1)) as stream:
                [o async for o in stream]
            assert engine.aborts == []


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_explicit_abort_closes_the_stream(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol=proto)) as (client, (engine,)):
            aborted = engine.abort_event
            async with client.generate(request("x", max_tokens=100_000)) as stream:
                await stream.__anext__()
                await client.abort("x")
                assert client.inflight_count == 0
                assert all(not s for s in client._router.inflight)
                with pytest.raises(RequestStreamClosed) as info:
                    async for _ in stream:  # already-queued outputs drain first
                        pass
                assert info.value.request_id == "x"
                assert not stream.finished
            await aborted.wait()
            assert "x" in engine.aborts
            # Unknown ids are ignored; the connection is unaffected.
            await client.abort("never-sent")
            async with client.generate(request("y", max_tokens=2)) as stream:
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "length"
            assert "never-sent" not in engine.aborts


async def _expect(engine: RawEngine, kind: bytes) -> Any:
    """The engine's next input message must be of type ``kind``; returns its payload."""
    got, payload = await engine.recv()
    assert got == kind, (got, payload)
    return payload


async def test_late_outputs_for_an_aborted_id_are_dropped_and_reaborted(
    addresses: WorkerAddresses,
) -> None:
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            async with client.generate(request("late")) as stream:
                assert (await _expect(engine, ADD))[0] == "late"
                await client.abort("late")
                assert await _expect(engine, ABORT) == ["late"]
                # The engine registered the request after the abort: its next output for the
                # id is dropped and the engine is told again.
                await engine.push_vllm(vllm_output("late", [7]))
                assert await _expect(engine, ABORT) == ["late"]
                with pytest.raises(RequestStreamClosed):
                    await stream.__anext__()
            # Leaving the block aborts once more (smg parity: explicit abort + drop = 2 frames).
            assert await _expect(engine, ABORT) == ["late"]

            # A terminal output for the aborted id is dropped and ends the re-abort memory ...
            await engine.push_vllm(vllm_output("late", [8], finish=2))
            await wait_until(lambda: "late" not in client._aborted)
            # ... so a stray running output after it is an id this client does not know: it is
            # ABORTed once (the rule that frees a restarted frontend's old requests). It travels
            # ahead of the probe's terminal output on the same pipe; once every task is idle
            # after the probe, the ABORT sits before the next ADD.
            async with client.generate(request("probe")) as stream:
                assert (await _expect(engine, ADD))[0] == "probe"
                await engine.push_vllm(vllm_output("late", [9]))
                await engine.push_vllm(vllm_output("probe", [1], finish=1))
                outputs = [o async for o in stream]
            assert [(o.new_token_ids, o.finish_reason) for o in outputs] == [([1], "length")]
            await trio.testing.wait_all_tasks_blocked()
            assert await _expect(engine, ABORT) == ["late"]
            async with client.generate(request("probe2")) as stream:
                assert (await _expect(engine, ADD))[0] == "probe2"
                await engine.push_vllm(vllm_output("probe2", [], finish=0))
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "stop"
            assert client.inflight_count == 0
            assert client.alive


async def test_reaborts_of_one_output_batch_go_in_one_message(addresses: WorkerAddresses) -> None:
    engine = RawEngine(addresses.handshake)
    ids = ["a", "b", "c"]
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            for rid in ids:
                async with client.generate(request(rid)):
                    assert (await _expect(engine, ADD))[0] == rid
                assert await _expect(engine, ABORT) == [rid]
            # Outputs that were on the way when the ABORTs went out (two for "a"): the engine
            # is told again once, in one message for the whole batch.
            await engine.push_vllm(*(vllm_output(rid, [1]) for rid in [*ids, "a"]))
            assert await _expect(engine, ABORT) == ids
            # Nothing else was sent for them: the next message is the probe's ADD.
            async with client.generate(request("probe")):
                assert (await _expect(engine, ADD))[0] == "probe"


@pytest.mark.parametrize("interval", [60.0, 0.0])
async def test_an_orphans_queued_outputs_bring_one_abort_per_interval(
    addresses: WorkerAddresses, monkeypatch: pytest.MonkeyPatch, interval: float
) -> None:
    """A restarted frontend finds many output batches of its previous life's request queued
    for it: the engine is told ABORT once per REABORT_INTERVAL_S, not once per batch (it was
    once per batch: harmless, but a burst of ABORTs for one request). With no interval, each
    batch is told again, as before."""
    monkeypatch.setattr(aborts_mod, "REABORT_INTERVAL_S", interval)
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            for step in range(5):
                await engine.push_vllm(vllm_output("orphan", [step]))
            await wait_until(lambda: "orphan" in client._aborted)
            await trio.testing.wait_all_tasks_blocked()
            aborts = 5 if interval == 0 else 1
            for _ in range(aborts):
                assert await _expect(engine, ABORT) == ["orphan"]
            # nothing else was sent for it: the next message is the probe's ADD
            async with client.generate(request("probe")):
                assert (await _expect(engine, ADD))[0] == "probe"


async def test_every_abort_arrives_when_many_streams_vanish_at_once(
    addresses: WorkerAddresses,
) -> None:
    ids = [f"storm-{i}" for i in range(64)]
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(step_s=0.005)) as (client, (engine,)):
            started: set[str] = set()

            async def stream_until_cancelled(rid: str) -> None:
                async with client.generate(request(rid, max_tokens=100_000)) as stream:
                    await stream.__anext__()
                    started.add(rid)
                    async for _ in stream:
                        pass

            for _ in range(3):  # rounds
                started.clear()
                async with trio.open_nursery() as nursery:
                    for rid in ids:
                        nursery.start_soon(stream_until_cancelled, rid)
                    await wait_until(lambda: len(started) == len(ids))
                    nursery.cancel_scope.cancel()  # every client vanishes at once
                await wait_until(lambda: not engine.active)
                assert client.inflight_count == 0
                assert set(ids) <= set(engine.aborts)
                engine.aborts.clear()


async def test_an_eager_abort_is_sent_at_once_and_only_once(addresses: WorkerAddresses) -> None:
    # abort_nowait (a client known gone) retires the request and queues its ABORT without a
    # checkpoint; the generate block then sends no second ABORT when it unwinds.
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            async with client.generate(request("gone")) as stream:
                assert (await _expect(engine, ADD))[0] == "gone"
                client.abort_nowait(["gone"])
                assert client.inflight_count == 0
                assert await _expect(engine, ABORT) == ["gone"]
                with pytest.raises(RequestStreamClosed):
                    await stream.__anext__()
            async with client.generate(request("next", max_tokens=1)) as stream:
                # the next message after that ABORT is this ADD: no ABORT from the block's exit
                kind, payload = await engine.recv()
                assert (kind, payload[0]) == (ADD, "next")
                await engine.push_vllm(vllm_output("next", [1], 1))
                assert [o.finish_reason async for o in stream] == ["length"]


async def test_an_abort_group_aborts_every_member_in_one_message(
    addresses: WorkerAddresses,
) -> None:
    # The HTTP front's group (aborts_mod.ABORT_GROUP) collects a request's generate blocks,
    # those of its fan-out tasks too; abort_now ABORTs them all while the blocks are still
    # open (before any cancellation has unwound), one message per engine.
    engine = RawEngine(addresses.handshake)
    group = aborts_mod.AbortGroup()
    token = aborts_mod.ABORT_GROUP.set(group)
    try:
        with trio.fail_after(IO_DEADLINE_S):
            async with raw_serving(addresses, engine) as client:
                opened = trio.Semaphore(0)
                release = trio.Event()

                async def sub(rid: str) -> None:
                    async with client.generate(request(rid)):
                        opened.release()
                        await release.wait()

                async with trio.open_nursery() as nursery:
                    for rid in ("req-0", "req-1"):
                        nursery.start_soon(sub, rid)
                    for _ in range(2):
                        await opened.acquire()
                    assert sorted([(await _expect(engine, ADD))[0] for _ in range(2)]) == [
                        "req-0",
                        "req-1",
                    ]
                    group.abort_now()
                    assert sorted(await _expect(engine, ABORT)) == ["req-0", "req-1"]
                    assert client.inflight_count == 0
                    release.set()
                assert not group._members
    finally:
        aborts_mod.ABORT_GROUP.reset(token)


async def test_a_disconnect_storms_aborted_ids_are_forgotten(
    addresses: WorkerAddresses, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ids retired by abort_nowait are remembered (a late output is ABORTed again), but
    # only for ABORTED_TTL_S: before, every storm's ids stayed until 4096 newer ones pushed
    # them out, and the gateway's RSS grew with each storm (bench/abort_storm.py's soak).
    # With the TTL then set to 0 the next engine batch forgets them all; an output that still
    # arrives for one of them is ABORTed anyway, as an id this client does not know.
    engine = RawEngine(addresses.handshake)
    ids = [f"gone-{i}" for i in range(32)]
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            opened = trio.Semaphore(0)
            release = trio.Event()

            async def one(rid: str) -> None:
                async with client.generate(request(rid)):
                    opened.release()
                    await release.wait()

            async with trio.open_nursery() as nursery:
                for rid in ids:
                    nursery.start_soon(one, rid)
                for _ in ids:
                    await opened.acquire()
                assert sorted([(await _expect(engine, ADD))[0] for _ in ids]) == sorted(ids)
                client.abort_nowait(ids)  # the storm: every client gone at once
                assert sorted(await _expect(engine, ABORT)) == sorted(ids)
                release.set()
            assert client.inflight_count == 0
            assert client.aborted_remembered == len(ids)
            monkeypatch.setattr(aborts_mod, "ABORTED_TTL_S", 0.0)
            async with client.generate(request("next", max_tokens=1)) as stream:
                assert (await _expect(engine, ADD))[0] == "next"
                await engine.push_vllm(vllm_output("next", [1], 1))
                assert [o.finish_reason async for o in stream] == ["length"]
            assert client.aborted_remembered == 0  # the registry of aborted ids is empty again
            await engine.push_vllm(vllm_output("gone-3", [1]))  # a very late output
            assert await _expect(engine, ABORT) == ["gone-3"]
