"""The inference route table: one row per API (path, API module), served by the ASGI fast
path (:mod:`~smg_trio.gateway.http.fastroute`) and, for what it does not take, by Quart."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from quart import Request, Response

from smg_trio.gateway.http.call import Gateway, RequestCall
from smg_trio.gateway.http.handler import handle
from smg_trio.gateway.openai.api import InferenceApi
from smg_trio.gateway.openai.chat import CHAT
from smg_trio.gateway.openai.completions import COMPLETIONS

if TYPE_CHECKING:
    from smg_trio.gateway.http.fastroute import AsgiRequest

__all__ = ["INFERENCE_APIS", "Route", "inference_routes"]

#: ``POST`` path -> the API served there. A new API is a new module in ``openai/`` and a row.
INFERENCE_APIS: tuple[tuple[str, InferenceApi[Any]], ...] = (
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", COMPLETIONS),
)

#: A route: the request (Quart's or the fast path's) in, the response out.
Route = Callable[["Request | AsgiRequest"], Awaitable[Response]]


def _route(gw: Gateway, api: InferenceApi[Any]) -> Route:
    async def route(request: Request | AsgiRequest) -> Response:
        return await handle(api, RequestCall(gw, request, api.name, api.id_prefix))

    return route


def inference_routes(gw: Gateway) -> dict[str, Route]:
    """Each inference path's route on ``gw``."""
    return {path: _route(gw, api) for path, api in INFERENCE_APIS}
