"""The pooling ``POST`` routes (embeddings, classify, score, rerank...): the inference
skeleton's auth, admission, body and model steps, the plan (tokenized under the pooling
limits, for the model's pooling task last seen), a lease routed by the first item's tokens,
the engine's task check (planned again if the model's task is not the one assumed), one engine
request per item, one JSON answer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from quart import Request, Response

from smg_trio.connector.tasks import TASKS_TIMEOUT_S, model_pooling_task
from smg_trio.errors import UnsupportedField, ValidationError
from smg_trio.gateway.http.call import SESSION_HEADER, Gateway, RequestCall
from smg_trio.gateway.openai.errors import EngineRequestFailed
from smg_trio.gateway.openai.pooling import PoolingApi, PoolingLimits, run_pooling
from smg_trio.gateway.openai.pooling_apis import POOLING_APIS
from smg_trio.routing.cache_aware import RouteRequest

if TYPE_CHECKING:
    from smg_trio.gateway.http.fastroute import AsgiRequest
    from smg_trio.gateway.http.routes import Route

__all__ = ["TASKS_BOUND_S", "pooling_routes"]

#: How long a pooling request waits for a new engine's ``get_supported_tasks`` answer.
TASKS_BOUND_S = TASKS_TIMEOUT_S


def _route_hint(call: RequestCall, items: list[list[int]], body: object) -> RouteRequest:
    """What ``cache_aware`` routes a pooling request by: the first item's tokens, and the
    session key (the ``x-session-id`` header, else the body's ``user``)."""
    key = call.request.headers.get(SESSION_HEADER) or None
    user = getattr(body, "user", None)
    if key is None and isinstance(user, str) and user:
        key = user
    return RouteRequest(items[0], session_key=key)


def _route(gw: Gateway, api: PoolingApi[Any], model_tasks: dict[str, str | None]) -> Route:
    async def route(request: Request | AsgiRequest) -> Response:
        call = RequestCall(gw, request, api.name, api.id_prefix)
        try:
            body = await call.read_body(api.body_type)
            served = await call.gw.resolve_model(body.model)
            caps = served.protocol.capabilities
            if not caps.pooling:
                raise UnsupportedField(
                    "pooling", caps.engine, f"{api.name} needs a vLLM pooling model"
                )
            cfg = call.gw.config
            limits = PoolingLimits(
                cfg.max_pooling_items, cfg.max_pooling_tokens, served.max_model_len
            )
            guess = model_tasks.get(served.model_id)
            plan = await call.tokenize(lambda: api.plan(body, served, limits, guess))
            call.prompt_tokens = plan.prompt_tokens
            ids = call.reserve_ids()
            lease = await call.lease(served.model_id, _route_hint(call, plan.items, body))
            client = lease.client
            tasks = await client.tasks.ensure(client, TASKS_BOUND_S, lease.worker_id)
            own = model_pooling_task(tasks)
            model_tasks[served.model_id] = own
            if plan.model_task is not None and own is not None and plan.model_task != own:
                plan = await call.tokenize(lambda: api.plan(body, served, limits, own))
                call.prompt_tokens = plan.prompt_tokens
            task = plan.options.task
            if task not in tasks:
                raise ValidationError(
                    f"model {served.model_id!r} does not serve the {task!r} pooling task "
                    f"(its engine serves: {', '.join(sorted(tasks))})",
                    param="model",
                    code="unsupported_task",
                )
            try:
                vectors = await run_pooling(client, plan, ids.engine_id, time.time())
            except EngineRequestFailed as exc:
                if exc.status < 500:
                    raise
                raise EngineRequestFailed(
                    f"engine {lease.worker_id}: {exc}", exc.code, status=exc.status
                ) from exc
            return call.ok_response(plan.render(vectors, ids.response_id, ids.created))
        except Exception as exc:
            return call.error_response(exc)
        finally:
            call.close(499, "client_disconnected")  # no-op unless cancelled

    return route


def pooling_routes(gw: Gateway) -> dict[str, Route]:
    """Each pooling ``POST`` path's route on ``gw``."""
    # The model's own pooling task, as last learnt from one of its engines: what score
    # (bi- or cross-encoder) and /pooling without a task plan for before a lease.
    model_tasks: dict[str, str | None] = {}
    return {r.path: _route(gw, r.api, model_tasks) for r in POOLING_APIS}
