"""OUR EngineClient against a REAL headless vLLM 0.32.0 engine (CPU, tiny random Llama).

One engine per module: it takes 40-100 s to register and handshakes only once, so the module
shares one engine process and one client (held open by a :class:`TrioPortal`); each test runs
its async body on that client.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from peers.tools import vllm_engine_command, vllm_engine_env, vllm_missing_reason
from smg_trio.connector import EngineClient, open_engine_client
from smg_trio.errors import UtilityCallFailed
from smg_trio.protocol import EngineOutput, GenerateRequest, SamplingOptions
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.tokenizer.eos import resolve_eos
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

PROMPT = [200, 201, 202, 203, 204, 205, 206, 207]
_ids = itertools.count()


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrioPortal]:
    """A real vLLM engine dialing our bound handshake; yields the portal holding the client."""
    require_e2e(vllm_missing_reason())
    log_path = tmp_path_factory.mktemp("vllm-engine") / "vllm.log"
    with ipc_worker() as addresses:
        cmd = vllm_engine_command(tiny_model, handshake_port(addresses))
        with process_group(cmd, log_path=log_path, env=vllm_engine_env()) as proc:
            portal = TrioPortal(
                lambda: open_engine_client(
                    VllmProtocol(), addresses, ready_timeout_s=ENGINE_STARTUP_S
                )
            )
            try:
                portal.start(
                    ENGINE_STARTUP_S + 10,
                    check=lambda: assert_alive(proc, log_path, "vLLM engine"),
                )
                yield portal
            finally:
                portal.close()


def request(
    *,
    max_tokens: int = 8,
    prompt: list[int] | None = None,
    eos: tuple[int | None, list[int]] = (None, []),
    **sampling: object,
) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"e2e-{next(_ids)}",
        prompt_token_ids=list(prompt or PROMPT),
        sampling=SamplingOptions(max_tokens=max_tokens, **sampling),  # type: ignore[arg-type]
        eos_token_id=eos[0],
        extra_eos_token_ids=eos[1],
    )


async def collect(client: EngineClient, req: GenerateRequest) -> list[EngineOutput]:
    with trio.fail_after(60):
        async with client.generate(req) as stream:
            return [o async for o in stream]


def tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def test_handshake_registration(engine: TrioPortal) -> None:
    client: EngineClient = engine.value
    assert client.alive
    assert client.max_model_len == 1024
    ready = client.ready_responses[0]
    assert ready.block_size == 128
    assert ready.max_num_seqs == 128


def test_seeded_generate_is_deterministic(engine: TrioPortal) -> None:
    client: EngineClient = engine.value

    async def body() -> tuple[list[int], list[int]]:
        a = await collect(client, request(temperature=0.7, seed=42))
        b = await collect(client, request(temperature=0.7, seed=42))
        assert a[-1].finish_reason == "length"
        assert b[-1].finish_reason == "length"
        assert all(o.finish_reason is None for o in a[:-1])
        return tokens(a), tokens(b)

    first, second = engine.run(body)
    assert len(first) == 8
    assert first == second
    assert all(0 <= t < 1024 for t in first)
    assert client.inflight_count == 0


def test_greedy_generate(engine: TrioPortal) -> None:
    client: EngineClient = engine.value

    async def body() -> tuple[list[EngineOutput], list[EngineOutput]]:
        return (
            await collect(client, request(temperature=0.0, max_tokens=6)),
            await collect(client, request(temperature=0.0, max_tokens=6)),
        )

    a, b = engine.run(body)
    assert len(tokens(a)) == 6
    assert tokens(a) == tokens(b)
    assert a[-1].finish_reason == "length"
    first = a[0]
    assert first.prompt_tokens in (None, len(PROMPT))


def test_logprobs_generate(engine: TrioPortal) -> None:
    client: EngineClient = engine.value
    outputs = engine.run(collect, client, request(temperature=0.0, max_tokens=5, logprobs=2))
    assert len(tokens(outputs)) == 5
    for out in outputs:
        lp = out.logprobs
        assert lp is not None, out
        assert lp.token_ids == out.new_token_ids
        assert len(lp.logprobs) == len(out.new_token_ids)
        assert lp.ranks is not None
        assert all(r >= 1 for r in lp.ranks)
        assert lp.top_token_ids is not None
        assert lp.top_logprobs is not None
        for top_ids, top_lps, sampled_lp, rank in zip(
            lp.top_token_ids, lp.top_logprobs, lp.logprobs, lp.ranks, strict=True
        ):
            assert len(top_ids) == 2
            assert len(top_lps) == 2
            assert top_lps[0] >= top_lps[1]
            assert sampled_lp is not None
            assert sampled_lp <= 0.0
            # greedy: the sampled token is the top-1 candidate
            assert rank == 1
            assert sampled_lp == pytest.approx(top_lps[0], abs=1e-4)


def test_abort_mid_stream(engine: TrioPortal) -> None:
    client: EngineClient = engine.value

    async def body() -> tuple[int, int, list[EngineOutput]]:
        got = 0
        with trio.fail_after(60):
            async with client.generate(request(temperature=0.0, max_tokens=200)) as stream:
                async for out in stream:
                    assert out.finish_reason is None
                    got += 1
                    if got == 2:
                        break
        inflight = client.inflight_count
        # the engine sends no terminal output for an ABORTed request; the next one works
        after = await collect(client, request(temperature=0.0, max_tokens=4))
        return got, inflight, after

    got, inflight, after = engine.run(body)
    assert got == 2
    assert inflight == 0
    assert len(tokens(after)) == 4
    assert after[-1].finish_reason == "length"
    assert client.inflight_count == 0
    assert client.alive


def test_eos_ids_folded_are_accepted(engine: TrioPortal, tiny_model: Path) -> None:
    client: EngineClient = engine.value
    eos = resolve_eos(tiny_model)
    assert eos[0] is not None
    outputs = engine.run(collect, client, request(temperature=0.0, max_tokens=16, eos=eos))
    toks = tokens(outputs)
    assert 1 <= len(toks) <= 16
    reason = outputs[-1].finish_reason
    if reason == "stop":
        assert toks[-1] in {eos[0], *eos[1]}
    else:
        assert reason == "length"
        assert len(toks) == 16
    # the same prompt with ignore_eos runs to length
    outputs = engine.run(
        collect, client, request(temperature=0.0, max_tokens=16, eos=eos, ignore_eos=True)
    )
    assert outputs[-1].finish_reason == "length"
    assert len(tokens(outputs)) == 16


def test_concurrent_generates(engine: TrioPortal) -> None:
    client: EngineClient = engine.value

    async def body() -> list[list[int]]:
        results: list[list[int]] = [[] for _ in range(8)]

        async def one(i: int) -> None:
            results[i] = tokens(
                await collect(client, request(temperature=0.0, max_tokens=5, prompt=[210 + i] * 4))
            )

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
        return results

    results = engine.run(body)
    assert all(len(r) == 5 for r in results)
    assert client.inflight_count == 0


def test_utility_calls_and_reset_prefix_cache(engine: TrioPortal) -> None:
    """vLLM's utility calls over our connector: a prompt's second run hits the prefix cache,
    ``reset_prefix_cache`` empties it (the third run hits nothing), the other read-only
    methods answer, and an unknown method is the engine's failure, not a hang."""
    client: EngineClient = engine.value
    prompt = list(range(300, 600))  # full KV blocks (a CPU engine's are 128 tokens)

    async def body() -> tuple[list[int | None], Any, Any, Any, Any, str]:
        cached: list[int | None] = []
        answers = []
        for step in range(3):
            if step == 2:
                with trio.fail_after(60):
                    answers.append(await client.call_utility("reset_prefix_cache", False, False))
            outputs = await collect(client, request(temperature=0.0, max_tokens=2, prompt=prompt))
            cached.append(outputs[0].cached_tokens)
        with trio.fail_after(60):
            answers.append(await client.call_utility("get_supported_tasks"))
            answers.append(await client.call_utility("is_sleeping"))
            answers.append(await client.call_utility("is_scheduler_paused"))
            with pytest.raises(UtilityCallFailed) as failed:
                await client.call_utility("no_such_method")
        return cached, *answers, str(failed.value)

    cached, reset, tasks, sleeping, paused, failure = engine.run(body)
    assert reset is True
    assert cached[0] == 0
    assert cached[1] is not None
    assert cached[1] > 0
    assert cached[2] == 0
    assert "generate" in tasks
    assert sleeping is False
    assert paused is False
    assert "no_such_method" in failure
    assert client.utility_pending == 0
    assert client.alive
