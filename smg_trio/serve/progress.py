"""Startup progress of ``serve``: each engine's registration stage as it changes, and a status
line at least every :data:`PROGRESS_INTERVAL_S` until the gateway is ready."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from smg_trio.transport.handshake_stage import handshake_stage
from smg_trio.worker.manager import WorkerManager

__all__ = ["PROGRESS_INTERVAL_S", "StartupProgress"]

log = logging.getLogger("smg_trio.serve")

#: Longest silence of the gateway's own startup lines (an engine's cold start takes minutes).
PROGRESS_INTERVAL_S = 5.0
#: How often the registration jobs' stages are looked at (startup only).
_POLL_S = 0.25

#: What each registration step means to a user watching the engines load.
_STAGES = {
    "load_tokenizer": "loading the tokenizer",
    "bind_handshake": "binding its sockets",
    "handshake": "handshaking",
    "discover_metadata": "reading the engine's metadata",
    "check_dp_group": "checking its data-parallel group",
    "activate": "activating",
}


class StartupProgress:
    """Reports the startup workers (``urls``, in order) until :meth:`finish`. ``launched``
    are the URLs whose engines ``serve`` launched itself."""

    def __init__(
        self,
        manager: WorkerManager,
        urls: Sequence[str],
        *,
        launched: Sequence[str] = (),
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.manager = manager
        self.urls = list(urls)
        self.launched = set(launched)
        self.interval_s = interval_s
        self.ready: list[str] = []
        self._stages: dict[str, str] = {}
        self._t0 = trio.current_time()
        self._scope = trio.CancelScope()

    def _label(self, url: str) -> str:
        kind = "engine" if url in self.launched else "worker"
        return f"{kind} {self.urls.index(url) + 1} of {len(self.urls)} ({url.rsplit('/', 1)[-1]})"

    def _elapsed(self) -> str:
        return f"{trio.current_time() - self._t0:.0f} s"

    def _stage(self, url: str) -> str:
        """The running step of ``url``'s registration job, else where it stands."""
        if url in self.ready:
            return "ready"
        for job in self.manager.jobs.values():
            if job.spec.url == url and job.status in ("pending", "running"):
                running = [name for name, status in job.steps.items() if status == "running"]
                if running and running[-1] == "handshake":
                    return self._handshake_stage(url)
                return _STAGES.get(running[-1], running[-1]) if running else "starting"
        return "loading, waiting its turn" if url in self.launched else "waiting its turn"

    def _handshake_stage(self, url: str) -> str:
        """``handshaking: `` and what the handshake on ``url``'s address waits for now."""
        address = next((w.handshake_address for w in self.manager.registry if w.url == url), None)
        return f"handshaking: {handshake_stage(address) or 'starting'}"

    def mark_ready(self, url: str) -> None:
        """``url`` registered: one line, ``engine ready (k of n)``."""
        self.ready.append(url)
        self._stages[url] = "ready"
        kind = "engine" if url in self.launched else "worker"
        log.info(
            "%s ready (%d of %d): %s after %s", kind, len(self.ready), len(self.urls), url,
            self._elapsed(),
        )  # fmt: skip

    def finish(self) -> None:
        """Stop reporting (the gateway is ready, or serve is stopping)."""
        self._scope.cancel()

    async def run(self) -> None:
        """Log each change of stage at once and the whole picture every ``interval_s``."""
        if not self.urls:
            return
        if self.launched:
            log.info(
                "starting %d engine(s); the gateway reports their progress every %.0f s",
                len(self.launched), self.interval_s,
            )  # fmt: skip
        with self._scope:
            next_status = trio.current_time() + self.interval_s
            while True:
                for url in self.urls:
                    stage = self._stage(url)
                    if self._stages.get(url) != stage and stage != "ready":
                        self._stages[url] = stage
                        log.info("%s: %s", self._label(url), stage)
                if trio.current_time() >= next_status:
                    waiting = [u for u in self.urls if u not in self.ready]
                    log.info(
                        "still starting (%s): %d of %d ready; %s", self._elapsed(),
                        len(self.ready), len(self.urls),
                        "; ".join(f"{self._label(u)} {self._stages.get(u, '')}" for u in waiting),
                    )  # fmt: skip
                    next_status = trio.current_time() + self.interval_s
                await trio.sleep(min(_POLL_S, self.interval_s))
