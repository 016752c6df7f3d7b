"""``python -m smg_trio.mock.engine``: a separate process that dials the client like a
real engine, serves, and exits 0 on SIGTERM/SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from smg_trio.connector import open_engine_client
from smg_trio.protocol.addresses import WorkerAddresses
from tests.helpers.engines import PROTOCOLS, ProtocolName, make_protocol, request

#: Starting a Python process that imports numpy/zmq/msgspec can take seconds on a busy machine.
SUBPROCESS_DEADLINE_S = 60.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("proto", "stop_signal"),
    [
        pytest.param(PROTOCOLS[0], signal.SIGTERM, id="vllm-SIGTERM"),
        pytest.param(PROTOCOLS[1], signal.SIGINT, id="tokenspeed-SIGINT"),
    ],
)
async def test_cli_serves_until_signalled(
    addresses: WorkerAddresses, proto: ProtocolName, stop_signal: signal.Signals
) -> None:
    argv = [
        sys.executable,
        "-m",
        "smg_trio.mock.engine",
        "--handshake",
        addresses.handshake,
        "--protocol",
        proto,
        "--engine-index",
        "0",
        "--step-ms",
        "1",
        "--eos-token-id",
        "2",
        "--max-model-len",
        "2048",
        "--log-level",
        "warning",
    ]
    with trio.fail_after(SUBPROCESS_DEADLINE_S):
        proc = await trio.lowlevel.open_process(argv, stderr=subprocess.PIPE)
        try:
            async with open_engine_client(
                make_protocol(proto), addresses, ready_timeout_s=SUBPROCESS_DEADLINE_S
            ) as client:
                assert client.max_model_len == 2048
                ready = client.ready_responses[0]
                if proto == "vllm":
                    assert ready.block_size is not None
                else:
                    assert ready.prefix_granularity is not None
                async with client.generate(request("cli", max_tokens=4)) as stream:
                    outputs = [o async for o in stream]
                assert [len(o.new_token_ids) for o in outputs] == [1, 1, 1, 1]
                assert outputs[-1].finish_reason == "length"
                proc.send_signal(stop_signal)
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.stderr is not None
    stderr = await proc.stderr.receive_some()
    assert b"Traceback" not in (stderr or b"")


async def test_cli_rejects_bad_arguments() -> None:
    with trio.fail_after(SUBPROCESS_DEADLINE_S):
        result = await trio.run_process(
            [sys.executable, "-m", "smg_trio.mock.engine", "--protocol", "sglang"],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    assert b"--handshake" in result.stderr
