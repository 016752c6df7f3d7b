"""Startup progress and engine log forwarding (issue 16, item 5): while a slow engine loads,
serve logs launched, handshaking, a status line per interval, engine ready (k of n) and
gateway ready; engine lines keep their ``[engine-PORT]`` prefix and their own level, and
``--engine-log-level`` filters them."""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

import pytest
import trio
import trio.testing

from smg_trio import cli
from smg_trio.mock.tiny_model import default_tiny_model_dir
from smg_trio.serve import EngineLaunchConfig, GatewayConfig, ServeHandle, _launch_plan, serve
from smg_trio.serve.enginelog import EngineLogLevels
from smg_trio.serve.launcher import EngineExited, _forward
from tests.helpers.frontends import with_api_server_count
from tests.helpers.ports import random_worker_base_port

VLLM_LINES = [
    ("(EngineCore_DP0 pid=4242) INFO 12-01 18:00:00 [core.py:93] Initializing", logging.INFO),
    ("(EngineCore_DP0 pid=4242) WARNING 12-01 18:00:01 [cpu.py:7] Pin memory is off", 30),
    ("\x1b[1;36m(APIServer pid=1)\x1b[0;0m \x1b[33mWARNING\x1b[0m 12-01 18:00:02 [x.py:1] w", 30),
    ("(EngineCore_DP0 pid=4242) ERROR 12-01 18:00:03 [core.py:9] EngineCore failed", 40),
    ("Traceback (most recent call last):", logging.ERROR),
    ('  File "/x/core.py", line 9, in run', logging.ERROR),
    ("RuntimeError: boom", logging.ERROR),
    ("(EngineCore_DP0 pid=4242) DEBUG 12-01 18:00:04 [core.py:1] tick", logging.DEBUG),
    ("2026-12-01 18:00:05,001 WARNING smg_trio.mock.engine: loading slowly", logging.WARNING),
    ("/x/torch/__init__.py:12: UserWarning: TF32 is deprecated", logging.WARNING),
    ("Loading safetensors checkpoint shards: 100% 1/1", logging.INFO),
]


def test_engine_line_levels() -> None:
    levels = EngineLogLevels()
    assert [levels.level(line) for line, _ in VLLM_LINES] == [lvl for _, lvl in VLLM_LINES]


async def test_forward_keeps_prefix_and_level_and_filters(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="smg_trio.serve.launcher")
    send, receive = trio.testing.memory_stream_one_way_pair()
    text = "\n".join(line for line, _ in VLLM_LINES).encode()
    await send.send_all(text)  # the last line has no newline: forwarded at end of stream
    await send.aclose()
    tail: deque[str] = deque(maxlen=100)
    await _forward(receive, "engine-31000", tail, logging.WARNING)
    assert list(tail) == [line for line, _ in VLLM_LINES]
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    expected = [(lvl, f"[engine-31000] {line}") for line, lvl in VLLM_LINES if lvl >= 30]
    assert got == expected


def test_engine_log_level_flag() -> None:
    parser = cli._parser()
    argv = ["serve", "--backend", "vllm", "--model", str(default_tiny_model_dir())]
    args = parser.parse_args([*argv, "--engine-log-level", "warning"])
    config = cli._config_from_args(args, [])
    assert config.engines.engine_log_level == "warning"
    (_, launch), *_ = _launch_plan(config)
    assert launch.log_level == logging.WARNING
    assert parser.parse_args(argv).engine_log_level == "info"


class _Waiter(logging.Handler):
    """Sets an event when a record containing its text is logged (all in the trio thread)."""

    def __init__(self, *texts: str) -> None:
        super().__init__(logging.DEBUG)
        self.events = {text: trio.Event() for text in texts}
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        for text, event in self.events.items():
            if text in record.getMessage():
                event.set()


@pytest.mark.slow
async def test_progress_lines_while_a_slow_engine_loads(sock_dir: str, tmp_path: Path) -> None:
    gate = tmp_path / "loaded"
    config = GatewayConfig(
        port=0,
        served_model_name="mock-tiny",
        startup_progress_interval_s=0.05,
        engines=EngineLaunchConfig(
            backend="mock",
            model=str(default_tiny_model_dir()),
            worker_base_port=random_worker_base_port(),
            socket_dir=sock_dir,
            engine_args=("--hello-after", str(gate)),
            engine_log_level="warning",
        ),
    )
    waiter = _Waiter(
        "launched engine-",
        "engine 1 of 1 (engine-",
        "handshaking: waiting for the engine process to start and say HELLO",
        "still starting",
        "loading slowly",
        "engine ready (1 of 1)",
        "gateway ready on http://",
    )
    root = logging.getLogger("smg_trio")
    root.addHandler(waiter)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                started = trio.Event()

                async def run() -> None:
                    handle: ServeHandle = await nursery.start(serve, with_api_server_count(config))
                    assert handle.workers
                    started.set()

                nursery.start_soon(run)
                for text in (
                    "launched engine-",
                    "handshaking: waiting for the engine process to start and say HELLO",
                ):
                    await waiter.events[text].wait()
                await waiter.events["loading slowly"].wait()
                await waiter.events["still starting"].wait()
                assert not waiter.events["engine ready (1 of 1)"].is_set()
                gate.touch()
                await waiter.events["engine ready (1 of 1)"].wait()
                await started.wait()
                await waiter.events["gateway ready on http://"].wait()
                nursery.cancel_scope.cancel()
    finally:
        root.removeHandler(waiter)
        root.setLevel(old_level)
    forwarded = [r for r in waiter.records if "loading slowly" in r.getMessage()]
    assert forwarded[0].levelno == logging.WARNING
    assert forwarded[0].getMessage().startswith("[engine-")


async def test_engine_debug_lines_show_with_the_gateway_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--engine-log-level debug`` shows the engine's DEBUG lines even though the gateway's
    own logger stays at INFO (the forwarded record bypasses the logger's level only)."""
    caplog.handler.setLevel(logging.DEBUG)  # a handler that takes everything, as basicConfig's
    logger = logging.getLogger("smg_trio.serve.launcher")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        send, receive = trio.testing.memory_stream_one_way_pair()
        await send.send_all(b"(EngineCore_DP0 pid=1) DEBUG 12-01 18:00:04 [core.py:1] tick\n")
        await send.aclose()
        await _forward(receive, "engine-31000", deque(maxlen=4), logging.DEBUG)
    finally:
        logger.setLevel(before)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.DEBUG,
            "[engine-31000] (EngineCore_DP0 pid=1) DEBUG 12-01 18:00:04 [core.py:1] tick",
        )
    ]


def test_an_engine_death_says_how() -> None:
    """Issue 29, item 9: the signal's name (SIGKILL with its usual sender), the exit code
    otherwise, and the engine's last log lines or that it wrote none."""
    killed = str(EngineExited("engine-1", -9, []))
    assert killed == (
        "engine engine-1 exited with code -9 (killed by SIGKILL, often the kernel's "
        "out-of-memory killer); no log lines"
    )
    segv = str(EngineExited("engine-1", -11, ["loading", "Fatal Python error"]))
    assert "(killed by SIGSEGV)" in segv
    assert segv.endswith("last log lines:\n  loading\n  Fatal Python error")
    assert (
        str(EngineExited("engine-2", 3, [])) == "engine engine-2 exited with code 3; no log lines"
    )
