"""The one handler skeleton of the inference routes: body, model, check, tokenize, build,
lease, submit, then a stream or one JSON result; every failure is the OpenAI envelope."""

from __future__ import annotations

from quart import Response

from smg_trio.gateway.http.background import start_background
from smg_trio.gateway.http.call import RequestCall
from smg_trio.gateway.http.request_log import log_request
from smg_trio.gateway.http.sse import sse_response, sse_whole
from smg_trio.gateway.openai.api import B, InferenceApi
from smg_trio.gateway.openai.fanout import run_all
from smg_trio.gateway.openai.framing import stream_done
from smg_trio.gateway.openai.pooling import check_generates
from smg_trio.gateway.openai.responses import ResponsesJob
from smg_trio.gateway.openai.textgen import ChoiceCollector
from smg_trio.gateway.openai.translate import check_data_parallel_rank

__all__ = ["handle"]


async def handle(api: InferenceApi[B], call: RequestCall) -> Response:
    """Serve one request of ``api`` on ``call``: 4xx for client input, 503 engine
    unavailable, 500 engine failure. A stream's body closes the call when it ends; any other
    response closes it here (499 when the client went away)."""
    streaming = False
    try:
        body = await call.read_body(api.body_type)
        served = await call.gw.resolve_model(body.model)
        call.hold_adapter(served)
        draft = api.check(body, served, call.gw.config)
        tokens = await call.tokenize(draft.tokenize)
        if call.gw.config.enable_log_requests:
            log_request(call, body, served.model_id)
        job = draft.build(tokens, call.reserve_ids())
        call.subs = job.subs
        call.prompt_tokens = job.prompt_tokens
        if job.answered:  # every choice finished without the engine
            if not job.stream:
                return call.ok_response(job.result(None))
            renderer = job.renderer()
            return sse_whole(call, renderer.start() + renderer.end() + stream_done(renderer))
        client = (await call.lease(served.engine_model_id, call.route_of(body))).client
        check_generates(client, served.model_id)  # a pooling-only engine: 400
        check_data_parallel_rank(job.data_parallel_rank, client.ranks)
        if isinstance(job, ResponsesJob) and job.background is not None:
            response = await start_background(call, client, served.model_id, job)
            streaming = True  # the background task closes the call
            return response
        if job.stream:
            response = await sse_response(call, client, job.subs, job.renderer())
            streaming = True
            return response
        collected = ChoiceCollector(len(job.subs))
        await call.run_with_retry(
            served.engine_model_id,
            client,
            lambda c: run_all(c, job.subs, collected.on_delta, call.on_batch),
        )
        return await call.ok_response_of(lambda: job.result(collected))
    except Exception as exc:
        return call.error_response(exc)
    finally:
        if not streaming:
            call.close(499, "client_disconnected")  # no-op unless cancelled
