"""The frontend handshake driver against engine-side dialers and hand-rolled misbehaving engines."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import msgspec
import pytest
import trio
import trio.testing
import zmq

from smg_trio.errors import (
    HandshakeTimeout,
    InputRegistrationTimeout,
    UnexpectedHandshakeMessage,
)
from smg_trio.protocol.handshake import (
    EngineCoreReadyResponse,
    decode_init,
    encode_ready_response,
    encode_status,
)
from smg_trio.transport import (
    BoundSockets,
    EngineRegistration,
    bind_worker_sockets,
    dial_frontend,
    engine_index,
    run_handshake,
)
from smg_trio.transport.handshake_stage import handshake_stage
from smg_trio.transport.zsocket import ZmqSocket
from tests.helpers.deadlines import IO_DEADLINE_S
from tests.helpers.hostile import open_raw_peer
from tests.helpers.ipc import IpcNamespace
from tests.helpers.sockets import RawSocketFactory

#: Short per-receive deadline for the timeout tests (real sockets, so a real clock).
SHORT_S = 0.2

E0 = b"\x00\x00"
E1 = b"\x01\x00"
HELLO = encode_status("HELLO")
READY = encode_status("READY")


def _registration(index: int = 0, **extra: object) -> bytes:
    resp = EngineCoreReadyResponse(
        max_model_len=4096,
        num_gpu_blocks=1000 + index,
        block_size=16,
        dtype="bfloat16",
        vllm_version="test-vllm-version",
        world_size=1,
        data_parallel_size=1,
        data_parallel_rank=index,
        max_num_seqs=256,
    )
    return encode_ready_response(resp, **extra)


@asynccontextmanager
async def _bound(ipc: IpcNamespace, handshake: str | None = None) -> AsyncIterator[BoundSockets]:
    addrs = ipc.addresses("w0") if handshake is None else ipc.addresses("w0", handshake)
    async with bind_worker_sockets(addrs) as bound:
        yield bound


async def _engine(
    address: str,
    index: int,
    *,
    done: trio.Event,
    dialled: trio.Event | None = None,
    **kwargs: bool,
) -> None:
    async with dial_frontend(
        address, engine_index=index, registration=_registration(index), **kwargs
    ):
        if dialled is not None:
            dialled.set()
        await done.wait()


def _check(regs: list[EngineRegistration], indices: list[int]) -> None:
    assert [r.index for r in regs] == indices
    assert [r.identity for r in regs] == [i.to_bytes(2, "little") for i in indices]
    assert [r.ready.num_gpu_blocks for r in regs] == [1000 + i for i in indices]
    assert all(r.ready.block_size_tokens == 16 for r in regs)


async def test_one_engine(ipc: IpcNamespace) -> None:
    done = trio.Event()
    with trio.fail_after(IO_DEADLINE_S):
        async with _bound(ipc) as bound, trio.open_nursery() as nursery:
            nursery.start_soon(partial(_engine, bound.handshake_address, 0, done=done))
            regs = await run_handshake(bound, engine_count=1)
            done.set()
    _check(regs, [0])


@pytest.mark.parametrize("first", [0, 1])
async def test_two_engines_in_hello_order(ipc: IpcNamespace, first: int) -> None:
    """The result is in HELLO order; the second engine dials only after the first got INIT."""
    second = 1 - first
    done = trio.Event()
    first_dialled = trio.Event()

    async def late() -> None:
        await first_dialled.wait()
        await _engine(bound.handshake_address, second, done=done)

    with trio.fail_after(IO_DEADLINE_S):
        async with _bound(ipc) as bound, trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(_engine, bound.handshake_address, first, done=done, dialled=first_dialled)
            )
            nursery.start_soon(late)
            regs = await run_handshake(bound, engine_count=2)
            done.set()
    _check(regs, [first, second])


async def test_registration_before_ready_like_vllm(ipc: IpcNamespace) -> None:
    done = trio.Event()
    with trio.fail_after(IO_DEADLINE_S):
        async with _bound(ipc) as bound, trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(
                    partial(
                        _engine, bound.handshake_address, i, done=done, register_before_ready=True
                    )
                )
            regs = await run_handshake(bound, engine_count=2)
            done.set()
    assert sorted(r.index for r in regs if r.index is not None) == [0, 1]


async def test_vllm_032_three_key_hello(ipc: IpcNamespace) -> None:
    done = trio.Event()
    with trio.fail_after(IO_DEADLINE_S):
        async with _bound(ipc) as bound, trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(
                    _engine,
                    bound.handshake_address,
                    0,
                    done=done,
                    hello_local=False,
                    with_hash_key=False,
                    register_before_ready=True,
                )
            )
            regs = await run_handshake(bound, engine_count=1)
            done.set()
    _check(regs, [0])


async def test_engine_dials_before_the_frontend_binds(ipc: IpcNamespace) -> None:
    """ZMQ connect retries: HELLO waits in the engine's DEALER until the frontend binds."""
    with socket.socket() as probe:  # find a free port; the race window is tiny
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    done = trio.Event()
    with trio.fail_after(IO_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(_engine, address, 0, done=done))
            await trio.testing.wait_all_tasks_blocked()  # HELLO sent, engine waits for INIT
            async with _bound(ipc, address) as bound:
                assert bound.handshake_address == address
                regs = await run_handshake(bound, engine_count=1)
                done.set()
    _check(regs, [0])


async def test_unindexed_identity(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    with trio.fail_after(IO_DEADLINE_S):
        async with _bound(ipc) as bound, trio.open_nursery() as nursery:

            async def engine() -> None:
                hs = raw_socket(zmq.DEALER, connect=bound.handshake_address, identity=b"abc")
                await hs.send_multipart([HELLO])
                init = decode_init((await hs.recv_multipart())[0])
                assert init.addresses.inputs == [bound.input_address]
                assert init.addresses.outputs == [bound.output_address]
                await hs.send_multipart([READY])
                inp = raw_socket(zmq.DEALER, connect=init.addresses.inputs[0], identity=b"abc")
                await inp.send_multipart([_registration(0)])

            nursery.start_soon(engine)
            regs = await run_handshake(bound, engine_count=1)
    assert regs[0].identity == b"abc"
    assert regs[0].index is None


def test_engine_index() -> None:
    assert engine_index(b"\x00\x00") == 0
    assert engine_index(b"\x01\x00") == 1
    assert engine_index(b"\x00\x01") == 256
    assert engine_index(b"\x01") is None
    assert engine_index(b"abc") is None


async def test_engine_count_must_be_positive(ipc: IpcNamespace) -> None:
    async with _bound(ipc) as bound:
        with pytest.raises(ValueError, match="engine_count >= 1"):
            await run_handshake(bound, engine_count=0)


# -- error paths: hand-rolled engines -------------------------------------------------------


async def _expect_failure(
    ipc: IpcNamespace,
    raw_socket: RawSocketFactory,
    script: list[tuple[str, bytes, list[bytes]]],
    *,
    engine_count: int,
    error: type[Exception],
    match: str,
) -> None:
    """Bind, play ``script`` ((socket, identity, frames) sends; socket is "hs" or "in") from
    raw DEALERs in order, and expect ``run_handshake`` to raise ``error``."""
    with trio.fail_after(IO_DEADLINE_S):
        async with _bound(ipc) as bound:
            dealers: dict[tuple[str, bytes], object] = {}
            for which, identity, frames in script:
                key = (which, identity)
                if key not in dealers:
                    address = bound.handshake_address if which == "hs" else bound.input_address
                    dealers[key] = raw_socket(zmq.DEALER, connect=address, identity=identity)
                sock = dealers[key]
                await sock.send_multipart(frames)  # type: ignore[attr-defined]
            with pytest.raises(error, match=match) as info:
                await run_handshake(bound, engine_count=engine_count, ready_timeout_s=SHORT_S)
            assert type(info.value) is error


Script = list[tuple[str, bytes, list[bytes]]]


class _LogWatch(logging.Handler):
    """Sets ``seen`` once the handshake logger emits a message containing ``text`` (the
    driver logs from the trio thread, so the event can be set directly)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def _ignored_then_real(
    ipc: IpcNamespace,
    raw_socket: RawSocketFactory,
    script: Script,
    *,
    engine_count: int = 1,
    real: list[int] | None = None,
    ignored: str,
) -> None:
    """Play ``script`` from raw DEALERs (strangers, which stay connected) to a running
    handshake (a ``("wait", b"", [text])`` step waits for the driver to log ``text``); once the driver logged ``ignored``, let real engines ``real`` dial: the
    handshake must complete with them."""
    real = [0] if real is None else real
    done = trio.Event()
    watch = _LogWatch(ignored)
    handshake_logger = logging.getLogger("smg_trio.transport.handshake")
    handshake_logger.addHandler(watch)
    old_level = handshake_logger.level
    handshake_logger.setLevel(logging.DEBUG)  # the waits watch DEBUG lines too
    regs: list[EngineRegistration] = []
    try:
        with trio.fail_after(IO_DEADLINE_S):
            async with _bound(ipc) as bound, trio.open_nursery() as nursery:

                async def drive() -> None:
                    regs.extend(await run_handshake(bound, engine_count=engine_count))
                    done.set()

                nursery.start_soon(drive)
                dealers: dict[tuple[str, bytes], ZmqSocket] = {}
                for which, identity, frames in script:
                    if which == "wait":  # messages on two sockets have no order: wait here
                        step = _LogWatch(frames[0].decode())
                        handshake_logger.addHandler(step)
                        try:
                            await step.seen.wait()
                        finally:
                            handshake_logger.removeHandler(step)
                        continue
                    key = (which, identity)
                    if key not in dealers:
                        address = bound.handshake_address if which == "hs" else bound.input_address
                        dealers[key] = raw_socket(zmq.DEALER, connect=address, identity=identity)
                    await dealers[key].send_multipart(frames)
                await watch.seen.wait()
                for index in real:
                    nursery.start_soon(partial(_engine, bound.handshake_address, index, done=done))
    finally:
        handshake_logger.removeHandler(watch)
        handshake_logger.setLevel(old_level)
    assert len(regs) == engine_count
    assert {r.index for r in regs} >= set(real)


async def test_duplicate_hello_does_not_abort(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    await _ignored_then_real(
        ipc,
        raw_socket,
        [("hs", E0, [HELLO]), ("hs", E0, [HELLO])],
        ignored="HELLO again from engine 0",
    )


async def test_ready_from_unknown_identity_is_ignored(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    await _ignored_then_real(
        ipc,
        raw_socket,
        [("hs", E1, [READY])],
        ignored="READY from engine 1, which never said HELLO",
    )


async def test_duplicate_ready_is_ignored(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    await _ignored_then_real(
        ipc,
        raw_socket,
        [("hs", E1, [HELLO]), ("hs", E1, [READY]), ("hs", E1, [READY])],
        ignored="duplicate READY from engine 1",
    )


async def test_extra_identity_does_not_abort(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    """More identities say HELLO than engines are expected: each gets INIT, the real one wins."""
    await _ignored_then_real(
        ipc,
        raw_socket,
        [("hs", E1, [HELLO]), ("hs", b"abc", [HELLO])],
        ignored="HELLO from engine with identity '616263'",
    )


@pytest.mark.parametrize(
    ("frames", "ignored"),
    [
        ([msgspec.msgpack.encode({"status": "BOGUS\nforged log line"})], "status 'BOGUS\\n"),
        ([b"\xc1"], "undecodable message from engine 0"),
        ([msgspec.msgpack.encode(["HELLO"])], "undecodable message from engine 0"),
        ([HELLO, b"extra"], "a 3-frame message from engine 0"),
        ([b""], "undecodable message from engine 0"),
    ],
    ids=["bad-status", "not-msgpack", "not-a-map", "three-frames", "empty"],
)
async def test_garbage_is_ignored(
    ipc: IpcNamespace,
    raw_socket: RawSocketFactory,
    frames: list[bytes],
    ignored: str,
) -> None:
    await _ignored_then_real(ipc, raw_socket, [("hs", E0, frames)], ignored=ignored)


async def test_bad_registrations_from_strangers_are_ignored(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    await _ignored_then_real(
        ipc,
        raw_socket,
        [("in", E1, [_registration(1), b"x"]), ("in", b"\x07\x00", [_registration(7)])],
        ignored="a 3-frame input registration from engine 1",
    )


async def test_duplicate_registration_is_ignored(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    await _ignored_then_real(
        ipc,
        raw_socket,
        [
            ("hs", E0, [HELLO]),
            ("hs", E0, [READY]),
            ("wait", b"", [b"handshake: READY from engine 0"]),
            ("in", E0, [_registration()]),
            ("in", E0, [_registration()]),
        ],
        engine_count=2,
        real=[1],
        ignored="duplicate input registration from engine 0",
    )


async def test_hostile_peer_holding_the_identity_during_a_real_handshake(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    """A stranger with the engine's identity says HELLO first and stays connected, then sends
    garbage and HELLO again while the real engine handshakes: the real engine still gets an
    INIT (resent to whoever holds the identity) and the handshake completes with it."""
    done = trio.Event()
    with trio.fail_after(IO_DEADLINE_S):
        async with (
            _bound(ipc) as bound,
            open_raw_peer(bound.handshake_address, E0) as stranger,
            trio.open_nursery() as nursery,
        ):
            await stranger.send(HELLO)
            await stranger.wait_connected()

            async def interfere() -> None:
                for payload in [b"\xc1", HELLO, READY, HELLO]:
                    await stranger.send(payload)
                    await trio.testing.wait_all_tasks_blocked()

            nursery.start_soon(partial(_engine, bound.handshake_address, 0, done=done))
            nursery.start_soon(interfere)
            regs = await run_handshake(bound, engine_count=1)
            done.set()
    _check(regs, [0])


async def test_empty_registration(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    await _expect_failure(
        ipc,
        raw_socket,
        [("hs", E0, [HELLO]), ("hs", E0, [READY]), ("in", E0, [b""])],
        engine_count=1,
        error=UnexpectedHandshakeMessage,
        match="empty input registration from engine 0",
    )


async def test_undecodable_registration(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    bad = msgspec.msgpack.encode({"max_model_len": 1, "dtype": "int8"})
    await _expect_failure(
        ipc,
        raw_socket,
        [("hs", E0, [HELLO]), ("hs", E0, [READY]), ("in", E0, [bad])],
        engine_count=1,
        error=UnexpectedHandshakeMessage,
        match="undecodable input registration from engine 0",
    )


async def test_hello_timeout(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    await _expect_failure(
        ipc,
        raw_socket,
        [],
        engine_count=1,
        error=HandshakeTimeout,
        match="waiting for HELLO after 0.2 s",
    )


async def test_ready_timeout(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    await _expect_failure(
        ipc,
        raw_socket,
        [("hs", E0, [HELLO])],
        engine_count=1,
        error=HandshakeTimeout,
        match="waiting for READY after 0.2 s",
    )


async def test_registration_timeout(ipc: IpcNamespace, raw_socket: RawSocketFactory) -> None:
    await _expect_failure(
        ipc,
        raw_socket,
        [
            ("hs", E0, [HELLO]),
            ("hs", E1, [HELLO]),
            ("hs", E0, [READY]),
            ("hs", E1, [READY]),
            ("in", E1, [_registration(1)]),
        ],
        engine_count=2,
        error=InputRegistrationTimeout,
        match=r"registration timed out after 0.2 s \(still waiting for engine 0\)",
    )


async def test_stage_says_what_the_handshake_waits_for(
    ipc: IpcNamespace, raw_socket: RawSocketFactory
) -> None:
    """The startup progress line's text (issue 29, item 9): before HELLO it waits for HELLO;
    after HELLO for READY (the model loading), not still for HELLO; after READY for the input
    registration; nothing once the handshake is over."""
    handshake_logger = logging.getLogger("smg_trio.transport.handshake")
    old_level = handshake_logger.level
    handshake_logger.setLevel(logging.INFO)
    stages: list[str | None] = []
    try:
        with trio.fail_after(IO_DEADLINE_S):
            async with _bound(ipc) as bound, trio.open_nursery() as nursery:
                address = bound.handshake_address
                assert address is not None
                done = trio.Event()

                async def drive() -> None:
                    await run_handshake(bound, engine_count=1)
                    done.set()

                nursery.start_soon(drive)
                await trio.testing.wait_all_tasks_blocked()
                stages.append(handshake_stage(address))
                hs = raw_socket(zmq.DEALER, connect=address, identity=E0)
                for frames, logged in ((HELLO, "HELLO from"), (READY, "READY from")):
                    watch = _LogWatch(logged)
                    handshake_logger.addHandler(watch)
                    try:
                        await hs.send_multipart([frames])
                        await watch.seen.wait()
                    finally:
                        handshake_logger.removeHandler(watch)
                    stages.append(handshake_stage(address))
                inp = raw_socket(zmq.DEALER, connect=bound.input_address, identity=E0)
                await inp.send_multipart([_registration(0)])
                await done.wait()
                stages.append(handshake_stage(address))
    finally:
        handshake_logger.setLevel(old_level)
    assert stages[0] is not None
    assert "say HELLO (0 of 1 said HELLO)" in stages[0]
    assert stages[1] is not None
    assert "said HELLO" in stages[1]
    assert "waiting for READY" in stages[1]
    assert "loads the model" in stages[1]
    assert stages[2] is not None
    assert "input registration (0 of 1" in stages[2]
    assert stages[3] is None
