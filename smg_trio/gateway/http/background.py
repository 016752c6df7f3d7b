"""Runs a ``background: true`` response after its 200 (``queued``) went out."""

from __future__ import annotations

import msgspec
import trio
from quart import Response

from smg_trio.connector import EngineClient
from smg_trio.connector.client import ABORT_GROUP
from smg_trio.errors import ValidationError
from smg_trio.gateway.http.call import SSE_HEADERS, RequestCall, json_response
from smg_trio.gateway.openai.errors import ApiError, to_api_error
from smg_trio.gateway.openai.fanout import SubRequest, run_all
from smg_trio.gateway.openai.responses import ResponsesJob
from smg_trio.gateway.openai.responses_background import BackgroundResponses
from smg_trio.gateway.openai.responses_events import EventLog
from smg_trio.gateway.openai.textgen import ChoiceCollector, TextDelta

__all__ = ["background_log", "event_log_response", "start_background"]


async def start_background(
    call: RequestCall, client: EngineClient, model_id: str, job: ResponsesJob
) -> Response:
    """Store the response as ``queued``, start it in the app's nursery under a cancel scope
    that ``POST /v1/responses/{id}/cancel`` cancels (the engine is told ABORT), and answer
    the ``queued`` response; with ``stream`` (vLLM's background stream) the task records its
    events in an :class:`EventLog` and the answer is the SSE stream that follows it. The task owns ``call`` (its lease, admission slot and metrics)
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
    log = reg.open_log(rid) if job.stream else None
    renderer = job.renderer()  # used with the log only

    def on_delta(sub: SubRequest, delta: TextDelta) -> None:
        assert log is not None
        log.extend(renderer.delta(sub, delta))

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        status: int = 499
        code: str | None = "cancelled"
        failure: BaseException | None = None
        ended = trio.Event()
        # The task's own context: its engine requests are not the client request's, whose
        # going away (its stream closed) must not ABORT them.
        ABORT_GROUP.set(None)
        try:
            with trio.CancelScope() as scope:
                reg.running[rid] = (scope, ended)
                task_status.started()
                try:
                    collected = ChoiceCollector(len(job.subs))
                    sink = collected.on_delta if log is None else on_delta
                    if log is not None:
                        log.extend(renderer.start())
                    await call.run_with_retry(
                        model_id, client, lambda c: run_all(c, job.subs, sink, call.on_batch)
                    )
                    if log is not None:
                        log.extend(renderer.end())  # stored, completed or incomplete
                    else:
                        job.result(collected)  # stored, completed or incomplete
                    status, code = 200, None
                except Exception as exc:
                    err = to_api_error(exc)
                    status, code, failure = err.status, err.detail.code, exc
                    job.put("failed", {"code": code, "message": err.detail.message})
                    if log is not None:
                        log.extend(renderer.error_event(exc))
            if scope.cancelled_caught:
                job.put("cancelled")
        finally:
            reg.running.pop(rid, None)
            reg.close_log(rid)
            call.close(status, code, failure)
            ended.set()

    await nursery.start(run)
    if log is not None:  # vLLM: the stream follows the events the background task records
        return event_log_response(log, 0, call.request_id)
    return json_response(200, msgspec.json.encode(queued), call.request_id)


def event_log_response(log: EventLog, start: int, request_id: str) -> Response:
    """The SSE response that follows ``log`` from index ``start``: the client going away
    ends only this stream, never the background response."""
    return Response(
        log.follow(start),
        status=200,
        content_type="text/event-stream; charset=utf-8",
        headers={**SSE_HEADERS, "x-request-id": request_id},
    )


def background_log(
    reg: BackgroundResponses | None, response_id: str, starting_after: str | None
) -> tuple[EventLog, int]:
    """The event log of the streamed background response ``response_id`` (stored) and the
    index to follow it from: a 400 naming ``response_id`` when none is kept here (vLLM's
    "Unknown response_id"; not streamed, run by another frontend, or ended long ago), one
    naming ``starting_after`` when that is not a number or its events are no longer kept."""
    log = None if reg is None else reg.logs.get(response_id)
    if log is None:
        raise ApiError(400, f"Unknown response_id: {response_id}", param="response_id")
    after = None
    if starting_after is not None:
        try:
            after = int(starting_after)
        except ValueError:
            raise ApiError(
                400, "starting_after must be an integer", param="starting_after"
            ) from None
    try:
        return log, log.check_start(after)
    except ValidationError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
