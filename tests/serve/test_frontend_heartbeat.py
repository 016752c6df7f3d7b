"""The supervisor's stall watch on one frontend's heartbeat pipe (``watch_beats``), driven
by the test as the frontend: a loop that stopped for less than the timeout is never killed,
whenever in its beat interval it stopped; one that stopped for good is; a draining group
and a frontend that exited end the watch without a kill."""

from __future__ import annotations

import os

import pytest
import trio

from smg_trio.serve.control import FRONTEND_BEATS
from smg_trio.serve.frontend import _beat
from smg_trio.serve.supervisor import watch_beats

pytestmark = pytest.mark.slow

STALL_S = 4.0
INTERVAL_S = STALL_S / FRONTEND_BEATS


class _Proc:
    pid = 4242

    def __init__(self) -> None:
        self.killed = trio.Event()

    def kill(self) -> None:
        self.killed.set()


async def test_a_stop_shorter_than_the_timeout_is_not_a_stall_and_a_long_one_is() -> None:
    read, write = os.pipe()
    proc = _Proc()
    try:
        with trio.fail_after(4 * STALL_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_beats, read, 1, proc, STALL_S, lambda: False)
                for _ in range(2):
                    os.write(write, b".")
                    await trio.sleep(INTERVAL_S)
                # the loop stops just as its next beat was due, for 0.9 of the timeout: the
                # pipe is silent for an interval more than the loop was stopped
                await trio.sleep(0.9 * STALL_S)
                assert not proc.killed.is_set()
                os.write(write, b".")
                stopped_at = trio.current_time()
                await proc.killed.wait()  # it stops for good
                assert trio.current_time() - stopped_at >= STALL_S
    finally:
        os.close(write)


@pytest.mark.parametrize("end", ["draining", "exited"])
async def test_a_draining_group_or_an_exited_frontend_ends_the_watch(end: str) -> None:
    read, write = os.pipe()
    proc = _Proc()
    with trio.fail_after(4 * STALL_S):
        os.write(write, b".")
        if end == "exited":
            os.close(write)
        await watch_beats(read, 1, proc, STALL_S, lambda: end == "draining")
    assert not proc.killed.is_set()
    if end == "draining":  # the read end is closed: the frontend's beat sees a broken pipe
        with pytest.raises(BrokenPipeError):
            os.write(write, b".")
        os.close(write)


async def test_a_frontends_beat_ends_quietly_when_the_supervisor_stopped_listening() -> None:
    """A frontend resumed after the supervisor ended its watch (it drains): the beat task
    returns; its broken pipe took the frontend's nursery down, mid-drain."""
    read, write = os.pipe()
    os.close(read)
    with trio.fail_after(STALL_S):
        await _beat(write, INTERVAL_S)  # closes ``write``
