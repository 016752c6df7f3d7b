"""Where a new request waits at saturation: the per-stage times of smg_trio's request spans.

Runs ``stream_c256`` (streaming, 64 tokens, c=256, lean client processes) against
``smg_trio launch --otlp-traces-endpoint`` pointing at an OTLP/HTTP sink in this process that
decodes every exported span. Each request span carries its start (the gateway has parsed the
request), ``admitted`` (the admission gate let it through), ``tokenized`` and ``first_token``
(the engine's first output reached the request). Prints p50/p99/max of each stage and of
span start -> first token, beside the client's own TTFT (request written -> first content
read): what the client waits beyond the span is the wait before the gateway reads and parses
the request (accept, the connection's read) or after the first token (the write).
Tracing costs the gateway CPU: these are stage shares, not the benchmark's TTFT figures.

    python bench/ttft_stages.py [--engine mock|lean] [--workload stream_c256] [--total 768]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import h11
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gateway  # noqa: E402
from gateway import WORKLOADS, gateway_run, quantile, start_gateway  # noqa: E402

from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402


class SpanSink:
    """An OTLP/HTTP (protobuf) endpoint that keeps, per span, its start and its events."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []

    def _take(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    rec: dict[str, Any] = {"start": span.start_time_unix_nano / 1e6}
                    rec["id"] = span.span_id.hex()
                    rec["end"] = span.end_time_unix_nano / 1e6
                    for ev in span.events:
                        rec.setdefault(ev.name, ev.time_unix_nano / 1e6)
                    self.spans.append(rec)

    async def serve(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        body = bytearray()
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    self._take(bytes(body))
                    body.clear()
                    out = conn.send(
                        h11.Response(status_code=200, headers=[("content-length", "0")])
                    )
                    await stream.send_all(out + conn.send(h11.EndOfMessage()))
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return


def _q(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": quantile(values, 0.5), "p99": quantile(values, 0.99), "max": max(values)}


STAGES = (
    ("start -> admitted", "start", "admitted"),
    ("admitted -> tokenized", "admitted", "tokenized"),
    ("start -> tokenized", "start", "tokenized"),
    ("tokenized -> first_token", "tokenized", "first_token"),
    ("start -> first_token", "start", "first_token"),
    # with --engine lean: the engine's side (same clock: time.time() in both processes)
    ("tokenized -> engine got ADD", "tokenized", "engine_add"),
    ("engine ADD -> first output sent", "engine_add", "engine_first"),
    ("engine sent -> first_token", "engine_first", "first_token"),
)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sink = SpanSink()
    w = next(w for w in WORKLOADS if w.name == args.workload)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, sink.serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        os.environ["SMG_BENCH_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}/v1/traces"
        name = "smg_trio_traced"
        add_log = Path(f"/tmp/smg-ttft-adds-{os.getpid()}.log")
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: add_log.unlink(missing_ok=True))
            if args.engine == "lean":
                gateway.ENGINE_SCRIPT = "lean_engine.py"
                real = gateway.mock_command
                gateway.mock_command = lambda *a: [*real(*a), "--add-log", str(add_log)]
            gw = await start_gateway(name, default_tiny_model_dir(), 1.0, stack)
            await gateway_run(gw, w, min(256, args.total))  # warm-up
            await trio.sleep(1.0)
            sink.spans.clear()
            rec = await gateway_run(gw, w, args.total)
            await trio.sleep(6.0)  # the last batch of spans (OTEL_BSP_SCHEDULE_DELAY 5 s)
            engine_times: dict[str, dict[str, float]] = {}
            with contextlib.suppress(OSError):
                for line in (await trio.Path(add_log).read_text()).splitlines():
                    t, what, span_id = line.split()
                    engine_times.setdefault(span_id, {})[f"engine_{what}"] = float(t) * 1e3
        nursery.cancel_scope.cancel()
    for s in sink.spans:
        s.update(engine_times.get(s["id"], {}))
    out: dict[str, Any] = {"spans": len(sink.spans), "load_avg": os.getloadavg()}
    out["client_ttft_ms"] = _q(rec["ttfts_ms"])
    out["tokens_per_s"] = rec["tokens_per_s"]
    for label, a, b in STAGES:
        out[label] = _q([s[b] - s[a] for s in sink.spans if a in s and b in s])
    print(
        f"{out['spans']} spans, {rec['tokens_per_s']:.0f} tokens/s, load {out['load_avg'][0]:.1f}"
    )
    for label in ["client_ttft_ms", *(s[0] for s in STAGES)]:
        q = out[label]
        if q:
            print(f"  {label:<32} p50 {q['p50']:7.1f}  p99 {q['p99']:7.1f}  max {q['max']:7.1f} ms")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total", type=int, default=768)
    p.add_argument("--workload", default="stream_c256", choices=[w.name for w in WORKLOADS])
    p.add_argument("--engine", choices=("mock", "lean"), default="mock")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    res = trio.run(main, a)
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1))
