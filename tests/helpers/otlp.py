"""An in-process OTLP/HTTP trace receiver (the collector's protocol: ``POST /v1/traces`` with
a protobuf ``ExportTraceServiceRequest``), for the tracing tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import h11
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "SpanRecord", "open_otlp_receiver"]


@attrs.frozen
class SpanRecord:
    """One received span, ids as hex as in ``traceparent``."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[str]
    service_name: str
    status_code: int


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


@attrs.define
class OtlpReceiver:
    """What :func:`open_otlp_receiver` serves: the spans received so far."""

    endpoint: str
    spans: list[SpanRecord] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)

    def take(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        SpanRecord(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=[e.name for e in s.events],
                            service_name=str(resource.get("service.name")),
                            status_code=s.status.code,
                        )
                    )
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, count: int) -> list[SpanRecord]:
        """Wait (under the caller's deadline) for at least ``count`` spans."""
        while len(self.spans) < count:
            await self.changed.wait()
        return self.spans


async def _serve_one(stream: trio.SocketStream, receiver: OtlpReceiver) -> None:
    conn = h11.Connection(h11.SERVER)
    body = b""
    async with stream:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                if not data and conn.their_state is not h11.SEND_BODY:
                    return
                continue
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                receiver.take(body)
                body = b""
                payload = ExportTraceServiceResponse().SerializeToString()
                headers = [
                    ("content-type", "application/x-protobuf"),
                    ("content-length", str(len(payload))),
                ]
                out = conn.send(h11.Response(status_code=200, headers=headers))
                out += conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())
                await stream.send_all(out)
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return


@asynccontextmanager
async def open_otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """A receiver on a free loopback port, ``endpoint`` its ``/v1/traces`` URL."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, lambda s: _serve_one(s, receiver), 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        receiver = OtlpReceiver(f"http://127.0.0.1:{port}/v1/traces")
        yield receiver
        nursery.cancel_scope.cancel()
