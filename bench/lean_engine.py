"""A lean engine for the gateway benchmark: a plain pyzmq loop with pre-encoded outputs.

``bench/mock.py`` (the product's trio mock) costs the engine side tens of microseconds per
token, so at c=256 it, not the gateway, capped the throughput. This engine does the same vLLM
handshake and registration (the product's encoders), then, in one blocking loop: decodes each
ADD once and pre-encodes every output of the request (tokens drawn from ``--token-range``
at ADD, one token a step, the last with finish_reason ``length``, the first with its prefill
stats); each step joins the pre-encoded outputs of the running requests into one
``EngineCoreOutputs`` envelope per frontend client. ABORT drops a request; UTILITY calls get
``None`` (``get_supported_tasks``: ``["generate"]``). No prefix cache, no logprobs, no stop
strings: only what the gateway benchmark sends.

On SIGTERM/SIGINT it writes ``--stats-file`` (JSON: ``steps``, ``busy_steps``, ``tokens``,
``cpu_s`` of the serving loop, the engine's own CPU per busy step and per token) and exits.

    python bench/lean_engine.py --handshake tcp://127.0.0.1:PORT --step-ms 1
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import msgspec
import zmq

from smg_trio.mock.engine import MockEngine, MockEngineConfig
from smg_trio.protocol import vllm
from smg_trio.protocol.handshake import decode_init, encode_status

_ENC = msgspec.msgpack.Encoder()
_ADD, _ABORT, _UTILITY = b"\x00", b"\x01", b"\x03"
#: A token id in the templates, and its encoding as a one-element ``new_token_ids``.
_PLACEHOLDER = 300
_PLACEHOLDER_BYTES = b"\x91\xcd" + _PLACEHOLDER.to_bytes(2, "big")


def _array_header(n: int) -> bytes:
    return bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")


class LeanEngine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.step_s = args.step_ms / 1000.0
        self.lo, self.hi = args.token_range
        self.rng = random.Random(0)
        if not 256 <= self.lo < self.hi <= 65536:
            raise SystemExit("--token-range must lie in 256..65536 (uint16 token ids)")
        self.token_bytes = {t: b"\x91\xcd" + t.to_bytes(2, "big") for t in range(self.lo, self.hi)}
        #: request id -> (client index, its pre-encoded outputs, index of the next one)
        self.active: dict[str, list[Any]] = {}
        self.steps = self.busy_steps = self.tokens = 0
        self.stop = False
        self.cpu0 = 0.0
        #: ``--add-log``: when each ADD arrived and when its first output was sent
        self.add_log: TextIO | None = None
        self.span_of: dict[str, str] = {}
        ctx = zmq.Context.instance()
        self.ctx = ctx
        status = {"local": False, "headless": True, "with_hash_key": False}
        identity = b"\x00\x00"
        hs = ctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, identity)
        hs.connect(args.handshake)
        hs.send(encode_status("HELLO", **status))  # type: ignore[arg-type]
        init = decode_init(hs.recv())
        registration = MockEngine(args.handshake, MockEngineConfig()).registration()
        self.inputs = []
        for address in init.addresses.inputs:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(address)
            sock.send(registration)
            self.inputs.append(sock)
        hs.send(encode_status("READY", **status))  # type: ignore[arg-type]
        hs.close(linger=1000)
        self.outputs = []
        for address in init.addresses.outputs:
            sock = ctx.socket(zmq.PUSH)
            sock.connect(address)
            self.outputs.append(sock)
        self.poller = zmq.Poller()
        for sock in self.inputs:
            self.poller.register(sock, zmq.POLLIN)

    def _add(self, payload: bytes) -> None:
        r = msgspec.msgpack.decode(payload, type=vllm.EngineCoreRequest)
        sp = r.sampling_params or {}
        n = max(int(sp.get("max_tokens") or 16), 1)
        prompt = len(r.prompt_token_ids or [])
        rid = r.request_id
        first = vllm.PrefillStats(num_prompt_tokens=prompt, num_computed_tokens=prompt)
        # Three templates (first, middle, last output) split at the token, then one bytes
        # concatenation per pre-drawn token (every token id encodes as a uint16).
        first_t, mid_t, last_t = (
            _ENC.encode(
                vllm.EngineCoreOutput(
                    request_id=rid, new_token_ids=[_PLACEHOLDER], finish_reason=f, prefill_stats=ps
                )
            ).split(_PLACEHOLDER_BYTES, 1)
            for f, ps in ((1 if n == 1 else None, first), (None, None), (1, None))
        )
        draw, toks = self.rng.randrange, self.token_bytes
        lo, hi = self.lo, self.hi
        outs = [first_t[0] + toks[draw(lo, hi)] + first_t[1]]
        outs += [mid_t[0] + toks[draw(lo, hi)] + mid_t[1] for _ in range(n - 2)]
        if n > 1:
            outs.append(last_t[0] + toks[draw(lo, hi)] + last_t[1])
        self.active[r.request_id] = [r.client_index, outs, 0]
        if self.add_log is not None:  # receipt time and the span id of its traceparent
            parent = (r.trace_headers or {}).get("traceparent", "")
            span = parent.split("-")[2] if parent.count("-") == 3 else r.request_id
            self.span_of[r.request_id] = span
            self.add_log.write(f"{time.time():.6f} add {span}\n")

    def _utility(self, payload: bytes, client: int) -> None:
        _client_index, call_id, method, _args = msgspec.msgpack.decode(payload)
        result: Any = ["generate"] if method == "get_supported_tasks" else None
        env = [0, [], None, 0.0, [call_id, None, [None, result]], None, None, None, None]
        self.outputs[client].send(_ENC.encode(env))

    def _read_inputs(self, timeout_ms: float) -> None:
        for sock, _ in self.poller.poll(timeout_ms):
            client = self.inputs.index(sock)
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                kind = frames[0]
                if kind == _ADD:
                    self._add(frames[1])
                elif kind == _ABORT:
                    for rid in msgspec.msgpack.decode(frames[1]):
                        self.active.pop(rid, None)
                elif kind == _UTILITY:
                    self._utility(frames[1], client)

    def _step(self) -> None:
        self.steps += 1
        if not self.active:
            return
        self.busy_steps += 1
        by_client: dict[int, list[bytes]] = {}
        done = []
        first: list[str] = []
        for rid, state in self.active.items():
            client, outs, i = state
            by_client.setdefault(client, []).append(outs[i])
            if i == 0 and self.add_log is not None:
                first.append(rid)
            i += 1
            if i == len(outs):
                done.append(rid)
            state[2] = i
        for rid in done:
            del self.active[rid]
        tail = _ENC.encode(time.monotonic()) + b"\xc0\xc0\xc0\xc0\xc0"
        for client, outs in by_client.items():
            self.tokens += len(outs)
            env = b"\x99\x00" + _array_header(len(outs)) + b"".join(outs) + b"\xc0" + tail
            self.outputs[client].send(env, copy=False)
        if first and self.add_log is not None:
            now = time.time()
            for rid in first:
                self.add_log.write(f"{now:.6f} first {self.span_of.pop(rid, rid)}\n")

    def run(self) -> None:
        self.cpu0 = time.process_time()  # the serving loop's CPU only, not the imports
        next_step = time.monotonic()
        while not self.stop:
            now = time.monotonic()
            if not self.active:
                self._read_inputs(100.0)  # idle: wait for work
                next_step = time.monotonic() + self.step_s
                continue
            if now < next_step:
                wait_ms = (next_step - now) * 1000
                if wait_ms >= 1:
                    self._read_inputs(int(wait_ms))  # zmq's poll counts whole milliseconds
                else:
                    time.sleep(wait_ms / 1000)  # not a poll(0) spin
                continue
            self._read_inputs(0)
            self._step()
            next_step += self.step_s
            if next_step < now:  # fell behind: no burst of catch-up steps
                next_step = now + self.step_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--handshake", required=True, metavar="tcp://HOST:PORT")
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--token-range", type=int, nargs=2, default=(259, 518), metavar=("LO", "HI"))
    p.add_argument("--stats-file", type=Path, default=None)
    p.add_argument("--ready-file", type=Path, default=None)
    p.add_argument(
        "--add-log",
        type=Path,
        default=None,
        help="log each ADD's receipt and its first output's send (time.time(), span id)",
    )
    args, _unknown = p.parse_known_args(argv)  # bench/mock.py's other flags: ignored
    engine = LeanEngine(args)
    if args.add_log is not None:
        engine.add_log = args.add_log.open("a", buffering=1 << 16)
    if args.ready_file is not None:
        args.ready_file.touch()

    def stop(signum: int, frame: FrameType | None) -> None:
        engine.stop = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        engine.run()
    finally:
        if engine.add_log is not None:
            engine.add_log.close()
        if args.stats_file is not None:
            cpu = time.process_time() - engine.cpu0
            busy = max(engine.busy_steps, 1)
            stats = {"steps": engine.steps, "busy_steps": engine.busy_steps}
            stats |= {"tokens": engine.tokens, "cpu_s": cpu}
            stats |= {"cpu_us_per_busy_step": cpu / busy * 1e6}
            stats |= {"cpu_us_per_token": cpu / max(engine.tokens, 1) * 1e6}
            args.stats_file.write_text(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
