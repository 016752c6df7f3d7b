"""Distributed tracing (issue 30, item 1): a request's span reaches a real OTLP receiver
(in-process, the collector's OTLP/HTTP protobuf), continues the caller's ``traceparent``, and
its context reaches the engine in ``EngineCoreRequest.trace_headers``; a malformed
``traceparent`` starts a new trace; with tracing off nothing of OpenTelemetry is imported."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from smg_trio.gateway.http.tenants import Tenant, TenantGate, TenantTable
from smg_trio.gateway.http.tracing import SPAN_NAME, Tracing, open_tracing
from tests.helpers.gateway import DEADLINE_S, HarnessFactory
from tests.helpers.otlp import OtlpReceiver, open_otlp_receiver

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@asynccontextmanager
async def _tracing(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Tracing, OtlpReceiver]]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    async with open_otlp_receiver() as receiver, trio.open_nursery() as nursery:
        tracing = open_tracing(receiver.endpoint)
        assert tracing is not None
        await nursery.start(tracing.run)
        yield tracing, receiver
        nursery.cancel_scope.cancel()


def _parent_of(traceparent: str) -> tuple[str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    assert int(flags, 16) & 1  # sampled
    return trace_id, span_id


@pytest.mark.parametrize("stream", [False, True])
async def test_span_continues_the_callers_trace_to_the_engine(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with _tracing(monkeypatch) as (tracing, receiver), harness(tracing=tracing) as h:
            r = await h.post(
                "/v1/chat/completions",
                {
                    "model": "M",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "temperature": 0.5,
                    "stream": stream,
                },
                headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
            )
            assert r.status_code == 200
            await tracing.flush()
            (span,) = await receiver.wait_for(1)
    assert span.name == SPAN_NAME
    assert span.service_name == "smg_trio"
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert span.kind == 2  # SPAN_KIND_SERVER
    assert span.events == ["admitted", "tokenized", "routed", "first_token"]
    attrs = span.attributes
    assert attrs["gen_ai.request.id"] == r.headers["x-request-id"]
    assert attrs["gen_ai.response.model"] == "M"
    assert attrs["gen_ai.request.max_tokens"] == 3
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.request.n"] == 1
    assert attrs["gen_ai.usage.completion_tokens"] == 3
    assert attrs["gen_ai.usage.prompt_tokens"] > 0
    assert attrs["http.response.status_code"] == 200
    assert "smg.worker.id" in attrs
    assert attrs["gen_ai.latency.e2e"] >= attrs["gen_ai.latency.time_to_first_token"] > 0
    # the engine got the gateway span's context: the same trace, the gateway span as parent
    sent = h.engine.requests[-1].raw.trace_headers
    assert _parent_of(sent["traceparent"]) == (TRACE_ID, span.span_id)
    assert sent["tracestate"] == "vendor=1"


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        f"00-{'0' * 32}-{PARENT_ID}-01",  # an all-zero trace id is invalid
        f"ff-{TRACE_ID}-{PARENT_ID}-01",  # version ff is forbidden
        f"00-{TRACE_ID}-{PARENT_ID}",  # too few fields
        "00-" + "x" * 4000,
    ],
)
async def test_malformed_traceparent_starts_a_new_trace(
    harness: HarnessFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    traceparent: str,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with _tracing(monkeypatch) as (tracing, receiver), harness(tracing=tracing) as h:
            r = await h.post(
                "/v1/completions",
                {"model": "M", "prompt": "hello", "max_tokens": 2},
                headers={"traceparent": traceparent},
            )
            assert r.status_code == 200
            await tracing.flush()
            (span,) = await receiver.wait_for(1)
    assert span.parent_span_id == ""
    assert span.trace_id not in (TRACE_ID, "0" * 32)
    sent = h.engine.requests[-1].raw.trace_headers
    assert _parent_of(sent["traceparent"]) == (span.trace_id, span.span_id)
    # a client's bad header never reaches the log through OpenTelemetry's warnings
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


@pytest.mark.parametrize(
    "tracestate",
    [
        "\x01bad",
        "a=" + "x" * 600,
        ",".join(["k=v"] * 2),  # a key twice
        ",".join(f"k{i}=v" for i in range(33)),  # more than 32 members
        "=,=",
        "Upper=1",
    ],
)
async def test_malformed_tracestate_is_dropped_and_the_trace_continues(
    harness: HarnessFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tracestate: str,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with _tracing(monkeypatch) as (tracing, receiver), harness(tracing=tracing) as h:
            r = await h.post(
                "/v1/completions",
                {"model": "M", "prompt": "hello", "max_tokens": 1},
                headers={"traceparent": TRACEPARENT, "tracestate": tracestate},
            )
            assert r.status_code == 200
            await tracing.flush()
            (span,) = await receiver.wait_for(1)
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, PARENT_ID)
    sent = h.engine.requests[-1].raw.trace_headers
    assert "tracestate" not in sent
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


async def test_an_error_is_on_the_span(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused request (404 model) still ends its span, with the status and error code."""
    with trio.fail_after(DEADLINE_S):
        async with _tracing(monkeypatch) as (tracing, receiver), harness(tracing=tracing) as h:
            r = await h.chat(model="nope")
            assert r.status_code == 404
            await tracing.flush()
            (span,) = await receiver.wait_for(1)
    assert span.attributes["http.response.status_code"] == 404
    assert span.attributes["error.type"] == "model_not_found"
    assert "routed" not in span.events


async def test_tracing_off_sends_no_trace_headers(harness: HarnessFactory) -> None:
    with trio.fail_after(DEADLINE_S):
        async with harness() as h:
            r = await h.chat(max_tokens=2)
            assert r.status_code == 200
    assert h.engine.requests[-1].raw.trace_headers is None


def test_tracing_off_imports_no_opentelemetry() -> None:
    """The serving modules import nothing of OpenTelemetry while tracing is off."""
    code = (
        "import sys, smg_trio.serve, smg_trio.serve.frontend, smg_trio.cli\n"
        "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_the_tenant_is_on_the_span(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-tenant-a-0123456789"
    gate = TenantGate(TenantTable((Tenant("team-a", key.encode()),)))
    with trio.fail_after(DEADLINE_S):
        async with (
            _tracing(monkeypatch) as (tracing, receiver),
            harness(tracing=tracing, tenants=gate) as h,
        ):
            r = await h.post(
                "/v1/completions",
                {"model": "M", "prompt": "hello", "max_tokens": 1},
                headers={"authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200
            await tracing.flush()
            (span,) = await receiver.wait_for(1)
    assert span.attributes["smg.tenant"] == "team-a"
    assert key not in repr(span)


async def test_grpc_is_the_default_protocol(
    harness: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without OTEL_EXPORTER_OTLP_TRACES_PROTOCOL the spans go over gRPC (vLLM's default),
    plaintext to an ``http://`` endpoint: a real gRPC TraceService receives them."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received: list[trace_service_pb2.ExportTraceServiceRequest] = []
    got = trio.Event()
    token = trio.lowlevel.current_trio_token()

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: object, context: object) -> object:
            received.append(request)  # type: ignore[arg-type]
            trio.from_thread.run_sync(got.set, trio_token=token)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    try:
        tracing = open_tracing(f"http://127.0.0.1:{port}")
        assert tracing is not None
        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as nursery, harness(tracing=tracing) as h:
                await nursery.start(tracing.run)
                r = await h.chat(max_tokens=1)
                assert r.status_code == 200
                await tracing.flush()
                await got.wait()
                nursery.cancel_scope.cancel()
    finally:
        server.stop(None)
    spans = [s for rs in received[0].resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for s in spans] == [SPAN_NAME]
