"""Fault F5: a disconnect storm. ``--clients`` streaming clients vanish at once, ``--rounds``
times; how long until the engine receives each ABORT?

Starts ``python -m smg_trio launch`` and the bench mock engine (``bench/mock.py
--abort-log``), each its own process group. Per round it opens the streams on raw sockets,
waits until every one has its first token, closes all the sockets in one go (no read, no
shutdown: the client just vanishes) and reads the mock's ABORT log: each line is the
``time.time()`` at which the engine's input loop received an ABORT and the request id. The
delay of an ABORT is that time minus the moment the first socket of its round was closed
(same host, same clock). Reports p50 and max over all rounds (target: max within 20 ms).

    python bench/abort_storm.py [--clients 64] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):  # bench helpers; peers/ (repo-only tooling)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gateway import (  # noqa: E402
    Gateway,
    _free_port,
    _remove_tree,
    gateway_launch,
    mock_command,
    rss_bytes,
    tree_pids,
    wait_ready,
)
from loadgen import build_request, chat_body  # noqa: E402

from peers.tools import start_process_group, stop_process_group  # noqa: E402
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402

#: Streams that would run for seconds: none ends before its client vanishes.
MAX_TOKENS = 900
#: The mock's step: slow enough that the mock itself (64 streams on a shared machine) is not
#: what delays its reading of ABORT.
STEP_MS = 10.0
TARGET_MS = 20.0
#: The soak's memory target: RSS after the last round within this of RSS after round 5.
RSS_TARGET_MB = 5.0
#: How long a round waits for its ABORTs before it counts the rest as lost.
ABORT_WAIT_S = 10.0


def sched_ns(pids: list[int]) -> tuple[int, int]:
    """Nanoseconds on a CPU and waiting on a run queue, summed over every thread of ``pids``
    (``/proc/<pid>/task/<tid>/schedstat``): a stall the machine's load caused shows as
    run-queue wait, one the process caused as CPU."""
    run = wait = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    fields = f.read().split()
                    run += int(fields[0])
                    wait += int(fields[1])
    return run, wait


def _read_aborts(path: Path, known: set[str]) -> dict[str, float]:
    """The first receipt time of each request id not in ``known`` (a request the engine is
    told about again, because an output of it was already on the way, counts once)."""
    first: dict[str, float] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        t, _, rid = line.partition(" ")
        if rid and rid not in known and rid not in first:
            first[rid] = float(t)
    return first


async def _open_stream(port: int, raw: bytes) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(raw)
    data = b""
    while b'"content":"' not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise RuntimeError(f"stream ended before its first token: {data[-300:]!r}")
        data += chunk
    return stream


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        directory = Path(tempfile.mkdtemp(prefix="smg-"))
        stack.callback(_remove_tree, directory)
        abort_log = directory / "aborts.log"
        port = _free_port()
        model_dir = default_tiny_model_dir()
        launch = gateway_launch(args.gateway, f"ipc://{directory}/engine-1", model_dir, port)
        cmd = launch.cmd
        env = launch.env
        trace_dir = args.tracemalloc or args.gc_log
        if not args.gateway.startswith("smg_trio"):
            trace_dir = None  # smg_trio's options: not the Rust smg's
        if trace_dir is not None:  # python -m smg_trio ... under bench/traced_run.py
            trace_dir.mkdir(parents=True, exist_ok=True)
            runner = [str(BENCH_DIR / "traced_run.py"), str(trace_dir)]
            cmd = [cmd[0], *runner, *cmd[2:]]
            if args.tracemalloc is None:
                env = {**(env or os.environ), "SMG_BENCH_TRACEMALLOC_FRAMES": "0"}
        proc = start_process_group(cmd, env=env, log_path=directory / "gateway.log")
        stack.callback(stop_process_group, proc)
        mock = start_process_group(
            mock_command(
                launch.handshake, args.step_ms, "--abort-log", str(abort_log), *launch.mock_args
            ),
            log_path=directory / "mock.log",
        )
        stack.callback(stop_process_group, mock)
        gw = Gateway(args.gateway, port, str(model_dir), proc, mock, directory / "gateway.log")
        await wait_ready(gw)
        raw = build_request(port, chat_body(gw.model, "hi", MAX_TOKENS, stream=True))
        delays_ms: list[float] = []
        round_max_ms: list[float] = []
        rss_mb: list[float] = []
        lost = 0
        known = set(_read_aborts(abort_log, set()))
        for r in range(args.rounds):
            streams: list[trio.SocketStream] = []

            async def one(streams: list[trio.SocketStream] = streams) -> None:
                streams.append(await _open_stream(port, raw))

            async with trio.open_nursery() as nursery:
                for _ in range(args.clients):
                    nursery.start_soon(one)
            pids = [*tree_pids(proc.pid), mock.pid]
            gw_before, mock_before = sched_ns(pids[:-1]), sched_ns(pids[-1:])
            t_close = time.time()
            for s in streams:
                s.socket.close()  # vanish: no read, no shutdown, no goodbye
            got: dict[str, float] = {}
            with trio.move_on_after(ABORT_WAIT_S):
                while len(got) < args.clients:
                    await trio.sleep(0.05)
                    got = _read_aborts(abort_log, known)
            gw_after, mock_after = sched_ns(pids[:-1]), sched_ns(pids[-1:])
            known |= set(got)
            lost += max(args.clients - len(got), 0)
            round_ms = [(t - t_close) * 1000 for t in got.values()]
            delays_ms += round_ms
            print(
                f"  round {r + 1}: {len(got)}/{args.clients} ABORTs,"
                f" p50 {statistics.median(round_ms):.1f} ms, max {max(round_ms):.1f} ms;"
                f" until the last: gateway CPU {(gw_after[0] - gw_before[0]) / 1e6:.1f} ms,"
                f" run-queue wait {(gw_after[1] - gw_before[1]) / 1e6:.1f} ms;"
                f" mock CPU {(mock_after[0] - mock_before[0]) / 1e6:.1f} ms,"
                f" wait {(mock_after[1] - mock_before[1]) / 1e6:.1f} ms",
                flush=True,
            )
            await trio.sleep(0.5)  # let the gateway settle between rounds
            rss_mb.append(rss_bytes(tree_pids(proc.pid)) / 2**20)
            round_max_ms.append(max(round_ms, default=float("nan")))
            print(f"  round {r + 1}: gateway RSS {rss_mb[-1]:.1f} MB", flush=True)
            if trace_dir is not None and (r + 1) in (5, args.rounds):
                proc.send_signal(signal.SIGUSR1)  # traced_run.py: a snapshot or a census
        delays_ms.sort()
        r5 = rss_mb[min(4, len(rss_mb) - 1)]
        return {
            "clients": args.clients,
            "rounds": args.rounds,
            "aborts": len(delays_ms),
            "lost": lost,
            "p50_ms": statistics.median(delays_ms),
            "p99_ms": delays_ms[int(0.99 * (len(delays_ms) - 1))],
            "max_ms": delays_ms[-1],
            "target_ms": TARGET_MS,
            "pass": lost == 0 and delays_ms[-1] <= TARGET_MS,
            "gateway": args.gateway,
            "round_max_ms": round_max_ms,
            "rss_mb": rss_mb,
            "rss_growth_after_round5_mb": rss_mb[-1] - r5,
            "rss_target_mb": RSS_TARGET_MB,
            "rss_pass": rss_mb[-1] - r5 <= RSS_TARGET_MB,
        }


def top_growth(directory: Path, n: int = 10) -> list[str]:
    """The ``n`` tracebacks whose live memory grew most between the first and the last
    snapshot in ``directory`` (``bench/traced_run.py``), as printable lines."""
    import tracemalloc

    snaps = sorted(directory.glob("snap-*.pickle"))
    if len(snaps) < 2:
        return [f"{len(snaps)} snapshot(s) in {directory}: nothing to compare"]
    first, last = (tracemalloc.Snapshot.load(str(p)) for p in (snaps[0], snaps[-1]))
    here = tracemalloc.Filter(False, tracemalloc.__file__)
    first, last = first.filter_traces([here]), last.filter_traces([here])
    lines = []
    for stat in last.compare_to(first, "traceback")[:n]:
        lines.append(f"{stat.size_diff / 1024:+.1f} KiB in {stat.count_diff:+d} blocks:")
        lines += [f"    {line}" for line in stat.traceback.format(limit=8)]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=STEP_MS, help="the mock's step")
    parser.add_argument("--gateway", default="smg_trio", choices=("smg_trio", "smg_trio_n2", "smg"))
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        default=None,
        metavar="DIR",
        help="run smg_trio under tracemalloc; snapshots after round 5 and the last round",
    )
    parser.add_argument(
        "--gc-log",
        type=Path,
        default=None,
        metavar="DIR",
        help="log smg_trio's generation 1 and 2 garbage collections to DIR/gc-<pid>.log",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    res = trio.run(bench, args)
    print(
        f"F5 abort storm ({res['clients']} x {res['rounds']}): {res['aborts']} ABORTs,"
        f" {res['lost']} lost; p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms,"
        f" max {res['max_ms']:.1f} ms; target max <= {TARGET_MS:g} ms:"
        f" {'PASS' if res['pass'] else 'FAIL'}; RSS round 5 -> {res['rounds']}:"
        f" {res['rss_growth_after_round5_mb']:+.1f} MB (target <= {RSS_TARGET_MB:g}):"
        f" {'PASS' if res['rss_pass'] else 'FAIL'}"
    )
    if args.tracemalloc is not None:
        res["tracemalloc_top_growth"] = top_growth(args.tracemalloc)
        print("\n".join(res["tracemalloc_top_growth"]))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
