"""Submit and stream: token delivery for both protocols, terminal shapes, duplicate ids,
abnormal finishes, slow consumers and the per-request memory bound."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from smg_trio.errors import ClientClosed, DuplicateRequestId, RequestStreamClosed
from smg_trio.mock.engine import MockEngineConfig, MockRequest
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.protocol.types import EngineOutput
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.engines import (
    PROTOCOLS,
    ProtocolName,
    RawEngine,
    raw_serving,
    request,
    serving,
    vllm_output,
    wait_until,
)


def _tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def _terminal_only_last(outputs: list[EngineOutput]) -> None:
    assert outputs, "no outputs"
    assert [o.finish_reason is not None for o in outputs] == [False] * (len(outputs) - 1) + [True]


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_submit_streams_tokens_until_finish(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, MockEngineConfig(protocol=proto)) as (client, (engine,)):
            async with client.generate(request("r1", max_tokens=5)) as stream:
                assert stream.request_id == "r1"
                outputs = [o async for o in stream]
                assert stream.finished
            _terminal_only_last(outputs)
            # One token per engine step; the last one rides on the terminal output.
            assert [len(o.new_token_ids) for o in outputs] == [1] * 5
            assert outputs[-1].finish_reason == "length"
            assert _tokens(outputs) == engine.requests[0].generated
            assert outputs[0].prompt_tokens == 3
            assert client.inflight_count == 0
            assert all(not s for s in client._router.inflight)


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_terminal_output_with_and_without_tokens(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    def plan(req: MockRequest) -> list[list[int]]:
        return [[10], [11], [12]]

    cfg = MockEngineConfig(protocol=proto, plan=plan)
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, cfg) as (client, _):
            # max_tokens hit on the last planned token: the token and the finish share an output.
            async with client.generate(request("with", max_tokens=3)) as stream:
                outputs = [o async for o in stream]
            _terminal_only_last(outputs)
            assert [o.new_token_ids for o in outputs] == [[10], [11], [12]]
            assert outputs[-1].finish_reason == "length"

            # The plan runs out first: a bare terminal output with no tokens (smg's mock shape).
            async with client.generate(request("without", max_tokens=8)) as stream:
                outputs = [o async for o in stream]
            _terminal_only_last(outputs)
            assert [o.new_token_ids for o in outputs] == [[10], [11], [12], []]
            assert outputs[-1].finish_reason == "stop"

            # A planned stop token finishes with stop_reason on vLLM.
            async with client.generate(
                request("stop-tok", max_tokens=8, stop_token_ids=[11])
            ) as stream:
                outputs = await stream.receive_some()
                while not stream.finished:
                    outputs += await stream.receive_some()
            assert _tokens(outputs) == [10, 11]
            assert outputs[-1].finish_reason == "stop"
            if proto == "vllm":
                assert outputs[-1].stop_reason == 11
            assert await stream.receive_some() == []


async def test_vllm_logprobs_arrive_in_wire_shape(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with (
            serving(addresses) as (client, _),
            client.generate(request("lp", max_tokens=3, logprobs=2)) as stream,
        ):
            outputs = [o async for o in stream]
    for out in outputs:
        assert out.logprobs is not None
        assert out.logprobs.token_ids == out.new_token_ids
        assert out.logprobs.top_token_ids is not None
        assert [len(row) for row in out.logprobs.top_token_ids] == [2]


async def test_duplicate_inflight_id_is_rejected_before_sending(
    addresses: WorkerAddresses,
) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, (engine,)):
            async with client.generate(request("dup", max_tokens=4)) as stream:
                with pytest.raises(DuplicateRequestId) as info:
                    async with client.generate(request("dup", max_tokens=4)):
                        pytest.fail("a duplicate id was admitted")
                assert info.value.request_id == "dup"
                # The first request is untouched by the refused one.
                outputs = [o async for o in stream]
            assert len(_tokens(outputs)) == 4
            assert client.inflight_count == 0

            # Reusable once retired. Input is one ordered pipe, so when the mock has seen this
            # ADD it has seen any ADD sent before it: exactly two means the refusal sent nothing.
            async with client.generate(request("dup", max_tokens=2)) as stream:
                outputs = [o async for o in stream]
            assert len(_tokens(outputs)) == 2
            assert [r.request_id for r in engine.requests] == ["dup", "dup"]
            assert engine.aborts == []


async def test_stream_ending_without_terminal_output_raises(addresses: WorkerAddresses) -> None:
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            async with client.generate(request("oob")) as stream:
                add = await engine.recv_kind(b"\x00")
                assert add[0] == "oob"
                await engine.push_vllm(vllm_output("oob", [5]))
                # Finished out of band: listed in finished_requests, no terminal output.
                await engine.push_vllm(finished_requests=["oob"])
                first = await stream.__anext__()
                assert first.new_token_ids == [5]
                with pytest.raises(RequestStreamClosed):
                    await stream.__anext__()
                assert not stream.finished
                assert client.inflight_count == 0

            async def drain_oob2() -> None:
                async with client.generate(request("oob2")) as stream:
                    await engine.recv_kind(b"\x00")
                    await engine.push_vllm(finished_requests=["oob2"])
                    async for _ in stream:
                        pytest.fail("no output was sent")

            with pytest.raises(RequestStreamClosed):
                await drain_oob2()


@pytest.mark.parametrize(
    ("proto", "fault", "expected"),
    [
        ("vllm", "error", "error"),
        ("vllm", "reject", "error"),
        ("tokenspeed", "error", "error"),
        ("tokenspeed", "reject", "abort"),
    ],
)
async def test_engine_side_failures_are_terminal_outputs(
    addresses: WorkerAddresses, proto: ProtocolName, fault: str, expected: str
) -> None:
    def bad(req: MockRequest) -> bool:
        return req.request_id.startswith("bad")

    cfg = MockEngineConfig(protocol=proto)
    if fault == "error":
        cfg.error_finish = bad
    else:
        cfg.reject = bad
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses, cfg) as (client, _):
            async with client.generate(request("bad-1")) as stream:
                outputs = [o async for o in stream]
            assert len(outputs) == 1
            assert outputs[0].finish_reason == expected
            assert outputs[0].new_token_ids == []
            assert client.inflight_count == 0
            # The connection is fine afterwards.
            async with client.generate(request("good", max_tokens=2)) as stream:
                outputs = [o async for o in stream]
            assert outputs[-1].finish_reason == "length"
            assert client.alive


async def test_slow_consumer_never_stalls_other_requests(addresses: WorkerAddresses) -> None:
    release = trio.Event()
    slow_outputs: list[EngineOutput] = []
    with trio.fail_after(IO_DEADLINE_S):
        async with serving(addresses) as (client, _), trio.open_nursery() as nursery:

            async def slow(task_status: trio.TaskStatus[None]) -> None:
                async with client.generate(request("slow", max_tokens=40)) as stream:
                    task_status.started()
                    await release.wait()  # reads nothing meanwhile
                    slow_outputs.extend([o async for o in stream])

            await nursery.start(slow)
            async with client.generate(request("fast", max_tokens=20)) as stream:
                fast = [o async for o in stream]
            assert len(_tokens(fast)) == 20
            assert not slow_outputs
            release.set()
    assert len(_tokens(slow_outputs)) == 40
    assert slow_outputs[-1].finish_reason == "length"


@pytest.mark.parametrize("proto", PROTOCOLS)
async def test_unread_request_holds_at_most_max_tokens_outputs(
    addresses: WorkerAddresses, proto: ProtocolName
) -> None:
    max_tokens = 25
    with trio.fail_after(IO_DEADLINE_S):
        async with (
            serving(addresses, MockEngineConfig(protocol=proto)) as (client, _),
            client.generate(request("idle", max_tokens=max_tokens)) as stream,
        ):
            await wait_until(lambda: stream.finished)
            pending = await stream.receive_some()
            assert await stream.receive_some() == []
    assert len(pending) <= max_tokens
    assert len(_tokens(pending)) == max_tokens
    assert pending[-1].finish_reason == "length"


async def test_closing_the_client_fails_live_streams(addresses: WorkerAddresses) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with AsyncExitStack() as outlives_client:
            async with serving(addresses) as (client, (engine,)):
                stream = await outlives_client.enter_async_context(
                    client.generate(request("live", max_tokens=100_000))
                )
                await stream.__anext__()
            # The stream never looks complete, and a closed client sends no abort.
            with pytest.raises(ClientClosed):
                async for _ in stream:
                    pass
            assert not stream.finished
            assert not client.alive
            with pytest.raises(ClientClosed):
                async with client.generate(request("late")):
                    pytest.fail("a closed client admitted a request")
    assert engine.aborts == []


async def test_a_request_is_woken_once_per_drain_with_all_its_outputs(
    addresses: WorkerAddresses,
) -> None:
    """Outputs that reach the client together (here three steps of one request in one
    message) wake the request's consumer once, with all of them, not once per output: a
    stream that fell behind the engine writes what it took in one socket write."""
    engine = RawEngine(addresses.handshake)
    with trio.fail_after(IO_DEADLINE_S):
        async with raw_serving(addresses, engine) as client:
            async with client.generate(request("r", max_tokens=3)) as stream:
                woken: list[list[EngineOutput]] = []
                stream.set_waker(lambda: woken.append(stream.receive_nowait()))
                await engine.recv_kind(b"\x00")
                await engine.push_vllm(
                    vllm_output("r", [5]), vllm_output("r", [6]), vllm_output("r", [7], finish=1)
                )
                await wait_until(lambda: stream.finished)
                assert [[o.new_token_ids for o in outs] for outs in woken] == [[[5], [6], [7]]]
            assert client.inflight_count == 0
