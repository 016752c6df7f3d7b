"""The engine-free ``POST`` routes (tokenize, detokenize, Messages ``count_tokens``): the
inference skeleton's auth, admission, body and model steps, then one tokenizer call (in a
worker thread for a large body) and a JSON answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec
from quart import Request, Response

from smg_trio.backend import ServedModel
from smg_trio.gateway.http.call import Gateway, RequestCall
from smg_trio.gateway.openai.errors import Envelope

if TYPE_CHECKING:
    from smg_trio.gateway.http.fastroute import AsgiRequest

__all__ = ["utility_route"]


class _HasModel(Protocol):
    @property
    def model(self) -> str | None: ...


B = TypeVar("B", bound=_HasModel)


def utility_route(
    gw: Gateway,
    name: str,
    body_type: type[B],
    fn: Callable[[B, ServedModel], msgspec.Struct],
    *,
    envelope: Envelope | None = None,
    x_api_key: bool = False,
) -> Callable[[Request | AsgiRequest], Any]:
    """The route that answers ``fn(body, served)`` as JSON; ``name`` is its metrics
    ``endpoint`` label, ``envelope`` its error shape (OpenAI's by default)."""

    async def route(request: Request | AsgiRequest) -> Response:
        call = RequestCall(gw, request, name, "", envelope=envelope, x_api_key=x_api_key)
        try:
            body = await call.read_body(body_type)
            served = await call.gw.resolve_model(body.model)
            result = await call.tokenize(lambda: fn(body, served))
            return call.ok_response(result)
        except Exception as exc:
            return call.error_response(exc)
        finally:
            call.close(499, "client_disconnected")  # no-op unless cancelled

    return route
