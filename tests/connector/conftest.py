"""Fixtures for the connector tests: a private ipc namespace and a worker's addresses in it
(the engines and clients are in :mod:`tests.helpers.engines`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from smg_trio.protocol.addresses import WorkerAddresses
from tests.helpers.ipc import IpcNamespace, free_handshake_address


@pytest.fixture
def ipc() -> Iterator[IpcNamespace]:
    with IpcNamespace() as ns:
        yield ns


@pytest.fixture
def addresses(ipc: IpcNamespace) -> WorkerAddresses:
    return ipc.addresses("w0", handshake=free_handshake_address())
