"""Gateway benchmark: smg_trio against the Rust smg 1.13.0, same mock engine, same run.

Not a test: it prints a table and (with ``--json``) writes the figures. ``bench/run.py`` is
the entry point that also draws the chart and refreshes ``docs/performance.md``.

Each gateway runs as its own process (its own process group) with its own mock engine
subprocess (``bench/mock.py``, 1 ms step, merged-BPE tokens) dialing its handshake port. The
load comes from ``--client-procs`` separate ``bench/lean_client.py`` processes (raw HTTP/1.1
on asyncio/uvloop, their CPU reported), and a client-capacity check runs the saturation
workload against smg with twice as many client processes: the client is not the bottleneck
when that raises smg's tokens/s by at most 5%. The workloads alternate between the gateways
inside each repetition, so all of them see the same machine noise. ``smg_trio_n2``
(``--api-server-count 2``) is a row when ``launch`` has that flag.

* CPU: utime+stime of every process in the gateway's process group (all threads), from
  ``/proc/<pid>/stat``, read when the workload's connections are open and again when its last
  request finished; divided by the completion tokens the client received (streamed) or by the
  requests (non-streamed).
* Added TTFT: a quantile (p50, p99) of the gateway's TTFT (request written -> first event
  with content read) minus the engine's own median TTFT. The engine's TTFT is measured in the
  same run with a bare engine client (``smg_trio.connector.EngineClient`` in this process)
  against a third mock with the same step, at the same concurrency and ``max_tokens``.
* Memory: each gateway is restarted against a mock that steps once a second; ``--rss-streams``
  streams are opened and each has received its first token; VmRSS of the gateway's process
  group is read then, and compared with the idle (warmed-up) VmRSS.

    python bench/gateway.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
# bench/ for its siblings, the repository root for the repo-only peers/ tooling
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from loadgen import HttpConnection, HttpError, LoadResult, build_request, chat_body, run_load  # noqa: E402

from peers.tools import (  # noqa: E402
    SMG_SPEC,
    peer_paths,
    smg_launch_command,
    smg_missing_reason,
    start_process_group,
    stop_process_group,
    vllm_engine_env,
    vllm_missing_reason,
)
from smg_trio.connector import open_engine_client  # noqa: E402
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.protocol.addresses import worker_addresses  # noqa: E402
from smg_trio.protocol.types import GenerateRequest, SamplingOptions  # noqa: E402
from smg_trio.protocol.vllm import VllmProtocol  # noqa: E402

READY_TIMEOUT_S = 180.0
#: The tiny model's max_position_embeddings; vLLM refuses a longer max_model_len.
VLLM_MAX_MODEL_LEN = 1024
#: max_tokens of the memory phase's streams (they are cancelled long before they end).
RSS_MAX_TOKENS = 900
#: How long every gateway sits idle (after its warm-up) to measure its idle CPU.
IDLE_WINDOW_S = 10.0
PROMPT = "Write a short story about a lighthouse keeper."
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Workload:
    name: str
    stream: bool
    concurrency: int
    max_tokens: int
    total: int
    quick_total: int
    step_ms: float = 1.0
    ttft: bool = True
    title: str = ""


WORKLOADS = (
    Workload("stream_c1", True, 1, 16, 240, 60, title="streaming, 16 tokens, c=1"),
    Workload("stream_c32", True, 32, 256, 96, 32, title="streaming, 256 tokens, c=32"),
    Workload("stream64_c32", True, 32, 64, 320, 96, ttft=False, title="streaming, 64 tokens, c=32"),
    Workload("stream_c256", True, 256, 64, 768, 256, title="streaming, 64 tokens, c=256"),
    Workload(
        "stream_c1024",
        True,
        1024,
        64,
        2048,
        1024,
        ttft=False,
        title="streaming, 64 tokens, c=1024",
    ),
    Workload(
        "streams_1000",
        True,
        1000,
        32,
        1000,
        1000,
        ttft=False,
        title="1000 concurrent streams x 32 tokens (wall time)",
    ),
    Workload(
        "chat_c32", False, 32, 16, 640, 160, ttft=False, title="non-streaming, 16 tokens, c=32"
    ),
    Workload(
        "fixed_c32",
        True,
        32,
        256,
        96,
        32,
        step_ms=10.0,
        ttft=False,
        title="streaming, 256 tokens, c=32, 10 ms step (~3.2k tokens/s)",
    ),
)
#: The saturation workload whose throughput the client-capacity check compares.
CHECK_WORKLOAD = "stream_c256"
#: Client processes per workload (``--client-procs``; at most one per connection).
CLIENT_PROCS = 2
#: The client-capacity check passes when doubling the client processes raises the reference
#: gateway's tokens/s by at most this fraction.
CLIENT_CHECK_MAX_GAIN = 0.05
#: Sampled token ids: the longest run of tiny-model tokens that each decode to complete UTF-8.
TOKEN_RANGE = (259, 518)


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp); fields[0] is field 3 (state)
            pids.append(int(entry))
    return pids


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant of it (a frontend in a session of its own too)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))  # field 4 (ppid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime+stime (all threads) of ``pids``, in seconds."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # fields 14 and 15
    return ticks / CLK_TCK


def rss_bytes(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/statm") as f:
            total += int(f.read().split()[1]) * PAGE
    return total


#: The engine process :func:`mock_command` starts: ``mock.py`` (the product's trio mock) or
#: ``lean_engine.py`` (a plain pyzmq loop; bench/engine_check.py).
ENGINE_SCRIPT = "mock.py"


def mock_command(handshake: str, step_ms: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(BENCH_DIR / ENGINE_SCRIPT),
        "--handshake",
        handshake,
        "--step-ms",
        str(step_ms),
        "--token-range",
        str(TOKEN_RANGE[0]),
        str(TOKEN_RANGE[1]),
        *extra,
    ]


@dataclass
class Gateway:
    """A running gateway and its mock engine, both in their own process groups."""

    name: str
    port: int
    model: str
    proc: subprocess.Popen[bytes]
    mock: subprocess.Popen[bytes]
    log: Path
    pids: list[int] = field(default_factory=list)

    def cpu(self) -> float:
        return cpu_seconds(self.pids)

    def rss(self) -> int:
        return rss_bytes(self.pids)


@dataclass(frozen=True)
class Launch:
    cmd: list[str]
    handshake: str
    env: dict[str, str] | None = None
    mock_args: tuple[str, ...] = ()
    #: The gateway's processes once it is fully up (the supervisor and its frontends).
    processes: int = 1


def gateway_launch(name: str, worker_url: str, model_dir: Path, port: int) -> Launch:
    """How to start gateway ``name`` serving ``worker_url`` and where its mock must dial."""
    handshake = worker_addresses(worker_url).handshake
    if name in ("smg_trio", "smg_trio_n2", "smg_trio_traced", "smg_trio_base", "smg_trio_base_n2"):
        cmd = [sys.executable, "-m", "smg_trio", "launch", "--worker-urls", worker_url]
        cmd += ["--backend", "vllm", "--model-path", str(model_dir), "--port", str(port)]
        if name.endswith("_n2"):
            cmd += ["--api-server-count", "2"]
        env = None
        if name == "smg_trio_traced":  # bench/tracing_cost.py: spans to its OTLP sink
            cmd += ["--otlp-traces-endpoint", os.environ["SMG_BENCH_OTLP_ENDPOINT"]]
            env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
        if name.startswith("smg_trio_base"):  # another checkout's smg_trio
            env = {**os.environ, "PYTHONPATH": os.environ["SMG_BENCH_BASE_TREE"]}
            cmd.insert(1, "-P")  # not the current directory's smg_trio: the tree's
        processes = 3 if name.endswith("_n2") else 1
        return Launch([*cmd, "--log-level", "warning"], handshake, env, processes=processes)
    if name == "smg":
        cmd = smg_launch_command(
            worker_url, model_dir, backend="vllm", port=port, prometheus_port=_free_port()
        )
        return Launch(cmd, handshake)
    if name == "vllm":
        # vLLM's API server fronting an external (headless) engine: the mock dials its
        # data-parallel RPC port as a non-local engine and answers its UTILITY calls.
        rpc = _free_port()
        cmd = [str(peer_paths().vllm_python), "-m", "vllm.entrypoints.cli.main", "serve"]
        cmd += [str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--data-parallel-size", "1", "--data-parallel-size-local", "0"]
        cmd += ["--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc)]
        cmd += ["--dtype", "float32", "--max-model-len", str(VLLM_MAX_MODEL_LEN)]
        cmd += ["--disable-uvicorn-access-log"]
        return Launch(cmd, f"tcp://127.0.0.1:{rpc}", vllm_engine_env(), ("--answer-utility",))
    raise ValueError(name)


async def start_gateway(
    name: str,
    model_dir: Path,
    step_ms: float,
    stack: contextlib.ExitStack,
    engine_args: Sequence[str] = (),
) -> Gateway:
    """Start gateway ``name`` and a mock dialing it (``engine_args`` added to its command
    line); return once a 1-token chat answers 200."""
    directory = Path(tempfile.mkdtemp(prefix="smg-"))  # short: ipc paths are length-limited
    stack.callback(_remove_tree, directory)
    url = f"ipc://{directory}/engine-1"
    port = _free_port()
    launch = gateway_launch(name, url, model_dir, port)
    log = directory / f"{name}.log"
    # another checkout's gateway runs from that tree, so that the frontend processes its
    # supervisor starts (python -m, the working directory first) import its code too
    cwd = os.environ["SMG_BENCH_BASE_TREE"] if name.startswith("smg_trio_base") else None
    proc = start_process_group(launch.cmd, env=launch.env, log_path=log, cwd=cwd)
    stack.callback(stop_process_group, proc)
    mock = start_process_group(
        mock_command(launch.handshake, step_ms, *launch.mock_args, *engine_args),
        log_path=directory / "mock.log",
    )
    stack.callback(stop_process_group, mock)
    gw = Gateway(name, port, str(model_dir), proc, mock, log)
    t0 = time.perf_counter()
    await wait_ready(gw)
    # The first answer can come before every frontend process has started: wait for all of
    # them, or the CPU of the missing ones is never counted.
    deadline = trio.current_time() + READY_TIMEOUT_S
    while True:
        gw.pids = sorted(set(group_pids(proc.pid)) | set(tree_pids(proc.pid)))
        if len(gw.pids) >= launch.processes:
            break
        if trio.current_time() > deadline:
            raise RuntimeError(f"{name}: {len(gw.pids)} of {launch.processes} processes")
        await trio.sleep(0.1)
    if launch.processes > 1:
        await trio.sleep(1.0)  # the last frontend to start finishes its own startup
    print(f"  {name} ready in {time.perf_counter() - t0:.1f} s (pids {gw.pids})", flush=True)
    return gw


def _remove_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*"), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() else path.unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


def _tail(path: Path, n: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


async def wait_ready(gw: Gateway) -> None:
    raw = build_request(gw.port, chat_body(gw.model, "hi", 1, stream=False))
    last = "no answer"
    deadline = trio.current_time() + READY_TIMEOUT_S
    while trio.current_time() < deadline:
        for proc, what in ((gw.proc, gw.name), (gw.mock, "mock engine")):
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited ({proc.returncode}):\n{_tail(gw.log)}")
        try:
            conn = await HttpConnection.connect(gw.port)
            try:
                with trio.fail_after(10):
                    await conn.request(raw, stream=False)
                return
            finally:
                await conn.aclose()
        except (OSError, HttpError, trio.TooSlowError) as exc:
            last = str(exc)[:200]
        await trio.sleep(0.25)
    raise RuntimeError(f"{gw.name} not ready in {READY_TIMEOUT_S}s ({last}):\n{_tail(gw.log)}")


# --------------------------------------------------------------------------- measurements


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def client_procs(w: Workload) -> int:
    """Client processes for ``w``: :data:`CLIENT_PROCS`, at most one per connection."""
    return max(1, min(CLIENT_PROCS, w.concurrency))


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


async def drive_clients(
    cmds: Sequence[Sequence[str]],
    *,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Start one load client process per command, wait until each prints its "ready" line,
    send them all "go", and collect their output until they exit (killed on the way out).
    Returns each one's result (the JSON of its last line) and the wall clock from "go" to the
    last exit. ``on_start`` runs once all are ready, ``on_end`` once all finished."""
    children = [
        await trio.lowlevel.open_process(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for cmd in cmds
    ]
    outs: list[bytes] = [b""] * len(children)
    try:
        for i, child in enumerate(children):  # each prints "ready" once connected
            assert child.stdout is not None
            while b"\n" not in outs[i]:
                data = await child.stdout.receive_some(65536)
                if not data:
                    raise RuntimeError(f"load client exited ({await child.wait()})")
                outs[i] += data
            outs[i] = outs[i].split(b"\n", 1)[1]
        if on_start is not None:
            on_start()
        wall0 = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            await child.stdin.send_all(b"go\n")

        async def collect(i: int) -> None:
            child = children[i]
            assert child.stdout is not None
            while data := await child.stdout.receive_some(1 << 20):
                outs[i] += data
            await child.wait()

        async with trio.open_nursery() as nursery:
            for i in range(len(children)):
                nursery.start_soon(collect, i)
        wall = time.perf_counter() - wall0
        if on_end is not None:
            on_end()
    finally:
        for child in children:
            with contextlib.suppress(OSError):
                child.kill()
    return [json.loads(out.strip().splitlines()[-1]) for out in outs], wall


async def run_clients(
    port: int,
    raw: bytes,
    *,
    stream: bool,
    concurrency: int,
    total: int,
    expect_tokens: int,
    procs: int,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> LoadResult:
    """:func:`loadgen.run_load`'s workload driven by ``procs`` separate
    ``bench/lean_client.py`` processes (the connections and requests split between them), so
    that the client is never the bottleneck; ``loadgen_cpu_s`` is their CPU time, summed.
    ``on_start`` runs once every connection is open, ``on_end`` once every process finished."""
    procs = max(1, min(procs, concurrency))
    with tempfile.NamedTemporaryFile(prefix="smg-req-", suffix=".bin", delete=False) as f:
        f.write(raw)
    result = LoadResult()
    try:
        cmds = []
        for conns, reqs in zip(_split(concurrency, procs), _split(total, procs), strict=True):
            cmd = [sys.executable, str(BENCH_DIR / "lean_client.py"), "--port", str(port)]
            cmd += ["--connections", str(conns), "--requests", str(reqs)]
            cmd += ["--request-file", f.name, "--max-tokens", str(expect_tokens)]
            cmds.append([*cmd, *(["--stream"] if stream else [])])
        outs, result.wall_s = await drive_clients(cmds, on_start=on_start, on_end=on_end)
        for r in outs:
            result.requests += r["requests"]
            result.errors += r["errors"]
            result.completion_tokens += r["completion_tokens"]
            result.content_chunks += r["content_chunks"]
            result.ttfts_s += r["ttfts_s"]
            result.loadgen_cpu_s += r["cpu_s"]
            result.first_error = result.first_error or r["first_error"]
    finally:
        os.unlink(f.name)
    return result


async def gateway_run(gw: Gateway, w: Workload, total: int, procs: int = 0) -> dict[str, Any]:
    """One run of ``w`` against ``gw``: from ``procs`` client processes (0: the default
    for the workload, :func:`client_procs`)."""
    raw = build_request(gw.port, chat_body(gw.model, PROMPT, w.max_tokens, stream=w.stream))
    marks: dict[str, float] = {}

    def start() -> None:
        marks["cpu0"] = gw.cpu()

    def end() -> None:
        marks["cpu1"] = gw.cpu()

    procs = procs or client_procs(w)
    res = await run_clients(
        gw.port,
        raw,
        stream=w.stream,
        concurrency=w.concurrency,
        total=total,
        expect_tokens=w.max_tokens,
        procs=procs,
        on_start=start,
        on_end=end,
    )
    rec = _record(res, marks["cpu1"] - marks["cpu0"], w)
    rec["client_procs"] = min(procs, w.concurrency)
    return rec


def _record(res: LoadResult, gw_cpu_s: float, w: Workload) -> dict[str, Any]:
    tokens = max(res.completion_tokens, 1)
    return {
        "requests": res.requests,
        "errors": res.errors,
        "first_error": res.first_error,
        "completion_tokens": res.completion_tokens,
        "content_chunks": res.content_chunks,
        "wall_s": res.wall_s,
        "req_per_s": res.requests / res.wall_s if res.wall_s else 0.0,
        "tokens_per_s": res.completion_tokens / res.wall_s if res.wall_s else 0.0,
        "gateway_cpu_s": gw_cpu_s,
        "gateway_cpu_util": gw_cpu_s / res.wall_s if res.wall_s else 0.0,
        "cpu_us_per_token": gw_cpu_s / tokens * 1e6,
        "cpu_us_per_request": gw_cpu_s / max(res.requests, 1) * 1e6,
        "tokens_per_chunk": (res.completion_tokens / res.content_chunks)
        if res.content_chunks
        else None,
        "loadgen_cpu_us_per_token": res.loadgen_cpu_s / tokens * 1e6,
        "loadgen_cpu_us_per_request": res.loadgen_cpu_s / max(res.requests, 1) * 1e6,
        "loadgen_cpu_s_total": res.loadgen_cpu_s,
        "ttfts_ms": [t * 1e3 for t in res.ttfts_s] if w.stream else [],
    }


async def client_check(gw: Gateway, w: Workload, total: int) -> dict[str, Any]:
    """Run ``w`` on ``gw`` with :func:`client_procs` client processes and with twice as
    many, alternating (median of 3 each): the client is not the bottleneck when doubling it
    raises the gateway's tokens/s by at most :data:`CLIENT_CHECK_MAX_GAIN`."""
    k = client_procs(w)
    tps: dict[int, list[float]] = {k: [], 2 * k: []}
    cpu: dict[int, list[float]] = {k: [], 2 * k: []}
    for rep in range(3):
        for procs in (k, 2 * k) if rep % 2 == 0 else (2 * k, k):
            rec = await gateway_run(gw, w, total, procs)
            tps[procs].append(rec["tokens_per_s"])
            cpu[procs].append(rec["loadgen_cpu_s_total"])
    base, doubled = statistics.median(tps[k]), statistics.median(tps[2 * k])
    gain = doubled / base - 1 if base else float("nan")
    out = {
        "gateway": gw.name,
        "workload": w.name,
        "procs": k,
        "tokens_per_s": base,
        "doubled_procs": 2 * k,
        "doubled_tokens_per_s": doubled,
        "gain": gain,
        "max_gain": CLIENT_CHECK_MAX_GAIN,
        "ok": gain <= CLIENT_CHECK_MAX_GAIN,
        "client_cpu_s": statistics.median(cpu[k]),
        "doubled_client_cpu_s": statistics.median(cpu[2 * k]),
    }
    print(f"  {client_check_line(out)}", flush=True)
    return out


def client_check_line(c: dict[str, Any]) -> str:
    return (
        f"client check ({c['gateway']}, {c['workload']}): {c['procs']} client processes "
        f"{c['tokens_per_s']:.0f} tokens/s, {c['doubled_procs']} processes "
        f"{c['doubled_tokens_per_s']:.0f} tokens/s: {c['gain'] * 100:+.1f}% "
        f"({'OK' if c['ok'] else 'FAILED'}: at most {c['max_gain'] * 100:+.0f}% allowed; "
        f"client CPU {c['client_cpu_s']:.2f} s vs {c['doubled_client_cpu_s']:.2f} s per run)"
    )


async def engine_baseline(client: Any, w: Workload, total: int, tag: str) -> dict[str, Any]:
    """The engine's own TTFT and throughput through a bare engine client (no HTTP)."""
    ttfts: list[float] = []
    tokens = 0
    remaining = iter(range(total))

    async def worker() -> None:
        nonlocal tokens
        for i in remaining:
            req = GenerateRequest(
                request_id=f"{tag}-{i}",
                prompt_token_ids=list(range(300, 300 + 24)),  # ~ the chat prompt
                sampling=SamplingOptions(max_tokens=w.max_tokens, temperature=1.0),
            )
            t0 = time.perf_counter()
            first = True
            async with client.generate(req) as stream:
                async for out in stream:
                    if first and out.new_token_ids:
                        ttfts.append((time.perf_counter() - t0) * 1e3)
                        first = False
                    tokens += len(out.new_token_ids)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(w.concurrency):
            nursery.start_soon(worker)
    wall = time.perf_counter() - wall0
    return {
        "requests": total,
        "completion_tokens": tokens,
        "wall_s": wall,
        "req_per_s": total / wall,
        "client_cpu_us_per_token": (time.process_time() - cpu0) / max(tokens, 1) * 1e6,
        "ttfts_ms": ttfts,
    }


def _median(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(
    runs: dict[str, dict[str, list[dict[str, Any]]]], baseline: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, dict[str, Any]]]:
    keys = (
        "wall_s",
        "req_per_s",
        "tokens_per_s",
        "cpu_us_per_token",
        "cpu_us_per_request",
        "tokens_per_chunk",
        "gateway_cpu_util",
        "loadgen_cpu_us_per_token",
        "loadgen_cpu_us_per_request",
    )
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for gw_name, per_workload in runs.items():
        out[gw_name] = {}
        for wname, reps in per_workload.items():
            s: dict[str, Any] = {k: _median(reps, k) for k in keys}
            s["reps"] = len(reps)
            s["errors"] = sum(r["errors"] for r in reps)
            s["cpu_us_per_token_range"] = [
                min(r["cpu_us_per_token"] for r in reps),
                max(r["cpu_us_per_token"] for r in reps),
            ]
            ttfts = [t for r in reps for t in r["ttfts_ms"]]
            base = [t for r in baseline.get(wname, []) for t in r["ttfts_ms"]]
            if ttfts and base:
                engine_p50 = quantile(base, 0.5)
                s["engine_ttft_p50_ms"] = engine_p50
                for q, label in ((0.5, "p50"), (0.99, "p99")):
                    s[f"ttft_{label}_ms"] = quantile(ttfts, q)
                    # the engine's median TTFT is a constant offset for both quantiles
                    s[f"added_ttft_{label}_ms"] = quantile(ttfts, q) - engine_p50
                s["ttft_samples"] = len(ttfts)
            out[gw_name][wname] = s
    return out


# --------------------------------------------------------------------------- memory


async def rss_with_streams(gw: Gateway, streams: int) -> dict[str, Any]:
    """Open ``streams`` streaming chats (slow mock), wait for each one's first token, read RSS."""
    warm = build_request(gw.port, chat_body(gw.model, PROMPT, 2, stream=True))
    await run_load(gw.port, warm, stream=True, concurrency=16, total=32, expect_tokens=2)
    await trio.sleep(0.5)
    idle = gw.rss()
    raw = build_request(gw.port, chat_body(gw.model, PROMPT, RSS_MAX_TOKENS, stream=True))
    opened = 0
    all_open = trio.Event()
    connect_limit = trio.Semaphore(64)
    failures: list[str] = []

    async def one() -> None:
        nonlocal opened
        async with connect_limit:
            conn = await HttpConnection.connect(gw.port)
        try:
            await conn.stream.send_all(raw)
            while b'"delta":{"content":"' not in conn.buf.replace(b'"delta":{"content":""', b""):
                await conn._fill()
            opened += 1
            if opened == streams:
                all_open.set()
            await trio.sleep_forever()
        except (OSError, HttpError) as exc:
            failures.append(str(exc)[:200])
            all_open.set()
        finally:
            conn.stream.socket.close()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
        with trio.fail_after(180):
            await all_open.wait()
        open_s = time.perf_counter() - t0
        await trio.sleep(1.0)
        held = gw.rss()
        nursery.cancel_scope.cancel()
    if failures:
        raise RuntimeError(f"{gw.name}: {len(failures)} streams failed: {failures[0]}")
    return {
        "streams": streams,
        "rss_idle_mib": idle / 2**20,
        "rss_with_streams_mib": held / 2**20,
        "kib_per_stream": (held - idle) / 1024 / streams,
        "open_s": open_s,
    }


# --------------------------------------------------------------------------- main


def multi_frontend_supported() -> bool:
    """Whether this smg_trio's ``launch`` takes ``--api-server-count`` (N frontends)."""
    out = subprocess.run(
        [sys.executable, "-m", "smg_trio", "launch", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "--api-server-count" in out


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError, ValueError):
        mem_gib = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    from importlib.metadata import version

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "smg_trio": version("smg_trio"),
        "trio": version("trio"),
        "pyzmq": version("pyzmq"),
        "hypercorn": version("hypercorn"),
        "smg": SMG_SPEC.split("==")[1],
        "loadavg_at_start": list(os.getloadavg()),
    }


def _ttft_cell(s: dict[str, Any]) -> str:
    if "added_ttft_p50_ms" not in s:
        return ""
    return f"{s['added_ttft_p50_ms']:.2f}/{s['added_ttft_p99_ms']:.2f}"


def print_table(result: dict[str, Any]) -> None:
    summary = result["summary"]
    names = list(summary)
    header = (
        f"{'workload':<12} {'gateway':<11} {'wall s':>6} {'req/s':>7} {'tok/s':>7} "
        f"{'CPU µs/tok':>10} "
        f"{'CPU µs/req':>10} {'tok/chunk':>9} {'+TTFT p50/p99 ms':>17} {'lg µs/tok':>9} "
        f"{'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for w in result["workloads"]:
        wname = w["name"]
        for gw in names:
            s = summary[gw].get(wname)
            if s is None:
                continue
            ref = summary.get("smg", {}).get(wname)
            metric = "cpu_us_per_token" if w["stream"] else "cpu_us_per_request"
            ratio = s[metric] / ref[metric] if ref and ref.get(metric) else float("nan")
            tpc = s.get("tokens_per_chunk")
            print(
                f"{wname:<12} {gw:<11} {s['wall_s']:>6.2f} {s['req_per_s']:>7.1f} "
                f"{s['tokens_per_s']:>7.0f} "
                f"{s['cpu_us_per_token'] if w['stream'] else float('nan'):>10.1f} "
                f"{s['cpu_us_per_request']:>10.0f} "
                f"{tpc if tpc is not None else float('nan'):>9.2f} {_ttft_cell(s):>17} "
                f"{s['loadgen_cpu_us_per_token'] if w['stream'] else float('nan'):>9.1f} "
                f"{ratio:>5.2f}x"
            )
    check = result.get("client_check")
    if check:
        print(client_check_line(check))
    for gw, m in result.get("memory", {}).items():
        print(
            f"memory {gw:<9} {m['streams']} streams: RSS {m['rss_idle_mib']:.1f} -> "
            f"{m['rss_with_streams_mib']:.1f} MiB, {m['kib_per_stream']:.1f} KiB/stream"
        )


async def _phase(
    args: argparse.Namespace,
    names: list[str],
    model_dir: Path,
    step_ms: float,
    workloads: Sequence[Workload],
    reps: int,
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    baseline: dict[str, list[dict[str, Any]]],
    idle: dict[str, float] | None = None,
    check_out: dict[str, Any] | None = None,
) -> None:
    """Start every gateway (and a baseline mock when a workload needs TTFT) with a mock that
    steps every ``step_ms``; run ``workloads`` ``reps`` times, alternating the gateways."""
    with contextlib.ExitStack() as stack:
        gateways: dict[str, Gateway] = {}
        for name in list(names):
            try:
                gw = gateways[name] = await start_gateway(name, model_dir, step_ms, stack)
            except RuntimeError as exc:
                if name != "smg_trio_n2":
                    raise
                print(f"  smg_trio_n2 skipped: it did not start: {str(exc)[-300:]}", flush=True)
                names.remove(name)
                runs.pop(name, None)
                continue
            for s in (True, False):  # warm-up
                raw = build_request(gw.port, chat_body(gw.model, PROMPT, 16, stream=s))
                await run_load(gw.port, raw, stream=s, concurrency=8, total=64, expect_tokens=16)
        if idle is not None:
            # every gateway idle at once, after the warm-up: CPU per second of wall time
            cpu0 = {n: g.cpu() for n, g in gateways.items()}
            window = IDLE_WINDOW_S / 3 if args.quick else IDLE_WINDOW_S
            await trio.sleep(window)
            for n, g in gateways.items():
                idle[n] = (g.cpu() - cpu0[n]) / window * 1e3
            print(f"  idle CPU ms/s: { {n: round(v, 1) for n, v in idle.items()} }", flush=True)
        client_cm: contextlib.AbstractAsyncContextManager[Any] | None = None
        if any(w.ttft for w in workloads):
            directory = Path(tempfile.mkdtemp(prefix="smg-"))
            stack.callback(_remove_tree, directory)
            addresses = worker_addresses(
                f"ipc://{directory}/engine-1", f"tcp://127.0.0.1:{_free_port()}"
            )
            base_mock = start_process_group(
                mock_command(addresses.handshake, step_ms), log_path=directory / "mock.log"
            )
            stack.callback(stop_process_group, base_mock)
            client_cm = open_engine_client(VllmProtocol(), addresses, ready_timeout_s=60)
        async with client_cm if client_cm is not None else contextlib.nullcontext() as client:
            for rep in range(reps):
                order = list(names) if rep % 2 == 0 else list(names)[::-1]
                for w in workloads:
                    total = w.quick_total if args.quick else w.total
                    if w.ttft:
                        b = await engine_baseline(client, w, total, f"{w.name}-{rep}")
                        baseline.setdefault(w.name, []).append(b)
                    for name in order:
                        rec = await gateway_run(gateways[name], w, total)
                        runs[name].setdefault(w.name, []).append(rec)
                        print(
                            f"  rep {rep + 1} {w.name:<12} {name:<11} "
                            f"{rec['req_per_s']:7.1f} req/s {rec['cpu_us_per_token']:7.1f} µs/tok "
                            f"{rec['cpu_us_per_request']:7.0f} µs/req errors {rec['errors']}",
                            flush=True,
                        )
                        if rec["errors"]:
                            print(f"    first error: {rec['first_error']}", flush=True)
            check = next((w for w in workloads if w.name == CHECK_WORKLOAD), None)
            if check_out is not None and check is not None:
                ref = "smg" if "smg" in gateways else names[0]
                check_out.update(
                    await client_check(
                        gateways[ref], check, check.quick_total if args.quick else check.total
                    )
                )


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = default_tiny_model_dir()
    global CLIENT_PROCS, ENGINE_SCRIPT
    CLIENT_PROCS = args.client_procs
    ENGINE_SCRIPT = "lean_engine.py" if args.engine == "lean" else "mock.py"
    names = ["smg_trio"]
    if os.environ.get("SMG_BENCH_BASE_TREE"):  # another checkout's smg_trio beside it
        names.append("smg_trio_base")
    if multi_frontend_supported():
        names.append("smg_trio_n2")
        if os.environ.get("SMG_BENCH_BASE_TREE"):
            names.append("smg_trio_base_n2")
    else:
        print("smg_trio_n2 skipped: `launch` has no --api-server-count", file=sys.stderr)
    reason = smg_missing_reason()
    if reason is None:
        names.append("smg")
    else:
        print(f"smg skipped: {reason}", file=sys.stderr)
    if args.vllm and args.quick and not args.with_vllm:
        print("vLLM API server skipped in --quick (its start-up takes minutes; --with-vllm)")
    elif args.vllm:
        reason = vllm_missing_reason()
        if reason is None:
            names.append("vllm")
        else:
            print(f"vLLM API server skipped: {reason}", file=sys.stderr)
    workloads = [w for w in WORKLOADS if not args.only or w.name in args.only]
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    info = machine_info()
    print(
        f"gateway bench: {info['cpu']}, {info['cores']} cores, python {info['python']}, "
        f"{reps} rep(s); load avg {info['loadavg_at_start']}",
        flush=True,
    )
    t_start = time.perf_counter()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in names}
    baseline: dict[str, list[dict[str, Any]]] = {}
    idle: dict[str, float] = {}
    check: dict[str, Any] = {}
    for i, step_ms in enumerate(sorted({w.step_ms for w in workloads})):
        phase = [w for w in workloads if w.step_ms == step_ms]
        print(f"phase: mock step {step_ms:g} ms: {', '.join(w.name for w in phase)}", flush=True)
        await _phase(
            args,
            names,
            model_dir,
            step_ms,
            phase,
            reps,
            runs,
            baseline,
            idle if i == 0 else None,
            check if i == 0 else None,
        )
    memory: dict[str, Any] = {}
    if args.rss_streams > 0:
        print(f"phase: memory, mock step {args.rss_step_ms:g} ms", flush=True)
        for name in names:
            with contextlib.ExitStack() as stack:
                try:
                    gw = await start_gateway(name, model_dir, args.rss_step_ms, stack)
                except RuntimeError:
                    if name != "smg_trio_n2":
                        raise
                    continue
                memory[name] = await rss_with_streams(gw, args.rss_streams)
                print(f"  memory {name}: {memory[name]}", flush=True)
    summary = summarize(runs, baseline)
    return {
        "machine": info,
        "config": {
            "quick": args.quick,
            "argv": args.argv,
            "reps": reps,
            "rss_step_ms": args.rss_step_ms,
            "client_procs": CLIENT_PROCS,
            "client": "bench/lean_client.py (asyncio" + (", uvloop)" if _has_uvloop() else ")"),
            "prompt": PROMPT,
            "token_range": list(TOKEN_RANGE),
            "smg_binary": str(peer_paths().smg_executable),
        },
        "workloads": [
            asdict(w) | {"requests": w.quick_total if args.quick else w.total} for w in workloads
        ],
        "summary": summary,
        "baseline": {
            wname: {
                "ttft_p50_ms": quantile([t for r in reps_ for t in r["ttfts_ms"]], 0.5),
                "ttft_p99_ms": quantile([t for r in reps_ for t in r["ttfts_ms"]], 0.99),
                "req_per_s": statistics.median(r["req_per_s"] for r in reps_),
                "client_cpu_us_per_token": statistics.median(
                    r["client_cpu_us_per_token"] for r in reps_
                ),
            }
            for wname, reps_ in baseline.items()
        },
        "memory": memory,
        "idle_cpu_ms_per_s": idle,
        "client_check": check,
        "runs": {
            gw: {
                w: [{k: v for k, v in r.items() if k != "ttfts_ms"} for r in rs]
                for w, rs in per_workload.items()
            }
            for gw, per_workload in runs.items()
        },
        "elapsed_s": time.perf_counter() - t_start,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="fewer requests, one repetition")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 1)")
    p.add_argument("--only", nargs="*", default=[], help="run only these workloads")
    p.add_argument(
        "--rss-streams",
        type=int,
        default=None,
        help="streams of the memory phase (default 1000, quick 200; 0 skips it)",
    )
    p.add_argument("--rss-step-ms", type=float, default=1000.0)
    p.add_argument(
        "--no-vllm",
        dest="vllm",
        action="store_false",
        help="skip vLLM's own API server (run when .peers/vllm is installed)",
    )
    p.add_argument("--with-vllm", action="store_true", help="run vLLM's API server in --quick too")
    p.add_argument(
        "--client-procs",
        type=int,
        default=CLIENT_PROCS,
        help=f"load-client processes per workload (default {CLIENT_PROCS}; the client check "
        "doubles them)",
    )
    p.add_argument(
        "--engine",
        choices=("mock", "lean"),
        default="mock",
        help="the engine: bench/mock.py (the product's trio mock) or bench/lean_engine.py",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


async def until_sigterm(
    run: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]], args: argparse.Namespace
) -> dict[str, Any] | None:
    """``run(args)``, cancelled cleanly on SIGTERM (None then); Ctrl-C raises
    KeyboardInterrupt through it. Either way every process it started is stopped."""
    result: dict[str, Any] | None = None
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    print("SIGTERM: stopping", file=sys.stderr, flush=True)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            result = await run(args)
            nursery.cancel_scope.cancel()
    return result


def _shown_argv(argv: list[str]) -> list[str]:
    """The options worth showing in the docs (not the JSON path)."""
    shown: list[str] = []
    skip = False
    for a in argv:
        if skip or a.startswith("--json="):
            skip = False
            continue
        if a == "--json":
            skip = True
            continue
        shown.append(a)
    return shown


def run_bench(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; every process it started is stopped on the way out (also on Ctrl-C
    or SIGTERM)."""
    args = parser().parse_args(argv)
    if args.rss_streams is None:
        args.rss_streams = 200 if args.quick else 1000
    args.argv = _shown_argv(list(sys.argv[1:] if argv is None else argv))
    result = trio.run(until_sigterm, bench, args)
    if result is None:
        raise SystemExit(128 + signal.SIGTERM)
    print_table(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    run_bench()
