"""The benchmark's mock engine: ``smg_trio.mock.engine`` with bench settings.

Same engine as ``python -m smg_trio.mock.engine``, plus two options the command line
of that module lacks:

* ``--token-range LO HI``: the sampled token ids. The benchmark uses merged BPE tokens
  (259..517 in the tiny model: the longest run of ids that each decode to complete UTF-8), so every token decodes to visible text on its own. With raw
  byte tokens, a gateway holds back incomplete UTF-8 (fewer, larger SSE chunks) and smg logs a
  warning per invalid byte, which would distort the CPU figures.
* ``--answer-utility``: answer vLLM ``UTILITY`` calls (``reset_mm_cache``,
  ``get_supported_tasks``, anything else returns None), which vLLM's own API server makes at
  start-up when it fronts an external engine.
* ``--ready-file FILE``: create it once the engine has handshaken with the gateway.
* ``--stats-file FILE``: on exit, write the engine's own prefix cache counts there (JSON:
  ``requests``, ``queries``, ``hits``, ``evicted``), for ``bench/routing.py``.

The prefix cache flags are the mock's own (``--block-size``, ``--num-gpu-blocks``,
``--prefill-us-per-token``, ``--kv-events-config``; docs/mock.md).

    python bench/mock.py --handshake tcp://127.0.0.1:PORT --step-ms 1 --token-range 259 518
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time
from typing import Any, TextIO

import trio

from smg_trio.codec.msgpack import decode, encoder
from smg_trio.mock.engine import (
    DEFAULT_NUM_GPU_BLOCKS,
    MockEngine,
    MockEngineConfig,
)
from smg_trio.mock.kv_publisher import parse_kv_events_config
from smg_trio.transport.zsocket import ZmqSocket


class BenchMockEngine(MockEngine):
    """A :class:`MockEngine` that can also answer vLLM ``UTILITY`` calls."""

    answer_utility = False
    #: Where each ABORT's receipt is logged (``time.time()`` and the request id, one a line).
    abort_log: TextIO | None = None

    async def _input_loop(self, client: int, sock: ZmqSocket) -> None:
        if not self.answer_utility and self.abort_log is None:
            await super()._input_loop(client, sock)
            return
        # Answer UTILITY (b"\x03") frames before the base loop sees them, and log ABORT
        # (b"\x01") receipts: the base loop reads ``sock``, so hand it a filtering stand-in.
        engine = self
        log = self.abort_log

        class _Filter:
            async def recv_multipart(self) -> list[bytes]:
                while True:
                    frames: list[bytes] = await sock.recv_multipart()
                    if log is not None and len(frames) >= 2 and frames[0] == b"\x01":
                        now = time.time()
                        for rid in decode(frames[1], list[str]):
                            log.write(f"{now:.6f} {rid}\n")
                        log.flush()
                    if engine.answer_utility and len(frames) >= 2 and frames[0] == b"\x03":
                        await engine._answer_utility(frames[1], client)
                        continue
                    return frames

        await super()._input_loop(client, _Filter())  # type: ignore[arg-type]

    async def _answer_utility(self, payload: bytes, client: int = 0) -> None:
        client_index, call_id, method, _args = decode(payload, tuple[int, int, str, Any])
        result: Any = ["generate"] if method == "get_supported_tasks" else None
        # vLLM 0.32 EngineCoreOutputs with utility_output = UtilityOutput(call_id,
        # failure_message, result); UtilityResult travels as (type info, value), type info
        # None meaning "decode the value as is".
        env = [self.config.engine_index, [], None, 0.0, [call_id, None, [None, result]]]
        env += [None, None, None, None]
        del client_index
        await self._push([encoder.encode(env)], client)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--handshake", required=True, metavar="tcp://HOST:PORT")
    p.add_argument("--protocol", choices=("vllm", "tokenspeed"), default="vllm")
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--token-range", type=int, nargs=2, default=(259, 518), metavar=("LO", "HI"))
    p.add_argument("--max-model-len", type=int, default=1 << 20)
    p.add_argument("--answer-utility", action="store_true")
    p.add_argument("--abort-log", default=None, metavar="FILE", help="log ABORT receipt times")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument(
        "--num-gpu-blocks",
        type=int,
        default=0,
        help="the prefix cache's capacity in blocks (default 0: no prefix cache, so that the "
        "gateway benchmarks pay no hashing in the engine)",
    )
    p.add_argument("--prefill-us-per-token", type=float, default=0.0)
    p.add_argument("--kv-events-config", default=None, metavar="JSON")
    p.add_argument("--stats-file", default=None, metavar="FILE")
    p.add_argument("--ready-file", default=None, metavar="FILE")
    p.add_argument("--log-level", default="WARNING", type=str.upper)
    return p


async def _serve(engine: MockEngine, ready_file: str | None) -> None:
    """:func:`run_until_signal`, creating ``ready_file`` once the handshake is done."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await nursery.start(engine.run)
            if ready_file is not None:
                await trio.Path(ready_file).touch()
            await engine.dead.wait()
            nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level)
    lo, hi = args.token_range
    config = MockEngineConfig(
        protocol=args.protocol,
        step_s=args.step_ms / 1000.0,
        token_range=(lo, hi),
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks or DEFAULT_NUM_GPU_BLOCKS,
        enable_prefix_caching=args.num_gpu_blocks > 0,
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        kv_events=(
            None if args.kv_events_config is None else parse_kv_events_config(args.kv_events_config)
        ),
    )
    engine = BenchMockEngine(args.handshake, config)
    engine.answer_utility = args.answer_utility
    with contextlib.ExitStack() as stack:
        if args.abort_log is not None:
            engine.abort_log = stack.enter_context(open(args.abort_log, "a"))
        trio.run(_serve, engine, args.ready_file)
    if args.stats_file is not None:
        total = engine.cache.total
        stats = {"requests": total.requests, "queries": total.queries, "hits": total.hits}
        with open(args.stats_file, "w") as f:
            json.dump({**stats, "evicted": engine.cache.evicted}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
