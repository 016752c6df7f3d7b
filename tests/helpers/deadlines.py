"""The absolute deadline every socket I/O test (transport, connector) runs under."""

from __future__ import annotations

__all__ = ["IO_DEADLINE_S"]

#: Every I/O test runs under this absolute deadline (seconds).
IO_DEADLINE_S = 10.0
