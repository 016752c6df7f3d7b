"""The asyncio half the lean client processes (``bench/lean_client.py``,
``bench/routing_client.py``) share, standard library only (plus optional uvloop): keep-alive
connections on asyncio streams, the ready/go handshake with the coordinator, the measured run
and the event loop (uvloop if installed)."""

from __future__ import annotations

import asyncio  # noqa: TID251 (a separate client process, not smg_trio: uvloop is the lean choice)
import sys
import time
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

from http1 import Http1Reader

__all__ = ["Conn", "measured", "open_conns", "ready_then_go", "run_loop"]


class Conn(Http1Reader):
    """One keep-alive HTTP/1.1 connection (the reader is :mod:`http1`'s)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self.reader = reader
        self.writer = writer

    async def _receive(self) -> bytes:
        return await self.reader.read(65536)


C = TypeVar("C", bound=Conn)


async def open_conns(conn_type: type[C], port: int, count: int, limit: int) -> list[C]:
    """``count`` connections to 127.0.0.1:``port`` (stream buffer ``limit`` bytes)."""
    conns = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=limit)
        conns.append(conn_type(reader, writer))
    return conns


async def ready_then_go() -> None:
    """Print ``ready`` and wait for the coordinator's line on stdin ("go")."""
    loop = asyncio.get_running_loop()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"


async def measured(
    out: dict[str, Any], runs: Sequence[Awaitable[None]], conns: Sequence[Conn]
) -> None:
    """Every run at once; ``out`` gets their ``wall_s`` and this process's ``cpu_s``, then the
    connections are closed."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*runs)
    out["wall_s"] = time.perf_counter() - wall0
    out["cpu_s"] = time.process_time() - cpu0
    for conn in conns:
        conn.writer.close()


def run_loop(main: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """``main`` to completion on uvloop if it is installed, else on asyncio's loop."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return asyncio.run(main)
    result: dict[str, Any] = uvloop.run(main)
    return result
