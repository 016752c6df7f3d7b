"""The supervisor's control socket (``--api-server-count`` > 1): the admin API and the worker
table, served over HTTP on a unix socket in the private run directory, and the frontends'
side of it (the admin proxy, the table long-poll)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import trio
from quart import Blueprint, Response, request
from quart_trio import QuartTrio

from smg_trio.backend import ServedModel
from smg_trio.gateway.openai.errors import ApiError
from smg_trio.serve.engine_control import ENGINE_CONTROL_PATHS
from smg_trio.serve.lora_routes import LORA_PATHS
from smg_trio.worker.manager import WorkerManager, WorkerState

__all__ = [
    "ADMIN_PATHS",
    "CONTROL_SOCKET",
    "FRONTEND_BEATS",
    "FRONTEND_READY",
    "RESPONSES_STORE",
    "TENANTS",
    "TABLE_POLL_S",
    "ControlClient",
    "admin_proxy_blueprint",
    "control_app",
    "worker_table",
]

log = logging.getLogger(__name__)

#: The line a frontend prints on stdout once it serves (the supervisor waits for it).
FRONTEND_READY = "smg_trio frontend ready"
#: The control socket's name in the run directory.
CONTROL_SOCKET = "control.sock"
#: A frontend's heartbeats per ``--frontend-stall-timeout-secs``; the supervisor kills it
#: after the timeout plus one beat's interval of silence, so that a loop that stopped for less
#: than the timeout is never killed.
FRONTEND_BEATS = 4
#: The Responses API's store shared by the frontends, in the run directory.
RESPONSES_STORE = "responses.sqlite3"
#: The tenants' shared ledger (``gateway/http/tenants.py``), in the run directory.
TENANTS = "tenants"
#: How long one table long-poll waits for a change before it answers unchanged.
TABLE_POLL_S = 10.0
#: The admin routes a frontend forwards to the supervisor (Quart rules).
ADMIN_PATHS = (
    ("/workers", ("GET", "POST")),
    ("/workers/<worker_id>", ("GET", "DELETE")),
    ("/workers/jobs/<job_id>", ("GET",)),
    ("/get_loads", ("GET",)),
    *ENGINE_CONTROL_PATHS,
    *LORA_PATHS,
)
#: Response headers of an admin answer that the frontend passes on.
_PASSED_HEADERS = ("content-type", "location", "www-authenticate", "retry-after")


def _worker_entry(worker: WorkerState, slot: int) -> dict[str, Any]:
    client = worker.engine_client
    spec = worker.spec
    engines = (
        [
            {
                "identity": e.identity.hex(),
                "index": e.index,
                "ready": msgspec.to_builtins(e.ready),
            }
            for e in client.engines
        ]
        if client is not None and client.alive
        else []
    )
    return {
        "id": worker.worker_id,
        "url": worker.url,
        "model_id": worker.model_id,
        "model_path": spec.model_path,
        "runtime": worker.runtime,
        "dp_size": worker.dp_size,
        "reasoning_parser": spec.reasoning_parser,
        "tool_call_parser": spec.tool_call_parser,
        "handshake": worker.addresses.handshake,
        "status": worker.status,
        "held": worker.held,
        "last_error": worker.last_error,
        "generation": worker.generation,
        "max_model_len": worker.metadata.get("max_model_len"),
        "metadata": dict(worker.metadata),
        "engines": engines,
        "slot": slot,
    }


def _model_entry(model: ServedModel) -> dict[str, Any]:
    return {
        "model_path": model.model_path,
        "reasoning_parser": model.reasoning_parser,
        "tool_call_parser": model.tool_call_parser,
    }


def worker_table(manager: WorkerManager, slots: Callable[[str], int]) -> dict[str, Any]:
    """What the frontends mirror: every registered worker with its engines' registrations
    (those of the live client 0 only), its generation and its load slot, the draining flag,
    and each served model's source (its directory and parsers: a worker that joins a served
    model names none of its own)."""
    return {
        "draining": manager.draining,
        "workers": [_worker_entry(w, slots(w.worker_id)) for w in manager.workers],
        "models": {m.model_id: _model_entry(m) for m in manager.models.values()},
        "lora_adapters": manager.loras.to_json(),
    }


def control_app(manager: WorkerManager, admin: Blueprint, slots: Callable[[str], int]) -> QuartTrio:
    """The supervisor's control app: ``admin`` (the ``/workers`` routes, with their auth) and
    ``GET /_smg/table?known=ETAG``, which answers once the table differs from ``ETAG`` (or
    after :data:`TABLE_POLL_S` unchanged)."""
    app = QuartTrio("smg_trio.serve.control", static_folder=None)
    app.config.update(RESPONSE_TIMEOUT=None)
    app.register_blueprint(admin)

    def snapshot() -> tuple[bytes, str]:
        body = msgspec.json.encode(worker_table(manager, slots))
        return body, format(hash(body) & 0xFFFFFFFFFFFF, "x")

    @app.get("/_smg/table")
    async def table() -> Response:
        known = request.args.get("known", "")
        body, etag = snapshot()
        with trio.move_on_after(TABLE_POLL_S):
            while etag == known:
                await manager.registry.changed.wait()
                body, etag = snapshot()
        return Response(body, content_type="application/json", headers={"ETag": etag})

    @app.post("/_smg/unresponsive")
    async def unresponsive() -> Response:
        # A frontend saw this worker's engine go silent (or its output fail) with requests in
        # flight. Client 0 here is idle and so never times the silence itself: latch it dead,
        # as if it had, so that a launched engine is stopped and relaunched (and an external
        # one re-handshaken). A report for an older generation is stale and ignored.
        try:
            report = msgspec.json.decode(await request.get_data(as_text=False), type=dict)
        except msgspec.DecodeError:
            return Response(b"", status=400)
        worker = manager.get_worker(str(report.get("id", "")))
        client = None if worker is None else worker.engine_client
        if (
            worker is not None
            and client is not None
            and client.alive
            and worker.generation == report.get("generation")
        ):
            log.error("worker %r: %s", worker.url, report.get("reason"))
            client.kill(str(report.get("reason")))
        return Response(b"", status=204)  # done, or stale (nothing to do)

    return app


class ControlClient:
    """A frontend's connection to the supervisor's control socket (HTTP over a unix socket;
    the caller bounds each call with a cancel scope)."""

    def __init__(self, path: str) -> None:
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://supervisor", timeout=None
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> httpx.Response:
        """One admin request, as the supervisor answers it."""
        return await self._client.request(method, path, headers=headers, content=body)

    async def table(self, known: str) -> tuple[dict[str, Any], str]:
        """The worker table once it differs from ``known`` (an ETag; empty at first)."""
        resp = await self._client.get("/_smg/table", params={"known": known})
        resp.raise_for_status()
        return msgspec.json.decode(resp.content), resp.headers.get("etag", "")

    async def report_unresponsive(self, worker_id: str, generation: int, reason: str) -> None:
        """Tell the supervisor that this worker's engine (``generation``) stopped answering
        (a failure to tell it is logged: the report is best effort)."""
        body = {"id": worker_id, "generation": generation, "reason": reason}
        try:
            resp = await self._client.post("/_smg/unresponsive", content=msgspec.json.encode(body))
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning(
                "engine death of worker %s not reported to the supervisor: %s", worker_id, exc
            )


def _request_target(path: str, query: bytes) -> str:
    """``path`` (decoded) percent-encoded again, segment by segment, with ``.`` and ``..``
    spelled ``%2E``: the HTTP client resolves literal dot segments (``/workers/..`` would go
    out as ``/``), so an id must not be one."""
    segments = [
        seg.replace(".", "%2E") if seg in (".", "..") else quote(seg, safe="")
        for seg in path.split("/")
    ]
    target = "/".join(segments)
    return f"{target}?{query.decode('latin-1')}" if query else target


def admin_proxy_blueprint(control: ControlClient) -> Blueprint:
    """The admin routes of a frontend: each request goes to the supervisor as it came (method,
    path, query, ``Authorization``, body), and its answer comes back as it went, so every
    frontend answers them the same and a job's status reads the same from any of them."""
    bp = Blueprint("smg_admin_proxy", __name__)

    async def forward(**_: str) -> Response:
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("authorization", "content-type", "accept")
        }
        body = await request.get_data(as_text=False)
        assert isinstance(body, bytes)
        path = _request_target(request.path, request.query_string)
        try:
            with trio.fail_after(60):
                resp = await control.forward(request.method, path, headers, body)
        except (httpx.HTTPError, trio.TooSlowError) as exc:
            log.warning("admin request not forwarded to the supervisor: %s", exc)
            err = ApiError(503, "the gateway supervisor is not reachable", code="unavailable")
            return Response(err.body(), status=503, content_type="application/json")
        out = Response(resp.content, status=resp.status_code)
        for name in _PASSED_HEADERS:
            if name in resp.headers:
                out.headers[name] = resp.headers[name]
        return out

    for rule, methods in ADMIN_PATHS:
        bp.add_url_rule(
            rule, endpoint=rule.replace("/", "_"), view_func=forward, methods=list(methods)
        )
    return bp
