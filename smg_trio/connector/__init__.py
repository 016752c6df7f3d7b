"""The request/response layer over a worker's sockets: submit, stream, abort, route ranks."""

from __future__ import annotations

from smg_trio.connector.client import (
    ENGINE_CORE_DEAD,
    EngineClient,
    open_engine_client,
    run_engine_client,
)
from smg_trio.connector.stream import RequestStream

__all__ = [
    "ENGINE_CORE_DEAD",
    "EngineClient",
    "RequestStream",
    "open_engine_client",
    "run_engine_client",
]
