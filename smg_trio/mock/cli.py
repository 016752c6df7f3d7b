"""The mock engine's command line: ``python -m smg_trio mock-engine`` / ``python -m smg_trio.mock.engine``."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Sequence

import trio

from smg_trio.exc_groups import leaves
from smg_trio.mock.engine import (
    DEFAULT_NUM_GPU_BLOCKS,
    MockEngine,
    MockEngineConfig,
    run_until_signal,
)
from smg_trio.mock.kv_publisher import KvEventPublisher, parse_kv_events_config
from smg_trio.mock.pooling import MockPooler
from smg_trio.mock.script import MockScript, MockScriptError, load_script

__all__ = ["main"]

log = logging.getLogger("smg_trio.mock.engine")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smg_trio mock-engine",
        description="A mock vLLM/TokenSpeed engine rank that dials a gateway's handshake socket "
        "and serves until SIGINT/SIGTERM.",
    )
    parser.add_argument(
        "--handshake",
        required=True,
        metavar="tcp://HOST:PORT",
        help="the gateway's handshake ROUTER address",
    )
    parser.add_argument("--protocol", choices=("vllm", "tokenspeed"), default="vllm")
    parser.add_argument(
        "--engine-index", type=int, default=0, help="DP rank index (the 2-byte identity)"
    )
    parser.add_argument(
        "--step-ms", type=float, default=2.0, help="engine step period in ms (0 = flat out)"
    )
    parser.add_argument("--eos-token-id", type=int, default=None)
    parser.add_argument(
        "--enable-lora", action="store_true", help="vLLM's flag (the mock always serves LoRA)"
    )
    parser.add_argument("--max-loras", type=int, default=4, help="LoRA adapters held at once")
    parser.add_argument("--max-lora-rank", type=int, default=16, help="the largest LoRA rank")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="reported data_parallel_size; > 1 makes a lockstep (wave) group for vLLM",
    )
    parser.add_argument(
        "--script",
        metavar="FILE",
        help="a JSON or TOML (.toml) file of rules that answer matching prompts with scripted "
        "text or token ids (docs/mock.md); without it every prompt gets random tokens",
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="the model directory whose tokenizer decodes prompts and encodes the script's text "
        "(with --script; default: the generated tiny model serve --backend mock serves)",
    )
    parser.add_argument(
        "--runner",
        choices=("generate", "pooling"),
        default="generate",
        help="vLLM's --runner: pooling serves embeddings (and, with --labels, classify) and "
        "refuses generation (smg_trio/mock/pooling.py)",
    )
    parser.add_argument(
        "--labels",
        metavar="A,B,...",
        default="",
        help="with --runner pooling: the classifier head's labels (classify is then served)",
    )
    parser.add_argument(
        "--convert",
        choices=("auto", "embed", "classify"),
        default="auto",
        help="vLLM's --convert: classify makes a sequence classifier with no embed task "
        "(with one label, a cross-encoder: /score and /rerank score text pairs); needs --labels",
    )
    parser.add_argument(
        "--hello-after",
        metavar="FILE",
        help="load slowly: dial the gateway only once FILE exists, logging a WARNING while it "
        "waits (a stand-in for a cold engine start, for startup-progress tests)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV block (default 16 for vllm, vLLM's GPU default; 64 for tokenspeed)",
    )
    parser.add_argument(
        "--num-gpu-blocks",
        type=int,
        default=DEFAULT_NUM_GPU_BLOCKS,
        help="the prefix cache's capacity in blocks, reported in the ready response "
        f"(default {DEFAULT_NUM_GPU_BLOCKS})",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="model a prefix cache (an LRU of full blocks; docs/mock.md); on by default, as vLLM",
    )
    parser.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        help="the engine step that prefills a request takes this much longer per uncached "
        "prompt token, in microseconds (default 0)",
    )
    parser.add_argument(
        "--kv-events-config",
        metavar="JSON",
        help="publish KV cache events as vLLM does, e.g. "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\' '
        "(vLLM's KVEventsConfig fields; docs/mock.md)",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    )
    return parser


def _load_script_or_exit(
    parser: argparse.ArgumentParser, path: str, model: str | None
) -> MockScript:
    """The compiled script, loaded before the engine dials (so no request waits on it); a bad
    script or model directory is a usage error (exit 2)."""
    from smg_trio.tokenizer import Tokenizer

    try:
        if model is None:
            from smg_trio.mock.tiny_model import default_tiny_model_dir

            model = str(default_tiny_model_dir())
        tokenizer = Tokenizer.from_dir(model)
    except (OSError, ValueError) as exc:
        parser.error(f"--model {model}: cannot load its tokenizer: {exc}")
    try:
        return load_script(path, tokenizer)
    except MockScriptError as exc:
        parser.error(str(exc))


def pooler_of(runner: str, labels: str, convert: str = "auto") -> MockPooler | None:
    """The mock's pooler for ``--runner``/``--labels``/``--convert`` (``None``: a generation
    model). Raises ``ValueError`` for ``--convert classify`` without labels."""
    if runner != "pooling":
        return None
    names = tuple(x for x in (s.strip() for s in labels.split(",")) if x)
    if convert == "classify" and not names:
        raise ValueError("--convert classify needs --labels (one label: a cross-encoder)")
    return MockPooler(labels=names, embed=convert != "classify")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m smg_trio.mock.engine``: dial ``--handshake`` and serve until SIGINT or
    SIGTERM; returns the exit status (0 on a signal)."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.step_ms < 0:
        log.error("--step-ms must be >= 0")
        return 2
    script = None
    if args.script is not None:
        script = _load_script_or_exit(parser, args.script, args.model)
    elif args.model is not None:
        parser.error("--model is the tokenizer of --script; give --script too")
    if args.block_size is not None and args.block_size < 1:
        parser.error("--block-size must be >= 1")
    if args.num_gpu_blocks < 0:
        parser.error("--num-gpu-blocks must be >= 0")
    if args.prefill_us_per_token < 0:
        parser.error("--prefill-us-per-token must be >= 0")
    kv_events = None
    if args.kv_events_config is not None:
        try:
            kv_events = parse_kv_events_config(args.kv_events_config)
        except ValueError as exc:
            parser.error(str(exc))
        if kv_events.zmq_enabled:
            try:  # the endpoints offset by the DP rank (an ipc one cannot be)
                KvEventPublisher(kv_events, args.engine_index)
            except ValueError as exc:
                parser.error(f"--kv-events-config: {exc}")
        else:
            kv_events = None
    try:
        pooler = pooler_of(args.runner, args.labels, args.convert)
    except ValueError as exc:
        parser.error(str(exc))
    config = MockEngineConfig(
        protocol=args.protocol,
        engine_index=args.engine_index,
        step_s=args.step_ms / 1000.0,
        eos_token_id=args.eos_token_id,
        max_model_len=args.max_model_len,
        data_parallel_size=args.data_parallel_size,
        script=script,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        kv_events=kv_events,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        pooler=pooler,
    )
    engine = MockEngine(args.handshake, config)
    log.info("mock %s engine %d dialing %s", config.protocol, config.engine_index, args.handshake)
    failed: BaseException | None = None
    try:
        trio.run(_run_after, engine, args.hello_after)
    except* OSError as group:  # the KV events endpoint could not be bound or connected
        failed = leaves(group)[0]
    if failed is not None:
        log.error("mock engine: %s", failed)
        return 1
    return 0


async def _run_after(engine: MockEngine, hello_after: str | None) -> None:
    """Wait for ``hello_after`` to exist (if given), then :func:`run_until_signal`."""
    if hello_after is not None:
        log.warning("mock engine: loading slowly, until %s exists", hello_after)
        loaded = False
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(stop_on_signal)
                # another process creates the file: there is no event to wait on, so poll
                while not await trio.Path(hello_after).exists():  # noqa: ASYNC110
                    await trio.sleep(0.05)
                loaded = True
                nursery.cancel_scope.cancel()
        if not loaded:
            return
    await run_until_signal(engine)
