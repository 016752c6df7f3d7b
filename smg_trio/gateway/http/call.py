"""Per-app state (``Gateway``) and per-request bookkeeping (``RequestCall``): request ids,
auth, body parsing, model lookup, the worker lease, responses and metrics."""

from __future__ import annotations

import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Final, Literal, TypeVar

import attrs
import msgspec
import trio
from quart import Request, Response
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from smg_trio.backend import GatewayBackend, NoWorkerAvailable, ServedModel, WorkerLease
from smg_trio.connector.client import EngineClient
from smg_trio.errors import EngineError
from smg_trio.exc_groups import is_cancellation
from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.admission import RETRY_AFTER_S, AdmissionGate
from smg_trio.gateway.http.budget import BodyBudget, decoded_bytes
from smg_trio.gateway.http.metrics import FastHistogram, GatewayMetrics, ModelStats
from smg_trio.gateway.http.tenants import OTHER, TenantCollector
from smg_trio.gateway.openai.api import ResponseIds
from smg_trio.gateway.openai.errors import (
    ApiError,
    EngineRequestFailed,
    Envelope,
    model_not_found,
    to_api_error,
)
from smg_trio.gateway.openai.fanout import SubRequest
from smg_trio.gateway.openai.responses_shared import SharedResponseStore
from smg_trio.gateway.openai.responses_store import ResponseStore, ResponseStoreLike
from smg_trio.gateway.openai.schemas import decode_body
from smg_trio.routing.cache_aware import RouteRequest

__all__ = [
    "BODY_RESERVE_STEP",
    "JSON_TYPE",
    "SSE_HEADERS",
    "HUGE_RENDER_TOKENS",
    "HUGE_TOKENIZER_THREADS",
    "HUGE_TOKENIZE_BYTES",
    "TOKENIZER_THREADS",
    "TOKENIZE_OFFLOAD_BYTES",
    "Gateway",
    "RequestCall",
    "bearer_matches",
    "json_response",
    "new_response_id",
]

if TYPE_CHECKING:
    from smg_trio.gateway.http.fastroute import AsgiRequest
    from smg_trio.gateway.http.tenants import Tenant, TenantGate
    from smg_trio.gateway.http.tracing import RequestSpan, Tracing

log = logging.getLogger(__name__)

T = TypeVar("T")

JSON_TYPE = "application/json"
#: The request header naming a session for sticky ``cache_aware`` routing.
SESSION_HEADER: Final = "x-session-id"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_MAX_REQUEST_ID = 256
#: Error codes whose unfinished engine requests count as ``finished_reason="abort"`` in
#: ``vllm:request_success_total`` (the request was stopped, not failed); others: ``"error"``.
_ABORT_CODES = frozenset({None, "client_disconnected", "engine_aborted", "draining"})

#: Request bodies from this size on are rendered and tokenized in a worker thread (HF
#: ``tokenizers`` releases the GIL while it encodes); smaller ones inline, where a thread
#: round trip would cost more than the work. Measured in docs/performance.md: an 8 KiB prompt
#: renders and encodes in about 3-5 ms, a 1 MiB one in about 1 s.
TOKENIZE_OFFLOAD_BYTES: Final = 8 * 1024
#: Bytes of the body budget a request reserves before its body arrives, and in steps of which
#: its reservation grows as the body does: an upload holds what it sent (plus one step), not
#: what it declared, so slow clients that declare large bodies cannot hold the budget.
BODY_RESERVE_STEP: Final = 64 * 1024
#: A whole (non-streamed) response of this many completion tokens or more is built and
#: encoded in a worker thread: with ``n`` choices and ``top_logprobs`` it can be tens of MB.
RENDER_OFFLOAD_TOKENS: Final = 2048
#: Worker threads tokenizing large prompts at once (more wait), which bounds their memory too.
TOKENIZER_THREADS: Final = 4
#: Request bodies from this size on are *huge*: their encode may take seconds (about 0.5 s a
#: MiB, more for text that is one pre-token), and they take at most
#: :data:`HUGE_TOKENIZER_THREADS` of the threads, so that the rest always serve the others.
HUGE_TOKENIZE_BYTES: Final = 1024 * 1024
HUGE_TOKENIZER_THREADS: Final = TOKENIZER_THREADS // 2
#: A whole response of this many completion tokens or more (``n`` choices with logprobs: a
#: second or more to build and encode) takes the huge requests' share of the threads too.
HUGE_RENDER_TOKENS: Final = 16 * RENDER_OFFLOAD_TOKENS


def json_response(
    status: int,
    body: bytes,
    request_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A JSON response, with ``x-request-id`` when given (and ``headers``)."""
    resp = Response(body, status=status, content_type=JSON_TYPE)
    if request_id is not None:
        resp.headers["x-request-id"] = request_id
    if headers:
        resp.headers.update(headers)
    return resp


def bearer_matches(authorization: str, key: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (scheme case-insensitive,
    as RFC 7235 says; compared in constant time)."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)


def _random_id() -> str:
    return secrets.token_hex(16)


def new_response_id(prefix: str) -> str:
    """A response id the server makes: ``prefix`` and 50 random hex digits (200 bits, the
    shape of OpenAI's ``resp_...`` ids)."""
    return f"{prefix}{secrets.token_hex(25)}"


class Gateway:
    """What the handlers share: the backend seam, config, metrics, and the source of engine
    request ids (see :meth:`engine_id`: a repeated ``x-request-id`` never collides on the
    engine)."""

    def __init__(
        self,
        backend: GatewayBackend,
        config: GatewayHttpConfig,
        metrics: GatewayMetrics,
        tracing: Tracing | None = None,
        tenants: TenantGate | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        self.metrics = metrics
        #: The request spans' tracer (``--otlp-traces-endpoint``); ``None``: tracing is off.
        self.tracing = tracing
        #: The tenants' keys and limits (``--api-keys-file``); ``None``: no tenants.
        self.tenants = tenants
        self.tenant_metrics: TenantCollector | None = None
        if tenants is not None:
            self.tenant_metrics = TenantCollector(tenants, tenants.table.names)
            metrics.registry.register(self.tenant_metrics)
        # vLLM's convention (0.10+): the engine id is the external id plus a unique suffix.
        self._id_nonce = secrets.token_hex(3)
        self._id_seq = itertools.count()
        self._api_key = None if config.api_key is None else config.api_key.encode()
        self.admission = AdmissionGate(
            config.max_concurrent_requests, config.queue_size, config.queue_timeout_s
        )
        self.tokenizer_limiter = trio.CapacityLimiter(TOKENIZER_THREADS)
        #: The share of those threads that huge requests may hold (see :meth:`RequestCall.tokenize`).
        self.huge_tokenizer_limiter = trio.CapacityLimiter(HUGE_TOKENIZER_THREADS)
        #: The bytes the requests in flight hold, bodies and decoded: see :meth:`RequestCall.read_body`.
        self.body_budget = BodyBudget(config.max_body_bytes_in_flight)
        #: The Responses API's stored responses (in memory, or shared by every frontend
        #: through ``responses_store_path``: see docs/responses.md).
        self.responses: ResponseStoreLike = (
            ResponseStore(config.responses_store_size, config.responses_store_max_bytes)
            if config.responses_store_path is None
            else SharedResponseStore(
                config.responses_store_path,
                config.responses_store_size,
                config.responses_store_max_bytes,
            )
        )
        metrics.watch_admission(self.admission)
        metrics.watch_backend(backend)

    def http_error(self, exc: HTTPException) -> ApiError:
        """The API error for the web framework's own: a body over ``max_body_bytes`` is 413
        ``request_too_large`` naming the limit; others keep their status and text (no code)."""
        if exc.code == 413:
            limit = self.config.max_body_bytes
            return ApiError(
                413,
                f"the request body is larger than this gateway's limit of {limit} bytes",
                code="request_too_large",
            )
        return ApiError(exc.code or 400, exc.description or exc.name)

    def request_id(self, request: Request | AsgiRequest) -> str:
        """The first configured request-id header present (printable ASCII without spaces,
        <= 256 chars), else a fresh 32-hex-digit id."""
        headers = request.headers
        for name in self.config.request_id_headers:
            value = headers.get(name)
            if (
                value
                and len(value) <= _MAX_REQUEST_ID
                and value.isascii()
                and value.isprintable()
                and " " not in value
            ):
                return str(value)
        return _random_id()

    def check_auth(
        self, request: Request | AsgiRequest, *, x_api_key: bool = False
    ) -> Tenant | None:
        """401 unless the bearer token matches the configured API key or a tenant's key (if
        any is configured); with ``x_api_key`` (Anthropic's routes) an ``x-api-key`` header
        holding a key also does. Returns the tenant whose key it was (``None``: the shared
        key, or no auth configured). Keys are compared in constant time."""
        tenants = self.tenants
        if self._api_key is None and tenants is None:
            return None
        headers = request.headers
        if x_api_key:
            given = headers.get("x-api-key")
            if given is not None:
                found = self._key_of(given.strip().encode())
                if found is not False:
                    return found
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            found = self._key_of(token.strip().encode())
            if found is not False:
                return found
        raise ApiError(
            401,
            "Incorrect API key provided.",
            code="invalid_api_key",
            error_type="authentication_error",
        )

    def _key_of(self, presented: bytes) -> Tenant | Literal[False] | None:
        """``None`` for the shared ``--api-key``, the tenant of a tenant key, else False."""
        if self._api_key is not None and hmac.compare_digest(presented, self._api_key):
            return None
        if self.tenants is not None:
            tenant = self.tenants.table.lookup(presented)
            if tenant is not None:
                return tenant
        return False

    async def resolve_model(self, name: str | None) -> ServedModel:
        """Exact, case- and space-sensitive lookup. A missing ``model`` picks the only known
        model (vLLM's rule) and is a 400 when several are known. Unknown (never registered,
        or gone longer than the grace period): 404. A known model whose tokenizer is still
        loading (its first worker registers) waits for a ready worker, as a lease does."""
        backend = self.backend
        if name is None:
            known = backend.known_models()
            if len(known) != 1:
                raise ApiError(
                    400, "'model' is required", param="model", code="missing_required_parameter"
                )
            name = known[0]
        served = backend.get_model(name)
        if served is None:
            adapter = backend.loras.get(name)
            if adapter is not None:  # a LoRA adapter: its base model's engines serve it
                base = await self.resolve_model(adapter.base_model)
                return attrs.evolve(base, model_id=adapter.name, lora=adapter)
            if name not in backend.known_models():
                raise model_not_found(name)
            await backend.wait_for_worker(name)  # the tokenizer loads before it is ready
            served = backend.get_model(name)
            if served is None:
                raise NoWorkerAvailable(f"model {name!r} is not ready")
        return served

    def engine_id(self, response_id: str) -> str:
        """The engine id base ``f"{response_id}-{token}"``, unique whatever clients send.

        ``token`` is ``{nonce}_{seq}``: this gateway's random nonce and a sequence number that
        is never reused, so it has no ``-`` and is never all digits. Sub-requests append
        ``-{index}`` (:func:`~smg_trio.gateway.openai.fanout.sub_request_id`). The token is then
        recoverable from any wire id (the last ``-`` component, or the one before it when the
        last is all digits), so two requests never share a wire id, however their client ids
        look (``1`` and ``1-0``, one id from many clients, ids shaped like sub-request ids).
        The nonce keeps gateways that share an engine apart.
        """
        return f"{response_id}-{self._id_nonce}_{next(self._id_seq)}"


def _over_budget(budget: BodyBudget) -> ApiError:
    return ApiError(
        429,
        f"the requests in flight hold this gateway's budget of {budget.limit} bytes of "
        "request bodies; retry later",
        code="too_many_requests",
        error_type="rate_limit_error",
        retry_after=RETRY_AFTER_S,
    )


class RequestCall:
    """One HTTP request's lifetime: ids, timing, lease and the final metrics record.

    :meth:`close` runs exactly once (the handler's ``finally`` for JSON responses, the
    stream body's exit for SSE): it releases the lease and records metrics.
    """

    def __init__(
        self,
        gw: Gateway,
        request: Request | AsgiRequest,
        endpoint: str,
        id_prefix: str,
        *,
        envelope: Envelope | None = None,
        x_api_key: bool = False,
        server_ids: bool = False,
    ) -> None:
        self.gw = gw
        #: The error body of this API (OpenAI's unless it has its own).
        self.envelope: Envelope = envelope or ApiError.body
        self._x_api_key = x_api_key
        self.endpoint = endpoint
        self.request = request
        self.request_id = gw.request_id(request)
        rid = self.request_id
        #: The client's request id under the API's prefix: the base of the engine ids, so a
        #: client's id correlates in logs and on the engine; never the id of a stored object.
        self.client_ref = rid if rid.startswith(id_prefix) else f"{id_prefix}{rid}"
        #: The response's ``id``. An API that stores its responses (``server_ids``) gets one
        #: the server makes, random and unguessable, as OpenAI's are: a client's
        #: ``x-request-id`` chose it before, so a second client sending the same header
        #: replaced a stored conversation (issue 28 item 4).
        self.response_id = new_response_id(id_prefix) if server_ids else self.client_ref
        self.created = int(time.time())
        self.start = time.perf_counter()
        self.first_batch: float | None = None
        self._last_batch: float | None = None
        #: The leased model's ``vllm:*`` stats, and its inter-token histogram (one choice).
        self._model: ModelStats | None = None
        self._itl: FastHistogram | None = None
        self.engine_id: str | None = None
        self.prompt_tokens = 0
        self.subs: Sequence[SubRequest] = ()
        self._lease_cm: AbstractContextManager[WorkerLease] | None = None
        #: The LoRA adapter this request uses, counted in flight until :meth:`close`.
        self._adapter: str | None = None
        self._adapter_started = False
        self._lease: WorkerLease | None = None
        #: What ``cache_aware`` routes by (the prompt, the session key); set by :meth:`lease`.
        self._route: RouteRequest | None = None
        self._closed = False
        self._admitted = False
        #: Size of the request body, which decides whether tokenizing goes to a thread.
        self.body_bytes = 0
        #: The tenant whose key authenticated the request (its metrics label), and the
        #: tenant whose slot the request holds until :meth:`close`.
        self.tenant_name: str = OTHER
        self._tenant_held: Tenant | None = None
        #: This request's span (``None`` unless tracing is on).
        self.span: RequestSpan | None = (
            None if gw.tracing is None else gw.tracing.start(request.headers, endpoint, rid)
        )
        gw.metrics.in_flight.inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s started (Content-Type %r)", rid, endpoint, request.content_type)

    # -- steps ---------------------------------------------------------------------------

    async def read_body(self, type_: type[T]) -> T:
        """Auth, then ``Content-Type`` (415 unless ``application/json``, parameters such as
        ``charset`` allowed), then a slot under ``--max-concurrent-requests`` or a place in
        its bounded queue (429 when neither), then the body (413 too large, 408 too slow),
        decoded into ``type_`` (400 naming the field), then, queued, the slot: waiters are
        served by the body's ``priority`` (lower first), then arrival (429 when none frees in
        time; see :class:`AdmissionGate`). The slot or place comes before the body, so the
        bodies held in memory are bounded by the admission limits (an upload is bounded in
        time by the body timeout). While draining: 503 before the body is read, so a stopping gateway spends
        nothing (reading, tokenizing) on requests it will refuse."""
        tenant = self.gw.check_auth(self.request, x_api_key=self._x_api_key)
        if tenant is not None:
            self.tenant_name = tenant.name
            if self.span is not None:
                self.span.set("smg.tenant", tenant.name)
        if self.gw.backend.draining:
            raise ApiError(503, "the gateway is shutting down", code="draining")
        mime = (self.request.mimetype or "").lower()
        if mime != JSON_TYPE and not (mime.startswith("application/") and mime.endswith("+json")):
            raise ApiError(
                415,
                f"Unsupported Content-Type {self.request.content_type or '(none)'!r}: "
                "only application/json is accepted",
                code="unsupported_media_type",
            )
        if tenant is not None and self.gw.tenants is not None:
            self.gw.tenants.enter(tenant)  # 429 over the tenant's limits
            self._tenant_held = tenant
        gate = self.gw.admission
        gate.arrive(self)  # a slot, or a bounded queue place (else 429)
        self._admitted = True
        length = self.request.headers.get("content-length")
        if not gate.may_read_body(self, int(length) if length and length.isdigit() else None):
            await self._wait_turn(0)  # a body over the queue's budget: unread, priority 0
            return await self._read_decode(type_)
        body = await self._read_decode(type_)
        # the wait for a slot is ordered by the body's priority (vLLM's: lower first)
        await self._wait_turn(getattr(body, "priority", None) or 0)
        return body

    async def _wait_turn(self, priority: int) -> None:
        """The admission slot (see :meth:`read_body`); the wait is the span's queue time."""
        span = self.span
        if span is None:
            await self.gw.admission.wait_turn(self, priority)
            return
        queued = time.perf_counter()
        await self.gw.admission.wait_turn(self, priority)
        span.admitted(time.perf_counter() - queued)

    async def _read_decode(self, type_: type[T]) -> T:
        await self._reserve_body()
        try:
            data = await self._receive_body()
        except HTTPException as exc:
            raise self.gw.http_error(exc) from None
        self.body_bytes = len(data)
        self._reserve_decoded(data)
        return decode_body(data, type_)

    def hold_adapter(self, served: ServedModel) -> None:
        """Count this request as using ``served``'s LoRA adapter (if any) until :meth:`close`:
        an adapter in use is not unloaded."""
        if served.lora is not None and self._adapter is None:
            self._adapter = served.lora.name
            self.gw.backend.loras.acquire(self._adapter)

    async def _reserve_body(self) -> None:
        """Reserve the body's declared length (``max_body_bytes`` when it declares none) in
        the gateway's :class:`BodyBudget`, waiting up to ``queue_timeout_s`` for room (429
        past it). Held until :meth:`close`."""
        config = self.gw.config
        budget = self.gw.body_budget
        length = self.request.headers.get("content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > config.max_body_bytes:
            return  # refused with 413 by the read, before anything is held
        nbytes = min(
            config.max_body_bytes if declared is None else declared,
            budget.limit,
            BODY_RESERVE_STEP,
        )
        if budget.try_reserve(self, nbytes):
            return  # the common case: no schedule point, as the admission gate's
        with trio.move_on_after(config.queue_timeout_s):
            await budget.reserve(self, nbytes)
            return
        raise _over_budget(budget)

    async def _receive_body(self) -> bytes:
        """The body, read as it arrives within ``body_timeout_s`` (408), at most
        ``max_body_bytes`` (413), the reservation growing with it (:meth:`_grow`)."""
        request = self.request
        if not isinstance(request, Request):
            return await request.get_data(progress=self._grow)
        limit = self.gw.config.max_body_bytes
        timeout = request.body_timeout
        buf = bytearray()
        with trio.move_on_after(float("inf") if timeout is None else timeout) as scope:
            # iterated, Quart's body no longer checks its size: done here
            async for chunk in request.body:
                buf += chunk
                if len(buf) > limit:
                    raise RequestEntityTooLarge()
                self._grow(len(buf))
        if scope.cancelled_caught:
            raise RequestTimeout()
        return bytes(buf)

    def _grow(self, size: int) -> None:
        """``size`` bytes of the body have arrived: keep the reservation ahead of them by
        :data:`BODY_RESERVE_STEP` (up to the declared length), only while the budget has room
        now (else 429: a request holding bytes never waits for more; 413 past the whole
        budget)."""
        budget = self.gw.body_budget
        if size <= budget.reserved(self):
            return
        if size > budget.limit:
            raise self._too_large(size)
        length = self.request.headers.get("content-length")
        cap = int(length) if length is not None and length.isdigit() else size
        step = min(max(cap, size), size + BODY_RESERVE_STEP, budget.limit)
        if not budget.try_resize(self, step) and not budget.try_resize(self, size):
            raise _over_budget(budget)

    def _too_large(self, need: int) -> ApiError:
        return ApiError(
            413,
            f"the request body would take about {need} bytes decoded, more than this "
            f"gateway's budget of {self.gw.body_budget.limit} bytes for the requests in flight",
            code="request_too_large",
        )

    def _reserve_decoded(self, data: bytes) -> None:
        """Make the reservation what the body and its decoded form may take
        (:func:`decoded_bytes`) before decoding it: 413 when that is more than the whole
        budget, 429 when the budget has no room for it now (a request holding bytes never
        waits for more). A body that declared no length gives back the rest of the
        ``max_body_bytes`` it reserved."""
        budget = self.gw.body_budget
        need = len(data) + decoded_bytes(data)
        if need > budget.limit:
            raise self._too_large(need)
        if not budget.try_resize(self, need):
            raise _over_budget(budget)

    async def tokenize(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (chat-template rendering, encoding) inline for a small request, or in a
        worker thread from :data:`TOKENIZE_OFFLOAD_BYTES` of body on, so that the event loop
        never waits for it. The thread is not abandoned on cancellation (structured
        concurrency): a client that goes away waits for at most one encode of a prompt that
        can fit the context (larger ones are refused before encoding). A huge request (from
        :data:`HUGE_TOKENIZE_BYTES` of body) first takes a slot of the huge ones' share, so
        that they hold at most :data:`HUGE_TOKENIZER_THREADS` threads and the others never
        wait behind them for more than the rest."""
        if self.body_bytes < TOKENIZE_OFFLOAD_BYTES:
            out = fn()
        else:
            gw = self.gw
            if self.body_bytes < HUGE_TOKENIZE_BYTES:
                out = await trio.to_thread.run_sync(fn, limiter=gw.tokenizer_limiter)
            else:
                async with gw.huge_tokenizer_limiter:
                    out = await trio.to_thread.run_sync(fn, limiter=gw.tokenizer_limiter)
        if self.span is not None:
            self.span.event("tokenized")
        return out

    def reserve_ids(self) -> ResponseIds:
        """The response's ids, with a fresh engine request id base: the response id plus a
        gateway-unique suffix."""
        self.engine_id = self.gw.engine_id(self.client_ref)
        return ResponseIds(self.response_id, self.created, self.engine_id)

    def route_of(self, body: object) -> RouteRequest | None:
        """What ``cache_aware`` routes this request by: the first choice's prompt, its LoRA
        adapter (the KV blocks' chain seed; the LoRA affinity prefers the workers holding it),
        its ``cache_salt`` (an extra key of the first block, as the engine's), and the session key (the ``x-session-id`` header, else the body's ``prompt_cache_key``, else
        its ``user``), which makes the routing sticky."""
        if not self.subs:
            return None
        key = self.request.headers.get(SESSION_HEADER) or None
        for name in ("prompt_cache_key", "user"):
            if key is not None:
                break
            value = getattr(body, name, None)
            key = value if isinstance(value, str) and value else None
        first = self.subs[0].request
        return RouteRequest(
            first.prompt_token_ids,
            lora_name=self._adapter,
            cache_salt=first.cache_salt,
            session_key=key,
        )

    def _hint_rank(self, lease: WorkerLease) -> None:
        """Hand the policy's DP rank to the engine requests (the connector takes it unless
        the client pinned ``data_parallel_rank``)."""
        for sub in self.subs:
            sub.request.rank_hint = lease.rank_hint

    async def lease(self, model_id: str, route: RouteRequest | None = None) -> WorkerLease:
        """Take a worker for this request, released by :meth:`close`. With none ready (a
        rolling update, a restarting engine), wait up to the backend's bound for one; then
        503 with ``Retry-After``. ``route``: see :meth:`route_of`."""
        backend = self.gw.backend
        await backend.wait_for_worker(model_id)
        if backend.draining:
            raise ApiError(503, "the gateway is shutting down", code="draining")
        self._route = route
        cm = backend.lease(model_id, (), route)
        lease = cm.__enter__()
        self._lease_cm, self._lease = cm, lease
        self._hint_rank(lease)
        metrics = self.gw.metrics
        metrics.track_worker(lease.worker_id, lease.client)
        self._model = metrics.model(model_id)
        if len(self.subs) == 1:  # n>1 interleaves its choices' batches: no per-choice ITL
            self._itl = self._model.itl
        if self.span is not None:  # also puts its context in the engine requests
            policy = getattr(backend, "policy", None)
            self.span.routed(model_id, lease.worker_id, getattr(policy, "name", ""), self.subs)
        return lease

    async def run_with_retry(
        self, model_id: str, client: EngineClient, run: Callable[[EngineClient], Awaitable[None]]
    ) -> None:
        """``await run(client)``. When the engine rejects the request with a retryable error
        (a paused engine, vLLM 0.33+) before any choice produced output, run it once more on
        another ready worker; this call's lease moves there. Otherwise, and when there is no
        other worker, the error stands (503 with ``Retry-After``). The only retry point."""
        try:
            await run(client)
        except EngineRequestFailed as exc:
            if not exc.retryable or any(
                s.pipeline.completion_tokens or s.pipeline.done for s in self.subs
            ):
                raise
            other = self._lease_elsewhere(model_id)
            if other is None:
                raise
            log.info("%s: %s; retrying on worker %s", self.request_id, exc, other.worker_id)
            if self.span is not None:
                self.span.event("retried", {"smg.worker.id": other.worker_id})
            await run(other.client)

    def _lease_elsewhere(self, model_id: str) -> WorkerLease | None:
        """Swap this call's lease for one on a different live worker, or return ``None``."""
        old_cm, old = self._lease_cm, self._lease
        assert old_cm is not None
        assert old is not None
        cm = self.gw.backend.lease(model_id, (old.worker_id,), self._route)
        try:
            lease = cm.__enter__()
        except NoWorkerAvailable:
            return None
        self._lease_cm, self._lease = cm, lease
        self._hint_rank(lease)
        old_cm.__exit__(None, None, None)
        self.gw.metrics.track_worker(lease.worker_id, lease.client)
        return lease

    def on_batch(self) -> None:
        """Called per delivery of engine outputs to the request (one or more steps taken
        in one wake-up): marks the first token's time, and observes the time since the
        previous delivery (``vllm:inter_token_latency_seconds``, one choice only): the gap
        the client sees."""
        now = time.perf_counter()
        last, self._last_batch = self._last_batch, now
        if last is None:
            self.first_batch = now
            if self._adapter is not None and not self._adapter_started:
                self._adapter_started = True
                self.gw.backend.loras.start(self._adapter)
            if self.span is not None:
                self.span.event("first_token")
        elif self._itl is not None:
            self._itl.observe(now - last)

    # -- endings -------------------------------------------------------------------------

    def error_response(self, exc: BaseException) -> Response:
        """The JSON error response for ``exc`` (closes the call)."""
        err = to_api_error(exc)
        self.close(err.status, err.detail.code, exc)
        return json_response(err.status, self.envelope(err), self.request_id, err.headers)

    def ok_response(self, payload: msgspec.Struct) -> Response:
        """A 200 JSON response (closes the call)."""
        self.close(200)
        return json_response(200, msgspec.json.encode(payload), self.request_id)

    async def ok_response_of(self, build: Callable[[], msgspec.Struct]) -> Response:
        """:meth:`ok_response` of ``build()``: built and encoded in a worker thread from
        :data:`RENDER_OFFLOAD_TOKENS` completion tokens on (``n`` choices with logprobs can
        make a response of tens of MB, seconds of Python on the event loop), inline below;
        from :data:`HUGE_RENDER_TOKENS` within the huge requests' share of the threads."""
        completion = sum(s.pipeline.completion_tokens for s in self.subs)
        if completion < RENDER_OFFLOAD_TOKENS:
            return self.ok_response(build())
        gw = self.gw
        share = gw.huge_tokenizer_limiter if completion >= HUGE_RENDER_TOKENS else nullcontext()
        async with share:
            body = await trio.to_thread.run_sync(
                lambda: msgspec.json.encode(build()), limiter=gw.tokenizer_limiter
            )
        self.close(200)
        return json_response(200, body, self.request_id)

    def close(
        self, status: int, error_code: str | None = None, exc: BaseException | None = None
    ) -> None:
        """Release the lease and record metrics; idempotent."""
        if self._closed:
            return
        self._closed = True
        gw = self.gw
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s %s finished: %d %s (tenant %s)%s",
                self.request_id,
                self.endpoint,
                status,
                error_code or "",
                self.tenant_name,
                f" (LoRA adapter {self._adapter!r})" if self._adapter else "",
            )
        gw.metrics.in_flight.dec()
        if self._admitted:
            self._admitted = False
            gw.admission.leave(self)
            gw.body_budget.release(self)
        adapter, self._adapter = self._adapter, None
        if adapter is not None:
            gw.backend.loras.release(adapter, started=self._adapter_started)
        cm, self._lease_cm = self._lease_cm, None
        if cm is not None:
            engine_exc = exc if isinstance(exc, EngineError) else None
            try:
                cm.__exit__(
                    None if engine_exc is None else type(engine_exc),
                    engine_exc,
                    None if engine_exc is None else engine_exc.__traceback__,
                )
            except Exception:
                if engine_exc is None:
                    log.exception("releasing the worker lease failed")
        end = time.perf_counter()
        ttft_s = None if self.first_batch is None else self.first_batch - self.start
        completion_tokens = sum(s.pipeline.completion_tokens for s in self.subs)
        gw.metrics.observe(
            self.endpoint,
            status,
            e2e_s=end - self.start,
            ttft_s=ttft_s,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion_tokens,
            error_code=error_code,
        )
        held, self._tenant_held = self._tenant_held, None
        if held is not None and gw.tenants is not None:
            # the prompt counts once an engine got it (a lease was taken)
            leased = cm is not None
            gw.tenants.leave(held, (self.prompt_tokens if leased else 0) + completion_tokens)
        if gw.tenant_metrics is not None:
            gw.tenant_metrics.finished(
                self.tenant_name, status, self.prompt_tokens, completion_tokens
            )
        span, self.span = self.span, None
        if span is not None:
            span.end(
                status,
                error_code,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=completion_tokens,
                sequences=len(self.subs),
                e2e_s=end - self.start,
                ttft_s=ttft_s,
            )
        model, self._model = self._model, None
        if model is not None:
            first, last = self.first_batch, self._last_batch
            model.finish(
                e2e_s=end - self.start,
                ttft_s=ttft_s,
                decode_s=None if first is None or last is None else last - first,
                prompt_tokens=self.prompt_tokens,
                finish_reasons=[s.pipeline.finish_reason for s in self.subs],
                generation_tokens=completion_tokens,
                unfinished="abort" if error_code in _ABORT_CODES else "error",
            )

    def close_from_exit(self, exc: BaseException | None) -> None:
        """Close from a context exit: a cancellation is the client going away (499)."""
        if exc is None:
            self.close(200)
        elif is_cancellation(exc):
            self.close(499, "client_disconnected")
        else:
            err = to_api_error(exc)
            self.close(err.status, err.detail.code, exc)
