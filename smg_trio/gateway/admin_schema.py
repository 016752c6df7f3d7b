"""msgspec schema of the ``POST /workers`` body (documentation only: admin.py parses it)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["WorkerSpecBody"]


class WorkerSpecBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /workers``: a worker to register. ``url`` is the engine's ZMQ address
    (``ipc://...`` or ``tcp://...``); every other field may be omitted or null. The fields
    mirror ``admin._FIELDS`` (a test keeps them in step)."""

    url: str
    model_path: str | None = None
    model_id: str | None = None
    runtime_type: str | None = None
    zmq_handshake_address: str | None = None
    dp_size: Annotated[int, Meta(ge=1)] | None = None
    reasoning_parser: str | None = None
