"""Routing benchmark: multi-turn chat over several mock engines with a prefix cache, per router.

Not a test: it prints a table and (with ``--json``) writes the figures. Each row is one router
in front of fresh engines, in the same run:

* smg_trio ``--policy P`` for each of ``--smg-trio-policies`` (engines publishing KV events),
  and for ``cache_aware`` also with the engines' events off (its fallback);
* the Rust smg (``smg launch``, its ZMQ backend) ``--policy P`` for each of ``--smg-policies``;
* the reference: one engine holding all the engines' cache together (smg_trio in front).

A policy a gateway's command line refuses (``cache_aware`` before smg_trio has it) is reported
as missing, not as a failure.

The workload (``--scenario``): S sessions x T turns over E engines. Every session shares one
system prompt and has a context of its own (its first user message); each turn is a streamed
chat of the whole conversation so far (the assistant's earlier answers included) plus a new
question. All sessions run at once, each turn after the previous answer. Each engine is the
bench mock (``bench/mock.py``, 1 ms step) with an LRU prefix cache of full 16-token blocks
sized for its share of the sessions and not for all of them (``--cache-factor``), and a
prefill delay per uncached prompt token (``--prefill-us-per-token``), so that a cache miss
costs TTFT.

Figures per row:

* cached share: prompt tokens the engines found in their caches over the prompt tokens they
  were asked, summed from the engines' own counts (each engine writes them when it stops);
* TTFT p50 / p99: request written -> first content event, at the client;
* requests per engine, max / min;
* gateway CPU per request: utime+stime of the gateway's processes (``/proc``) over the run,
  divided by the requests.

The load comes from ``--client-procs`` ``bench/routing_client.py`` processes (asyncio, raw
HTTP/1.1 keep-alive, one connection per session), never the gateway's process.

    python bench/routing.py --quick            # one small scenario, < 2 minutes
    python bench/routing.py                    # 2 engines 32x6 and 4 engines 64x8
    python bench/routing.py --scenario 4x64x8 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

BENCH_DIR = Path(__file__).resolve().parent
for _path in (BENCH_DIR, BENCH_DIR.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gateway import (  # noqa: E402
    TOKEN_RANGE,
    _free_port,
    _remove_tree,
    _tail,
    cpu_seconds,
    drive_clients,
    group_pids,
    quantile,
    tree_pids,
)
from loadgen import HttpConnection, HttpError, build_request, chat_body  # noqa: E402

from peers.tools import (  # noqa: E402
    smg_launch_command,
    smg_missing_reason,
    start_process_group,
    stop_process_group,
)
from smg_trio.mock.tiny_model import default_tiny_model_dir  # noqa: E402
from smg_trio.protocol.addresses import worker_addresses  # noqa: E402
from smg_trio.serve.commands import kv_events_config, reject_handshake_collisions  # noqa: E402
from smg_trio.tokenizer import Tokenizer  # noqa: E402

READY_TIMEOUT_S = 120.0
BLOCK_SIZE = 16
#: Words of the synthetic texts (each a few tiny-model tokens).
_WORD_TEXT = (
    "river stone cloud amber signal lantern orchard meadow copper harbor winter violet "
    "engine garden pillar marble thunder willow canvas beacon ember falcon glacier island "
    "jasmine kettle ledger mirror nectar oyster pepper quartz ribbon saddle timber umbrella "
    "velvet walnut yonder zephyr anchor bramble cinder dune"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Scenario:
    engines: int
    sessions: int
    turns: int
    system_words: int = 160
    context_words: int = 120
    question_words: int = 14
    max_tokens: int = 24

    @property
    def name(self) -> str:
        return f"{self.engines}x{self.sessions}x{self.turns}"


SCENARIOS = {s.name: s for s in (Scenario(2, 32, 6), Scenario(4, 64, 8))}
QUICK = Scenario(2, 16, 4)


@dataclass(frozen=True)
class Variant:
    label: str
    gateway: str  # smg_trio or smg
    policy: str
    events: bool
    reference: bool = False


@dataclass
class Row:
    label: str
    status: str = "ok"
    cached_share: float = float("nan")
    vs_reference: float = float("nan")
    ttft_p50_ms: float = float("nan")
    ttft_p99_ms: float = float("nan")
    engine_requests: list[int] = field(default_factory=list)
    max_min: float = float("nan")
    cpu_us_per_request: float = float("nan")
    requests: int = 0
    errors: int = 0
    client_cpu_s: float = 0.0
    wall_s: float = 0.0


# --------------------------------------------------------------------------- workload


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def make_sessions(sc: Scenario, seed: int) -> list[dict[str, Any]]:
    """One shared system prompt; per session a context (in its first user message) and a
    question per turn."""
    rng = random.Random(seed)
    system = "You are a careful assistant. Shared instructions: " + _text(rng, sc.system_words)
    sessions = []
    for i in range(sc.sessions):
        turns = [f"Session {i} context: {_text(rng, sc.context_words)}. Question: "]
        turns[0] += _text(rng, sc.question_words)
        turns += [_text(rng, sc.question_words) + "?" for _ in range(sc.turns - 1)]
        sessions.append({"system": system, "turns": turns})
    return sessions


def cache_blocks(sc: Scenario, sessions: list[dict[str, Any]], factor: float) -> int:
    """One engine's capacity in blocks: the system prompt's blocks plus ``factor`` times its
    share of the sessions' own blocks (a session's last prompt, with answers of
    ``max_tokens`` tokens), so that it holds its share and not all of them."""
    tok = Tokenizer.from_dir(default_tiny_model_dir())
    spec = sessions[0]
    messages = [{"role": "system", "content": spec["system"]}]
    for turn in spec["turns"]:
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": ""}]
    messages.pop()
    last = len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))
    last += sc.max_tokens * (sc.turns - 1)
    system = len(tok.encode(tok.apply_chat_template(messages[:1], add_generation_prompt=False)))
    per_session = math.ceil((last - system) / BLOCK_SIZE)
    share = sc.sessions / sc.engines
    return math.ceil(system / BLOCK_SIZE + factor * share * per_session)


# --------------------------------------------------------------------------- processes


def gateway_command(v: Variant, urls: list[str], model_dir: Path, port: int) -> list[str]:
    if v.gateway == "smg_trio":
        cmd = [sys.executable, "-m", "smg_trio", "launch", "--worker-urls", *urls]
        cmd += ["--backend", "vllm", "--model-path", str(model_dir), "--port", str(port)]
        return [*cmd, "--policy", v.policy, "--log-level", "warning"]
    cmd = smg_launch_command(
        urls[0], model_dir, backend="vllm", port=port, prometheus_port=_free_port()
    )
    at = cmd.index(urls[0]) + 1
    return [*cmd[:at], *urls[1:], *cmd[at:], "--policy", v.policy]


def engine_command(
    url: str, blocks: int, args: argparse.Namespace, events: bool, stats: Path, ready: Path
) -> list[str]:
    cmd = [sys.executable, str(BENCH_DIR / "mock.py"), "--handshake"]
    cmd += [worker_addresses(url).handshake, "--step-ms", str(args.step_ms)]
    cmd += ["--token-range", str(TOKEN_RANGE[0]), str(TOKEN_RANGE[1])]
    cmd += ["--block-size", str(BLOCK_SIZE), "--num-gpu-blocks", str(blocks)]
    cmd += ["--prefill-us-per-token", str(args.prefill_us_per_token)]
    cmd += ["--stats-file", str(stats), "--ready-file", str(ready)]
    if events:
        cmd += ["--kv-events-config", kv_events_config(url)]
    return cmd


async def _wait_ready(
    port: int, model: str, procs: list[subprocess.Popen[bytes]], ready: list[Path], log: Path
) -> None:
    """Every engine handshook and the gateway answers a one-token chat."""
    raw = build_request(port, chat_body(model, "hi", 1, stream=False))
    deadline = trio.current_time() + READY_TIMEOUT_S
    last = "no answer"
    while trio.current_time() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise GatewayExited(proc.returncode, _tail(log))
        if all(p.exists() for p in ready):
            try:
                conn = await HttpConnection.connect(port)
                try:
                    with trio.fail_after(10):
                        await conn.request(raw, stream=False)
                    return
                finally:
                    await conn.aclose()
            except (OSError, HttpError, trio.TooSlowError) as exc:
                last = str(exc)[:200]
        await trio.sleep(0.2)
    raise RuntimeError(f"not ready in {READY_TIMEOUT_S}s ({last}):\n{_tail(log)}")


class GatewayExited(RuntimeError):
    def __init__(self, code: int | None, tail: str) -> None:
        super().__init__(f"exited ({code}):\n{tail}")
        self.tail = tail


async def run_clients(
    port: int, model: str, sessions: list[dict[str, Any]], max_tokens: int, procs: int, tmp: Path
) -> tuple[list[dict[str, Any]], float, float]:
    """Run ``sessions`` split over ``procs`` client processes; their results, and the wall
    clock from "go" to the last answer."""
    cmds = []
    for i in range(procs):
        part = tmp / f"sessions-{i}.json"
        part.write_text(json.dumps(sessions[i::procs]))
        cmd = [sys.executable, str(BENCH_DIR / "routing_client.py"), "--port", str(port)]
        cmd += ["--model", model, "--sessions", str(part), "--max-tokens", str(max_tokens)]
        cmds.append(cmd)
    results, wall = await drive_clients(cmds)
    return results, wall, sum(r["cpu_s"] for r in results)


async def run_variant(
    v: Variant, sc: Scenario, sessions: list[dict[str, Any]], blocks: int, args: argparse.Namespace
) -> Row:
    row = Row(v.label)
    if v.gateway == "smg" and (why := smg_missing_reason()) is not None:
        row.status = f"missing ({why})"
        return row
    engines = 1 if v.reference else sc.engines
    capacity = blocks * sc.engines if v.reference else blocks
    model_dir = default_tiny_model_dir()
    tmp = Path(tempfile.mkdtemp(prefix="smg-"))  # short: ipc paths are length-limited
    with contextlib.ExitStack() as stack:
        stack.callback(_remove_tree, tmp)
        names = iter(range(1000))
        urls: list[str] = []
        while len(urls) < engines:  # names whose derived handshake ports differ
            url = f"ipc://{tmp}/engine-{next(names)}"
            try:
                reject_handshake_collisions([*urls, url])
            except ValueError:
                continue
            urls.append(url)
        port = _free_port()
        log = tmp / "gateway.log"
        gw = start_process_group(gateway_command(v, urls, model_dir, port), log_path=log)
        stack.callback(stop_process_group, gw)
        mocks = []
        stats = [tmp / f"stats-{i}.json" for i in range(engines)]
        ready = [tmp / f"ready-{i}" for i in range(engines)]
        for i, url in enumerate(urls):
            cmd = engine_command(url, capacity, args, v.events, stats[i], ready[i])
            mock = start_process_group(cmd, log_path=tmp / f"mock-{i}.log")
            mocks.append(mock)
            stack.callback(stop_process_group, mock)
        try:
            await _wait_ready(port, str(model_dir), [gw, *mocks], ready, log)
        except GatewayExited as exc:
            if "invalid choice" in exc.tail and v.policy in exc.tail:
                row.status = f"missing (--policy {v.policy} refused by the CLI)"
                return row
            raise
        await trio.sleep(0.5)  # the last worker's registration settles
        pids = sorted(set(group_pids(gw.pid)) | set(tree_pids(gw.pid)))
        cpu0 = cpu_seconds(pids)
        results, row.wall_s, row.client_cpu_s = await run_clients(
            port, str(model_dir), sessions, sc.max_tokens, args.client_procs, tmp
        )
        cpu1 = cpu_seconds(pids)
        for proc in (*mocks, gw):  # the engines write their counts as they stop
            stop_process_group(proc)
        counts = [json.loads(p.read_text()) for p in stats]
    row.requests = sum(r["requests"] for r in results)
    row.errors = sum(r["errors"] for r in results)
    ttfts = [t for r in results for t in r["ttft_s"]]
    row.ttft_p50_ms = quantile(ttfts, 0.5) * 1e3
    row.ttft_p99_ms = quantile(ttfts, 0.99) * 1e3
    queries = sum(c["queries"] for c in counts)
    row.cached_share = sum(c["hits"] for c in counts) / queries if queries else float("nan")
    row.engine_requests = [c["requests"] for c in counts]
    if min(row.engine_requests) > 0:
        row.max_min = max(row.engine_requests) / min(row.engine_requests)
    else:
        row.max_min = float("inf")
    row.cpu_us_per_request = (cpu1 - cpu0) / max(1, row.requests) * 1e6
    if row.errors:
        first = next(r["first"] for r in results if r["first"])
        row.status = f"{row.errors} errors: {first}"
    return row


# --------------------------------------------------------------------------- report


def variants(args: argparse.Namespace) -> list[Variant]:
    out = []
    for p in args.smg_trio_policies:
        out.append(Variant(f"smg_trio {p}", "smg_trio", p, events=True))
        if p == "cache_aware":
            out.append(Variant(f"smg_trio {p}, events off", "smg_trio", p, events=False))
    out += [Variant(f"smg {p}", "smg", p, events=False) for p in args.smg_policies]
    out.append(
        Variant("one engine, all caches (reference)", "smg_trio", "round_robin", False, True)
    )
    return out


def table(sc: Scenario, blocks: int, rows: Sequence[Row]) -> str:
    head = (
        f"{sc.sessions} sessions x {sc.turns} turns over {sc.engines} engines "
        f"({blocks} blocks of {BLOCK_SIZE} tokens each)"
    )
    lines = [
        head,
        "| router | cached share | vs reference | TTFT p50 / p99 (ms) | requests per engine "
        "(max/min) | gateway CPU µs/request |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if r.status.startswith("missing"):
            lines.append(f"| {r.label} | {r.status} | | | | |")
            continue
        note = "" if r.status == "ok" else f" ({r.status[:80]})"
        lines.append(
            f"| {r.label}{note} | {r.cached_share:.3f} | {r.vs_reference:.2f} | "
            f"{r.ttft_p50_ms:.1f} / {r.ttft_p99_ms:.1f} | {r.engine_requests} "
            f"({r.max_min:.2f}) | {r.cpu_us_per_request:.0f} |"
        )
    return "\n".join(lines)


async def run_scenario(sc: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    sessions = make_sessions(sc, args.seed)
    blocks = cache_blocks(sc, sessions, args.cache_factor)
    print(f"scenario {sc.name}: {blocks} blocks per engine", flush=True)
    rows = []
    for v in variants(args):
        t0 = time.perf_counter()
        row = await run_variant(v, sc, sessions, blocks, args)
        print(f"  {v.label}: {row.status}, {time.perf_counter() - t0:.1f} s", flush=True)
        rows.append(row)
    ref = next((r for r in rows if "reference" in r.label), None)
    for r in rows:
        if ref is not None and ref.cached_share > 0:
            r.vs_reference = r.cached_share / ref.cached_share
    print(table(sc, blocks, rows), flush=True)
    return {"scenario": asdict(sc), "blocks": blocks, "rows": [asdict(r) for r in rows]}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help=f"only {QUICK.name} (< 2 minutes)")
    p.add_argument("--scenario", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    p.add_argument("--smg-trio-policies", nargs="+", default=["cache_aware", "round_robin"])
    p.add_argument("--smg-policies", nargs="*", default=["cache_aware", "round_robin"])
    p.add_argument("--cache-factor", type=float, default=1.25)
    p.add_argument("--prefill-us-per-token", type=float, default=20.0)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not (BENCH_DIR.parent / ".peers").exists():  # scripts/setup_peers.sh's shared place
        os.environ.setdefault("SMG_TRIO_PEERS_DIR", str(Path.home() / ".cache/smg_trio/peers"))
    scenarios = [QUICK] if args.quick else [SCENARIOS[n] for n in args.scenario]

    async def all_scenarios() -> list[dict[str, Any]]:
        return [await run_scenario(sc, args) for sc in scenarios]

    results = trio.run(all_scenarios)
    if args.json is not None:
        args.json.write_text(json.dumps({"time": time.time(), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
