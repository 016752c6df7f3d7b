"""Raw engine-side ZMQ sockets for the transport tests, wrapped and closed with an exit stack."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import zmq

from smg_trio.transport.zsocket import ZmqSocket, zmq_context

__all__ = ["RawSocketFactory", "raw_socket"]

#: ``make(zmq.DEALER, connect=addr, identity=b"\\x00\\x00", **sockopts)`` (the ``raw_socket``
#: fixture).
RawSocketFactory = Callable[..., ZmqSocket]


def raw_socket(
    stack: contextlib.ExitStack,
    socket_type: int,
    *,
    connect: str | None = None,
    bind: str | None = None,
    identity: bytes | None = None,
    **options: int,
) -> ZmqSocket:
    """A wrapped socket of ``socket_type`` that ``stack`` closes; ``options`` are ``zmq``
    socket option names (``LINGER=0``)."""
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
