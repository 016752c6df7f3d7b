"""``--api-server-count``: how many frontend processes drive the engines, and which engine
wires can serve more than one (vLLM's multi-client ``EngineZmqAddresses``)."""

from __future__ import annotations

import os
from typing import Final, Literal

__all__ = [
    "AUTO",
    "TOKENSPEED_SINGLE_CLIENT",
    "api_server_count_problem",
    "parse_api_server_count",
    "resolve_api_server_count",
]

AUTO: Final = "auto"

#: Why TokenSpeed cannot have several frontends: its engine reads only the first address of
#: INIT's lists and its requests carry no client index (TokenSpeed's
#: ``runtime/engine/zmq_msgpack.py`` uses ``init.addresses.inputs[0]``/``outputs[0]``).
TOKENSPEED_SINGLE_CLIENT: Final = (
    "--api-server-count above 1 needs an engine wire with several frontend clients, and "
    "TokenSpeed's has one: its engine connects only to the first input and output address of "
    "INIT (zmq_msgpack.py uses addresses.inputs[0]/outputs[0]) and its requests carry no "
    "client index; use --api-server-count 1 with --backend tokenspeed"
)


def parse_api_server_count(text: str) -> int | Literal["auto"]:
    """The flag's value: a positive integer or ``auto``. Raises ``ValueError``."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"must be a positive integer or auto, got {text!r}") from None
    if value < 1:
        raise ValueError(f"must be at least 1 or auto, got {value}")
    return value


def resolve_api_server_count(value: int | Literal["auto"], affinity: set[int] | None = None) -> int:
    """``auto`` is one frontend per core this process may run on (``os.sched_getaffinity``)."""
    if value != AUTO:
        return value
    cores = os.sched_getaffinity(0) if affinity is None else affinity
    return max(1, len(cores))


def api_server_count_problem(count: int, backend: str | None) -> str | None:
    """Why ``count`` frontends cannot drive ``backend`` (a usage error), or ``None``."""
    if count <= 1:
        return None
    if backend == "tokenspeed":
        return TOKENSPEED_SINGLE_CLIENT
    return None
