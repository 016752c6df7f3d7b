"""Two frontend clients (``--api-server-count 2``'s wire) on one REAL headless vLLM 0.32.0
engine: one handshake names both clients' pairs, each client's requests carry its
``client_index`` and their outputs come back on its own socket, and a client re-bound after a
crash ABORTs the requests of its previous life (vLLM keeps their outputs for that socket)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from peers.tools import vllm_engine_command, vllm_engine_env, vllm_missing_reason
from smg_trio.connector import EngineClient
from smg_trio.connector.client import attach_engine_client, open_engine_client
from smg_trio.mock.tiny_model import build_tiny_model
from smg_trio.protocol import GenerateRequest, SamplingOptions
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.vllm import VllmProtocol
from tests.helpers.e2e import (
    ENGINE_STARTUP_S,
    assert_alive,
    handshake_port,
    ipc_worker,
    process_group,
    require_e2e,
)
from tests.helpers.portal import TrioPortal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Context of this module's model and engine. The orphan below runs to it, so it outlives the
#: client's crash and rebind by far on any machine (the tiny model makes ~1000 tokens a second
#: here; a 900-token orphan once finished before its client came back, on a slower CI host).
_CONTEXT = 16384

_ids = itertools.count()


@attrs.define
class Engine:
    addresses: WorkerAddresses
    first: EngineClient


@asynccontextmanager
async def _first_client(addresses: WorkerAddresses) -> AsyncIterator[Engine]:
    multi = attrs.evolve(addresses, client_count=2)
    async with open_engine_client(VllmProtocol(), multi, ready_timeout_s=ENGINE_STARTUP_S) as first:
        yield Engine(multi, first)


def _second_client(engine: Engine) -> AbstractAsyncContextManager[EngineClient]:
    """Client 1 of the engine (callers bound the wait for the engine to connect)."""
    return attach_engine_client(
        VllmProtocol(1), engine.addresses.for_client(1), engine.first.engines
    )


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrioPortal]:
    require_e2e(vllm_missing_reason())
    base = tmp_path_factory.mktemp("vllm-multi")
    model = build_tiny_model(base / "model", max_positions=_CONTEXT)
    log_path = base / "vllm.log"
    with ipc_worker() as addresses:
        cmd = vllm_engine_command(model, handshake_port(addresses), max_model_len=_CONTEXT)
        with process_group(cmd, log_path=log_path, env=vllm_engine_env()) as proc:
            portal = TrioPortal(lambda: _first_client(addresses))
            try:
                portal.start(
                    ENGINE_STARTUP_S + 10, check=lambda: assert_alive(proc, log_path, "vLLM")
                )
                yield portal
            finally:
                portal.close()


def _request(max_tokens: int = 6, *, ignore_eos: bool = False) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"mc-{next(_ids)}",
        prompt_token_ids=[200, 201, 202, 203],
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos),
    )


async def _tokens(client: EngineClient, max_tokens: int = 6) -> list[int]:
    with trio.fail_after(60):
        async with client.generate(_request(max_tokens)) as stream:
            return [t async for o in stream for t in o.new_token_ids]


def test_both_clients_get_their_own_outputs(engine: TrioPortal) -> None:
    state: Engine = engine.value

    async def body() -> dict[int, list[int]]:
        got: dict[int, list[int]] = {}
        with trio.fail_after(120):
            async with _second_client(state) as second:
                clients = [state.first, second]

                async def one(i: int) -> None:
                    got[i] = await _tokens(clients[i])

                async with trio.open_nursery() as nursery:
                    for i in (0, 1):
                        nursery.start_soon(one, i)
                assert second.inflight_count == 0
        return got

    got = engine.run(body)
    assert len(got[0]) == 6
    assert got[0] == got[1]  # greedy, same prompt: the same answer on either client
    assert state.first.inflight_count == 0


def test_a_rebound_client_aborts_its_orphans(
    engine: TrioPortal, caplog: pytest.LogCaptureFixture
) -> None:
    state: Engine = engine.value
    caplog.set_level(logging.INFO, logger="smg_trio.connector.client")

    async def body() -> tuple[str, list[int], bool]:
        with trio.fail_after(120):
            # Runs to the context's end unless it is aborted.
            orphan = _request(max_tokens=_CONTEXT - 8, ignore_eos=True)
            # A long request on client 1, then client 1 "crashes": no ABORT leaves it and its
            # sockets close.
            async with _second_client(state) as second, second.generate(orphan) as stream:
                await stream.__anext__()
                second.kill("simulated frontend crash")
            # Its replacement binds the same addresses. While it runs a request of its own,
            # the orphan's outputs (vLLM batches every running request of client 1 into one
            # message per step) reach it, and it ABORTs the id it never sent.
            async with _second_client(state) as again:
                fresh = await _tokens(again)
                # The engine heard: within a few steps its reports count only our own request.
                # At most 20 probes of 64 steps each: far fewer steps than the orphan has left.
                heard = False
                for _ in range(20):
                    async with again.generate(_request(64, ignore_eos=True)) as probe:
                        await probe.__anext__()
                        if again.load()[0].num_running == 1:
                            heard = True
                            break
                return orphan.request_id, fresh, heard

    orphan_id, fresh, heard = engine.run(body)
    assert len(fresh) == 6
    assert heard, "the engine still runs the orphan"
    # The decision, as the client logs it (its memory of the id is dropped again once the
    # engine reports the request finished, which may come before ``fresh`` ends).
    told = [r.getMessage() for r in caplog.records if r.name == "smg_trio.connector.client"]
    assert f"aborting {orphan_id}: an engine request this client does not know" in told
