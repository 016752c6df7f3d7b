"""The engine-side dialer: data plane after the handshake, INIT validation, exit flushing."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import zmq

from smg_trio.errors import UnexpectedHandshakeMessage
from smg_trio.protocol.handshake import EngineCoreReadyResponse, encode_ready_response
from smg_trio.transport import bind_worker_sockets, dial_frontend, run_handshake
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import RawSocketFactory

REGISTRATION = encode_ready_response(
    EngineCoreReadyResponse(
        max_model_len=2048,
        num_gpu_blocks=10,
        prefix_granularity=64,  # TokenSpeed's spelling
        dtype="float16",
        vllm_version="tokenspeed-0.0.1",
        world_size=1,
        data_parallel_size=1,
    ),
)


async def test_data_plane_round_trip(ipc: IpcNamespace) -> None:
    """After the handshake: ROUTER → DEALER ``[type, payload, *aux]``, PUSH → PULL outputs; an
    engine that pushes and exits at once still delivers (it lingers)."""

    async def engine(handshake_address: str) -> None:
        async with dial_frontend(
            handshake_address, engine_index=3, registration=REGISTRATION
        ) as es:
            assert es.identity == b"\x03\x00"
            assert es.engine_index == 3
            assert es.init.addresses.inputs == [bound.input_address]
            frames = await es.input.recv_multipart()
            assert frames == [b"\x00", b"payload", b"aux"]
            await es.output.send_multipart([b"out-1"])
            await es.output.send_multipart([b"ENGINE_CORE_DEAD"])
        assert es.input.closed
        assert es.output.closed

    with trio.fail_after(IO_DEADLINE_S):
        async with (
            bind_worker_sockets(ipc.addresses("w0")) as bound,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(partial(engine, bound.handshake_address))
            (reg,) = await run_handshake(bound, engine_count=1)
            assert reg.index == 3
            assert reg.ready.block_size_tokens == 64
            await bound.input.send_multipart([reg.identity, b"\x00", b"payload", b"aux"])
            assert await bound.output.recv_multipart() == [b"out-1"]
            assert await bound.output.recv_multipart() == [b"ENGINE_CORE_DEAD"]


@pytest.mark.parametrize("index", [-1, 65536])
async def test_engine_index_must_fit_two_bytes(index: int) -> None:
    with pytest.raises(ValueError, match=r"0\.\.65535"):
        async with dial_frontend("tcp://127.0.0.1:1", engine_index=index, registration=b""):
            pass  # pragma: no cover


async def test_multi_frame_init_is_rejected(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    router = raw_socket(zmq.ROUTER, bind="tcp://127.0.0.1:*")
    address = router._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def frontend() -> None:
        identity, _hello = await router.recv_multipart()
        await router.send_multipart([identity, b"init", b"extra"])

    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(frontend)
            with pytest.raises(UnexpectedHandshakeMessage, match="1-frame INIT, got 2"):
                async with dial_frontend(address, engine_index=0, registration=REGISTRATION):
                    pass  # pragma: no cover
