"""A gateway (the test harness: mock engine, tiny model) in a process of its own, for tests
that bound its memory: ``python -m tests.helpers.rss_gateway MODEL_DIR CONFIG_JSON`` prints
its base URL on a line, then serves until its stdin closes. :func:`rss_gateway` runs it and
reads its resident set size from ``/proc``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

__all__ = ["RssGateway", "rss_gateway"]

MIB = 1024 * 1024


@attrs.frozen
class RssGateway:
    """The running gateway: its URL and process."""

    base_url: str
    proc: subprocess.Popen[bytes]

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise LookupError(field)

    def rss(self) -> int:
        """Resident bytes now."""
        return self._status("VmRSS")

    def peak(self) -> int:
        """The most resident bytes so far (``VmHWM``)."""
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        """Start ``VmHWM`` again from the current RSS (Linux 4.0+)."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextmanager
def rss_gateway(model_dir: Path, **config: Any) -> Iterator[RssGateway]:
    """Run the gateway with ``GatewayHttpConfig(**config)``; stop it on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.rss_gateway", str(model_dir), json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("http"):
            raise RuntimeError(f"the gateway did not start: {line!r}")
        yield RssGateway(line, proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


async def _serve(model_dir: Path, config: dict[str, Any]) -> None:
    import trio

    from smg_trio.gateway.config import GatewayHttpConfig
    from smg_trio.tokenizer import Tokenizer
    from tests.helpers.gateway import open_harness

    tok = Tokenizer.from_dir(model_dir)
    async with open_harness(tok, model_dir, config=GatewayHttpConfig(**config)) as h:
        # The mock engine records every request it was sent (for other tests' asserts): keep
        # the last few only, so that what is measured is the gateway's memory.
        h.engine.requests = deque(maxlen=4)  # type: ignore[assignment]
        print(h.base_url, flush=True)
        # Serve until the parent closes stdin (a thread waits for it: no sleeps).
        await trio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)


if __name__ == "__main__":
    import trio

    trio.run(_serve, Path(sys.argv[1]), json.loads(sys.argv[2]))
