"""The trio⇄pyzmq adapter: backpressure, cancel-atomicity, single-owner and close semantics."""

from __future__ import annotations

import errno
import random
from typing import cast

import pytest
import trio
import trio.testing
import zmq

from smg_trio.transport.zsocket import ZmqSocket, zmq_context
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import RawSocketFactory


def _push_pull(
    raw_socket: RawSocketFactory, ipc: IpcNamespace, hwm: int = 1000
) -> tuple[ZmqSocket, ZmqSocket]:
    url = ipc.worker_url("pp.sock")
    pull = raw_socket(zmq.PULL, bind=url, RCVHWM=hwm)
    push = raw_socket(zmq.PUSH, connect=url, SNDHWM=hwm)
    return push, pull


def test_zmq_context_is_shared() -> None:
    assert zmq_context() is zmq_context()


async def test_push_pull_backpressure_in_order(
    raw_socket: RawSocketFactory, ipc: IpcNamespace
) -> None:
    """20,000 multipart messages through HWM 8 on both ends into a randomly slow consumer."""
    count = 20_000
    push, pull = _push_pull(raw_socket, ipc, hwm=8)
    rng = random.Random(1)
    blocked = 0

    async def produce() -> None:
        nonlocal blocked
        for i in range(count):
            frames = [i.to_bytes(4, "little"), b"x" * (i % 64)]
            if i % 2:
                await push.send_multipart(frames)
            elif not push.send_multipart_nowait(frames):
                blocked += 1
                await push.send_multipart(frames)

    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            for i in range(count):
                frames = await pull.recv_multipart()
                assert frames == [i.to_bytes(4, "little"), b"x" * (i % 64)]
                if rng.random() < 0.002:
                    await trio.sleep(0.001)  # a slow consumer, not synchronisation
    assert blocked > 0, "the producer never hit the high-water mark"


async def test_recv_is_cancel_atomic(raw_socket: RawSocketFactory, ipc: IpcNamespace) -> None:
    """recv under random move_on_after(0 / tiny) loses and reorders nothing."""
    count = 5_000
    push, pull = _push_pull(raw_socket, ipc, hwm=16)
    rng = random.Random(7)
    cancelled = 0

    async def produce() -> None:
        for i in range(count):
            await push.send_multipart([i.to_bytes(4, "little")])
            if i % 97 == 0:
                await trio.sleep(0.0002)  # let the consumer park on the fd now and then

    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            expected = 0
            while expected < count:
                with trio.move_on_after(rng.choice((0.0, 0.0, 1e-5, 2e-4))) as scope:
                    frames = await pull.recv_multipart()
                if scope.cancelled_caught:
                    cancelled += 1
                    continue
                assert frames == [expected.to_bytes(4, "little")]
                expected += 1
    assert cancelled > 0


async def test_cancelled_send_sends_nothing(
    raw_socket: RawSocketFactory, ipc: IpcNamespace
) -> None:
    push, pull = _push_pull(raw_socket, ipc)
    with trio.fail_after(IO_DEADLINE_S):
        with trio.CancelScope() as scope:
            scope.cancel()
            await push.send_multipart([b"lost"])
        await push.send_multipart([b"marker"])
        assert await pull.recv_multipart() == [b"marker"]


async def test_send_is_a_checkpoint(raw_socket: RawSocketFactory, ipc: IpcNamespace) -> None:
    push, pull = _push_pull(raw_socket, ipc)
    with trio.fail_after(IO_DEADLINE_S):
        with trio.testing.assert_checkpoints():
            await push.send_multipart([b"a", b"b"])
        assert await pull.recv_multipart() == [b"a", b"b"]


async def test_ready_recv_is_a_checkpoint(raw_socket: RawSocketFactory, ipc: IpcNamespace) -> None:
    push, pull = _push_pull(raw_socket, ipc)
    with trio.fail_after(IO_DEADLINE_S):
        await push.send_multipart([b"1"])
        await push.send_multipart([b"2"])
        assert await pull.recv_multipart() == [b"1"]
        # b"2" arrived in the same batch or is about to; either way recv is a checkpoint.
        with trio.testing.assert_checkpoints():
            assert await pull.recv_multipart() == [b"2"]


async def test_two_waiters_on_one_socket_are_refused(
    raw_socket: RawSocketFactory, ipc: IpcNamespace
) -> None:
    _push, pull = _push_pull(raw_socket, ipc)
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull.recv_multipart)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await pull.recv_multipart()
            nursery.cancel_scope.cancel()


async def test_close_wakes_a_blocked_task(raw_socket: RawSocketFactory, ipc: IpcNamespace) -> None:
    """A task blocked in recv gets trio.ClosedResourceError when another task closes the socket;
    afterwards every operation raises it and close() is idempotent."""
    push, pull = _push_pull(raw_socket, ipc)
    outcome: list[BaseException] = []

    async def reader() -> None:
        try:
            await pull.recv_multipart()
        except trio.ClosedResourceError as exc:
            outcome.append(exc)

    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            pull.close()
    assert len(outcome) == 1
    assert pull.closed
    pull.close()
    with pytest.raises(trio.ClosedResourceError):
        await pull.recv_multipart()
    push.close()
    with pytest.raises(trio.ClosedResourceError):
        await push.send_multipart([b"x"])
    with pytest.raises(trio.ClosedResourceError):
        push.send_multipart_nowait([b"x"])


async def test_router_mandatory_unknown_identity_raises_raw(
    raw_socket: RawSocketFactory, ipc: IpcNamespace
) -> None:
    """The adapter stays raw: EHOSTUNREACH surfaces as zmq.ZMQError (the connector maps it)."""
    router = raw_socket(zmq.ROUTER, bind=ipc.worker_url("r.sock"), ROUTER_MANDATORY=1)
    with trio.fail_after(IO_DEADLINE_S):
        with pytest.raises(zmq.ZMQError) as info:
            await router.send_multipart([b"\x05\x00", b"\x00", b"payload"])
        assert info.value.errno == errno.EHOSTUNREACH
        with pytest.raises(zmq.ZMQError) as info:
            router.send_multipart_nowait([b"\x05\x00", b"\x00", b"payload"])
        assert info.value.errno == errno.EHOSTUNREACH


async def test_router_mandatory_send_to_full_peer_waits_without_spinning(
    raw_socket: RawSocketFactory, ipc: IpcNamespace
) -> None:
    """With ROUTER_MANDATORY, EVENTS reports POLLOUT while ANY peer pipe has room, so a send to a
    full peer fails with Again even though POLLOUT is set. The adapter must then sleep on the fd
    (a checkpoint), not spin, and complete once that peer drains."""
    url = ipc.worker_url("r.sock")
    router = raw_socket(zmq.ROUTER, bind=url, ROUTER_MANDATORY=1, SNDHWM=1)
    slow = raw_socket(zmq.DEALER, connect=url, identity=b"\x00\x00", RCVHWM=1)
    fast = raw_socket(zmq.DEALER, connect=url, identity=b"\x01\x00", RCVHWM=1)
    big = b"z" * 65536
    with trio.fail_after(IO_DEADLINE_S):
        for dealer in (slow, fast):  # register both identities with the ROUTER
            await dealer.send_multipart([b"hi"])
            await router.recv_multipart()
        # Fill the slow peer's path (ROUTER pipe, kernel buffers, DEALER pipe) until a send has
        # been stuck for a while. A spinning adapter would never reach the checkpoint that lets
        # move_on_after fire, and this loop would hang instead of failing.
        queued = 0
        while True:
            with trio.move_on_after(0.05) as scope:
                await router.send_multipart([b"\x00\x00", big])
            if scope.cancelled_caught:
                break
            queued += 1
        # The scenario: the slow peer refuses, yet EVENTS says POLLOUT (the fast peer has room).
        assert not router.send_multipart_nowait([b"\x00\x00", b"last"])
        assert cast(int, router._sock.getsockopt(zmq.EVENTS)) & zmq.POLLOUT

        async with trio.open_nursery() as nursery:
            nursery.start_soon(router.send_multipart, [b"\x00\x00", b"last"])
            for _ in range(queued):
                assert await slow.recv_multipart() == [big]
            assert await slow.recv_multipart() == [b"last"]
        await router.send_multipart([b"\x01\x00", b"fast"])
        assert await fast.recv_multipart() == [b"fast"]


async def test_drain_without_again(raw_socket: RawSocketFactory, ipc: IpcNamespace) -> None:
    """``recv_multipart_nowait`` returns ``None`` on an empty socket (no ``zmq.Again``, no
    checkpoint), ``wait_readable`` sleeps until a message is there and is always a
    checkpoint, and a burst is drained in order without sleeping in between."""
    push, pull = _push_pull(raw_socket, ipc)
    with trio.fail_after(IO_DEADLINE_S):
        with trio.testing.assert_no_checkpoints():
            assert pull.recv_multipart_nowait() is None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull.wait_readable)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(5):
                await push.send_multipart([b"m", bytes([i])])
        got = []
        while len(got) < 5:
            frames = pull.recv_multipart_nowait()
            if frames is None:
                await pull.wait_readable()
                continue
            got.append(frames[1][0])
        assert got == [0, 1, 2, 3, 4]
        await push.send_multipart([b"ready"])
        await pull.wait_readable()
        with trio.testing.assert_checkpoints():
            await pull.wait_readable()  # a message is waiting: still a checkpoint
        assert pull.recv_multipart_nowait() == [b"ready"]
    pull.close()
    with pytest.raises(trio.ClosedResourceError):
        pull.recv_multipart_nowait()
    with pytest.raises(trio.ClosedResourceError):
        await pull.wait_readable()
