"""In-process micro-benchmarks of the per-token hot paths, to compare pure Python with mypyc.

Run it once against a plain checkout and once against one built by ``scripts/build_mypyc.sh``
(the module paths it prints say which was imported), from that checkout's root::

    cd /path/to/plain && PYTHONPATH=$PWD nice -n 19 python bench/mypyc_micro.py
    cd /path/to/built && PYTHONPATH=$PWD nice -n 19 python bench/mypyc_micro.py

Each case prints the best of several repeats, in nanoseconds per operation.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import msgspec
import trio

from smg_trio.codec import msgpack as codec
from smg_trio.connector import output, stream
from smg_trio.gateway.openai import framing, textgen
from smg_trio.gateway.openai.schemas import ChunkChoice, Delta
from smg_trio.gateway.server import direct, fast_http1
from smg_trio.protocol import vllm
from smg_trio.protocol.types import EngineOutput
from smg_trio.tokenizer import detokenizer
from smg_trio.tokenizer.core import Tokenizer
from tests.helpers.deepseek_vocab import deepseek_model_dir
from tests.helpers.engines import RawEngine, raw_serving, request
from tests.helpers.ipc import IpcNamespace, free_handshake_address

REPEATS = 5
TEXT = (
    "The quick brown fox jumps over the lazy dog. Ünïcödé, emoji 🚀 and 中文字符 mixed in; "
    "numbers 12345 and code `x = f(y)` too. "
) * 40


def best_ns(fn: Callable[[], int]) -> float:
    """Best of REPEATS runs of ``fn`` (which returns how many operations it did), ns/op."""
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter_ns()
        n = fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


async def dispatch_ns(n: int = 64) -> float:
    """``EngineClient._dispatch`` + ``_wake_queued`` of one decoded ``n``-output vLLM batch
    for ``n`` open streams (a real client handshaken with a hand-driven engine; no ZMQ in the
    timed loop), ns per output. Each stream's waker drops its queue."""
    with IpcNamespace() as ipc:
        addresses = ipc.addresses("w0", handshake=free_handshake_address())
        engine = RawEngine(addresses.handshake)
        async with raw_serving(addresses, engine) as client, AsyncExitStack() as stack:
            streams = [
                await stack.enter_async_context(client.generate(request(f"r{i}", max_tokens=10**6)))
                for i in range(n)
            ]
            for s in streams:
                s.set_waker(s._entry.queue.clear)
            env = vllm.EngineCoreOutputs(
                outputs=[vllm.EngineCoreOutput(f"r{i}", [1000 + i]) for i in range(n)],
                scheduler_stats=vllm.SchedulerStats(n, 0, 0.5),
            )
            batch = vllm.decode_outputs([msgspec.msgpack.encode(env)])

            def run() -> int:
                for _ in range(300):
                    client._dispatch(batch)
                    client._wake_queued()
                return 300 * n

            best = best_ns(run)
            for s in streams:
                s.set_waker(None)
    return best


def main() -> None:
    for mod in (detokenizer, textgen, framing, stream, direct, fast_http1, vllm, codec, output):
        print(f"# {mod.__name__}: {mod.__file__}")
    tok = Tokenizer.from_dir(deepseek_model_dir())
    ids: list[int] = tok.encode(TEXT)
    print(f"# {len(ids)} tokens per pass")

    def detok() -> int:
        d = detokenizer.IncrementalDetokenizer(tok)
        for t in ids:
            d.push([t])
        d.flush()
        return len(ids)

    def pipeline(params: textgen.ChoiceParams) -> Callable[[], int]:
        outs = [EngineOutput("r", [t]) for t in ids]

        def run() -> int:
            p = textgen.ChoicePipeline(0, tok, params)
            for o in outs:
                p.feed([o])
            return len(outs)

        return run

    framer = framing.ChunkFramer("chatcmpl-0123456789abcdef", "chat.completion.chunk", 1, "m")
    choices = [ChunkChoice(0, Delta(content=tok.decode([t]))) for t in ids[:500]]

    def frame() -> int:
        for c in choices:
            framer.frame(c)
        return len(choices)

    entry_outs = [EngineOutput("r", [t]) for t in range(1000)]

    def entry() -> int:
        e = stream._Entry("r", 0, b"id")
        s = stream.RequestStream(e)
        e.waker = lambda: None
        for o in entry_outs:
            e.put(o)
            e.wake()
            s.receive_nowait()
        return len(entry_outs)

    chunks = [tok.decode([t]).encode() for t in ids[:500]]

    def chunk() -> int:
        for c in chunks:
            direct.frame_chunk(c)
        return len(chunks)

    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8000\r\n"
        b"Content-Type: application/json\r\nAccept: */*\r\nUser-Agent: bench/1\r\n"
        b"Authorization: Bearer x\r\nContent-Length: 123\r\n\r\n"
    )

    def parse() -> int:
        for _ in range(2000):
            fast_http1.parse_head(head)
        return 2000

    batch = [
        vllm.EngineCoreOutputs(
            outputs=[vllm.EngineCoreOutput(f"req-{i:04d}", [1000 + i]) for i in range(64)],
            scheduler_stats=vllm.SchedulerStats(64, 0, 0.5),
        )
    ]
    frames: list[Any] = [msgspec.msgpack.encode(batch[0])]

    def decode() -> int:
        for _ in range(200):
            vllm.decode_outputs(frames)
        return 200 * 64  # per output

    cases: list[tuple[str, Callable[[], int]]] = [
        ("detokenizer push, per token", detok),
        ("ChoicePipeline.feed, per token", pipeline(textgen.ChoiceParams(limit=10**6))),
        (
            "ChoicePipeline.feed + stop string, per token",
            pipeline(textgen.ChoiceParams(limit=10**6, stops=("never-seen-stop",))),
        ),
        ("ChunkFramer.frame, per chunk", frame),
        ("_Entry.put+wake+receive_nowait, per output", entry),
        ("direct.frame_chunk, per chunk", chunk),
        ("fast_http1.parse_head, per head", parse),
        ("vllm.decode_outputs (64/batch), per output", decode),
    ]
    only = set(sys.argv[1:])
    for name, fn in cases:
        if only and not any(o in name for o in only):
            continue
        print(f"{name:48s} {best_ns(fn):10.1f} ns/op")
    name = "EngineClient._dispatch+_wake_queued, per output"
    if not only or any(o in name for o in only):
        print(f"{name:48s} {trio.run(dispatch_ns):10.1f} ns/op")


if __name__ == "__main__":
    main()
