"""A real-transport TokenSpeed peer with a fake one-token-per-step model.

ONLY USABLE UNDER THE PEERS' INTERPRETER (``.peers/vllm/bin/python``, see
``scripts/setup_peers.sh``): it imports ``tokenspeed`` (0.1.1, installed ``--no-deps``) and
torch at RUN time. Importing this module does not import them, so smg_trio's own venv can
import, lint and type-check it.

Run it as::

    PYTHONPATH=<stub dir>:<repo> .peers/vllm/bin/python -m peers.tokenspeed_peer \\
        --handshake tcp://127.0.0.1:PORT --engine-index 0 [--max-new-tokens 16] ...

(:func:`peers.tools.tokenspeed_peer_command` and
:func:`peers.tools.tokenspeed_peer_env` build exactly that.) The TokenSpeed import
stand-ins are installed in-process when they are not already on ``PYTHONPATH``.

What is real: the transport. The peer calls TokenSpeed's own
``tokenspeed.runtime.engine.zmq_msgpack.connect_msgpack_engine`` (identity ``<H`` engine
index, HELLO ``local: true`` -> INIT -> READY, registration with TokenSpeed's
``WireEngineCoreReadyResponse``), receives requests through its ``MsgpackRecvSocket`` (which
decodes ``TokenizedGenerateReqInput``/ABORT frames, normalizes and verifies sampling params
exactly as the engine does) and sends outputs through its ``MsgpackSendSocket`` (which slices
``BatchTokenIDOut`` into the 14-element ``BatchTokenIDOutSlim`` with TokenSpeed's encoder and
load tail).

What is fake: the model. Each scheduler step every running request gets ONE token,
``fake_token(prompt_ids, step)`` (deterministic, from a CRC-32 of the prompt), until
``max_new_tokens`` (the request's, else ``--max-new-tokens``; also capped by
``--max-model-len``), or a token in ``stop_token_ids`` once ``min_new_tokens`` are out (unless
``ignore_eos``). Output cadence mirrors TokenSpeed's ``stream_output``: ``stream`` requests
get every ``stream_interval`` (default 1) tokens; non-stream requests get the first token,
every 50th and the finish. A client ABORT ends the request with NO terminal output (as the
real engine does); a request the transport marks invalid gets a terminal ``"abort"``.

``--self-check`` only imports the wire modules and round-trips a request and an output
through TokenSpeed's codec (used by ``scripts/setup_peers.sh``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import math
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

__all__ = ["fake_token", "install_tokenspeed_stubs", "main"]

log = logging.getLogger("peers.tokenspeed_peer")

# TokenSpeed's DEFAULT_FORCE_STREAM_INTERVAL: a non-stream request still gets a frame every
# 50 tokens (and on its first token).
_NON_STREAM_INTERVAL = 50
_POLL_IDLE_MS = 50
# The 14-element BatchTokenIDOutSlim vector pinned in the wire spec (section 5.6): rids
# ["vec-1"], output_ids [[10, 11]], "length", 3/2/1 tokens, logprobs [[-0.5, -0.25]] for
# [[10, 11]], engine_index 1, running 2, waiting 5, kv pages 100/400.
_PINNED_OUTPUT_HEX = (
    "9eb34261746368546f6b656e49444f7574536c696d91a57665632d3191920a0b91a66c656e"
    "6774689103910291019192cbbfe0000000000000cbbfd000000000000091920a0b01020564"
    "cd0190"
)


def fake_token(prompt_ids: Sequence[int], step: int, *, low: int = 3, high: int = 97) -> int:
    """The fake model's token at 0-based ``step`` for a prompt: in ``[low, high)``.

    ``low + (crc32(",".join(prompt_ids)) + step) % (high - low)``. The defaults skip the three
    special tokens of smg_trio's tiny test model (a byte-level BPE: specials 0-2, then the byte
    alphabet in code-point order) and land on its 94 printable-ASCII byte tokens ``!``..``~``.
    """
    seed = zlib.crc32(",".join(str(i) for i in prompt_ids).encode())
    return low + (seed + step) % (high - low)


def install_tokenspeed_stubs() -> None:
    """Make ``tokenspeed.runtime`` wire modules importable without TokenSpeed's GPU deps.

    No-op when the stand-ins are already active (``PYTHONPATH`` with a ``sitecustomize``
    written by :func:`peers.tools.write_tokenspeed_stubs`).
    """
    from peers.tools import TOKENSPEED_ENV_STUB_MODULE, write_tokenspeed_stubs

    if (
        "tokenspeed.runtime.utils.env" in sys.modules
        and importlib.util.find_spec("tokenspeed_kernel") is not None
    ):
        return
    stub_dir = write_tokenspeed_stubs(
        tempfile.mkdtemp(prefix="smg-trio-ts-stubs-"), sitecustomize=False
    )
    sys.path.insert(0, str(stub_dir))
    importlib.import_module(TOKENSPEED_ENV_STUB_MODULE)


@dataclass
class _Wire:
    """TokenSpeed's modules, imported at run time (typed Any: not in smg_trio's venv)."""

    zmq: ModuleType
    zmq_msgpack: Any
    zmq_wire: Any
    io_struct: Any
    sampling_params: Any
    version: str


def _import_wire() -> _Wire:
    install_tokenspeed_stubs()
    zmq = importlib.import_module("zmq")
    io_struct = importlib.import_module("tokenspeed.runtime.engine.io_struct")
    zmq_wire = importlib.import_module("tokenspeed.runtime.engine.zmq_wire")
    zmq_msgpack = importlib.import_module("tokenspeed.runtime.engine.zmq_msgpack")
    sampling = importlib.import_module("tokenspeed.runtime.sampling.sampling_params")
    try:
        version = str(importlib.import_module("tokenspeed.version").__version__)
    except Exception:
        version = "unknown"
    return _Wire(zmq, zmq_msgpack, zmq_wire, io_struct, sampling, version)


@dataclass
class _Request:
    rid: str
    prompt_ids: list[int]
    limit: int
    min_new: int
    stop_ids: frozenset[int]
    ignore_eos: bool
    stream: bool
    stream_interval: int
    logprobs: bool
    generated: list[int] = field(default_factory=list)
    sent: int = 0
    finish: dict[str, Any] | None = None


@dataclass
class _Config:
    handshake: str
    engine_index: int
    max_new_tokens: int
    max_model_len: int
    vocab_size: int
    token_low: int
    token_high: int
    page_size: int
    total_pages: int
    max_num_seqs: int
    dtype: str
    data_parallel_size: int
    data_parallel_rank: int
    step_interval: float
    report_load: bool
    enable_output_logprobs: bool
    instance_id: str
    ready_file: str | None


class _Peer:
    def __init__(self, wire: _Wire, cfg: _Config) -> None:
        self.wire = wire
        self.cfg = cfg
        self.running: dict[str, _Request] = {}
        self.pending_rows: list[_Request] = []  # pre-finished (invalid) requests to report
        self.stopping = False
        self.connected = False

    # -- handshake ---------------------------------------------------------------------
    def connect(self, context: Any) -> tuple[Any, Any]:
        cfg = self.cfg
        ready = self.wire.zmq_wire.WireEngineCoreReadyResponse(
            max_model_len=cfg.max_model_len,
            num_gpu_blocks=cfg.total_pages,
            prefix_granularity=cfg.page_size,
            dtype=self.wire.zmq_wire.wire_dtype(cfg.dtype),
            vllm_version=f"tokenspeed-{self.wire.version}",
            world_size=1,
            data_parallel_size=cfg.data_parallel_size,
            tensor_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=cfg.data_parallel_rank,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_model_len * 8,
            instance_id=cfg.instance_id,
            kv_cache_size_tokens=cfg.total_pages * cfg.page_size,
        )
        sockets: tuple[Any, Any] = self.wire.zmq_msgpack.connect_msgpack_engine(
            context,
            cfg.handshake,
            cfg.engine_index + cfg.data_parallel_rank,  # TokenSpeed: zmq_engine_index + dp_rank
            ready,
            cfg.vocab_size,
            enable_output_logprobs=cfg.enable_output_logprobs,
            supports_prompt_logprobs=False,
        )
        return sockets

    # -- input -------------------------------------------------------------------------
    def admit(self, obj: Any) -> None:
        io = self.wire.io_struct
        if isinstance(obj, io.AbortReq):
            # Client abort: the real engine streams no terminal frame for it.
            dropped = self.running.pop(str(obj.rid), None)
            log.info("abort %s (%s)", obj.rid, "running" if dropped else "unknown")
            return
        if not isinstance(obj, io.TokenizedGenerateReqInput):
            log.warning("ignoring unexpected input %s", type(obj).__name__)
            return
        sp = obj.sampling_params
        prompt = list(obj.input_ids or [])
        limit = sp.max_new_tokens if sp.max_new_tokens is not None else self.cfg.max_new_tokens
        limit = max(0, min(int(limit), self.cfg.max_model_len - len(prompt)))
        interval = sp.stream_interval if sp.stream_interval else 1
        req = _Request(
            rid=str(obj.rid),
            prompt_ids=prompt,
            limit=limit,
            min_new=int(sp.min_new_tokens or 0),
            stop_ids=frozenset(sp.stop_token_ids or ()),
            ignore_eos=bool(sp.ignore_eos),
            stream=bool(obj.stream),
            stream_interval=max(1, int(interval)),
            logprobs=bool(obj.return_logprob),
        )
        if obj.validation_error is not None:
            log.info("invalid request %s: %s", req.rid, obj.validation_error)
            req.finish = {"type": "abort", "message": str(obj.validation_error), "err_type": 500}
            self.pending_rows.append(req)
            return
        if req.limit == 0:
            req.finish = {"type": "length", "length": 0}
            self.pending_rows.append(req)
            return
        self.running[req.rid] = req

    # -- one scheduler step --------------------------------------------------------------
    def step(self) -> list[_Request]:
        rows = self.pending_rows
        self.pending_rows = []
        for req in list(self.running.values()):
            tok = fake_token(
                req.prompt_ids, len(req.generated), low=self.cfg.token_low, high=self.cfg.token_high
            )
            req.generated.append(tok)
            n = len(req.generated)
            if tok in req.stop_ids and not req.ignore_eos and n >= req.min_new:
                req.finish = {"type": "stop", "matched": tok}
            elif n >= req.limit:
                req.finish = {"type": "length", "length": n}
            if req.finish is not None:
                del self.running[req.rid]
                rows.append(req)
            elif req.stream:
                si = req.stream_interval
                if (n % si == 1) if si > 1 else True:
                    rows.append(req)
            elif n == 1 or n % _NON_STREAM_INTERVAL == 0:
                rows.append(req)
        return rows

    def batch(self, rows: list[_Request]) -> Any:
        """A ``BatchTokenIDOut`` as TokenSpeed's ``stream_output`` fills it."""
        out_ids: list[list[int]] = []
        lp_val: list[list[float]] = []
        lp_idx: list[list[int]] = []
        for req in rows:
            new = req.generated[req.sent :]
            req.sent = len(req.generated)
            out_ids.append(new)
            lp_val.append([-0.5] * len(new) if req.logprobs else [])
            lp_idx.append(list(new) if req.logprobs else [])
        k = len(rows)
        return self.wire.io_struct.BatchTokenIDOut(
            rids=[r.rid for r in rows],
            finished_reasons=[r.finish for r in rows],
            decoded_texts=[""] * k,
            decode_ids=[list(ids) for ids in out_ids],
            read_offsets=[0] * k,
            output_ids=out_ids,
            output_multi_ids=[[] for _ in rows],
            skip_special_tokens=[True] * k,
            spaces_between_special_tokens=[True] * k,
            no_stop_trim=[False] * k,
            prompt_tokens=[len(r.prompt_ids) for r in rows],
            completion_tokens=[len(r.generated) for r in rows],
            cached_tokens=[0] * k,
            spec_verify_ct=[],
            input_token_logprobs_val=[[] for _ in rows],
            input_token_logprobs_idx=[[] for _ in rows],
            output_token_logprobs_val=lp_val,
            output_token_logprobs_idx=lp_idx,
            input_top_logprobs_val=[[] for _ in rows],
            input_top_logprobs_idx=[[] for _ in rows],
            output_top_logprobs_val=[[] for _ in rows],
            output_top_logprobs_idx=[[] for _ in rows],
            input_token_ids_logprobs_val=[[] for _ in rows],
            input_token_ids_logprobs_idx=[[] for _ in rows],
            output_token_ids_logprobs_val=[[] for _ in rows],
            output_token_ids_logprobs_idx=[[] for _ in rows],
            output_hidden_states=[],
            batch_accept_draft_tokens=[],
            output_extra_infos=[{"decode_prefix_len": 0} for _ in rows],
            generated_time=time.time(),
        )

    def load_pages(self) -> int:
        page = self.cfg.page_size
        return sum(
            math.ceil((len(r.prompt_ids) + len(r.generated)) / page) for r in self.running.values()
        )

    # -- main loop -----------------------------------------------------------------------
    def serve(self) -> None:
        zmq: Any = self.wire.zmq
        context = zmq.Context()
        # Bounded linger: an unanswered HELLO or a final ENGINE_CORE_DEAD nobody reads must not
        # keep the process alive at exit.
        context.setsockopt(zmq.LINGER, 1000)
        recv, send = self.connect(context)
        self.connected = True
        log.info(
            "handshake complete: %s engine_index=%d",
            self.cfg.handshake,
            self.cfg.engine_index + self.cfg.data_parallel_rank,
        )
        if self.cfg.ready_file:
            with open(self.cfg.ready_file, "w") as f:
                f.write(
                    f"{self.cfg.handshake} {self.cfg.engine_index + self.cfg.data_parallel_rank}\n"
                )
        raw_input = recv._socket  # the DEALER inside MsgpackRecvSocket, polled while idle
        try:
            while not self.stopping:
                busy = bool(self.running or self.pending_rows)
                if raw_input.poll(0 if busy else _POLL_IDLE_MS, zmq.POLLIN):
                    while True:
                        try:
                            obj = recv.recv_pyobj(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.admit(obj)
                rows = self.step()
                if rows:
                    if self.cfg.report_load:
                        send.set_load_snapshot(
                            len(self.running), 0, self.load_pages(), self.cfg.total_pages
                        )
                    send.send_pyobj(self.batch(rows))
                if self.running and self.cfg.step_interval > 0:
                    time.sleep(self.cfg.step_interval)
        finally:
            log.info("shutting down: sending ENGINE_CORE_DEAD")
            send.send_engine_dead()
            recv.close()
            send.close()
            context.term()


def _check(ok: bool, what: object) -> None:
    if not ok:
        raise RuntimeError(f"tokenspeed wire self-check failed: {what!r}")


def _self_check(wire: _Wire) -> None:
    """Round-trip one request and one output through TokenSpeed's own codec."""
    io, zw = wire.io_struct, wire.zmq_wire
    sp = wire.sampling_params.SamplingParams(max_new_tokens=8, temperature=0.0)
    sp.normalize(tokenizer=None)
    req = io.TokenizedGenerateReqInput(rid="r1", input_ids=[1, 2, 3], sampling_params=sp)
    payload = io.MsgpackEncoder().encode(req)
    (decoded,) = zw.decode_request_frames([zw.REQ_TYPE_ADD, *payload])
    _check(decoded.rid == "r1", decoded)
    _check(decoded.input_ids == [1, 2, 3], decoded)
    (abort,) = zw.decode_request_frames([zw.REQ_TYPE_ABORT, b"\x91\xa2r1"])
    _check(isinstance(abort, io.AbortReq), abort)
    _check(abort.rid == "r1", abort)
    slim = io.BatchTokenIDOutSlim(
        rids=["vec-1"],
        output_ids=[[10, 11]],
        finished_reasons=["length"],
        prompt_tokens=[3],
        completion_tokens=[2],
        cached_tokens=[1],
        output_token_logprobs_val=[[-0.5, -0.25]],
        output_token_logprobs_idx=[[10, 11]],
        engine_index=1,
        num_running=2,
        num_waiting=5,
        kv_active_pages=100,
        kv_total_pages=400,
    )
    (frame,) = io.MsgpackEncoder().encode(slim)
    _check(bytes(frame).hex() == _PINNED_OUTPUT_HEX, bytes(frame).hex())
    sys.stdout.write(
        f"tokenspeed {wire.version} wire OK: request round-trip, "
        "BatchTokenIDOutSlim matches the pinned 14-element vector\n"
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m peers.tokenspeed_peer",
        description="TokenSpeed's real ZMQ transport driven by a fake one-token-per-step model.",
    )
    p.add_argument("--handshake", help="frontend handshake address, tcp://127.0.0.1:PORT")
    p.add_argument(
        "--engine-index",
        type=int,
        default=0,
        help="TokenSpeed's --zmq-engine-index; the identity is this plus --data-parallel-rank",
    )
    p.add_argument("--max-new-tokens", type=int, default=16, help="when the request sets none")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--vocab-size", type=int, default=1024, help="for sampling-param checks")
    p.add_argument("--token-low", type=int, default=3)
    p.add_argument("--token-high", type=int, default=97, help="exclusive")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--total-pages", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--data-parallel-rank", type=int, default=0)
    p.add_argument("--step-interval", type=float, default=0.0, help="seconds between steps")
    p.add_argument("--no-load", action="store_true", help="send no load tail (all zeros)")
    p.add_argument(
        "--disable-output-logprobs", action="store_true", help="reject return_logprob requests"
    )
    p.add_argument("--instance-id", default="smg-trio-tokenspeed-peer")
    p.add_argument("--ready-file", help="written once the handshake completed")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--self-check", action="store_true", help="check the wire modules and exit")
    args = p.parse_args(argv)
    if not args.self_check and not args.handshake:
        p.error("--handshake is required")
    if not 0 <= args.token_low < args.token_high:
        p.error("need 0 <= --token-low < --token-high")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    holder: list[_Peer] = []

    def _stop(signum: int, frame: FrameType | None) -> None:
        # Serving: finish the step, send ENGINE_CORE_DEAD, exit 0. Importing or still in the
        # handshake (blocked waiting for INIT): leave at once.
        if holder and holder[0].connected:
            holder[0].stopping = True
        else:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    wire = _import_wire()
    if args.self_check:
        _self_check(wire)
        return 0
    cfg = _Config(
        handshake=args.handshake,
        engine_index=args.engine_index,
        max_new_tokens=args.max_new_tokens,
        max_model_len=args.max_model_len,
        vocab_size=args.vocab_size,
        token_low=args.token_low,
        token_high=args.token_high,
        page_size=args.page_size,
        total_pages=args.total_pages,
        max_num_seqs=args.max_num_seqs,
        dtype=args.dtype,
        data_parallel_size=args.data_parallel_size,
        data_parallel_rank=args.data_parallel_rank,
        step_interval=args.step_interval,
        report_load=not args.no_load,
        enable_output_logprobs=not args.disable_output_logprobs,
        instance_id=args.instance_id,
        ready_file=args.ready_file,
    )
    peer = _Peer(wire, cfg)
    holder.append(peer)
    peer.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
