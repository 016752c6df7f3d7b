"""Who is at the other end of a tcp connection on this host: its socket's uid in /proc/net/tcp."""

from __future__ import annotations

import ipaddress
import logging
import sys
from collections.abc import Iterable
from typing import Final, TypeAlias

import attrs

__all__ = [
    "TCP_TABLES",
    "Address",
    "IpAddress",
    "TcpEntry",
    "normalize_ip",
    "parse_tcp_table",
    "read_tcp_tables",
]

logger = logging.getLogger(__name__)

#: The kernel's tables of this network namespace's tcp sockets (IPv4, IPv6). Fixed paths:
#: nothing else is read.
TCP_TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")

IpAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
#: An (ip, port) pair; an IPv4-mapped IPv6 address is its IPv4 address.
Address: TypeAlias = tuple[IpAddress, int]

#: tcp states (include/net/tcp_states.h) of a connection still open at this end.
ESTABLISHED: Final = 0x01
CLOSE_WAIT: Final = 0x08


def normalize_ip(ip: str | IpAddress) -> IpAddress:
    """``ip`` as an address object, an IPv4-mapped IPv6 one (``::ffff:a.b.c.d``, as a
    dual-stack socket names an IPv4 peer) as its IPv4 address. Raises ``ValueError``."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0] if isinstance(ip, str) else ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


@attrs.frozen
class TcpEntry:
    """One row of a tcp table: a socket of this host (any process's)."""

    local: Address
    remote: Address
    state: int
    uid: int
    #: 0 for a socket no process holds any more (closed, lingering): its uid means nothing.
    inode: int

    @property
    def open(self) -> bool:
        """Held by a process and not closed at this end (``ESTABLISHED`` or ``CLOSE_WAIT``)."""
        return self.inode != 0 and self.state in (ESTABLISHED, CLOSE_WAIT)


def _address(text: str) -> Address:
    """``0100007F:1F90`` (IPv4: one 32-bit word in host order) or 32 hex digits (IPv6: four
    such words), then the port in hex."""
    hexip, _, hexport = text.partition(":")
    raw = bytes.fromhex(hexip)
    # the kernel prints each 32-bit word as a native integer
    ordered = (
        b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        if sys.byteorder == "little"
        else raw
    )
    ip: IpAddress = (
        ipaddress.IPv4Address(ordered) if len(ordered) == 4 else ipaddress.IPv6Address(ordered)
    )
    return normalize_ip(ip), int(hexport, 16)


def parse_tcp_table(lines: Iterable[str], port: int | None = None) -> list[TcpEntry]:
    """The rows of one ``/proc/net/tcp``-format text (its header line skipped); a row that
    does not parse is skipped. With ``port``, only the rows whose local or remote port it is
    (the others are skipped before they are parsed: the table lists every tcp socket of the
    host, which any local user can multiply)."""
    entries = []
    suffix = f":{port:04X}" if port is not None else None
    for line in lines:
        if suffix is not None and suffix not in line:
            continue
        fields = line.split()
        if len(fields) < 10 or not fields[0].endswith(":"):
            continue
        if suffix is not None and not (
            fields[1].upper().endswith(suffix) or fields[2].upper().endswith(suffix)
        ):
            continue
        try:
            entries.append(
                TcpEntry(
                    local=_address(fields[1]),
                    remote=_address(fields[2]),
                    state=int(fields[3], 16),
                    uid=int(fields[7]),
                    inode=int(fields[9]),
                )
            )
        except ValueError:
            continue
    return entries


def read_tcp_tables(port: int | None = None) -> list[TcpEntry] | None:
    """Every tcp socket of this network namespace (with ``port``, those whose local or remote
    port it is), or ``None`` when no table can be read (not Linux, or /proc not mounted):
    then no peer on this host can be verified. Blocking: time in proportion to the host's tcp
    sockets."""
    entries: list[TcpEntry] = []
    read_any = False
    for path in TCP_TABLES:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                entries += parse_tcp_table(f, port)
        except OSError:
            continue
        read_any = True
    if not read_any:
        logger.warning("cannot read %s: engine peers on this host cannot be verified", TCP_TABLES)
        return None
    return entries
