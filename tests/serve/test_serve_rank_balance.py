"""DP-rank choice with ``--api-server-count 2`` on ONE worker of two DP ranks: each frontend
picks a rank by the in-flight counts of every frontend (``worker/shared_load.py``), not only
its own (the engines' load reports reach one client only).

Frontend 1 holds two streams on one rank (call it A) and none on the other (B). Frontend 2
then opens two streams. Sharing the counts, both go to B (2 and 2). By its own counts alone
(zero on each rank) frontend 2 would put one on each, A ending with 3 and B with 1."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.mock.tiny_model import default_tiny_model_dir
from tests.helpers.frontends import hold_chat_stream, single_frontend
from tests.helpers.ipc import free_handshake_address
from tests.helpers.ports import free_port
from tests.helpers.procs import descendants, kill_leftovers, read_until_ready

pytestmark = [
    pytest.mark.slow,
    single_frontend("it starts --api-server-count 2 itself: the first pass runs it"),
]

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": 2000,
    "ignore_eos": True,
    "stream": True,
}


def _rank_of(engines: list[MockEngine], rid: str) -> int:
    (rank,) = [i for i, engine in enumerate(engines) if any(rid in key for key in engine.active)]
    return rank


async def test_each_frontend_picks_ranks_by_every_frontends_load(
    sock_dir: str, tmp_path: Path
) -> None:
    port = free_port()
    handshake = free_handshake_address()
    env = {**os.environ, "SMG_ZMQ_SOCKET_DIR": sock_dir, "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "smg_trio", "launch", "--port", str(port),
        "--api-server-count", "2", "--model-path", str(default_tiny_model_dir()),
        "--served-model-name", "m", "--worker-urls", f"ipc://{sock_dir}/engine-dp",
        "--zmq-handshake-address", handshake, "--zmq-engine-count", "2",
    ]  # fmt: skip
    log_path = tmp_path / "launch.stderr"
    with log_path.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    children: set[int] = set()
    engines = [MockEngine(handshake, MockEngineConfig(engine_index=i, step_s=0.01)) for i in (0, 1)]
    try:
        async with trio.open_nursery() as nursery:
            for engine in engines:
                nursery.start_soon(engine.run)
            assert proc.stdout is not None
            with trio.fail_after(120):
                await read_until_ready(proc.stdout, "launch")
            children = descendants(proc.pid)
            (run_dir,) = glob.glob(os.path.join(sock_dir, "smg-trio-run-*"))
            socks = {i: os.path.join(run_dir, f"frontend-{i}.sock") for i in (1, 2)}

            async def open_stream(frontend: int) -> tuple[trio.CancelScope, str, int]:
                scope = trio.CancelScope()

                async def run(task_status: trio.TaskStatus[str]) -> None:
                    with scope:
                        stream = await trio.open_unix_socket(socks[frontend])
                        await hold_chat_stream(stream, BODY, task_status=task_status)

                rid: str = await nursery.start(run)
                while not any(any(rid in k for k in e.active) for e in engines):  # noqa: ASYNC110
                    await trio.sleep(0.01)  # the ADD is on its way to another process's engine
                rank = _rank_of(engines, rid)
                (req,) = [r for k, r in engines[rank].active.items() if rid in k]
                assert req.client_index == frontend  # it came through that frontend
                return scope, rid, rank

            with trio.fail_after(60):
                # frontend 1: four streams (two per rank), then the two on one rank end
                first = [await open_stream(1) for _ in range(4)]
                assert sorted(rank for _, _, rank in first) == [0, 0, 1, 1]
                a = first[0][2]
                b = 1 - a
                for scope, rid, rank in first:
                    if rank == b:
                        scope.cancel()
                        while not any(rid in k for k in engines[b].aborts):
                            await engines[b].abort_event.wait()
                assert len(engines[a].active) == 2
                assert len(engines[b].active) == 0
                # frontend 2: two streams; every frontend's count says B is the free rank
                second = [await open_stream(2) for _ in range(2)]
                assert [rank for _, _, rank in second] == [b, b]
                assert (len(engines[a].active), len(engines[b].active)) == (2, 2)
            nursery.cancel_scope.cancel()
    finally:
        await kill_leftovers(proc, children)
