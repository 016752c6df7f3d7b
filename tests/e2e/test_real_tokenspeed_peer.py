"""OUR EngineClient (TokenSpeedProtocol) against TokenSpeed 0.1.1's REAL engine-side transport.

The peer (``peers.tokenspeed_peer`` under the peers' interpreter) handshakes with
TokenSpeed's own ``connect_msgpack_engine`` and decodes/encodes with its own msgpack sockets;
only the model is fake (one deterministic token per step).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from peers.tools import (
    start_process_group,
    stop_process_group,
    tokenspeed_missing_reason,
    tokenspeed_peer_command,
    tokenspeed_peer_env,
    write_tokenspeed_stubs,
)
from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.protocol import GenerateRequest, SamplingOptions
from smg_trio.protocol.tokenspeed import TokenSpeedProtocol
from tests.helpers.e2e import ipc_worker, log_tail, require_e2e

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PEER_STARTUP_S = 120.0
_ids = itertools.count()


def request(max_tokens: int, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"ts-{next(_ids)}",
        prompt_token_ids=[5, 6, 7, 8, 9],
        sampling=SamplingOptions(max_tokens=max_tokens, **sampling),  # type: ignore[arg-type]
        stream=True,
    )


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    """Skip (sync, so the reason survives pytest-trio) unless the TokenSpeed peer can run."""
    require_e2e(tokenspeed_missing_reason())
    return write_tokenspeed_stubs(tmp_path / "stubs")


@pytest.fixture
async def peer_client(stubs: Path, tmp_path: Path) -> AsyncIterator[EngineClient]:
    log_path = tmp_path / "tokenspeed-peer.log"
    with ipc_worker() as addresses:
        cmd = tokenspeed_peer_command(
            addresses.handshake, extra_args=["--step-interval", "0.01", "--log-level", "WARNING"]
        )
        proc = start_process_group(cmd, env=tokenspeed_peer_env(stubs), log_path=log_path)
        try:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
                    raise AssertionError(
                        f"TokenSpeed peer exited with {proc.returncode}:\n{log_tail(log_path)}"
                    )

                nursery.start_soon(watch)
                # ready_timeout_s bounds the handshake (a fail_after around entering the
                # client would misnest its nursery)
                async with open_engine_client(
                    TokenSpeedProtocol(), addresses, ready_timeout_s=PEER_STARTUP_S
                ) as client:
                    yield client
                    nursery.cancel_scope.cancel()
        finally:
            stop_process_group(proc)
        assert "Traceback" not in log_tail(log_path, 100_000), log_tail(log_path)


async def test_generate_streams_to_completion(peer_client: EngineClient) -> None:
    client = peer_client
    assert client.alive
    with trio.fail_after(30):
        async with client.generate(request(12, temperature=0.0)) as stream:
            outputs = [o async for o in stream]
    toks = [t for o in outputs for t in o.new_token_ids]
    assert len(toks) == 12
    assert all(3 <= t < 259 for t in toks)
    assert outputs[-1].finish_reason == "length"
    assert all(o.finish_reason is None for o in outputs[:-1])
    # streamed one token per step (stream_interval 1)
    assert len(outputs) == 12
    if outputs[-1].completion_tokens is not None:
        assert outputs[-1].completion_tokens == 12

    # the fake model is deterministic per prompt
    with trio.fail_after(30):
        async with client.generate(request(12, temperature=0.0)) as stream:
            again = [t for o in [o async for o in stream] for t in o.new_token_ids]
    assert again == toks

    # the sampled token's logprob rides along
    with trio.fail_after(30):
        async with client.generate(request(4, logprobs=0)) as stream:
            lp_outputs = [o async for o in stream]
    assert sum(len(o.new_token_ids) for o in lp_outputs) == 4
    assert client.inflight_count == 0


async def test_abort_then_generate(peer_client: EngineClient) -> None:
    client = peer_client
    got = 0
    with trio.fail_after(30):
        async with client.generate(request(500, temperature=0.0)) as stream:
            async for out in stream:
                assert out.finish_reason is None
                got += 1
                if got == 2:
                    break
    assert got == 2
    assert client.inflight_count == 0
    with trio.fail_after(30):
        async with client.generate(request(3, temperature=0.0)) as stream:
            outputs = [o async for o in stream]
    assert sum(len(o.new_token_ids) for o in outputs) == 3
    assert outputs[-1].finish_reason == "length"
    assert client.inflight_count == 0
    assert client.alive
