"""The inference route table: one row per API (path, API module), served by the ASGI fast
path (:mod:`~smg_trio.gateway.http.fastroute`) and, for what it does not take, by Quart."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from quart import Request, Response

from smg_trio.gateway.http.call import Gateway, RequestCall
from smg_trio.gateway.http.handler import handle
from smg_trio.gateway.http.pooling_route import pooling_routes
from smg_trio.gateway.http.utility import utility_route
from smg_trio.gateway.openai.api import InferenceApi
from smg_trio.gateway.openai.chat import CHAT
from smg_trio.gateway.openai.chat_batch import CHAT_BATCH
from smg_trio.gateway.openai.completions import COMPLETIONS
from smg_trio.gateway.openai.errors import anthropic_envelope
from smg_trio.gateway.openai.invocations import INVOCATIONS
from smg_trio.gateway.openai.messages import MESSAGES, count_tokens
from smg_trio.gateway.openai.messages_schemas import CountTokensRequest
from smg_trio.gateway.openai.responses import ResponsesApi
from smg_trio.gateway.openai.responses_background import BackgroundResponses
from smg_trio.gateway.openai.tokens import (
    DetokenizeRequest,
    TokenizeRequest,
    detokenize,
    tokenize,
)

if TYPE_CHECKING:
    from smg_trio.gateway.http.fastroute import AsgiRequest

__all__ = ["INFERENCE_APIS", "UNSERVED_PREFIXES", "Route", "inference_routes"]

#: ``POST`` path -> the API served there. A new API is a new module in ``openai/`` and a row.
INFERENCE_APIS: tuple[tuple[str, InferenceApi[Any]], ...] = (
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", COMPLETIONS),
    ("/v1/messages", MESSAGES),
)

#: A route: the request (Quart's or the fast path's) in, the response out.
Route = Callable[["Request | AsgiRequest"], Awaitable[Response]]


def _route(gw: Gateway, api: InferenceApi[Any]) -> Route:
    async def route(request: Request | AsgiRequest) -> Response:
        call = RequestCall(
            gw,
            request,
            api.name,
            api.id_prefix,
            envelope=getattr(api, "envelope", None),
            x_api_key=bool(getattr(api, "x_api_key", False)),
            server_ids=bool(getattr(api, "server_ids", False)),
        )
        return await handle(api, call)

    return route


#: OpenAI/vLLM endpoints this gateway knows of and does not serve (a path equal to one, or
#: under it): a 404 saying so, with the served endpoints. Never a 5xx: the official clients
#: retry every 5xx, as vLLM's server answers these when it does not serve them.
UNSERVED_PREFIXES: tuple[str, ...] = (
    "/v1/embeddings",
    "/v1/audio",
    "/v1/images",
    "/v1/moderations",
    "/v1/files",
    "/v1/uploads",
    "/v1/batches",
    "/v1/fine_tuning",
    "/v1/assistants",
    "/v1/threads",
    "/v1/vector_stores",
    "/v1/realtime",
    "/v1/conversations",
    "/v1/score",
    "/v1/rerank",
    "/score",
    "/rerank",
    "/pooling",
    "/classify",
)


def inference_routes(
    gw: Gateway, background: BackgroundResponses | None = None
) -> dict[str, Route]:
    """Each ``POST`` path's route on ``gw``: the inference APIs (and SageMaker's
    ``/invocations``, chat or completions by the body), then the engine-free ones
    (``/tokenize`` and ``/detokenize``, also under ``/v1``, as vLLM and smg spell them)."""
    routes: dict[str, Route] = {path: _route(gw, api) for path, api in INFERENCE_APIS}
    # The Responses API is made per gateway: it reads and fills the gateway's store.
    routes["/v1/responses"] = _route(gw, ResponsesApi(gw.responses, background))
    routes["/invocations"] = _route(gw, INVOCATIONS)  # vLLM's SageMaker route
    routes["/v1/chat/completions/batch"] = _route(gw, CHAT_BATCH)  # vLLM 0.32's
    routes.update(pooling_routes(gw))  # embeddings, classify, score, rerank (docs/pooling.md)
    defaults = gw.config.default_chat_template_kwargs  # vLLM's tokenize renders with them
    tok = utility_route(gw, "tokenize", TokenizeRequest, lambda b, s: tokenize(b, s, defaults))
    detok = utility_route(gw, "detokenize", DetokenizeRequest, detokenize)
    routes.update({"/tokenize": tok, "/v1/tokenize": tok})
    routes.update({"/detokenize": detok, "/v1/detokenize": detok})
    routes["/v1/messages/count_tokens"] = utility_route(
        gw,
        "messages_count_tokens",
        CountTokensRequest,
        count_tokens,
        envelope=anthropic_envelope,
        x_api_key=True,
    )
    return routes
