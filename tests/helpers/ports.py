"""TCP ports for tests: one free right now, and a random worker base port."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port", "random_worker_base_port"]


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_worker_base_port() -> int:
    """A worker base port outside the 20000..29999 handshake band, random per test."""
    return random.randint(40000, 60000)
