"""Worker URL -> socket addresses, and the FNV-1a handshake port (wire-spec section 2)."""

from __future__ import annotations

import pytest

from conformance.vectors import DERIVED_PORTS, PINNED_PORTS
from smg_trio.errors import WorkerAddressError
from smg_trio.protocol.addresses import (
    HANDSHAKE_PORT_BASE,
    HANDSHAKE_PORT_SPAN,
    derive_handshake_port,
    ipc_path,
    worker_addresses,
)

# Pinned by smg's Rust and Python tests (wire-spec section 2.2), and derived in the spec from
# the same algorithm (not pinned upstream): one copy each, shared with the conformance runner.
PINNED = list(PINNED_PORTS)
DERIVED = list(DERIVED_PORTS)


def reference_fnv1a_64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) % 2**64
    return h


@pytest.mark.parametrize(("path", "port"), PINNED)
def test_pinned_ports(path: str, port: int) -> None:
    assert derive_handshake_port(path) == port


@pytest.mark.parametrize(("path", "port"), DERIVED)
def test_derived_ports(path: str, port: int) -> None:
    assert derive_handshake_port(path) == port


def test_empty_path_hashes_to_the_offset_basis() -> None:
    assert derive_handshake_port("") == 20000 + 0xCBF29CE484222325 % 10000


def test_full_hash_of_the_ts0_path_matches_the_spec() -> None:
    assert reference_fnv1a_64(b"/tmp/smg-zmq/ts0.ipc") == 0xE4031584FC679770
    assert derive_handshake_port("/tmp/smg-zmq/ts0.ipc") == 20000 + 0xE4031584FC679770 % 10000


def test_band_constants() -> None:
    assert (HANDSHAKE_PORT_BASE, HANDSHAKE_PORT_SPAN) == (20000, 10000)


def range_paths() -> list[str]:
    paths = ["", "a", "/x/y/z.ipc", "very/long/path/with/segments.sock", "é/ünïcode/路径"]
    for uid in (0, 1000, 65534):
        paths += [f"ipc:///tmp/smg-zmq-{uid}/engine-{p}" for p in range(30000, 30050)]
    paths += [f"/run/user/{i}/w{i * 7}.sock" for i in range(200)]
    return paths


def test_every_port_lies_in_the_band_and_matches_the_reference_hash() -> None:
    for path in range_paths():
        port = derive_handshake_port(path)
        assert 20000 <= port <= 29999, path
        stripped = path.removeprefix("ipc://")
        assert port == 20000 + reference_fnv1a_64(stripped.encode()) % 10000, path


def test_ipc_prefix_is_stripped_only_once() -> None:
    assert derive_handshake_port("ipc://ts0.ipc") == derive_handshake_port("ts0.ipc")
    # Only the leading prefix goes: the rest, "ipc://x", is hashed verbatim.
    assert derive_handshake_port("ipc://ipc://x") == 20000 + reference_fnv1a_64(b"ipc://x") % 10000
    assert derive_handshake_port("ipc://ipc://x") != derive_handshake_port("x")


def test_worker_addresses_derive_handshake_by_default() -> None:
    a = worker_addresses("ipc:///tmp/smg-zmq/ts0.ipc")
    assert a.handshake == "tcp://127.0.0.1:25152"
    assert a.input == "ipc:///tmp/smg-zmq/ts0.ipc-in.sock"
    assert a.output == "ipc:///tmp/smg-zmq/ts0.ipc-out.sock"
    assert a.url == "ipc:///tmp/smg-zmq/ts0.ipc"
    assert a.path == "/tmp/smg-zmq/ts0.ipc"


def test_worker_addresses_honour_a_tcp_override() -> None:
    a = worker_addresses("ipc:///tmp/smg-zmq/ts0.ipc", "tcp://127.0.0.1:30500")
    assert a.handshake == "tcp://127.0.0.1:30500"
    assert a.input == "ipc:///tmp/smg-zmq/ts0.ipc-in.sock"
    assert a.output == "ipc:///tmp/smg-zmq/ts0.ipc-out.sock"


@pytest.mark.parametrize("override", ["ipc:///tmp/hs.sock", "127.0.0.1:30500", "", "TCP://x:1"])
def test_worker_addresses_reject_a_non_tcp_override(override: str) -> None:
    with pytest.raises(WorkerAddressError, match="tcp://"):
        worker_addresses("ipc:///tmp/smg-zmq/ts0.ipc", override)


@pytest.mark.parametrize("url", ["http://localhost:8000", "/tmp/x.ipc", "ipc://", "IPC:///x"])
def test_non_ipc_worker_urls_are_rejected(url: str) -> None:
    with pytest.raises(WorkerAddressError, match="ipc://"):
        worker_addresses(url)
    with pytest.raises(ValueError, match="ipc://"):  # WorkerAddressError is a ValueError
        ipc_path(url)


@pytest.mark.parametrize("url", ["tcp://127.0.0.1", "tcp://127.0.0.1:*", "tcp://:5555"])
def test_tcp_worker_urls_need_host_and_port(url: str) -> None:
    with pytest.raises(WorkerAddressError, match="tcp://HOST:PORT"):
        worker_addresses(url)


def test_a_tcp_worker_url_is_not_an_ipc_path() -> None:
    with pytest.raises(WorkerAddressError, match="ipc://"):
        ipc_path("tcp://127.0.0.1:5555")
