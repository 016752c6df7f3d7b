"""``create_app``: the quart-trio application, and ``serve_http``: smg_trio's hypercorn server."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import msgspec
import trio
from hypercorn.config import Config as HyperConfig
from quart import Request, Response, request
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from smg_trio import __version__
from smg_trio.backend import GatewayBackend
from smg_trio.gateway.config import DEFAULT_WRITE_TIMEOUT_S, GatewayHttpConfig
from smg_trio.gateway.http.background import background_log, event_log_response
from smg_trio.gateway.http.call import JSON_TYPE, Gateway, json_response
from smg_trio.gateway.http.cors import Cors
from smg_trio.gateway.http.fastroute import InferenceRoutes
from smg_trio.gateway.http.health import health, liveness, readiness
from smg_trio.gateway.http.metrics import GatewayMetrics
from smg_trio.gateway.http.openapi import OPERATIONS, Operation, openapi_document
from smg_trio.gateway.http.routes import UNSERVED_PREFIXES, Route, inference_routes
from smg_trio.gateway.http.sse import StreamBody
from smg_trio.gateway.http.tenants import TenantGate
from smg_trio.gateway.http.tracing import Tracing
from smg_trio.gateway.openai.errors import ApiError, anthropic_envelope, to_api_error
from smg_trio.gateway.openai.models import model_detail, model_list
from smg_trio.gateway.openai.responses_background import BackgroundResponses
from smg_trio.gateway.openai.responses_schemas import ResponseDeleted
from smg_trio.gateway.openai.tokens import VersionResponse
from smg_trio.gateway.server.asgi_guard import RequestGuard
from smg_trio.gateway.server.asgi_shield import ShieldedFinish
from smg_trio.gateway.server.direct import SERVER_SEND_KEY, DirectWriter
from smg_trio.gateway.server.hypercorn_errors import HTTP2_ENABLED_ATTR
from smg_trio.gateway.server.serve import serve
from smg_trio.parsers.reasoning import get_reasoning_format

__all__ = ["GATEWAY_KEY", "create_app", "gateway_of", "listen_backlog", "serve_http"]

log = logging.getLogger(__name__)

#: The kernel's cap on a listening socket's accept queue (``listen(2)`` clamps to it).
SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"
#: The backlog when ``SOMAXCONN_PATH`` cannot be read (Linux's default since 5.4).
DEFAULT_BACKLOG = 4096

#: ``app.extensions`` key holding the app's :class:`~smg_trio.gateway.http.call.Gateway`.
GATEWAY_KEY = "smg_trio.gateway"

#: Anthropic's route: a 404 or 405 under it answers in Anthropic's error envelope.
MESSAGES_PATH = "/v1/messages"


class _Connection(TrioASGIHTTPConnection):
    """Quart-trio's connection, plus: a stream body gets the connection's direct socket, and
    one that was never entered (the client vanished between the view returning and the body
    starting) still ABORTs its engine request and releases its lease."""

    async def _send_response(self, send: Any, response: Any) -> None:
        body = getattr(response, "response", None)
        if isinstance(body, StreamBody):
            extensions = self.scope.get("extensions") or {}
            body.attach(DirectWriter.of(extensions.get(SERVER_SEND_KEY)))
        try:
            await super()._send_response(send, response)
        finally:
            if isinstance(body, StreamBody):
                with trio.CancelScope(shield=True):  # its ABORT send is time-bounded
                    await body.release()


def _current() -> Request:
    return cast(Request, request._get_current_object())  # type: ignore[attr-defined]


def _view(route: Route) -> Callable[[], Awaitable[Response]]:
    """The Quart view of an inference route (it reads Quart's current request)."""

    async def view() -> Response:
        return await route(_current())

    return view


def _response_not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"No response with id '{response_id}' is stored (not stored, evicted, deleted, or "
        "stored by another frontend process).",
        param="response_id",
        code="not_found",
    )


def gateway_of(app: QuartTrio) -> Gateway:
    """The :class:`~smg_trio.gateway.http.call.Gateway` of an app made by :func:`create_app`."""
    return cast(Gateway, app.extensions[GATEWAY_KEY])


def create_app(
    backend: GatewayBackend,
    config: GatewayHttpConfig | None = None,
    *,
    metrics: GatewayMetrics | None = None,
    operations: Sequence[Operation] = (),
    tracing: Tracing | None = None,
    tenants: TenantGate | None = None,
) -> QuartTrio:
    """Build the HTTP front for ``backend``.

    Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
    ``GET /v1/models/<id>``, ``GET /health``, ``GET /liveness``, ``GET /readiness``,
    ``GET /metrics``, ``GET /openapi.json``. Every error is an OpenAI envelope with ``x-request-id``. ``metrics``
    defaults to a fresh :class:`GatewayMetrics` on its own registry. ``operations``: the routes
    the caller mounts on the app itself (``serve``'s admin API), documented in
    ``/openapi.json`` too. ``tracing``: the request spans' tracer (its ``run`` is the
    caller's to start). ``tenants``: the tenants' keys and limits. Raises ``ValueError`` for
    an unknown ``config.reasoning_parser``.
    """
    config = config or GatewayHttpConfig()
    if config.reasoning_parser is not None:
        get_reasoning_format(config.reasoning_parser)  # ValueError listing the names
    metrics = metrics or GatewayMetrics()
    gw = Gateway(backend, config, metrics, tracing, tenants)

    app = QuartTrio("smg_trio.gateway", static_folder=None)
    app.asgi_http_class = _Connection
    app.config.update(
        RESPONSE_TIMEOUT=None,  # streams last as long as generation does
        BODY_TIMEOUT=config.body_timeout_s,
        MAX_CONTENT_LENGTH=config.max_body_bytes,
    )
    app.extensions[GATEWAY_KEY] = gw

    # background: true responses run in the app's nursery, at most as many as are stored
    size = config.responses_store_size
    background = (
        BackgroundResponses(lambda: getattr(app, "nursery", None), size) if size > 0 else None
    )
    routes = inference_routes(gw, background)

    async def send_response(scope: Any, send: Any, response: Response) -> None:
        await _Connection(app, scope)._send_response(send, response)

    # The hot routes skip Quart's per-request machinery; Quart views of the same routes serve
    # what the middleware does not take (e.g. the app mounted under a root path).
    def with_cors(inner: Any) -> Cors:
        return Cors(
            inner,
            config.allowed_origins,
            config.allowed_methods,
            config.allowed_headers,
            config.allow_credentials,
        )

    # With origins allowed every request passes the CORS layer; with none (the default) only
    # what reaches Quart does (a preflight is an OPTIONS: refused as vLLM refuses it), and
    # the hot routes have no CORS layer on their path.
    origins = bool(config.allowed_origins)
    hot = InferenceRoutes(
        app.asgi_app if origins else with_cors(app.asgi_app),
        routes,
        send_response,
        max_body=config.max_body_bytes,
        body_timeout_s=config.body_timeout_s,
    )
    guarded = RequestGuard(hot)
    app.asgi_app = with_cors(guarded) if origins else guarded  # type: ignore[assignment,method-assign]

    for path, route in routes.items():
        app.add_url_rule(path, path, _view(route), methods=["POST"])

    def authed_json(answer: Callable[[], bytes]) -> Response:
        """A GET under ``--api-key``: 200 with ``answer()``, or the envelope of the
        ``ApiError`` that auth or ``answer`` raises; ``x-request-id`` on both."""
        req = _current()
        rid = gw.request_id(req)
        try:
            gw.check_auth(req)
            return json_response(200, answer(), rid)
        except ApiError as exc:
            return json_response(exc.status, exc.body(), rid)

    @app.get("/v1/responses/<response_id>")
    async def get_response(response_id: str) -> Response:
        def stored() -> bytes:
            entry = gw.responses.get(response_id)
            if entry is None:
                raise _response_not_found(response_id)
            return entry.response_json

        req = _current()
        if req.args.get("stream", "").lower() not in ("true", "1"):
            return authed_json(stored)
        rid = gw.request_id(req)
        try:  # vLLM's background stream, from after ``starting_after``
            gw.check_auth(req)
            stored()
            return event_log_response(
                *background_log(background, response_id, req.args.get("starting_after")), rid
            )
        except ApiError as exc:
            return json_response(exc.status, exc.body(), rid)

    @app.post("/v1/responses/<response_id>/cancel")
    async def cancel_response(response_id: str) -> Response:
        req = _current()
        rid = gw.request_id(req)
        try:
            gw.check_auth(req)
            entry = gw.responses.get(response_id)
            if entry is None:
                raise _response_not_found(response_id)
            if entry.response().get("status") not in ("queued", "in_progress"):
                raise ApiError(  # vLLM 0.32's words
                    400, "Cannot cancel a synchronous response.", param="response_id"
                )
            ended = background.cancel(response_id) if background is not None else None
            if ended is None:
                raise ApiError(
                    409,
                    "the response runs in another frontend process (or is ending); poll it",
                    param="response_id",
                    code="not_running_here",
                )
            await ended.wait()  # the engine was told ABORT and the state is stored
            entry = gw.responses.get(response_id)
            if entry is None:
                raise _response_not_found(response_id)
            return json_response(200, entry.response_json, rid)
        except ApiError as exc:
            return json_response(exc.status, exc.body(), rid)

    @app.delete("/v1/responses/<response_id>")
    async def delete_response(response_id: str) -> Response:
        def deleted() -> bytes:
            if not gw.responses.delete(response_id):
                raise _response_not_found(response_id)
            return msgspec.json.encode(ResponseDeleted(response_id))

        return authed_json(deleted)

    @app.get("/v1/models")
    async def models() -> Response:
        return authed_json(lambda: model_list(backend))

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        return authed_json(lambda: model_detail(backend, model_id))

    def _probe(result: tuple[int, bytes], content_type: str = "text/plain") -> Response:
        status, body = result
        return Response(body, status=status, content_type=content_type)

    @app.get("/liveness")
    async def live() -> Response:
        return _probe(liveness())

    @app.get("/health")
    async def healthz() -> Response:
        return _probe(health(backend))

    @app.route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:  # vLLM's SageMaker probe: /health's answer
        return _probe(health(backend))

    @app.get("/readiness")
    async def ready() -> Response:
        return _probe(readiness(backend), JSON_TYPE)

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, status=200, content_type=content_type)

    openapi_body = msgspec.json.encode(
        openapi_document((*OPERATIONS, *operations), version=__version__)
    )  # built once

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return Response(openapi_body, status=200, content_type=JSON_TYPE)

    version_body = msgspec.json.encode(VersionResponse(__version__))

    @app.get("/version")
    async def version() -> Response:
        return Response(version_body, status=200, content_type=JSON_TYPE)

    served_list: list[str] = []

    def served_endpoints() -> str:
        if not served_list:
            rules = {
                (method, rule.rule.replace("<path:", "{").replace("<", "{").replace(">", "}"))
                for rule in app.url_map.iter_rules()
                for method in rule.methods or ()
                if method in ("GET", "POST", "DELETE")
            }
            served_list.extend(f"{m} {p}" for p, m in sorted((p, m) for m, p in rules))
        return ", ".join(served_list)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        err = gw.http_error(exc)
        status = exc.code or 500
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, err.detail.code)
        message = err.detail.message
        if status == 404:
            path = _current().path
            known = next(
                (p for p in UNSERVED_PREFIXES if path == p or path.startswith(p + "/")), None
            )
            if known is not None:
                message = (
                    f"{known} is not served by this gateway (smg_trio serves text "
                    f"generation); served endpoints: {served_endpoints()}"
                )
            else:
                message = f"no endpoint {path!r}; served endpoints: {served_endpoints()}"
        err = ApiError(status, message, code=code)
        path = _current().path
        anthropic = path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")
        body = anthropic_envelope(err) if anthropic else err.body()
        resp = json_response(status, body, gw.request_id(_current()))
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            resp.headers["Allow"] = ", ".join(sorted(exc.valid_methods))  # RFC 9110 15.5.6
        return resp

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        err = to_api_error(exc)
        return json_response(err.status, err.body())

    return app


def listen_backlog(path: str = SOMAXCONN_PATH) -> int:
    """The listen backlog: the kernel's ``somaxconn`` (hypercorn's default, 100, drops
    connections of a burst that the gateway could serve), else :data:`DEFAULT_BACKLOG`."""
    try:
        with open(path, encoding="ascii") as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT_BACKLOG
    return value if value > 0 else DEFAULT_BACKLOG


def hyper_config(
    host: str,
    port: int,
    graceful_timeout_s: float,
    *,
    enable_http2: bool = False,
    bind: str | None = None,
) -> HyperConfig:
    """Hypercorn's config for :func:`serve_http`; ``bind`` (hypercorn's spelling: ``fd://N``,
    ``unix:PATH``) replaces ``host:port``."""
    cfg = HyperConfig()
    setattr(cfg, HTTP2_ENABLED_ATTR, enable_http2)
    cfg.bind = [bind or (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    cfg.graceful_timeout = graceful_timeout_s
    cfg.backlog = listen_backlog()
    return cfg


async def serve_http(
    app: QuartTrio,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    graceful_timeout_s: float = 30.0,
    bind: str | None = None,
    fast_http1: bool | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with smg_trio's hypercorn server
    (:func:`smg_trio.gateway.server.serve.serve`: hypercorn's trio worker, its fixes applied to
    this server only) on ``host:port`` (port 0: any free port).

    For ``binds = await nursery.start(serve_http, app, host, port)``: ``binds`` is the list of
    bound base URLs, e.g. ``["http://127.0.0.1:41234"]``. Runs until cancelled or until
    ``shutdown_trigger()`` returns; then in-flight requests get ``graceful_timeout_s`` seconds
    to finish. Hypercorn logs through the ``hypercorn.error`` logger; no access log. A write
    blocked for the app's ``write_timeout_s`` drops its connection; the listen backlog is
    :func:`listen_backlog`. ``bind`` serves an inherited listening socket (``fd://N``, as
    ``--api-server-count`` frontends do) or a unix socket (``unix:PATH``) instead.
    ``fast_http1`` overrides the app's ``GatewayHttpConfig.fast_http1``.
    """
    gw = getattr(app, "extensions", {}).get(GATEWAY_KEY)  # a bare ASGI app has none
    enable_http2 = gw.config.enable_http2 if isinstance(gw, Gateway) else False
    if fast_http1 is None:  # the app's setting (the fast path for a bare ASGI app)
        fast_http1 = gw.config.fast_http1 if isinstance(gw, Gateway) else True
    cfg = hyper_config(host, port, graceful_timeout_s, enable_http2=enable_http2, bind=bind)
    write_timeout_s = (
        gw.config.write_timeout_s if isinstance(gw, Gateway) else DEFAULT_WRITE_TIMEOUT_S
    )
    await serve(
        ShieldedFinish(app),  # type: ignore[arg-type]
        cfg,
        write_timeout_s=write_timeout_s,
        fast_http1=fast_http1,
        shutdown_trigger=shutdown_trigger,
        task_status=task_status,
    )
