"""The admin API's documented operations and the msgspec schema of the ``POST /workers`` body
(documentation only: admin.py parses it)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from smg_trio.gateway.http.openapi import Operation

__all__ = ["ADMIN_OPERATIONS", "WorkerSpecBody"]


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
    tool_call_parser: str | None = None
    #: With a Hugging Face id in ``model_path`` (or ``model_id``): its branch, tag or commit in
    #: the hub cache (default ``main``).
    revision: str | None = None


#: The admin routes (``admin_blueprint``), for ``create_app(operations=...)``.
ADMIN_OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "post",
        "/workers",
        "addWorker",
        "Register a worker; answers 202 with the registration job",
        "admin",
        "admin",
        request=WorkerSpecBody,
        errors=("400", "401", "403", "409", "413", "415"),
    ),
    Operation(
        "get",
        "/workers",
        "listWorkers",
        "The registered workers, optionally of one model",
        "admin",
        "admin",
        query=("model",),
        errors=("401",),
    ),
    Operation(
        "get",
        "/workers/{worker_id}",
        "getWorker",
        "One worker",
        "admin",
        "admin",
        errors=("401", "404"),
    ),
    Operation(
        "delete",
        "/workers/{worker_id}",
        "removeWorker",
        "Remove a worker",
        "admin",
        "admin",
        errors=("401", "403", "404"),
    ),
    Operation(
        "get",
        "/workers/jobs/{job_id}",
        "getWorkerJob",
        "A registration job's status",
        "admin",
        "admin",
        errors=("401", "404"),
    ),
    Operation(
        "get",
        "/get_loads",
        "getLoads",
        "Per-worker, per-DP-rank load",
        "admin",
        "admin",
        errors=("401",),
    ),
)
