"""The tcp engine peer guard's parts: /proc/net/tcp rows, the verdict on a peer (host, and
on this host the uid owning its socket), and the ZAP answer when an allowed and a refused
connection from one IP wait at once (issue 28, item 2; the attack itself is in
tests/connector/test_tcp_engine_claims.py)."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest
import trio

from smg_trio.transport import peer_guard
from smg_trio.transport.peer_guard import PeerGuard, judge, judge_connection
from smg_trio.transport.peercred import TcpEntry, normalize_ip, parse_tcp_table, read_tcp_tables
from smg_trio.transport.tcp import TcpOptions

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid ..."
LO = ipaddress.IPv4Address("127.0.0.1")
OURS = (LO, 40000)


def _row(local: str, remote: str, state: str = "01", uid: int = 0, inode: int = 7) -> str:
    return (
        f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid} 0 {inode} 1"
    )


def test_parses_ipv4_ipv6_and_mapped_rows() -> None:
    rows = parse_tcp_table(
        [
            HEADER,
            _row("0100007F:89C6", "0100007F:2755", uid=65534, inode=12345),
            _row("00000000000000000000000001000000:1F90", "00000000000000000000000001000000:0050"),
            _row("0000000000000000FFFF00000100007F:1F90", "0000000000000000FFFF00000500000A:01BB"),
            "   1: garbage",
        ]
    )
    assert rows[0] == TcpEntry((LO, 0x89C6), (LO, 0x2755), 1, 65534, 12345)
    assert rows[1].local == (ipaddress.IPv6Address("::1"), 8080)
    assert rows[2].local == (LO, 8080)  # an IPv4-mapped address is its IPv4 address
    assert rows[2].remote == (ipaddress.IPv4Address("10.0.0.5"), 443)
    assert len(rows) == 3
    assert normalize_ip("::ffff:10.0.0.5") == ipaddress.IPv4Address("10.0.0.5")


def test_finds_a_live_connections_owner() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                table = read_tcp_tables()
                assert table is not None
                mine = [
                    e
                    for e in table
                    if e.local == (LO, client.getsockname()[1]) and e.remote == (LO, port)
                ]
                assert [(e.uid, e.inode) for e in mine] == [
                    (os.geteuid(), os.fstat(client.fileno()).st_ino)
                ]
                verdict = judge_connection(accepted.fileno(), port, TcpOptions())
                assert verdict is not None
                assert verdict.allowed, verdict
                assert f"(uid {os.geteuid()})" in verdict.peer
                # another port's connection (a reused descriptor) is not judged
                assert judge_connection(accepted.fileno(), port + 1, TcpOptions()) is None


def _peer(port: int, uid: int, inode: int = 9) -> TcpEntry:
    """The peer's own socket, as the table lists it: local = the peer, remote = us."""
    return TcpEntry((LO, port), OURS, 1, uid, inode)


def test_judges_host_then_uid() -> None:
    opts = TcpOptions(allowed_hosts=("10.0.0.7",), allowed_uids=(1000,))
    table = [_peer(50001, 1000), _peer(50002, 65534), _peer(50003, 1000, inode=0)]
    assert judge(OURS, (LO, 50001), table, opts).allowed
    refused = judge(OURS, (LO, 50002), table, opts)
    assert not refused.allowed
    assert refused.peer == "127.0.0.1:50002 (uid 65534)"
    assert "allowed uid" in refused.why
    assert not judge(OURS, (LO, 50003), table, opts).allowed  # a closed socket's uid is 0
    assert not judge(OURS, (LO, 50004), table, opts).allowed  # loopback, owner unknown
    remote = ipaddress.IPv4Address("10.0.0.7")
    assert judge(OURS, (remote, 50005), table, opts).allowed  # another host: by address
    other = judge(OURS, (ipaddress.IPv4Address("10.0.0.8"), 1), table, opts)
    assert not other.allowed
    assert "--allowed-engine-hosts" in other.why
    assert TcpOptions().uid_allowed(os.geteuid())
    assert TcpOptions().uid_allowed(0)


def _ours(peer_port: int, state: int = 1, *, closed: bool = False) -> TcpEntry:
    """Our accepted socket of a connection from 127.0.0.1:peer_port (inode 0: libzmq has
    closed it)."""
    return TcpEntry(OURS, (LO, peer_port), state, os.geteuid(), 0 if closed else 100 + peer_port)


def _request(domain: bytes = b"input") -> list[bytes]:
    return [b"session", b"", b"1.0", b"7", domain, b"127.0.0.1", b"", b"NULL"]


async def test_zap_answers_when_every_connection_from_the_ip_agrees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guard = PeerGuard(None, TcpOptions())  # type: ignore[arg-type]  # no socket is made
    guard.bound("input", "tcp://127.0.0.1:40000")
    allowed = [_ours(50001), _peer(50001, os.geteuid())]
    refused = [_ours(50002), _peer(50002, 65534)]
    monkeypatch.setattr(peer_guard, "read_tcp_tables", lambda port=None: allowed)
    assert await guard._answer(_request()) == [
        b"session",
        b"",
        b"1.0",
        b"7",
        b"200",
        b"OK",
        b"",
        b"",
    ]
    monkeypatch.setattr(peer_guard, "read_tcp_tables", lambda port=None: refused)
    reply = await guard._answer(_request())
    assert reply is not None
    assert reply[4] == b"400"
    assert await guard._answer(_request(b"elsewhere")) is None  # not a socket it guards
    monkeypatch.setattr(peer_guard, "read_tcp_tables", lambda port=None: allowed[1:])
    assert await guard._answer(_request()) is None  # no connection of ours: not admitted


async def test_zap_waits_for_a_refused_connection_to_close_before_admitting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An allowed and a refused connection from 127.0.0.1 both wait: the request could be
    # either's. The refused one is shut down, and only once libzmq has closed it (its inode
    # gone from the table) is the request admitted: an admission can no longer reach it.
    guard = PeerGuard(None, TcpOptions())  # type: ignore[arg-type]
    guard.bound("input", "tcp://127.0.0.1:40000")
    allowed = [_ours(50001), _peer(50001, os.geteuid())]
    tables = [
        [*allowed, _ours(50002), _peer(50002, 65534)],  # both open
        [*allowed, _ours(50002, state=4), _peer(50002, 65534)],  # shut down (FIN_WAIT1)
        [*allowed, _ours(50002, state=4, closed=True), _peer(50002, 65534)],  # closed
    ]
    reads: list[int] = []
    shut: list[int] = []

    def table(port: int | None = None) -> list[TcpEntry]:
        reads.append(1)
        return tables[min(len(reads), len(tables)) - 1]

    monkeypatch.setattr(peer_guard, "read_tcp_tables", table)
    monkeypatch.setattr(peer_guard, "_shut_down_inode", shut.append)
    with trio.fail_after(5):
        reply = await guard._answer(_request())
    assert reply is not None
    assert reply[4] == b"200"
    assert shut == [100 + 50002]  # once, while it was open
    assert len(reads) == 3


def test_a_table_read_for_a_port_keeps_only_its_rows() -> None:
    """The guard asks for the rows of its socket's port only (as the local or the remote
    port): a local user who fills the table with thousands of other connections no longer
    makes each ZAP request parse all of them (about 200 ms for 8000 rows here)."""
    lines = [
        HEADER,
        _row("0100007F:9C40", "0100007F:C351"),  # ours: local port 40000
        _row("0100007F:C351", "0100007F:9C40"),  # the peer's end: remote port 40000
        _row("0100007F:1F90", "0100007F:C352"),  # another socket
        _row("0100007F:C352", "0100007F:1F90"),
    ]
    rows = parse_tcp_table(lines, port=40000)
    assert [(r.local[1], r.remote[1]) for r in rows] == [(40000, 50001), (50001, 40000)]
    assert len(parse_tcp_table(lines)) == 4


async def test_zap_reads_the_table_for_its_port_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading and parsing ``/proc/net/tcp`` takes time in proportion to every tcp socket of
    the host, which any local user can inflate: the ZAP handler does it in a worker thread,
    for its port's rows only, so a flood of connection attempts does not stall the event
    loop that serves every request."""
    guard = PeerGuard(None, TcpOptions())  # type: ignore[arg-type]
    guard.bound("input", "tcp://127.0.0.1:40000")
    allowed = [_ours(50001), _peer(50001, os.geteuid())]
    calls: list[tuple[int | None, bool]] = []

    def table(port: int | None = None) -> list[TcpEntry]:
        calls.append((port, trio.lowlevel.in_trio_run()))
        return allowed

    monkeypatch.setattr(peer_guard, "read_tcp_tables", table)
    reply = await guard._answer(_request())
    assert reply is not None
    assert reply[4] == b"200"
    assert calls == [(40000, False)]
