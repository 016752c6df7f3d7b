"""What tracing costs the gateway: the benchmark's workloads against ``smg_trio launch``
without tracing, with ``--otlp-traces-endpoint`` (OTLP/HTTP to a sink in this process that
answers every export with 200), and, with ``--base TREE``, another checkout's smg_trio (say
main, before tracing existed) for the cost of tracing off. Gateway CPU per request and per
token, median of the repetitions, the gateways alternating. Not a test: nothing fails on a
number.

    .venv/bin/python bench/tracing_cost.py [--reps 3] [--only stream_c32 chat_c32]
                                           [--base /work/main]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import h11
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import (
    PROMPT,
    WORKLOADS,
    Gateway,
    gateway_run,
    start_gateway,
)
from loadgen import build_request, chat_body, run_load

from smg_trio.mock.tiny_model import default_tiny_model_dir


class Sink:
    """An OTLP/HTTP endpoint that takes every export (counted, not decoded)."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Data):
                    self.bytes += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    self.exports += 1
                    out = conn.send(
                        h11.Response(status_code=200, headers=[("content-length", "0")])
                    )
                    await stream.send_all(out + conn.send(h11.EndOfMessage()))
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return


async def main(args: argparse.Namespace) -> None:
    sink = Sink()
    model_dir = default_tiny_model_dir()
    names = ["smg_trio", "smg_trio_traced"] + (["smg_trio_base"] if args.base else [])
    if args.base:
        os.environ["SMG_BENCH_BASE_TREE"] = args.base
    workloads = [w for w in WORKLOADS if w.name in args.only]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, sink.serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        os.environ["SMG_BENCH_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}/v1/traces"
        with contextlib.ExitStack() as stack:
            gateways: dict[str, Gateway] = {}
            for name in names:
                gw = gateways[name] = await start_gateway(name, model_dir, 1.0, stack)
                for s in (True, False):  # warm-up
                    raw = build_request(gw.port, chat_body(gw.model, PROMPT, 16, stream=s))
                    await run_load(
                        gw.port, raw, stream=s, concurrency=8, total=64, expect_tokens=16
                    )
            for rep in range(args.reps):
                order = names if rep % 2 == 0 else names[::-1]
                for w in workloads:
                    for name in order:
                        rec = await gateway_run(gateways[name], w, w.total)
                        results.setdefault((w.name, name), []).append(rec)
                        print(
                            f"rep {rep + 1} {w.name:<12} {name:<16} {rec['req_per_s']:7.1f} req/s "
                            f"{rec['cpu_us_per_request']:7.0f} µs/req "
                            f"{rec['cpu_us_per_token']:6.1f} µs/tok errors {rec['errors']}",
                            flush=True,
                        )
        nursery.cancel_scope.cancel()
    print(f"\nOTLP sink: {sink.exports} exports, {sink.bytes} bytes")
    print("\n| workload | gateway | req/s | CPU µs/request | CPU µs/token |")
    print("|---|---|---:|---:|---:|")
    for (wname, name), recs in results.items():
        med = {k: statistics.median(r[k] for r in recs) for k in ("req_per_s",
               "cpu_us_per_request", "cpu_us_per_token")}  # fmt: skip
        print(
            f"| {wname} | {name} | {med['req_per_s']:.0f} | {med['cpu_us_per_request']:.0f} "
            f"| {med['cpu_us_per_token']:.1f} |"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", nargs="+", default=["stream_c32", "chat_c32"])
    p.add_argument("--base", help="a checkout whose smg_trio is the tracing-off baseline")
    trio.run(main, p.parse_args())
