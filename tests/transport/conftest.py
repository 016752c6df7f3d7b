"""Fixtures for the transport tests: a private ipc namespace and raw engine-side sockets."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import zmq

from smg_trio.transport.zsocket import ZmqSocket, zmq_context
from tests.helpers.ipc import IpcNamespace

#: Every I/O test runs under this absolute deadline (seconds).
IO_DEADLINE_S = 10.0

RawSocketFactory = Callable[..., ZmqSocket]


@pytest.fixture
def ipc() -> Iterator[IpcNamespace]:
    with IpcNamespace() as ns:
        yield ns


@pytest.fixture
def raw_socket() -> Iterator[RawSocketFactory]:
    """A factory for wrapped sockets closed at teardown:
    ``raw_socket(zmq.DEALER, connect=addr, identity=b"\\x00\\x00", **sockopts)``."""
    with contextlib.ExitStack() as stack:

        def make(
            socket_type: int,
            *,
            connect: str | None = None,
            bind: str | None = None,
            identity: bytes | None = None,
            **options: int,
        ) -> ZmqSocket:
            sock = zmq_context().socket(socket_type)
            wrapped = ZmqSocket(sock)
            stack.callback(wrapped.close)
            if identity is not None:
                sock.setsockopt(zmq.IDENTITY, identity)
            for name, value in options.items():
                sock.setsockopt(getattr(zmq, name), value)
            if bind is not None:
                sock.bind(bind)
            if connect is not None:
                sock.connect(connect)
            return wrapped

        yield make
