"""Binding one worker's socket set: order, resolved addresses, socket files, options, errors."""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import zmq

from smg_trio.errors import EngineError, SocketDirError
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.transport.topology import bind_worker_sockets
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import RawSocketFactory

# Sync helpers: tiny local filesystem checks, kept out of the async tests (ASYNC230/240).


def _lexists(path: str) -> bool:
    return os.path.lexists(path)


def _isfile(path: str) -> bool:
    return os.path.isfile(path)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


async def test_binds_and_cleans_up(ipc: IpcNamespace) -> None:
    addrs = ipc.addresses("w0")
    in_path = addrs.input.removeprefix("ipc://")
    out_path = addrs.output.removeprefix("ipc://")
    async with bind_worker_sockets(addrs) as bound:
        assert bound.input_address == addrs.input
        assert bound.output_address == addrs.output
        host, _, port = bound.handshake_address.rpartition(":")
        assert host == "tcp://127.0.0.1"
        assert port.isdigit()
        assert int(port) > 0  # the wildcard came back resolved
        assert stat.S_ISSOCK(os.lstat(in_path).st_mode)
        assert stat.S_ISSOCK(os.lstat(out_path).st_mode)
        sockets = (bound.input, bound.output, bound.handshake)
    assert all(s.closed for s in sockets)
    assert not _lexists(in_path)
    assert not _lexists(out_path)


async def test_creates_the_socket_dir_0700(ipc: IpcNamespace) -> None:
    url = f"ipc://{ipc.directory}/run/w0"
    async with bind_worker_sockets(worker_addresses(url, "tcp://127.0.0.1:*")):
        assert stat.S_IMODE(os.lstat(f"{ipc.directory}/run").st_mode) == 0o700


async def test_socket_files_are_0600_and_their_dir_0700_under_umask_000(
    ipc: IpcNamespace,
) -> None:
    # libzmq creates an ipc socket 0777 & ~umask: world-connectable under umask 000.
    url = f"ipc://{ipc.directory}/run/w0"
    addrs = worker_addresses(url, "tcp://127.0.0.1:*")
    old = os.umask(0)
    try:
        async with bind_worker_sockets(addrs):
            for address in (addrs.input, addrs.output):
                path = address.removeprefix("ipc://")
                assert stat.S_ISSOCK(os.lstat(path).st_mode)
                assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
            assert stat.S_IMODE(os.lstat(f"{ipc.directory}/run").st_mode) == 0o700
    finally:
        os.umask(old)


async def test_replaces_stale_sockets(ipc: IpcNamespace) -> None:
    addrs = ipc.addresses("w0")
    for address in (addrs.input, addrs.output):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(address.removeprefix("ipc://"))
        s.close()
    async with bind_worker_sockets(addrs) as bound:
        assert bound.input_address == addrs.input


async def test_refuses_a_regular_file_at_a_socket_path(ipc: IpcNamespace) -> None:
    addrs = ipc.addresses("w0")
    out_path = addrs.output.removeprefix("ipc://")
    _write(out_path, "precious")
    with pytest.raises(SocketDirError, match="not a socket; refusing to unlink"):
        async with bind_worker_sockets(addrs):
            pass  # pragma: no cover
    assert _isfile(out_path)


async def test_rejects_an_overlong_ipc_path(ipc: IpcNamespace) -> None:
    addrs = ipc.addresses("w" * 120)
    with pytest.raises(SocketDirError, match="sun_path"):
        async with bind_worker_sockets(addrs):
            pass  # pragma: no cover


async def test_handshake_port_in_use_names_the_address(ipc: IpcNamespace) -> None:
    async with bind_worker_sockets(ipc.addresses("a")) as first:
        taken = first.handshake_address
        addrs = ipc.addresses("b", handshake=taken)
        with pytest.raises(EngineError, match=f"handshake ROUTER socket to {taken}"):
            async with bind_worker_sockets(addrs):
                pass  # pragma: no cover
        # Nothing of the failed set is left behind.
        assert not _lexists(addrs.input.removeprefix("ipc://"))


async def test_binds_again_at_once_after_a_close(ipc: IpcNamespace) -> None:
    """Each bind starts a socket monitor on an inproc endpoint. libzmq unregisters a stopped
    monitor's endpoint asynchronously, so a name reused at once (it was ``id()`` of the
    socket, which CPython hands out again) failed now and then with EADDRINUSE."""
    addrs = ipc.addresses("w0")
    for _ in range(300):
        async with bind_worker_sockets(addrs) as bound:
            assert bound.input_address == addrs.input


async def test_input_router_is_mandatory(ipc: IpcNamespace) -> None:
    """A send to an identity that never registered raises instead of vanishing silently."""
    async with bind_worker_sockets(ipc.addresses("w0")) as bound:
        with trio.fail_after(IO_DEADLINE_S), pytest.raises(zmq.ZMQError) as info:
            await bound.input.send_multipart([b"\x00\x00", b"\x00", b"req"])
        assert info.value.errno == errno.EHOSTUNREACH


async def test_input_router_hands_over_a_reconnected_identity(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    """ROUTER_HANDOVER: an engine restarted with the same identity replaces the old one."""
    async with bind_worker_sockets(ipc.addresses("w0")) as bound:
        with trio.fail_after(IO_DEADLINE_S):
            old = raw_socket(zmq.DEALER, connect=bound.input_address, identity=b"\x00\x00")
            await old.send_multipart([b"reg-old"])
            assert await bound.input.recv_multipart() == [b"\x00\x00", b"reg-old"]
            new = raw_socket(zmq.DEALER, connect=bound.input_address, identity=b"\x00\x00")
            await new.send_multipart([b"reg-new"])
            assert await bound.input.recv_multipart() == [b"\x00\x00", b"reg-new"]
            await bound.input.send_multipart([b"\x00\x00", b"\x00", b"req"])
            assert await new.recv_multipart() == [b"\x00", b"req"]


async def test_output_pull_receives_from_many_pushers(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    async with bind_worker_sockets(ipc.addresses("w0")) as bound:
        with trio.fail_after(IO_DEADLINE_S):
            pushers = [raw_socket(zmq.PUSH, connect=bound.output_address) for _ in range(3)]
            for i, p in enumerate(pushers):
                await p.send_multipart([b"out", bytes([i])])
            got = sorted([(await bound.output.recv_multipart())[1] for _ in pushers])
            assert got == [b"\x00", b"\x01", b"\x02"]


_UNREAD_MONITOR = """\
import sys, tempfile, time
import trio, zmq
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.transport.topology import bind_worker_sockets
from smg_trio.transport.zsocket import zmq_context

async def main() -> None:
    url = f"ipc://{tempfile.mkdtemp(prefix='smg-mon-')}/w"
    async with bind_worker_sockets(worker_addresses(url, "tcp://127.0.0.1:*")) as bound:
        for _ in range(1500):  # 3000 events, over libzmq's default high-water mark
            d = zmq_context().socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(bound.input_address)
            time.sleep(0.0005)
            d.close(0)
    print("closed")

trio.run(main)
"""


def test_an_unread_connection_monitor_never_blocks_the_sockets(tmp_path: Path) -> None:
    """Nobody reads the input ROUTER's monitor (before the engine client starts, after it
    ended): libzmq sends its events with a blocking send from the thread that calls into the
    ROUTER, so with a bounded pipe the socket set's teardown (or any call) blocked the whole
    event loop for good, as a CI run did. Run in a subprocess: a blocked C call cannot be
    cancelled from here."""
    proc = subprocess.run(
        [sys.executable, "-c", _UNREAD_MONITOR],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "closed"
