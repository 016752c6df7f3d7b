"""The worker admin API: ``/workers`` (add, list, get, remove), ``/workers/jobs/{id}`` and
``/get_loads``, behind ``--admin-api-key``; without a key only reading is open."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from smg_trio import jsontext
from smg_trio.errors import ValidationError
from smg_trio.gateway.http.call import bearer_matches
from smg_trio.gateway.openai.errors import ApiError, to_api_error
from smg_trio.worker.manager import WorkerManager, WorkerSpec

__all__ = ["NO_ADMIN_KEY_MESSAGE", "admin_blueprint", "parse_worker_spec"]

#: ``POST /workers`` fields and their JSON types (``None`` is allowed for every one but url);
#: the discovery file's entries take the same ones.
_FIELDS: dict[str, type] = {
    "url": str,
    "model_path": str,
    "model_id": str,
    "runtime_type": str,
    "zmq_handshake_address": str,
    "dp_size": int,
    "reasoning_parser": str,
    "tool_call_parser": str,
    "revision": str,
}


def _error(exc: ApiError) -> Response:
    return Response(exc.body(), status=exc.status, content_type="application/json")


def parse_worker_spec(body: Any, what: str = "the request body") -> WorkerSpec:
    """A ``WorkerSpec`` from a JSON object (``POST /workers``, a discovery-file entry); raises
    ``ValidationError`` for a bad shape, an unknown field or a wrongly typed one."""
    if not isinstance(body, dict):
        raise ValidationError(f"{what} must be a JSON object")
    unknown = sorted(str(k) for k in set(body) - set(_FIELDS))
    if unknown:
        raise ValidationError(f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    kwargs: dict[str, Any] = {}
    for name, kind in _FIELDS.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValidationError(f"{name} must be a {kind.__name__}", param=name)
        kwargs[name] = value
    if "url" not in kwargs:
        raise ValidationError("url is required", param="url")
    return WorkerSpec(**kwargs)


#: The 403 of a changing admin request (``/workers``, engine control) when no admin key is
#: set; ``{route}`` is the method and path, so the message fits ``/sleep`` as well as
#: ``/workers``.
NO_ADMIN_KEY_MESSAGE = (
    "{route} is an admin route and needs an admin key: set --admin-api-key (or --api-key), "
    "or --allow-insecure-admin for single-user development"
)


def admin_blueprint(
    manager: WorkerManager, *, admin_api_key: str | None, allow_insecure: bool = False
) -> Blueprint:
    """The admin routes over ``manager``. With ``admin_api_key`` every route requires
    ``Authorization: Bearer <key>`` (401 otherwise). Without one, reading (``GET``) is open
    and requests that change workers (``POST``, ``DELETE``) get 403, unless
    ``allow_insecure``."""
    bp = Blueprint("smg_admin", __name__)
    expected = admin_api_key.encode() if admin_api_key is not None else None

    @bp.before_request
    async def _auth() -> Response | None:
        if expected is None:
            if allow_insecure or request.method in ("GET", "HEAD", "OPTIONS"):
                return None
            route = f"{request.method} {request.path}"
            message = NO_ADMIN_KEY_MESSAGE.format(route=route)
            return _error(ApiError(403, message, code="admin_api_disabled"))
        if bearer_matches(request.headers.get("Authorization", ""), expected):
            return None
        resp = _error(ApiError(401, "invalid or missing admin API key", code="invalid_api_key"))
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @bp.post("/workers")
    async def add_worker() -> Response | tuple[dict[str, Any], int, dict[str, str]]:
        try:
            # the body's own decoder (UTF-8, no lone surrogates), never a 500
            body = jsontext.loads(await request.get_data(), param=None, what="the request body")
            spec = parse_worker_spec(body)
            spec = await manager.check_spec(spec)
            job = manager.add_worker(spec)
        except ValidationError as exc:
            return _error(to_api_error(exc))
        status_url = f"/workers/jobs/{job.job_id}"
        doc = {"job_id": job.job_id, "worker_id": job.worker_id, "status_url": status_url}
        return doc, 202, {"Location": status_url}

    @bp.get("/workers/jobs/<job_id>")
    async def get_job(job_id: str) -> Response | dict[str, Any]:
        job = manager.jobs.get(job_id)
        if job is None:
            return _error(ApiError(404, f"no job {job_id!r}", code="job_not_found"))
        return job.to_json()

    @bp.get("/workers")
    async def list_workers() -> dict[str, Any]:
        model = request.args.get("model")
        workers = [w.to_json() for w in manager.workers if model is None or w.model_id == model]
        return {"workers": workers, "total": len(workers)}

    @bp.get("/workers/<worker_id>")
    async def get_worker(worker_id: str) -> Response | dict[str, Any]:
        worker = manager.get_worker(worker_id)
        if worker is None:
            return _error(ApiError(404, f"no worker {worker_id!r}", code="worker_not_found"))
        return worker.to_json()

    @bp.delete("/workers/<worker_id>")
    async def remove_worker(worker_id: str) -> Response | dict[str, Any]:
        if not await manager.remove_worker(worker_id):
            return _error(ApiError(404, f"no worker {worker_id!r}", code="worker_not_found"))
        return {"id": worker_id, "status": "removed"}

    @bp.get("/get_loads")
    async def get_loads() -> dict[str, Any]:
        return {
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "url": w.url,
                    "model_id": w.model_id,
                    "status": w.status,
                    "inflight": w.inflight,
                    "loads": [
                        {"dp_rank": rank, **load} for rank, load in enumerate(w.to_json()["load"])
                    ],
                }
                for w in manager.workers
            ]
        }

    return bp
