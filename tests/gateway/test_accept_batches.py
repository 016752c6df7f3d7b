"""The plain listeners' accept loop takes every waiting connection per wake-up: a burst of
connects is not accepted one per scheduler pass (the last of 256 waited seconds under load);
transient accept errors are skipped and resource exhaustion is retried, as trio does."""

from __future__ import annotations

import errno
import socket
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from smg_trio.gateway.server.accept import serve_batched

DEADLINE_S = 10.0
BURST = 24


def _listening() -> socket.socket:
    sock = socket.create_server(("127.0.0.1", 0), backlog=BURST * 2)
    sock.setblocking(False)
    return sock


def _connect_all(sock: socket.socket, n: int) -> list[socket.socket]:
    """``n`` clients whose connections wait in the accept queue."""
    return [socket.create_connection(sock.getsockname()) for _ in range(n)]


async def test_a_burst_of_connections_is_taken_in_one_pass() -> None:
    sock = _listening()
    clients = _connect_all(sock, BURST)
    ticks = 0
    started: list[int] = []
    all_in = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        started.append(ticks)
        if len(started) == BURST:
            all_in.set()
        await trio.sleep_forever()

    async def ticker() -> None:  # one tick per pass of the scheduler
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            nursery.start_soon(partial(serve_batched, handler, [sock], handler_nursery=nursery))
            await all_in.wait()
            nursery.cancel_scope.cancel()
    # trio.serve_listeners takes one per pass: BURST passes apart
    assert max(started) - min(started) <= 1, started
    for c in clients:
        c.close()


class _Scripted:
    """A listening socket whose ``accept`` first raises the given errors."""

    def __init__(self, real: socket.socket, errors: list[int]) -> None:
        self.real = real
        self.errors = errors

    def fileno(self) -> int:
        return self.real.fileno()

    def setblocking(self, flag: bool) -> None:
        self.real.setblocking(flag)

    def accept(self) -> tuple[socket.socket, Any]:
        if self.errors:
            code = self.errors.pop(0)
            raise OSError(code, "scripted")
        return self.real.accept()

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("code", [errno.ECONNABORTED, errno.EMFILE])
async def test_accept_errors_are_skipped_or_retried(
    code: int, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    real = _listening()
    clients = _connect_all(real, 1)
    served = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        served.set()

    sock = _Scripted(real, [code])
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(serve_batched, handler, [sock], handler_nursery=nursery))
            await served.wait()
            nursery.cancel_scope.cancel()
    assert ("EMFILE" in caplog.text) == (code == errno.EMFILE)
    clients[0].close()


async def test_another_accept_error_is_raised() -> None:
    real = _listening()
    clients = _connect_all(real, 1)

    async def handler(stream: trio.SocketStream) -> None:
        raise AssertionError("not reached")

    with trio.fail_after(DEADLINE_S), pytest.RaisesGroup(OSError, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            sock = _Scripted(real, [errno.EBADF])
            nursery.start_soon(partial(serve_batched, handler, [sock], handler_nursery=nursery))
    clients[0].close()
