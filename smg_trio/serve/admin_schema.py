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
    # engine control (serve/engine_control.py), each to ?model= or ?worker_id= (default every worker); see docs/admin.md
    Operation(
        "post",
        "/reset_prefix_cache",
        "resetPrefixCache",
        "Reset every targeted engine's prefix cache (vLLM's route)",
        "admin",
        "admin",
        query=("reset_running_requests", "reset_external", "model", "worker_id"),
        errors=("400", "401", "403", "404", "503", "504"),
    ),
    Operation(
        "post",
        "/sleep",
        "sleep",
        "Put the targeted engines to sleep; their workers leave routing",
        "admin",
        "admin",
        query=("level", "mode", "model", "worker_id"),
        errors=("400", "401", "403", "404", "503", "504"),
    ),
    Operation(
        "post",
        "/wake_up",
        "wakeUp",
        "Wake the targeted engines (all tags, or tags=...)",
        "admin",
        "admin",
        query=("tags", "model", "worker_id"),
        errors=("400", "401", "403", "404", "503", "504"),
    ),
    Operation(
        "get",
        "/is_sleeping",
        "isSleeping",
        "Whether any targeted engine sleeps, per engine",
        "admin",
        "admin",
        query=("model", "worker_id"),
        errors=("400", "401", "404", "503", "504"),
    ),
    Operation(
        "post",
        "/pause",
        "pause",
        "Pause the targeted engines' schedulers; their workers leave routing",
        "admin",
        "admin",
        query=("mode", "clear_cache", "model", "worker_id"),
        errors=("400", "401", "403", "404", "503", "504"),
    ),
    Operation(
        "post",
        "/resume",
        "resume",
        "Resume the targeted engines' schedulers",
        "admin",
        "admin",
        query=("model", "worker_id"),
        errors=("400", "401", "403", "404", "503", "504"),
    ),
    Operation(
        "get",
        "/is_paused",
        "isPaused",
        "Whether any targeted engine is paused, per engine",
        "admin",
        "admin",
        query=("model", "worker_id"),
        errors=("400", "401", "404", "503", "504"),
    ),
    Operation(
        "get",
        "/server_info",
        "serverInfo",
        "The targeted workers and their engines' registrations",
        "admin",
        "admin",
        query=("model", "worker_id"),
        errors=("401", "404", "503"),
    ),
)
