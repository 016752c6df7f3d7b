"""Engine death seen from the socket itself: the input ROUTER's monitor reports an engine's
connection closing, and after a short grace (no reconnect) only that rank's requests fail.
A reconnect within the grace (a blip) fails nothing."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

import pytest
import trio
import zmq

from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.connector import state as state_mod
from smg_trio.connector.stream import RequestStream
from smg_trio.errors import EngineDeadError
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.types import EngineOutput
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import (
    RawEngine,
    make_protocol,
    raw_serving,
    request,
    serving,
    vllm_output,
    wait_until,
)

#: Starting a Python process that imports numpy/zmq/msgspec can take seconds on a busy machine.
SUBPROCESS_DEADLINE_S = 60.0
#: Death is decided from the socket: the silence watchdog must not be what ends the requests.
NO_WATCHDOG_S = 300.0
DISCONNECTED = "disconnected from the input socket"


@pytest.fixture
def long_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grace far longer than any test: a rank declared dead here was not given its grace."""
    monkeypatch.setattr(state_mod, "ENGINE_DISCONNECT_GRACE_S", 60.0)


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "ENGINE_DISCONNECT_GRACE_S", 0.05)


def _down_after_disconnect(client: EngineClient, inp: zmq.Socket[bytes]) -> Callable[[], bool]:
    """A ``wait_until`` predicate: the client saw rank 0's input connection close. libzmq
    completes a ``disconnect()`` only when the engine's socket next processes its commands
    (reading ``EVENTS`` does; nothing else touches that idle socket)."""

    def down() -> bool:
        inp.get(zmq.EVENTS)
        return client._router.down[0]

    return down


def _up_after_reconnect(client: EngineClient, inp: zmq.Socket[bytes]) -> Callable[[], bool]:
    """A ``wait_until`` predicate: rank 0 is back. As for the disconnect, the idle engine
    socket processes its commands (the new connection's pipe) only when something touches it."""

    def up() -> bool:
        inp.get(zmq.EVENTS)
        return not client._router.down[0]

    return up


async def _drain(stream: RequestStream) -> list[EngineOutput]:
    return [o async for o in stream]


@pytest.mark.slow
async def test_sigkilled_engine_process_fails_every_inflight_request(
    addresses: WorkerAddresses,
) -> None:
    # `launch`-style: the engine is a process nobody here watches (no sentinel, no exit
    # status); only its sockets closing can tell.
    argv = [sys.executable, "-m", "smg_trio.mock.engine", "--handshake", addresses.handshake]
    argv += ["--step-ms", "5", "--log-level", "error"]
    proc = await trio.lowlevel.open_process(argv)
    try:
        with trio.fail_after(SUBPROCESS_DEADLINE_S):
            async with open_engine_client(
                make_protocol("vllm"),
                addresses,
                ready_timeout_s=SUBPROCESS_DEADLINE_S,
                silence_timeout_s=NO_WATCHDOG_S,
            ) as client:
                errors: dict[str, BaseException] = {}

                async def one(rid: str, streaming: bool, started: trio.Event) -> None:
                    async with client.generate(request(rid, max_tokens=1_000_000)) as stream:
                        await stream.__anext__()
                        started.set()
                        try:
                            if streaming:
                                async for _ in stream:
                                    pass
                            else:  # collect everything, as a non-streaming response does
                                await _drain(stream)
                        except EngineDeadError as exc:
                            errors[rid] = exc

                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        started = trio.Event()
                        nursery.start_soon(one, f"r{i}", i % 2 == 0, started)
                        await started.wait()
                    proc.send_signal(signal.SIGKILL)
                    killed = trio.current_time()
                with trio.fail_after(IO_DEADLINE_S):
                    await client.dead_event.wait()
                assert sorted(errors) == ["r0", "r1", "r2", "r3"]
                for exc in errors.values():
                    assert DISCONNECTED in str(exc)
                assert client.dead_reason is not None
                assert DISCONNECTED in str(client.dead_reason)
                assert client.inflight_count == 0
                # Logged, not asserted (no timing targets in tests): bench/fault_engine_kill.py
                print(f"requests ended {trio.current_time() - killed:.3f} s after SIGKILL")
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@pytest.mark.usefixtures("long_grace")
async def test_a_reconnect_within_the_grace_fails_nothing(addresses: WorkerAddresses) -> None:
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine, silence_timeout_s=NO_WATCHDOG_S) as client:
            async with client.generate(request("blip", max_tokens=3)) as stream:
                await engine.recv_kind(b"\x00")
                await engine.push_vllm(vllm_output("blip", [5]))
                assert (await stream.__anext__()).new_token_ids == [5]
                # The engine's input connection drops and comes back (same identity).
                inp = engine.sockets.input.raw
                address = engine.sockets.init.addresses.inputs[0]
                inp.disconnect(address)
                await wait_until(_down_after_disconnect(client, inp))
                with pytest.raises(EngineDeadError, match="not connected"):
                    async with client.generate(request("during-blip")):
                        pytest.fail("a disconnected rank took a request")
                inp.connect(address)
                await wait_until(_up_after_reconnect(client, inp))
                # The request it was serving all along finishes normally.
                await engine.push_vllm(vllm_output("blip", [6]), vllm_output("blip", [7], 1))
                outputs = await _drain(stream)
            assert [o.new_token_ids for o in outputs] == [[6], [7]]
            assert outputs[-1].finish_reason == "length"
            assert client.alive
            assert not client._router.down[0]  # routable again
            # And it takes new requests over its new connection.
            async with client.generate(request("after", max_tokens=1)) as stream:
                await engine.recv_kind(b"\x00")
                await engine.push_vllm(vllm_output("after", [8], 1))
                assert [o.new_token_ids for o in await _drain(stream)] == [[8]]


@pytest.mark.usefixtures("long_grace")
async def test_a_request_right_after_a_reconnect_is_delivered(addresses: WorkerAddresses) -> None:
    # The rank turns routable only once the ROUTER can route to it: marked up at the new
    # connection's accept, a request sent at once failed with "not connected" (the new pipe
    # not attached yet) or went into the closed connection's pipe and was lost.
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine, silence_timeout_s=NO_WATCHDOG_S) as client:
            inp = engine.sockets.input.raw
            address = engine.sockets.init.addresses.inputs[0]
            for i in range(20):
                inp.disconnect(address)
                await wait_until(_down_after_disconnect(client, inp))
                inp.connect(address)
                await wait_until(_up_after_reconnect(client, inp))
                rid = f"after-blip-{i}"
                async with client.generate(request(rid, max_tokens=1)) as stream:
                    assert (await engine.recv_kind(b"\x00"))[0] == rid
                    await engine.push_vllm(vllm_output(rid, [8], 1))
                    assert [o.new_token_ids for o in await _drain(stream)] == [[8]]
            assert client.alive


@pytest.mark.usefixtures("short_grace")
async def test_no_reconnect_within_the_grace_is_death(addresses: WorkerAddresses) -> None:
    # The engine's process is alive and its output still connected, but its input connection
    # stays closed: the rank can never be given work again, so it is dead.
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine, silence_timeout_s=NO_WATCHDOG_S) as client:
            async with client.generate(request("r", max_tokens=100)) as stream:
                await engine.recv_kind(b"\x00")
                inp = engine.sockets.input.raw
                inp.disconnect(engine.sockets.init.addresses.inputs[0])
                await wait_until(_down_after_disconnect(client, inp))
                with pytest.raises(EngineDeadError, match=r"did not reconnect within 0\.05 s"):
                    await _drain(stream)
            assert not client.alive
            assert DISCONNECTED in str(client.dead_reason)


@pytest.mark.usefixtures("short_grace")
async def test_only_the_dead_ranks_requests_fail(addresses: WorkerAddresses) -> None:
    configs = [MockEngineConfig(engine_index=i, step_s=0.005) for i in range(2)]
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, *configs, silence_timeout_s=NO_WATCHDOG_S) as (
            client,
            engines,
        ):
            async with (
                client.generate(request("on0", max_tokens=100_000, rank=0)) as s0,
                client.generate(request("on1", max_tokens=200, rank=1)) as s1,
            ):
                await s0.__anext__()
                await s1.__anext__()
                engines[0].die_silently()  # closes its sockets, no sentinel
                with pytest.raises(EngineDeadError, match=DISCONNECTED):
                    await _drain(s0)
                # Rank 1 is untouched: its request runs to the end.
                outputs = await _drain(s1)
            assert outputs[-1].finish_reason == "length"
            assert client.alive
            assert engines[1].aborts == []
            # New requests go to the live rank; the dead one refuses pinned requests.
            for i in range(3):
                async with client.generate(request(f"new{i}", max_tokens=2)) as stream:
                    assert stream.rank == 1
                    await _drain(stream)
            with pytest.raises(EngineDeadError, match="engine 0 is not connected"):
                async with client.generate(request("pinned0", rank=0)):
                    pytest.fail("a dead rank took a request")
            # The last rank dying latches the client dead.
            engines[1].die_silently()
            await client.dead_event.wait()
            assert DISCONNECTED in str(client.dead_reason)


@pytest.mark.usefixtures("short_grace")
async def test_a_restarted_rank_is_readmitted_while_the_others_serve(
    addresses: WorkerAddresses,
) -> None:
    # DP=2, independent ranks: rank 0 dies and is restarted while rank 1 keeps serving. The
    # restarted engine handshakes as at startup and takes requests again; nothing on rank 1
    # is touched, and the client never dies.
    configs = [MockEngineConfig(engine_index=i, step_s=0.005) for i in range(2)]
    with trio.fail_after(IO_DEADLINE_S):
        async with (
            serving(addresses, *configs, silence_timeout_s=NO_WATCHDOG_S) as (client, engines),
            trio.open_nursery() as nursery,
        ):
            async with client.generate(request("on1", max_tokens=100_000, rank=1)) as s1:
                await s1.__anext__()
                slot = client.ranks.index(0)  # slots are in HELLO order
                engines[0].die_silently()
                await wait_until(lambda: slot in client._lost)
                restarted = MockEngine(addresses.handshake, configs[0])
                nursery.start_soon(restarted.run)
                await wait_until(lambda: slot not in client._lost)
                assert sorted(client.ranks) == [0, 1]
                async with client.generate(request("pinned0", max_tokens=3, rank=0)) as s0:
                    outputs = await _drain(s0)
                assert outputs[-1].finish_reason == "length"
                assert restarted.aborts == []
                # rank 1's long request was never disturbed
                assert (await s1.__anext__()).finish_reason is None
            assert client.alive
            nursery.cancel_scope.cancel()
