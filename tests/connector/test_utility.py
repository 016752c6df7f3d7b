"""Utility calls through the connector: answers, the engine's failures, cancellation that
leaves nothing pending, a dead engine failing its pending calls, one DP rank at a time."""

from __future__ import annotations

import pytest
import trio

from smg_trio.errors import (
    EngineDeadError,
    InvalidDataParallelRank,
    UtilityCallFailed,
    UtilityUnsupported,
)
from smg_trio.mock.engine import MockEngineConfig
from smg_trio.mock.utility import NEVER_ANSWERS
from smg_trio.protocol.addresses import WorkerAddresses
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import request, serving, wait_until


async def test_reset_prefix_cache_answers(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            assert await client.call_utility("reset_prefix_cache", False, False) is True
            assert engine.utility.prefix_cache_resets == 1
            assert engine.utility.calls == [("reset_prefix_cache", [False, False])]
            assert await client.call_utility("get_supported_tasks") == ["generate"]
            assert await client.call_utility("is_sleeping") is False
            assert client.utility_pending == 0


async def test_sleep_and_wake_hold_and_release_requests(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            assert await client.call_utility("sleep", 1, "abort") is None
            assert await client.call_utility("is_sleeping") is True
            async with client.generate(request("r1", max_tokens=2)) as stream:
                await wait_until(lambda: bool(engine.requests))
                assert engine.active  # held while asleep, not stepped
                assert await client.call_utility("wake_up", None) is True
                tokens = [t async for out in stream for t in out.new_token_ids]
            assert len(tokens) == 2


async def test_engine_failure_is_an_error_naming_the_engine(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            engine.utility.sleep_mode = False
            with pytest.raises(UtilityCallFailed, match=r"engine 0 refused sleep: .*not enabled"):
                await client.call_utility("sleep", 1, "abort")
            with pytest.raises(UtilityCallFailed, match="no attribute 'no_such_method'"):
                await client.call_utility("no_such_method")
            assert client.utility_pending == 0
            assert client.alive


async def test_cancelled_call_leaves_nothing_pending(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.call_utility, NEVER_ANSWERS)
                    await wait_until(lambda: bool(engine.utility.calls))
                    assert client.utility_pending == 1
                    scope.cancel()
            assert client.utility_pending == 0
            # A late answer to the abandoned call id is dropped; the client carries on.
            engine.utility.silent.clear()
            assert await client.call_utility("reset_prefix_cache") is True


async def test_dead_engine_fails_pending_calls(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):

            async def kill_when_called() -> None:
                await wait_until(lambda: bool(engine.utility.calls))
                await engine.die_with_sentinel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_when_called)
                with pytest.raises(EngineDeadError, match="ENGINE_CORE_DEAD"):
                    await client.call_utility(NEVER_ANSWERS)
            assert client.utility_pending == 0
            with pytest.raises(EngineDeadError):
                await client.call_utility("reset_prefix_cache")


async def test_call_goes_to_the_named_rank(addresses: WorkerAddresses) -> None:
    cfgs = [MockEngineConfig(engine_index=i, data_parallel_size=2) for i in range(2)]
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, *cfgs) as (client, engines):
            by_rank = {e.config.engine_index: e for e in engines}
            assert await client.call_utility("reset_prefix_cache", rank=1) is True
            assert by_rank[1].utility.prefix_cache_resets == 1
            assert by_rank[0].utility.prefix_cache_resets == 0
            with pytest.raises(InvalidDataParallelRank):
                await client.call_utility("reset_prefix_cache", rank=5)


async def test_tokenspeed_has_no_utility_calls(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol="tokenspeed")) as (client, _):
            with pytest.raises(UtilityUnsupported, match="tokenspeed"):
                await client.call_utility("reset_prefix_cache")
            assert client.utility_pending == 0
