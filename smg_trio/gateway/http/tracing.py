"""OpenTelemetry tracing of inference requests (``--otlp-traces-endpoint``): one span per
request, W3C trace context in from the client and out to the engine, spans exported by a trio
task. OpenTelemetry is imported only when tracing is on (the ``otel`` extra)."""

from __future__ import annotations

import collections
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from smg_trio.gateway.openai.fanout import SubRequest

__all__ = [
    "SPAN_NAME",
    "RequestSpan",
    "Tracing",
    "TracingUnavailable",
    "open_tracing",
]

log = logging.getLogger(__name__)

#: The request span's name: vLLM's frontend names its per-request span ``llm_request``
#: (``vllm/v1/engine/output_processor.py``); in front of bare engines smg_trio plays that
#: frontend, so dashboards and queries written for vLLM find the same span and attributes.
SPAN_NAME: Final = "llm_request"
#: The W3C headers carried to the engine (``EngineCoreRequest.trace_headers``), as vLLM's
#: ``TRACE_HEADERS``.
TRACE_HEADERS: Final = ("traceparent", "tracestate")
#: The longest ``traceparent`` and ``tracestate`` passed on (W3C: a ``tracestate`` of at
#: least 512 characters must be propagated; longer ones may be dropped).
_MAX_HEADER = 512
#: W3C trace context's ``tracestate`` member, ``key=value`` (section 3.3.1).
_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_MAX_MEMBERS = 32
#: How long stopping waits for the last export.
_SHUTDOWN_EXPORT_S: Final = 10.0


def _carrier(headers: Any) -> dict[str, str]:
    """The caller's ``traceparent`` and ``tracestate`` worth parsing: any longer than
    :data:`_MAX_HEADER` is ignored, and a ``tracestate`` that breaks W3C's grammar (a bad
    member, more than 32, a key twice) is dropped whole, as the spec allows. OpenTelemetry's
    parser logs a warning quoting each bad header it meets: a client must not be able to write
    to the gateway's log at will."""
    out: dict[str, str] = {}
    parent = headers.get("traceparent")
    if not parent or len(parent) > _MAX_HEADER:
        return out
    out["traceparent"] = str(parent)
    state = headers.get("tracestate")
    if state and len(state) <= _MAX_HEADER:
        members = [m.strip(" \t") for m in str(state).split(",")]
        members = [m for m in members if m]
        keys = {m.partition("=")[0] for m in members}
        if (
            len(members) <= _MAX_MEMBERS
            and len(keys) == len(members)
            and all(_MEMBER.fullmatch(m) for m in members)
        ):
            out["tracestate"] = str(state)
    return out


class TracingUnavailable(RuntimeError):
    """``--otlp-traces-endpoint`` without the OpenTelemetry packages (``smg_trio[otel]``)."""


class RequestSpan:
    """One request's span: stage events, attributes, the headers for the engine, the end."""

    __slots__ = ("_span", "headers")

    def __init__(self, span: Span, headers: dict[str, str]) -> None:
        self._span = span
        #: ``traceparent`` (and ``tracestate``) naming this span: the engine's parent.
        self.headers = headers

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """A stage (``tokenized``, ``first_token``, ``retried``)."""
        self._span.add_event(name, attributes=dict(attributes) if attributes else None)

    def set(self, key: str, value: Any) -> None:
        """Set one attribute."""
        self._span.set_attribute(key, value)

    def admitted(self, waited_s: float) -> None:
        """The request got its ``--max-concurrent-requests`` slot after ``waited_s``."""
        self._span.set_attribute("gen_ai.latency.time_in_queue", waited_s)
        self._span.add_event("admitted", {"gen_ai.latency.time_in_queue": waited_s})

    def routed(
        self, model_id: str, worker_id: str, policy: str, subs: Sequence[SubRequest]
    ) -> None:
        """The routing stage and the request's attributes (vLLM's names); this span's
        context goes in every engine request's ``trace_headers``."""
        span = self._span
        span.add_event("routed", {"smg.worker.id": worker_id, "smg.route.policy": policy})
        attributes: dict[str, Any] = {
            "gen_ai.response.model": model_id,
            "smg.worker.id": worker_id,
            "gen_ai.request.n": len(subs),
        }
        if subs:
            sampling = subs[0].request.sampling
            attributes["gen_ai.request.max_tokens"] = sampling.max_tokens
            attributes["gen_ai.request.temperature"] = sampling.temperature
            attributes["gen_ai.request.top_p"] = sampling.top_p
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        for sub in subs:
            sub.request.trace_headers = self.headers

    def end(
        self,
        status: int,
        error_code: str | None,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        sequences: int,
        e2e_s: float,
        ttft_s: float | None,
    ) -> None:
        """End with the usage, latencies and HTTP status; 5xx marks the span an error
        (OpenTelemetry's rule for HTTP servers)."""
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        attributes: dict[str, Any] = {
            "gen_ai.usage.prompt_tokens": prompt_tokens,
            "gen_ai.usage.completion_tokens": completion_tokens,
            "gen_ai.usage.num_sequences": sequences,
            "gen_ai.latency.e2e": e2e_s,
            "http.response.status_code": status,
        }
        if ttft_s is not None:
            attributes["gen_ai.latency.time_to_first_token"] = ttft_s
        if error_code is not None:
            attributes["error.type"] = error_code
        span.set_attributes(attributes)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, error_code))
        span.end()


class _QueueProcessor:
    """A span processor that only queues ended spans (bounded: the oldest are dropped when
    the exporter falls behind); :meth:`Tracing.run` exports them off the event loop. The SDK's
    ``BatchSpanProcessor`` would start a thread of its own."""

    def __init__(self, max_queue: int, batch: int) -> None:
        self.queue: collections.deque[ReadableSpan] = collections.deque(maxlen=max_queue)
        self.batch = batch
        self.dropped = 0
        self.wake = trio.Event()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        queue = self.queue
        if len(queue) == queue.maxlen:
            self.dropped += 1
        queue.append(span)
        if len(queue) >= self.batch:
            self.wake.set()

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _env_int(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        log.warning("%s is not an integer; using %d", name, default)
        return default


class Tracing:
    """The gateway's tracer. Run :meth:`run` in a nursery for the gateway's life (it exports
    the queued spans every ``OTEL_BSP_SCHEDULE_DELAY`` ms, or at once when a batch is full,
    and the rest when cancelled); :meth:`start` makes a request's span."""

    def __init__(self, provider: TracerProvider, exporter: SpanExporter, endpoint: str) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = endpoint
        self._provider = provider
        self._exporter = exporter
        self._tracer: Tracer = provider.get_tracer("smg_trio")
        self._propagator = TraceContextTextMapPropagator()
        self._delay_s = _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self._processor = _QueueProcessor(
            _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
            _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        )
        provider.add_span_processor(self._processor)  # type: ignore[arg-type]
        self.exported = 0

    @property
    def dropped(self) -> int:
        """Spans dropped because the queue was full."""
        return self._processor.dropped

    def start(self, headers: Any, endpoint: str, request_id: str) -> RequestSpan:
        """The span of one request (``headers``: Quart's or the fast path's, read with
        ``get``): a child of the caller's ``traceparent`` when it is valid
        (a malformed one is ignored and a new trace starts, as the W3C spec says)."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        carrier = _carrier(headers)
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"gen_ai.request.id": request_id, "smg.endpoint": endpoint},
        )
        out: dict[str, str] = {}
        self._propagator.inject(out, context=set_span_in_context(span))
        return RequestSpan(span, out)

    async def flush(self) -> None:
        """Export every queued span now."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        queue = self._processor.queue
        while queue:
            batch = [queue.popleft() for _ in range(min(len(queue), self._processor.batch))]
            try:
                result = await trio.to_thread.run_sync(self._exporter.export, batch)
            except Exception as exc:  # an exporter's bug must not stop the gateway
                log.warning("%d span(s) not exported to %s: %r", len(batch), self.endpoint, exc)
                continue
            if result is not SpanExportResult.SUCCESS:
                log.warning("%d span(s) not exported to %s", len(batch), self.endpoint)
            else:
                self.exported += len(batch)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Export until cancelled, then export what is left (bounded) and close the
        exporter."""
        task_status.started()
        processor = self._processor
        try:
            while True:
                with trio.move_on_after(self._delay_s):
                    await processor.wake.wait()
                processor.wake = trio.Event()
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(_SHUTDOWN_EXPORT_S):
                    await self.flush()
                await trio.to_thread.run_sync(self._exporter.shutdown)


#: The usage error of ``--otlp-traces-endpoint`` without the OpenTelemetry packages: the
#: ``otel`` extra, installed the way the README installs smg_trio (from its checkout).
OTEL_MISSING_MESSAGE = (
    "--otlp-traces-endpoint needs OpenTelemetry (opentelemetry-sdk and "
    "opentelemetry-exporter-otlp): pip install -e '.[otel]' in the smg_trio checkout"
)


def _exporter(endpoint: str) -> SpanExporter:
    """vLLM's choice (``vllm/tracing/otel.py``): ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``,
    ``grpc`` (the default) or ``http/protobuf``. gRPC is plaintext unless the endpoint is
    ``https://``. The exporters read their other ``OTEL_EXPORTER_OTLP_TRACES_*`` variables
    (headers, timeout, compression, certificate) themselves."""
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=endpoint)
    raise ValueError(
        f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r} is not supported "
        "(use 'grpc' or 'http/protobuf')"
    )


def open_tracing(endpoint: str, *, process: str = "gateway") -> Tracing | None:
    """The tracer exporting to ``endpoint`` (``--otlp-traces-endpoint``), or ``None`` when
    ``OTEL_SDK_DISABLED`` is true. The resource is OpenTelemetry's (``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``; ``service.name`` ``smg_trio`` unless they name one), the
    sampler too (``OTEL_TRACES_SAMPLER``). Raises :class:`TracingUnavailable` without the
    packages, ``ValueError`` for an unknown protocol."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("OTEL_SDK_DISABLED is set: tracing is off")
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        exporter = _exporter(endpoint)
    except ImportError as exc:  # the SDK, or the protocol's exporter
        raise TracingUnavailable(OTEL_MISSING_MESSAGE) from exc
    resource = Resource.create({"smg_trio.process_kind": process, "process.pid": os.getpid()})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "smg_trio"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    return Tracing(provider, exporter, endpoint)
