"""Engine-client throughput, CPU cost and memory, against the mock engine in a subprocess.

Not a test: it prints a table. The mock runs as ``python -m smg_trio.mock.engine`` in a
child process, so this process's CPU time (``time.process_time``, all threads including
libzmq's I/O thread) is the gateway side alone: the engine client, its output loop, decoding,
dispatch and one consumer task per request.

Throughput: for each concurrency C, C workers each run requests back to back (``max_tokens``
tokens each, ``async for`` over the stream) until ``--requests`` requests completed, after a
warm-up. Memory: ``--memory-requests`` requests are opened against a second mock that never
steps, then the tracemalloc and RSS deltas are divided by the count, once with the requests
held by one task (the client's own state) and once with a trio task parked on each.

    python bench/engine_client.py                     # ~30 s on a 2-core machine
    python bench/engine_client.py --protocol tokenspeed --tokens 256
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import socket
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Literal

import trio

from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from smg_trio.protocol.types import EngineProtocol, GenerateRequest, SamplingOptions
from smg_trio.protocol.vllm import VllmProtocol

ProtocolName = Literal["vllm", "tokenspeed"]
STARTUP_TIMEOUT_S = 60.0


def _free_tcp_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _protocol(name: ProtocolName) -> EngineProtocol:
    return VllmProtocol() if name == "vllm" else TokenSpeedProtocol()


@asynccontextmanager
async def mock_engine_client(protocol: ProtocolName, step_ms: float) -> AsyncIterator[EngineClient]:
    """An engine client handshaken with a mock engine subprocess (terminated on exit)."""
    directory = tempfile.mkdtemp(prefix="smg-bench-")
    addresses = worker_addresses(f"ipc://{directory}/w0", _free_tcp_address())
    argv = [
        sys.executable,
        "-m",
        "smg_trio.mock.engine",
        "--handshake",
        addresses.handshake,
        "--protocol",
        protocol,
        "--step-ms",
        str(step_ms),
        "--max-model-len",
        "1048576",
    ]
    proc = await trio.lowlevel.open_process(argv)
    try:
        async with open_engine_client(
            _protocol(protocol), addresses, ready_timeout_s=STARTUP_TIMEOUT_S
        ) as client:
            yield client
    finally:
        proc.terminate()
        with trio.move_on_after(5) as cs:
            await proc.wait()
        if cs.cancelled_caught:
            proc.kill()
            await proc.wait()
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def _request(rid: str, max_tokens: int, prompt_len: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        prompt_token_ids=list(range(3, 3 + prompt_len)),
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=1.0, seed=7),
    )


class _Run:
    def __init__(self) -> None:
        self.tokens = 0
        self.requests = 0


async def throughput(
    client: EngineClient, concurrency: int, total: int, max_tokens: int, prompt_len: int, tag: str
) -> tuple[float, float, _Run]:
    """Run ``total`` requests with ``concurrency`` workers; returns (wall s, CPU s, counts)."""
    run = _Run()
    next_id = iter(range(total))

    async def worker() -> None:
        for i in next_id:
            async with client.generate(_request(f"{tag}-{i}", max_tokens, prompt_len)) as stream:
                async for out in stream:
                    run.tokens += len(out.new_token_ids)
            run.requests += 1

    gc.collect()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - wall0, time.process_time() - cpu0, run


async def memory_per_request(
    client: EngineClient, count: int, prompt_len: int, *, with_tasks: bool, tag: str
) -> tuple[float, float]:
    """Open ``count`` requests that never produce output; (tracemalloc B, RSS B) per request.

    The ``GenerateRequest`` objects are built before measuring: they are the caller's, and
    their prompt lists would otherwise dominate the figure.
    """
    requests = [_request(f"{tag}-{i}", 16, prompt_len) for i in range(count)]
    gc.collect()
    tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    rss0 = _rss_bytes()
    async with AsyncExitStack() as held:
        if with_tasks:
            async with trio.open_nursery() as nursery:
                opened = 0
                all_open = trio.Event()

                async def one(i: int) -> None:
                    nonlocal opened
                    async with client.generate(requests[i]) as stream:
                        opened += 1
                        if opened == count:
                            all_open.set()
                        await stream.receive_some()  # parks: the engine never steps

                for i in range(count):
                    nursery.start_soon(one, i)
                await all_open.wait()
                gc.collect()
                traced = tracemalloc.get_traced_memory()[0] - traced0
                rss = _rss_bytes() - rss0
                assert client.inflight_count == count
                nursery.cancel_scope.cancel()  # each block aborts its request on the way out
        else:
            for i in range(count):
                await held.enter_async_context(client.generate(requests[i]))
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] - traced0
            rss = _rss_bytes() - rss0
            assert client.inflight_count == count
    tracemalloc.stop()
    return traced / count, rss / count


async def main(args: argparse.Namespace) -> None:
    proto: ProtocolName = args.protocol
    print(
        f"smg_trio engine client vs mock {proto} engine (subprocess, step {args.step_ms:g} ms); "
        f"{args.tokens} tokens/request, prompt {args.prompt_len} tokens; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    header = (
        f"{'concurrency':>11} {'requests':>8} {'tokens':>8} {'wall s':>7} {'tokens/s':>9} "
        f"{'req/s':>7} {'CPU s':>6} {'CPU µs/token':>12} {'CPU util':>8}"
    )
    async with mock_engine_client(proto, args.step_ms) as client:
        await throughput(client, 8, 32, args.tokens, args.prompt_len, "warm")
        print(header)
        print("-" * len(header))
        for c in args.concurrency:
            total = max(c * args.rounds, args.min_requests)
            wall, cpu, run = await throughput(
                client, c, total, args.tokens, args.prompt_len, f"c{c}"
            )
            assert run.tokens == total * args.tokens, (run.tokens, total * args.tokens)
            print(
                f"{c:>11} {run.requests:>8} {run.tokens:>8} {wall:>7.2f} "
                f"{run.tokens / wall:>9.0f} {run.requests / wall:>7.0f} {cpu:>6.2f} "
                f"{cpu / run.tokens * 1e6:>12.1f} {cpu / wall:>7.0%}"
            )
    if args.memory_requests > 0:
        # A mock whose first step is an hour away: requests stay in flight, silent.
        async with mock_engine_client(proto, 3_600_000) as client:
            n = args.memory_requests
            state = await memory_per_request(
                client, n, args.prompt_len, with_tasks=False, tag="held"
            )
            tasks = await memory_per_request(
                client, n, args.prompt_len, with_tasks=True, tag="task"
            )
        print()
        print(f"memory per in-flight request ({n} open, no output yet)")
        print(f"{'':>34} {'tracemalloc B':>13} {'RSS B':>9}")
        print(f"{'client state (one holder task)':>34} {state[0]:>13.0f} {state[1]:>9.0f}")
        print(f"{'+ a trio task per request':>34} {tasks[0]:>13.0f} {tasks[1]:>9.0f}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--protocol", choices=("vllm", "tokenspeed"), default="vllm")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    p.add_argument("--tokens", type=int, default=128, help="max_tokens per request")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="mock engine step period (0: step as fast as it can, so the client is the limit "
        "once concurrency is high)",
    )
    p.add_argument("--rounds", type=int, default=4, help="requests per worker at concurrency C")
    p.add_argument("--min-requests", type=int, default=100)
    p.add_argument("--memory-requests", type=int, default=2000)
    return p


def run(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if any(c < 1 for c in args.concurrency) or not math.isfinite(args.step_ms):
        raise SystemExit("concurrency must be >= 1 and --step-ms finite")
    trio.run(main, args)


if __name__ == "__main__":
    run()
