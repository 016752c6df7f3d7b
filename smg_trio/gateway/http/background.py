"""Runs a ``background: true`` response after its 200 (``queued``) went out."""

from __future__ import annotations

import msgspec
import trio
from quart import Response

from smg_trio.connector import EngineClient
from smg_trio.gateway.http.call import RequestCall, json_response
from smg_trio.gateway.openai.errors import ApiError, to_api_error
from smg_trio.gateway.openai.fanout import run_all
from smg_trio.gateway.openai.responses import ResponsesJob
from smg_trio.gateway.openai.textgen import ChoiceCollector

__all__ = ["start_background"]


async def start_background(
    call: RequestCall, client: EngineClient, model_id: str, job: ResponsesJob
) -> Response:
    """Store the response as ``queued``, start it in the app's nursery under a cancel scope
    that ``POST /v1/responses/{id}/cancel`` cancels (the engine is told ABORT), and answer
    the ``queued`` response. The task owns ``call`` (its lease, admission slot and metrics)
    and closes it when the response is ``completed``/``incomplete``, ``failed`` (stored with
    its error) or ``cancelled``. More running at once than the store holds: 429."""
    reg = job.background
    assert reg is not None
    if not reg.has_room():
        raise ApiError(
            429,
            f"at most {reg.limit} background responses run at once (the responses store's "
            "size); poll or cancel the running ones first",
            code="too_many_background_responses",
        )
    nursery = reg.nursery()
    if nursery is None:
        raise ApiError(
            400,
            "background responses need the server's lifespan, which this server does not run",
            param="background",
            code="unsupported_field",
        )
    rid = job.chat.ids.response_id
    queued = job.put("queued")

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        status: int = 499
        code: str | None = "cancelled"
        failure: BaseException | None = None
        ended = trio.Event()
        try:
            with trio.CancelScope() as scope:
                reg.running[rid] = (scope, ended)
                task_status.started()
                try:
                    collected = ChoiceCollector(len(job.subs))
                    await call.run_with_retry(
                        model_id,
                        client,
                        lambda c: run_all(c, job.subs, collected.on_delta, call.on_batch),
                    )
                    job.result(collected)  # stored, completed or incomplete
                    status, code = 200, None
                except Exception as exc:
                    err = to_api_error(exc)
                    status, code, failure = err.status, err.detail.code, exc
                    job.put("failed", {"code": code, "message": err.detail.message})
            if scope.cancelled_caught:
                job.put("cancelled")
        finally:
            reg.running.pop(rid, None)
            call.close(status, code, failure)
            ended.set()

    await nursery.start(run)
    return json_response(200, msgspec.json.encode(queued), call.request_id)
