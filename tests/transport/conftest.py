"""Fixtures for the transport tests: a private ipc namespace and raw engine-side sockets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import pytest

from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import RawSocketFactory
from tests.helpers.sockets import raw_socket as make_raw_socket


@pytest.fixture
def ipc() -> Iterator[IpcNamespace]:
    with IpcNamespace() as ns:
        yield ns


@pytest.fixture
def raw_socket() -> Iterator[RawSocketFactory]:
    """A factory for wrapped sockets closed at teardown:
    ``raw_socket(zmq.DEALER, connect=addr, identity=b"\\x00\\x00", **sockopts)``."""
    with contextlib.ExitStack() as stack:
        yield partial(make_raw_socket, stack)
