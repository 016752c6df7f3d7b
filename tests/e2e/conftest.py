"""Shared plumbing for the real-peer (e2e) lane.

Every test here is marked ``e2e`` and skips, with the reason and the install command, unless
``SMG_TRIO_E2E=1`` and the peers it needs are installed (``bash scripts/setup_peers.sh``).

Processes are started in their own session (process group) and stopped by group (SIGTERM,
then SIGKILL) in fixture teardown, so nothing outlives a test, even a failing one. Everything
listens on 127.0.0.1; ipc paths live in short ``/tmp/smg-*`` directories.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio

from peers.tools import start_process_group, stop_process_group
from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.protocol.addresses import WorkerAddresses, worker_addresses

E2E_ENV = "SMG_TRIO_E2E"
INSTALL_HINT = "install the peers with: bash scripts/setup_peers.sh"
#: A vLLM engine registers 40-100 s after launch on a 2-core machine.
ENGINE_STARTUP_S = 240.0
#: Once up, everything answers within seconds.
HTTP_READY_S = 60.0

T = TypeVar("T")


def require_e2e(*reasons: str | None) -> None:
    """Skip the calling test/fixture unless ``SMG_TRIO_E2E=1`` and every reason is None."""
    if os.environ.get(E2E_ENV) != "1":
        pytest.skip(f"real-peer lane is off: set {E2E_ENV}=1 ({INSTALL_HINT})")
    for reason in reasons:
        if reason:
            pytest.skip(f"real peer missing: {reason}; {INSTALL_HINT}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama (byte-level BPE, ChatML template) the lane serves."""
    if os.environ.get(E2E_ENV) != "1":
        pytest.skip(f"real-peer lane is off: set {E2E_ENV}=1 ({INSTALL_HINT})")
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@contextlib.contextmanager
def ipc_worker(name: str = "engine-1") -> Iterator[WorkerAddresses]:
    """A short ``ipc:///tmp/smg-XXXX/<name>`` worker URL and its derived addresses."""
    directory = tempfile.mkdtemp(prefix="smg-")
    try:
        yield worker_addresses(f"ipc://{directory}/{name}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def handshake_port(addresses: WorkerAddresses) -> int:
    return int(addresses.handshake.rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no log>"


@contextlib.contextmanager
def process_group(
    cmd: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own process group for the block; always stop the whole group."""
    proc = start_process_group(cmd, env=env, log_path=log_path, cwd=cwd)
    try:
        yield proc
    finally:
        stop_process_group(proc)


def assert_alive(proc: subprocess.Popen[bytes], log_path: Path, what: str) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"{what} exited with {proc.returncode}:\n{log_tail(log_path)}")


def wait_http(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    *,
    timeout: float,
    what: str,
    ok: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
    also: Callable[[], None] = lambda: None,
) -> None:
    """Poll ``url`` (sync) until ``ok``; fail early, with the log, if ``proc`` dies (``also``
    runs each round too, e.g. to check the engine process)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        assert_alive(proc, log_path, what)
        also()
        try:
            r = httpx.get(url, timeout=5.0)
            if ok(r):
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(1.0)
    raise AssertionError(
        f"{what} not ready at {url} after {timeout}s ({last}):\n{log_tail(log_path)}"
    )


class TrioPortal:
    """One trio loop in a background thread that holds an async context open.

    pytest-trio fixtures are function-scoped, but a real vLLM engine handshakes once per
    process and takes a minute to start, so a module shares one engine + client through this
    portal: sync tests call :meth:`run` with an async function of the held object.
    """

    def __init__(self, factory: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self._factory = factory
        self.value: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        # test-only and never stray: close() stops the loop and joins the thread
        self._thread = threading.Thread(  # noqa: TID251
            target=self._main, name="e2e-trio-portal", daemon=True
        )

    def _main(self) -> None:
        async def body() -> None:
            self._stop = trio.Event()
            async with self._factory() as value:
                self.value = value
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()

        try:
            trio.run(body)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    def start(self, timeout: float, *, check: Callable[[], None] = lambda: None) -> None:
        """Start and wait until the context is entered; ``check`` runs every second (e.g. to
        fail fast when the engine process died)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(1.0):
            check()
            if time.monotonic() > deadline:
                raise AssertionError(f"portal not ready after {timeout}s")
        if self._error is not None:
            raise AssertionError(f"portal failed to start: {self._error!r}") from self._error

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        assert self._token is not None, "portal not started"
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def close(self, timeout: float = 30.0) -> None:
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        if self._thread.is_alive():
            self._thread.join(timeout)


async def chat(
    client: httpx.AsyncClient, model: str, content: str = "Hello there", **extra: Any
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return await client.post("/v1/chat/completions", json=body)


async def stream_chat(
    client: httpx.AsyncClient, model: str, content: str = "Hello there", **extra: Any
) -> list[dict[str, Any]]:
    """POST a streaming chat completion and return its parsed SSE chunks (without [DONE])."""
    import json

    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        **extra,
    }
    chunks: list[dict[str, Any]] = []
    done = False
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, (await resp.aread()).decode(errors="replace")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            chunks.append(json.loads(data))
    assert done, "stream ended without data: [DONE]"
    return chunks


@contextlib.asynccontextmanager
async def http_client(base_url: str, timeout: float = 60.0) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        yield client
