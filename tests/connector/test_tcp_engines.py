"""Remote engines over tcp: a ``tcp://HOST:PORT`` worker binds tcp input and output sockets,
INIT gives engines (``local: false``) tcp addresses with the advertised host, peers outside
the allow-list are refused at the handshake, and ZMTP heartbeats see a frozen peer."""

from __future__ import annotations

import logging
import signal
import sys

import pytest
import trio

from smg_trio.connector import open_engine_client
from smg_trio.connector import state as state_mod
from smg_trio.errors import EngineDeadError, HandshakeTimeout, WorkerAddressError
from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses
from smg_trio.transport.tcp import TcpOptions, advertised
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import make_protocol, request
from tests.helpers.ports import free_port

#: Starting a Python process that imports numpy/zmq/msgspec can take seconds on a busy machine.
SUBPROCESS_DEADLINE_S = 60.0


@pytest.fixture
def tcp_worker() -> WorkerAddresses:
    return worker_addresses(f"tcp://127.0.0.1:{free_port()}")


def test_tcp_worker_addresses() -> None:
    addrs = worker_addresses("tcp://10.0.0.5:7001")
    assert addrs.is_tcp
    assert addrs.handshake == "tcp://10.0.0.5:7001"
    assert addrs.input == addrs.output == "tcp://10.0.0.5:*"
    with pytest.raises(WorkerAddressError, match="tcp://HOST:PORT"):
        worker_addresses("tcp://10.0.0.5:*")
    with pytest.raises(WorkerAddressError, match="handshake address is its URL"):
        worker_addresses("tcp://10.0.0.5:7001", "tcp://127.0.0.1:7002")
    assert advertised("tcp://0.0.0.0:4100", "gw.example") == "tcp://gw.example:4100"
    assert advertised("tcp://0.0.0.0:4100", "fd00::1") == "tcp://[fd00::1]:4100"
    assert advertised("ipc:///x", "gw.example") == "ipc:///x"


def test_peer_allow_list() -> None:
    opts = TcpOptions(allowed_hosts=("10.0.0.7", "[FD00::2]"))
    assert opts.peer_allowed("127.0.0.1")
    assert opts.peer_allowed("::1")
    assert opts.peer_allowed("10.0.0.7")
    assert opts.peer_allowed("::ffff:10.0.0.7")
    assert opts.peer_allowed("fd00::2")
    assert not opts.peer_allowed("10.0.0.8")
    assert not TcpOptions(allow_loopback=False).peer_allowed("127.0.0.1")


@pytest.mark.parametrize("advertise", [None, "localhost"])
async def test_mock_engine_over_tcp(tcp_worker: WorkerAddresses, advertise: str | None) -> None:
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig(step_s=0.001))
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.run)
            async with open_engine_client(
                make_protocol("vllm"),
                tcp_worker,
                ready_timeout_s=IO_DEADLINE_S,
                tcp=TcpOptions(advertise_host=advertise),
            ) as client:
                assert engine._sockets is not None
                inputs = engine._sockets.init.addresses.inputs
                outputs = engine._sockets.init.addresses.outputs
                host = advertise or "127.0.0.1"
                assert inputs[0].startswith(f"tcp://{host}:")
                assert outputs[0].startswith(f"tcp://{host}:")
                async with client.generate(request("tcp-1", max_tokens=3)) as stream:
                    outs = [o async for o in stream]
                assert outs[-1].finish_reason == "length"
                assert sum(len(o.new_token_ids) for o in outs) == 3
            nursery.cancel_scope.cancel()


async def test_a_peer_outside_the_allow_list_is_refused(
    tcp_worker: WorkerAddresses, caplog: pytest.LogCaptureFixture
) -> None:
    # The engine connects from 127.0.0.1, which this worker does not allow: its HELLO is
    # dropped with a log line, so it never gets INIT and never becomes an engine.
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig())
    opts = TcpOptions(allow_loopback=False, allowed_hosts=("192.0.2.7",))
    caplog.set_level(logging.WARNING, logger="smg_trio.transport.handshake")
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.run)
            with pytest.raises(HandshakeTimeout, match="0 of 1 engine"):
                async with open_engine_client(
                    make_protocol("vllm"), tcp_worker, ready_timeout_s=0.5, tcp=opts
                ):
                    pytest.fail("a refused peer completed the handshake")
            assert engine._sockets is None  # no INIT reached it
            nursery.cancel_scope.cancel()
    assert "at 127.0.0.1: refused" in caplog.text
    assert "--allowed-engine-hosts" in caplog.text


@pytest.mark.slow
async def test_heartbeats_see_a_frozen_engine(
    tcp_worker: WorkerAddresses, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stopped process keeps its tcp connections open (no FIN, as with a host that vanished),
    # and it answers no ZMTP PING: the heartbeat timeout closes its input connection, the
    # socket monitor reports it, and after the grace its request fails.
    monkeypatch.setattr(state_mod, "ENGINE_DISCONNECT_GRACE_S", 0.05)
    argv = [sys.executable, "-m", "smg_trio.mock.engine", "--handshake", tcp_worker.handshake]
    argv += ["--step-ms", "5", "--log-level", "error"]
    proc = await trio.lowlevel.open_process(argv)
    opts = TcpOptions(heartbeat_ivl_s=0.1, heartbeat_timeout_s=0.3)
    try:
        with trio.fail_after(SUBPROCESS_DEADLINE_S):
            async with open_engine_client(
                make_protocol("vllm"),
                tcp_worker,
                ready_timeout_s=SUBPROCESS_DEADLINE_S,
                silence_timeout_s=300.0,  # the watchdog must not be what ends it
                tcp=opts,
            ) as client:
                async with client.generate(request("frozen", max_tokens=1_000_000)) as stream:
                    await stream.__anext__()
                    proc.send_signal(signal.SIGSTOP)
                    with pytest.raises(EngineDeadError, match="disconnected from the input"):
                        async for _ in stream:
                            pass
                assert not client.alive
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("which", ["input", "output"])
async def test_a_strangers_data_plane_connection_is_shut_down(
    tcp_worker: WorkerAddresses, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    # Allowed: 127.0.0.1 only. A peer at 127.0.0.2 that reaches the input or output port after
    # the handshake has its connection ended (shutdown) by the socket monitor's reader.
    engine = MockEngine(tcp_worker.handshake, MockEngineConfig(step_s=0.001))
    opts = TcpOptions(allow_loopback=False, allowed_hosts=("127.0.0.1",))
    caplog.set_level(logging.WARNING, logger="smg_trio.connector.client")
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.run)
            async with open_engine_client(
                make_protocol("vllm"), tcp_worker, ready_timeout_s=IO_DEADLINE_S, tcp=opts
            ) as client:
                bound = getattr(client._sockets, f"{which}_address")
                port = int(bound.rpartition(":")[2])
                with trio.socket.socket() as stranger:
                    await stranger.bind(("127.0.0.2", 0))
                    await stranger.connect(("127.0.0.1", port))
                    while await stranger.recv(4096):  # libzmq's greeting, then EOF
                        pass
                async with client.generate(request("still-fine", max_tokens=2)) as stream:
                    assert [o async for o in stream][-1].finish_reason == "length"
            nursery.cancel_scope.cancel()
    assert f"refused a connection to the {which} socket from 127.0.0.2" in caplog.text
