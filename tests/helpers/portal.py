"""A trio loop in a background thread holding one async context open, for module-scoped
resources that sync tests share (the e2e lane's real vLLM engine and its client)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import trio

__all__ = ["TrioPortal"]

T = TypeVar("T")


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
