"""The frontend count the serve-level tests run ``serve`` with: ``SMG_TRIO_TEST_API_SERVER_COUNT``
(default 1). ``SMG_TRIO_TEST_API_SERVER_COUNT=2 pytest tests/serve ...`` is the second pass of
those suites against two frontend processes (docs/multi-frontend.md); a test that inherently
needs one process is marked :data:`single_frontend` and skips, with its reason, under N > 1."""

from __future__ import annotations

import glob
import json
import os
import re

import attrs
import httpx
import pytest
import trio

from smg_trio.serve.config import GatewayConfig

__all__ = [
    "API_SERVER_COUNT",
    "ENV",
    "find_run_dir",
    "frontend_client",
    "hold_chat_stream",
    "multi_frontend",
    "serve_args",
    "single_frontend",
    "start_chat_stream",
    "with_api_server_count",
]

ENV = "SMG_TRIO_TEST_API_SERVER_COUNT"
#: The ``--api-server-count`` of every ``serve`` the shared tests start.
API_SERVER_COUNT = int(os.environ.get(ENV, "1") or "1")
#: True in the second pass (two or more frontends).
multi_frontend = API_SERVER_COUNT > 1


def serve_args() -> list[str]:
    """The CLI flags to add to a ``serve``/``launch`` command line (none at N=1)."""
    return ["--api-server-count", str(API_SERVER_COUNT)] if multi_frontend else []


def with_api_server_count(config: GatewayConfig) -> GatewayConfig:
    """``config`` for the embedding API, with this pass's frontend count."""
    return attrs.evolve(config, api_server_count=API_SERVER_COUNT)


def single_frontend(reason: str) -> pytest.MarkDecorator:
    """Skip under N > 1: the test needs the gateway in one process (``reason`` says why)."""
    return pytest.mark.skipif(
        multi_frontend, reason=f"{ENV}={API_SERVER_COUNT}: needs one frontend ({reason})"
    )


def find_run_dir(sock_dir: str) -> str:
    """The one run directory (``smg-trio-run-*``) a multi-frontend gateway made in
    ``sock_dir``: its ``frontend-{i}.sock`` serve one frontend each."""
    run_dirs = glob.glob(os.path.join(sock_dir, "smg-trio-run-*"))
    assert len(run_dirs) == 1, run_dirs
    return run_dirs[0]


def frontend_client(run_dir: str, index: int) -> httpx.AsyncClient:
    """A client of frontend ``index`` only (its private unix socket)."""
    transport = httpx.AsyncHTTPTransport(uds=os.path.join(run_dir, f"frontend-{index}.sock"))
    return httpx.AsyncClient(transport=transport, base_url="http://frontend", timeout=30)


async def start_chat_stream(stream: trio.abc.Stream, body: dict[str, object]) -> str:
    """POST a streaming chat on a raw HTTP/1.1 connection (no async generator to leave
    unfinished; the caller owns the connection) and return the response id once the first
    chunk arrived."""
    data = json.dumps(body).encode()
    await stream.send_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(data), data)
    )
    buf = b""
    while (found := re.search(rb'data: \{"id":"([^"]+)"', buf)) is None:
        chunk = await stream.receive_some()
        assert chunk, buf
        buf += chunk
    return found.group(1).decode()


async def hold_chat_stream(
    stream: trio.abc.Stream,
    body: dict[str, object],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """For ``nursery.start``: start a streaming chat on ``stream``, report its response id,
    then hold the connection until cancelled (a client disconnect)."""
    async with stream:
        task_status.started(await start_chat_stream(stream, body))
        await trio.sleep_forever()
