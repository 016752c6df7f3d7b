"""``GatewayHttpConfig``: the HTTP front's limits, auth and request-id settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "DEFAULT_MAX_BODY_BYTES_IN_FLIGHT",
    "DEFAULT_MAX_CONCURRENT_REQUESTS",
    "DEFAULT_MAX_N",
    "DEFAULT_RESPONSES_STORE_MAX_BYTES",
    "DEFAULT_RESPONSES_STORE_SIZE",
    "DEFAULT_MAX_SEQUENCES_PER_REQUEST",
    "DEFAULT_QUEUE_SIZE",
    "DEFAULT_QUEUE_TIMEOUT_S",
    "DEFAULT_WRITE_TIMEOUT_S",
    "REQUEST_TOKENS_CONTEXTS",
    "DEFAULT_REQUEST_ID_HEADERS",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "GatewayHttpConfig",
]

#: smg's default ``--request-id-headers``: the first one present names the request.
DEFAULT_REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
#: Where the gateway listens unless told otherwise (``--host``/``--port``): loopback only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

# The abuse limits' defaults, in one place (the CLI, ``GatewayConfig`` and embedding read
# them from here). See docs/security.md#limits.
#: The largest ``n`` accepted (OpenAI allows 128); the CLI's ``--max-n`` default.
DEFAULT_MAX_N = 16
#: Responses kept in memory for ``GET /v1/responses/{id}`` and ``previous_response_id``
#: (``--responses-store-size``; least recently used evicted first; per process).
DEFAULT_RESPONSES_STORE_SIZE = 1000
#: The Responses store's byte budget (its entries' encoded sizes): echoed request fields such
#: as a ``text.format`` JSON schema are not bounded by the context, so 1000 entries alone
#: could hold 1000 request bodies (32 GiB at the body limit).
DEFAULT_RESPONSES_STORE_MAX_BYTES = 256 * 1024 * 1024
#: Most sequences (prompts x ``n``) one request may start: the default prompt limit, so every
#: batch accepted before with ``n=1`` still is, while 128 prompts x ``n=16`` (2048) is not.
DEFAULT_MAX_SEQUENCES_PER_REQUEST = 128
#: ``max_tokens_per_request`` unset: this many times the model's context length, so that any
#: request with ``n <= 16`` (:data:`DEFAULT_MAX_N`) and no ``max_tokens`` still fits.
REQUEST_TOKENS_CONTEXTS = 16
#: Inference requests served at once; above what the benchmark's 1000 concurrent streams need.
DEFAULT_MAX_CONCURRENT_REQUESTS = 1024
#: What the requests in flight may hold together, each its body and the estimate of its
#: decoded form (:func:`~smg_trio.gateway.http.budget.decoded_bytes`): 8 maximal bodies of
#: prose, or thousands of ordinary requests; without it, 1024 admitted requests of 32 MiB
#: bodies could hold 32 GiB before decoding them.
DEFAULT_MAX_BODY_BYTES_IN_FLIGHT = 1024 * 1024 * 1024
#: Requests that may wait for a slot; more get 429 at once.
DEFAULT_QUEUE_SIZE = 1024
#: How long a request waits for a slot before its 429.
DEFAULT_QUEUE_TIMEOUT_S = 10.0
#: A response write blocked this long (the client stopped reading) drops the connection.
DEFAULT_WRITE_TIMEOUT_S = 30.0


def _lower(headers: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(h.lower() for h in headers)


def _positive(_: object, attr: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attr.name} must be >= 1, got {value}")


@attrs.frozen(kw_only=True)
class GatewayHttpConfig:
    """Settings of :func:`~smg_trio.gateway.http.app.create_app`. All limits are inclusive.

      - ``responses_store_size``: responses the Responses API keeps (0: none); see
        :data:`DEFAULT_RESPONSES_STORE_SIZE`. ``responses_store_max_bytes``: their encoded
        size together (:data:`DEFAULT_RESPONSES_STORE_MAX_BYTES`; the least recently used go first, a larger one is
        not kept). ``responses_store_path``: a SQLite file that holds them, shared by every
        process that names it (the frontends of ``--api-server-count``; ``None``: in memory).
      - ``max_n``: the largest ``n`` accepted (default :data:`DEFAULT_MAX_N`). Larger ``n`` is
        a 400 naming ``n``.
      - ``max_top_logprobs``: cap on chat ``top_logprobs`` and completions ``logprobs``
        (default 20, OpenAI's chat limit); the engine's own cap applies on top of it.
      - ``max_prompts``: most prompts in one batched ``/v1/completions`` request.
      - ``max_body_bytes``: largest request body (413 above it).
      - ``max_body_bytes_in_flight``: the bytes all requests in flight may hold together,
        each its body and an estimate of its decoded form (:data:`DEFAULT_MAX_BODY_BYTES_IN_FLIGHT`;
        a request waits for room up to ``queue_timeout_s``, then 429; one that alone needs
        more is a 413). See docs/security.md ("Memory").
      - ``api_key``: when set, ``/v1/*`` needs ``Authorization: Bearer <api_key>`` (401).
      - ``request_id_headers``: lower-case header names tried in order for the request id,
        which is echoed in ``x-request-id``; when none is present one is generated.
      - ``reasoning_parser``: parser name used for models whose ``ServedModel`` names none
        (``None``: no reasoning split).
      - ``tool_call_parser``: the tool-call format (``--tool-call-parser``) for models whose
        ``ServedModel`` names none; ``enable_auto_tool_choice``: parse tool calls for
        ``tool_choice: auto`` (without it, ``auto`` with tools is a 400, as in vLLM).
      - ``trust_request_chat_template``: a request's own ``chat_template`` (or
        ``chat_template_kwargs.chat_template``) is rendered, sandboxed like the model's;
        without it such a request is a 400, as in vLLM.
      - ``body_timeout_s``: seconds to receive a request body (408 past it).
      - ``max_sequences_per_request``: most sequences (prompts x ``n``) in one request (400
        naming ``n``).
      - ``max_tokens_per_request``: most completion tokens one request may ask for, summed over
        its sequences (``max_tokens``, or the context left when unset); ``None``:
        :data:`REQUEST_TOKENS_CONTEXTS` times the model's context length. 400 naming
        ``max_tokens`` above it.
      - ``max_concurrent_requests``: inference requests served at once; past it a request waits
        up to ``queue_timeout_s`` seconds for a slot, among at most ``queue_size`` waiting, then
        gets 429 with ``Retry-After``.
      - ``enable_http2``: serve cleartext HTTP/2 (prior knowledge and ``Upgrade: h2c``). Off by
        default: hypercorn's HTTP/2 has no write timeout for a stream whose flow-control window
        the client never opens (its buffered output then grows, and stopping waits for it), so a
        prior-knowledge preface gets a 505 and an ``Upgrade: h2c`` is answered in HTTP/1.1.
    - ``write_timeout_s``: a response write blocked this long drops the connection (its engine
        requests are ABORTed); applied by :func:`~smg_trio.gateway.http.app.serve_http`.
    - ``fast_http1``: serve plain HTTP/1.1 requests on the fenced fast path
      (:mod:`smg_trio.gateway.server.fast_http1`); ``False`` gives every connection to
      hypercorn and h11 (``--disable-fast-http1``).
    """

    max_n: int = attrs.field(default=DEFAULT_MAX_N, validator=_positive)
    responses_store_size: int = attrs.field(default=DEFAULT_RESPONSES_STORE_SIZE)
    responses_store_max_bytes: int = attrs.field(
        default=DEFAULT_RESPONSES_STORE_MAX_BYTES, validator=_positive
    )
    responses_store_path: str | None = None
    max_top_logprobs: int = attrs.field(default=20)
    max_prompts: int = attrs.field(default=128, validator=_positive)
    max_body_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=_positive)
    max_body_bytes_in_flight: int = attrs.field(
        default=DEFAULT_MAX_BODY_BYTES_IN_FLIGHT, validator=_positive
    )
    #: Pooling routes (embeddings, score, rerank...): most inputs (engine requests) in one
    #: request, and most tokens over them all (docs/pooling.md).
    max_pooling_items: int = attrs.field(default=2048, validator=_positive)
    max_pooling_tokens: int = attrs.field(default=1_048_576, validator=_positive)
    api_key: str | None = None
    request_id_headers: tuple[str, ...] = attrs.field(
        default=DEFAULT_REQUEST_ID_HEADERS, converter=_lower
    )
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    enable_prompt_tokens_details: bool = False
    trust_request_chat_template: bool = False
    #: vLLM's ``--default-chat-template-kwargs``: template variables under each request's
    #: ``chat_template_kwargs`` (a request value wins, unless ``null`` or ``"auto"``).
    default_chat_template_kwargs: Mapping[str, Any] | None = None
    #: vLLM's ``--response-role``: the reply's role with ``add_generation_prompt`` (chat).
    response_role: str = "assistant"
    #: vLLM's ``--enable-log-requests`` (one INFO line per inference request) and
    #: ``--max-log-len`` (the most body characters in it; ``None``: all).
    enable_log_requests: bool = False
    max_log_len: int | None = None
    #: CORS with vLLM 0.32's defaults: no allowed origin (no CORS headers at all), every
    #: method and header once an origin is allowed, no credentials.
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    #: The structured-output backend the engines are configured with (vLLM's
    #: ``--structured-outputs-config.backend``); ``auto`` asks for ``guidance`` (one of the
    #: backends vLLM's ``auto`` picks; ``xgrammar`` for ``structural_tag``).
    structured_outputs_backend: str = "auto"
    body_timeout_s: float = 60.0
    max_sequences_per_request: int = attrs.field(
        default=DEFAULT_MAX_SEQUENCES_PER_REQUEST, validator=_positive
    )
    max_tokens_per_request: int | None = attrs.field(default=None)
    max_concurrent_requests: int = attrs.field(
        default=DEFAULT_MAX_CONCURRENT_REQUESTS, validator=_positive
    )
    queue_size: int = attrs.field(default=DEFAULT_QUEUE_SIZE)
    queue_timeout_s: float = attrs.field(default=DEFAULT_QUEUE_TIMEOUT_S)
    write_timeout_s: float = attrs.field(default=DEFAULT_WRITE_TIMEOUT_S)
    enable_http2: bool = False
    fast_http1: bool = True

    @max_top_logprobs.validator
    def _check_top(self, _: attrs.Attribute[int], value: int) -> None:
        if value < 0:
            raise ValueError(f"max_top_logprobs must be >= 0, got {value}")

    @max_tokens_per_request.validator
    def _check_budget(self, _: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"max_tokens_per_request must be >= 1, got {value}")

    @queue_size.validator
    def _check_queue(self, _: attrs.Attribute[int], value: int) -> None:
        if value < 0:
            raise ValueError(f"queue_size must be >= 0, got {value}")

    @queue_timeout_s.validator
    def _check_wait(self, _: attrs.Attribute[float], value: float) -> None:
        if not value >= 0:
            raise ValueError(f"queue_timeout_s must be >= 0, got {value}")

    @write_timeout_s.validator
    def _check_write(self, _: attrs.Attribute[float], value: float) -> None:
        if not value > 0:
            raise ValueError(f"write_timeout_s must be > 0, got {value}")
