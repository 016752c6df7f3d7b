"""A mock inference engine that dials a gateway over real ZMQ, speaking vLLM or TokenSpeed.

It simulates continuous batching (one token per active request per step), honours
max_tokens / stop_token_ids / EOS / ignore_eos, returns logprobs in the real wire shapes,
attaches load, and can be scripted to misbehave (stall, die, send garbage, fail requests).
With a script (``--script FILE``, :mod:`smg_trio.mock.script`), prompts that match a rule get
the rule's tokens instead of random ones.
"""

from __future__ import annotations

import logging
import random
import signal
import sys
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import msgspec
import numpy as np
import trio

from smg_trio.codec.msgpack import decode, encoder
from smg_trio.codec.tensor import encode_tensor_inline
from smg_trio.mock.kv_publisher import KvEventPublisher
from smg_trio.mock.lora import MockLoras
from smg_trio.mock.pooling import MockPooler
from smg_trio.mock.prefix_cache import PrefixCache
from smg_trio.mock.script import MockScript
from smg_trio.mock.utility import MockUtility
from smg_trio.protocol import tokenspeed as ts
from smg_trio.protocol import vllm
from smg_trio.protocol.handshake import EngineCoreReadyResponse, encode_ready_response
from smg_trio.protocol.kv_events import KVEventsConfig
from smg_trio.transport.engine_side import EngineSockets, dial_frontend
from smg_trio.transport.zsocket import ZmqSocket

__all__ = [
    "DEFAULT_NUM_GPU_BLOCKS",
    "MockEngine",
    "MockEngineConfig",
    "MockRequest",
    "Plan",
    "main",
    "run_until_signal",
]

#: Requests a mock engine remembers for tests (:attr:`MockEngine.requests`), at least.
KEEP_REQUESTS = 4096

log = logging.getLogger(__name__)

ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
#: Tensors at or above this size go in aux frames, as vLLM's encoder does
#: (``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``).
_AUX_THRESHOLD_BYTES = 256
#: The prefix cache's default capacity in blocks: modest (16k tokens at block size 16), so
#: that a cache-blind router's misses show.
DEFAULT_NUM_GPU_BLOCKS = 1024


@attrs.define
class MockRequest:
    """What the mock understood of one ADD (engine-neutral), plus its progress."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    stop_token_ids: set[int]
    eos_token_id: int | None
    ignore_eos: bool
    seed: int | None
    temperature: float
    logprobs: int | None
    n: int
    raw: Any
    generated: list[int] = attrs.field(factory=list)
    steps: list[list[int]] | None = None
    arrival_step: int = 0
    error: vllm.RequestError | None = None
    #: With ``steps``: the finish reason and stop reason of the last step (a scripted reply);
    #: ``None`` finishes with ``stop`` on the step after the last.
    final: tuple[str, int | str | None] | None = None
    #: The script rule that answered, if any.
    rule: str | None = None
    #: The frontend client whose output socket gets this request's outputs (vLLM's
    #: ``EngineCoreRequest.client_index``; TokenSpeed has one client).
    client_index: int = 0
    #: The LoRA adapter it names, ``(lora_name, lora_int_id, lora_path)`` (vLLM only).
    lora: tuple[str, int, str] | None = None
    #: Why its adapter could not be used (the request then finishes with ERROR).
    lora_error: str | None = None
    #: Prompt tokens found in the prefix cache, set when the request is prefilled (``None``
    #: before: it gets no output until then).
    cached_tokens: int | None = None
    #: A pooling request's wire ``PoolingParams`` array (vLLM), ``None`` for generation.
    pooling: Any = None


def _kv_echo(req: MockRequest) -> Any:
    """The mock's KV connector: a request's ``extra_args.kv_transfer_params`` come back on its
    final output, as a real connector's answer would (prefill/decode clients read it)."""
    sp = (
        req.raw.sampling_params
        if isinstance(getattr(req.raw, "sampling_params", None), dict)
        else {}
    )
    extra = sp.get("extra_args")
    return extra.get("kv_transfer_params") if isinstance(extra, dict) else None


#: A scripted plan: the token ids to emit per step for a request (each inner list is one step).
Plan = Callable[[MockRequest], Sequence[Sequence[int]]]


@attrs.define
class MockEngineConfig:
    """Mock behaviour. ``step_s`` is the engine step period in seconds; ``eos_token_id`` is the
    engine's own EOS (TokenSpeed stops on it itself; vLLM only on ``_eos_token_id``)."""

    protocol: Literal["vllm", "tokenspeed"] = "vllm"
    engine_index: int = 0
    step_s: float = 0.002
    vocab_size: int = 1024
    token_range: tuple[int, int] = (3, 1000)
    eos_token_id: int | None = None
    eos_after: int | None = None
    max_model_len: int = 4096
    default_max_tokens: int = 16
    data_parallel_size: int = 1
    stats: bool = True
    load_columns: bool = True
    register_before_ready: bool | None = None
    plan: Plan | None = None
    reject: Callable[[MockRequest], bool] | None = None
    #: True finishes the request with ERROR; a ``RequestError`` also sends it (vLLM 0.33).
    error_finish: Callable[[MockRequest], bool | vllm.RequestError] | None = None
    #: Scripted replies for prompts that match a rule (``plan``, when set, comes first).
    script: MockScript | None = None
    #: LoRA: reported ``max_loras`` (0: no LoRA support, as an engine without
    #: ``--enable-lora``) and the largest adapter rank ``add_lora`` takes.
    max_loras: int = 4
    max_lora_rank: int = 16
    #: Tokens per KV block: ``None`` is 16 for vLLM (its GPU default), 64 for TokenSpeed.
    block_size: int | None = None
    #: The prefix cache's capacity in blocks (the ready response's ``num_gpu_blocks``).
    num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS
    enable_prefix_caching: bool = True
    #: Extra seconds the prefill step takes per uncached prompt token (0: prefill is free).
    prefill_s_per_token: float = 0.0
    #: The seed of the block hash chain (``None``: random per engine, as vLLM's may be).
    cache_seed: int | None = None
    #: Publish KV events (vLLM's ``--kv-events-config``); ``None`` or disabled: none.
    kv_events: KVEventsConfig | None = None
    #: A pooling model (vLLM ``--runner pooling``): pooling requests answered, generation
    #: requests refused with ERROR; ``get_supported_tasks`` answers its tasks.
    pooler: MockPooler | None = None

    @property
    def kv_block_size(self) -> int:
        """The block size in tokens (the default of the protocol when unset)."""
        if self.block_size is not None:
            return self.block_size
        return 16 if self.protocol == "vllm" else 64


class MockEngine:
    """A mock engine rank. Start with ``await nursery.start(engine.run)``; it returns once the
    handshake and registration are done. Inspect ``requests``, ``aborts``, ``active``,
    ``waves``; inject faults with :meth:`stall`, :meth:`resume`, :meth:`die_with_sentinel`,
    :meth:`die_silently`, :meth:`send_garbage`.
    """

    def __init__(self, handshake_address: str, config: MockEngineConfig | None = None) -> None:
        self.handshake_address = handshake_address
        self.config = config or MockEngineConfig()
        #: The requests seen, newest last: at least the last :data:`KEEP_REQUESTS` (older ones
        #: are dropped in batches, so a long-running mock's memory stays flat).
        self.requests: list[MockRequest] = []
        self.aborts: list[str] = []
        self.waves: list[tuple[int, int | None]] = []
        self.active: dict[str, MockRequest] = {}
        self.finished: list[str] = []
        self.request_event = trio.Event()
        self.abort_event = trio.Event()
        self._wake = trio.Event()
        self._stalled = False
        self._resume = trio.Event()
        self._sockets: EngineSockets | None = None
        self._cancel: trio.CancelScope | None = None
        self._step = 0
        self._current_wave = 0
        self._last_idle_sent = True
        self._garbage = 0
        # The step loop, the input loops (TokenSpeed abort replies) and die_with_sentinel all
        # send on the PUSH sockets: one sender at a time per socket (the adapter's
        # single-owner rule). One lock per frontend client's PUSH, made once INIT named them.
        self._out_locks: list[trio.StrictFIFOLock] = []
        self.dead = trio.Event()
        self._hard_killed = False
        #: Utility calls (vLLM): sleep, pause, reset_prefix_cache... (:mod:`smg_trio.mock.utility`).
        self.utility = MockUtility(
            on_pause=self._on_pause,
            on_reset_cache=self.reset_prefix_cache,
            loras=MockLoras(self.config.max_loras, self.config.max_lora_rank),
        )
        if self.config.pooler is not None:
            self.utility.supported_tasks = self.config.pooler.tasks
        self._abort_on_pause = False
        cfg = self.config
        events = cfg.kv_events is not None and cfg.kv_events.zmq_enabled
        self.cache = PrefixCache(
            cfg.kv_block_size,
            cfg.num_gpu_blocks if cfg.enable_prefix_caching else 0,
            seed=cfg.cache_seed,
            events=events,
        )
        self.publisher: KvEventPublisher | None = None
        if events:
            assert cfg.kv_events is not None
            self.publisher = KvEventPublisher(cfg.kv_events, cfg.engine_index)

    # -- lifecycle -----------------------------------------------------------------------

    def registration(self) -> bytes:
        """The registration map this mock sends (realistic keys for its protocol)."""
        cfg = self.config
        vllm_like = cfg.protocol == "vllm"
        resp = EngineCoreReadyResponse(
            max_model_len=cfg.max_model_len,
            num_gpu_blocks=cfg.num_gpu_blocks,
            dtype="float32",
            vllm_version="0.32.0" if vllm_like else "tokenspeed-0.1.1",
            world_size=1,
            data_parallel_size=cfg.data_parallel_size,
            block_size=cfg.kv_block_size if vllm_like else None,
            prefix_granularity=None if vllm_like else cfg.kv_block_size,
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=cfg.engine_index,
            max_num_seqs=128,
            max_num_batched_tokens=2048,
            instance_id=f"mock-{cfg.protocol}-{cfg.engine_index}",
            kv_cache_size_tokens=cfg.num_gpu_blocks * cfg.kv_block_size,
            kv_cache_max_concurrency=1024.0,
        )
        extra: dict[str, Any] = (
            {
                "supports_lora": cfg.max_loras > 0,
                "max_loras": cfg.max_loras,
                "mamba_block_size": None,
            }
            if vllm_like
            else {"multimodal_encoder_dtype": None}
        )
        if vllm_like and self.publisher is not None:
            # vLLM's ready response carries the publisher's resolved config (its endpoint
            # offset by the DP rank); the engine announces it only once its sockets are open.
            extra["kv_events_config"] = msgspec.structs.asdict(self.publisher.config)
        return encode_ready_response(resp, **extra)

    async def run(
        self, *, task_status: trio.TaskStatus[MockEngine] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Dial the gateway, handshake, then serve until cancelled or killed by a fault."""
        cfg = self.config
        vllm_like = cfg.protocol == "vllm"
        before = cfg.register_before_ready if cfg.register_before_ready is not None else vllm_like
        with trio.CancelScope() as cancel:
            self._cancel = cancel
            async with trio.open_nursery() as events:
                if self.publisher is not None:
                    # Opened before the handshake: the registration names its endpoint.
                    await events.start(self.publisher.run)
                async with dial_frontend(
                    self.handshake_address,
                    engine_index=cfg.engine_index,
                    registration=self.registration(),
                    hello_local=not vllm_like,
                    with_hash_key=not vllm_like,
                    register_before_ready=before,
                    multi_client=vllm_like,
                ) as sockets:
                    self._sockets = sockets
                    self._out_locks = [trio.StrictFIFOLock() for _ in sockets.outputs]
                    task_status.started(self)
                    try:
                        async with trio.open_nursery() as nursery:
                            for client, sock in enumerate(sockets.inputs):
                                nursery.start_soon(self._input_loop, client, sock)
                            nursery.start_soon(self._step_loop)
                    finally:
                        events.cancel_scope.cancel()
                        if self._hard_killed:
                            # A killed process's sockets are gone at once: none lingers to
                            # deliver its queued messages (a lingering DEALER would reconnect
                            # to a re-bound frontend socket with this engine's identity).
                            for sock in (*sockets.inputs, *sockets.outputs):
                                sock.close(linger_ms=0)
        self.dead.set()

    def reset_prefix_cache(self) -> None:
        """Drop the whole prefix cache (vLLM's ``reset_prefix_cache``): ``AllBlocksCleared``
        is published at once."""
        self.cache.reset()
        self._publish_events()

    def _publish_events(self) -> None:
        events = self.cache.take_events()
        if self.publisher is not None:
            self.publisher.publish(events)

    # -- faults --------------------------------------------------------------------------

    def stall(self) -> None:
        """Stop stepping: no outputs until :meth:`resume` (an alive-but-hung engine)."""
        self._stalled = True
        self._resume = trio.Event()

    def resume(self) -> None:
        """Undo :meth:`stall`."""
        self._stalled = False
        self._resume.set()

    async def die_with_sentinel(self) -> None:
        """Send ``ENGINE_CORE_DEAD`` to every client and stop, as vLLM does on a fatal error."""
        for client in range(len(self._out_locks)):
            await self._push([ENGINE_CORE_DEAD], client)
        if self._cancel is not None:
            self._cancel.cancel()  # the sockets linger to deliver the sentinel

    def die_silently(self) -> None:
        """Stop at once with no sentinel (a hard-killed engine): its sockets close with no
        linger, as a killed process's do."""
        self._hard_killed = True
        if self._cancel is not None:
            self._cancel.cancel()

    def send_garbage(self, count: int = 1) -> None:
        """Send ``count`` undecodable output messages on the next steps."""
        self._garbage += count
        self._wake.set()

    # -- input ---------------------------------------------------------------------------

    @property
    def client_count(self) -> int:
        """How many frontend clients this engine serves (INIT's address count it uses)."""
        return len(self._out_locks)

    async def _input_loop(self, client: int, sock: ZmqSocket) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) < 2:
                log.warning("mock: dropping short input message")
                continue
            kind, payload = frames[0], frames[1]
            if kind == b"\x00":
                req = self._parse_add(payload)
                if req is not None and not 0 <= req.client_index < self.client_count:
                    log.warning(
                        "mock: dropping %s: client_index %d (from client %d) names no client",
                        req.request_id,
                        req.client_index,
                        client,
                    )
                elif req is not None:
                    self._admit(req)
            elif kind == b"\x01":
                for rid in decode(payload, list[str]):
                    log.debug("mock: abort %s", rid)
                    self.aborts.append(rid)
                    req = self.active.pop(rid, None)
                    if req is not None and self.config.protocol == "tokenspeed":
                        await self._send_ts([(req, [], "abort")])
                self.abort_event.set()
                self.abort_event = trio.Event()
            elif kind == b"\x02" and self.config.protocol == "vllm":
                wave, exclude = decode(payload, tuple[int, int | None])
                self.waves.append((wave, exclude))
                if exclude != self.config.engine_index and wave >= self._current_wave:
                    self._current_wave = wave
            elif kind == b"\x03" and self.config.protocol == "vllm":
                await self._on_utility(payload)
            else:
                log.warning("mock: ignoring request type %r", kind)

    async def _on_utility(self, payload: bytes) -> None:
        """A UTILITY call ``[client_index, call_id, method, args]``: answered on that client's
        output socket with ``utility_output``, after the outputs of the requests a pause
        aborted (as vLLM finishes a pause)."""
        client, call_id, method, args = decode(payload, tuple[int, int, str, list[Any]])
        answer = self.utility.call(method, args)
        if self._abort_on_pause:
            self._abort_on_pause = False
            aborted: list[tuple[MockRequest, list[int], str | None, int | str | None]] = [
                (req, [], "abort", None) for req in self.active.values()
            ]
            self.active.clear()
            self.finished.extend(r.request_id for r, *_ in aborted)
            if aborted:
                await self._send_vllm(aborted)
        self._wake.set()  # a resume or wake-up lets the step loop go on
        if answer is None or not 0 <= client < self.client_count:
            return
        failure, result = answer
        out = [call_id, failure, None if failure is not None else [None, result]]
        env = vllm.EngineCoreOutputs(
            engine_index=self.config.engine_index,
            timestamp=trio.current_time(),
            utility_output=out,
        )
        await self._push([encoder.encode(env)], client)

    def _on_pause(self, mode: str) -> None:
        if mode == "abort":
            self._abort_on_pause = True

    def _parse_add(self, payload: bytes) -> MockRequest | None:
        cfg = self.config
        if cfg.protocol == "vllm":
            r = decode(payload, vllm.EngineCoreRequest)
            sp = r.sampling_params or {}
            stops = set(sp.get("stop_token_ids") or [])
            eos = sp.get("_eos_token_id")
            lr = r.lora_request
            return MockRequest(
                request_id=r.request_id,
                prompt_token_ids=list(r.prompt_token_ids or []),
                max_tokens=int(sp.get("max_tokens", 16)),
                min_tokens=int(sp.get("min_tokens", 0)),
                stop_token_ids=stops,
                eos_token_id=eos,
                ignore_eos=eos is None,
                seed=sp.get("seed"),
                temperature=float(sp.get("temperature", 1.0)),
                logprobs=sp.get("logprobs"),
                n=1,
                raw=r,
                client_index=r.client_index,
                lora=None if lr is None else (lr.lora_name, lr.lora_int_id, lr.lora_path),
                pooling=r.pooling_params,
            )
        t = msgspec.msgpack.decode(payload, type=ts.TokenizedGenerateReqInput)
        p = t.sampling_params
        return MockRequest(
            request_id=str(t.rid),
            prompt_token_ids=list(t.input_ids or []),
            max_tokens=cfg.default_max_tokens if p.max_new_tokens is None else p.max_new_tokens,
            min_tokens=p.min_new_tokens,
            stop_token_ids=set(p.stop_token_ids or []),
            eos_token_id=cfg.eos_token_id,
            ignore_eos=p.ignore_eos,
            seed=p.seed,
            temperature=0.0 if p.top_k == 1 else p.temperature,
            logprobs=0 if t.return_logprob else None,
            n=p.n,
            raw=t,
        )

    def _admit(self, req: MockRequest) -> None:
        log.debug("mock: add %s (client %d)", req.request_id, req.client_index)
        self.requests.append(req)
        if len(self.requests) > 2 * KEEP_REQUESTS:
            del self.requests[:-KEEP_REQUESTS]
        req.arrival_step = self._step
        if req.lora is not None:
            try:
                if self.config.max_loras < 1:
                    raise ValueError("LoRA is not enabled (start the engine with --enable-lora)")
                self.utility.loras.use(req.lora)
            except (ValueError, OSError) as exc:
                req.lora_error = str(exc)
        if self.config.plan is not None:
            req.steps = [list(s) for s in self.config.plan(req)]
        elif self.config.script is not None:
            reply = self.config.script.reply_for(req.prompt_token_ids)
            if reply is not None:
                req.steps = [list(s) for s in reply.steps]
                req.final = (reply.finish_reason, reply.stop_reason)
                req.rule = reply.rule
                log.debug("mock: %s answers %s", reply.rule, req.request_id)
        self.active[req.request_id] = req
        self.request_event.set()
        self.request_event = trio.Event()
        self._wake.set()

    # -- stepping ------------------------------------------------------------------------

    def _rng(self, req: MockRequest) -> random.Random:
        if req.seed is not None:
            key = req.seed
        elif req.temperature <= 1e-6:
            key = zlib.crc32(np.asarray(req.prompt_token_ids, dtype=np.int64).tobytes())
        else:
            key = zlib.crc32(req.request_id.encode())
        if req.lora is not None:  # each adapter answers its own tokens
            key = key * 2_147_483_659 + req.lora[1]
        return random.Random(key * 1_000_003 + len(req.generated))

    def _next_tokens(self, req: MockRequest) -> list[int]:
        cfg = self.config
        if req.steps is not None:
            idx = self._step - req.arrival_step - 1
            return list(req.steps[idx]) if 0 <= idx < len(req.steps) else []
        if (
            cfg.eos_after is not None
            and cfg.eos_token_id is not None
            and len(req.generated) == cfg.eos_after
        ):
            return [cfg.eos_token_id]
        lo, hi = cfg.token_range
        return [self._rng(req).randrange(lo, hi)]

    def _advance(self, req: MockRequest) -> tuple[list[int], str | None, int | str | None]:
        """Emit this step's tokens for ``req`` applying vLLM's check_stop order: min_tokens
        gate, EOS, stop_token_ids, then length; a scripted reply's own finish comes last, on
        its last step."""
        out: list[int] = []
        planned = self._next_tokens(req)
        idx = self._step - req.arrival_step - 1
        if req.steps is not None and not planned and idx >= len(req.steps):
            return (out, *req.final) if req.final is not None else (out, "stop", None)
        for tok in planned:
            out.append(tok)
            req.generated.append(tok)
            n = len(req.generated)
            if n > req.min_tokens:
                if not req.ignore_eos and req.eos_token_id is not None and tok == req.eos_token_id:
                    return out, "stop", None
                if tok in req.stop_token_ids:
                    return out, "stop", tok
            if n >= req.max_tokens:
                return out, "length", None
        if req.final is not None and req.steps is not None and idx == len(req.steps) - 1:
            return (out, *req.final)
        return out, None, None

    async def _step_loop(self) -> None:
        cfg = self.config
        while True:
            if self._stalled:
                await self._resume.wait()
            if (not self.active or self.utility.holding) and self._garbage == 0:
                if not self._last_idle_sent:
                    await self._send_idle()
                    self._last_idle_sent = True
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            await trio.sleep(cfg.step_s)
            if self._stalled:
                continue
            if self._garbage:
                self._garbage -= 1
                await self._push([b"\xc1\xc1garbage"])
                continue
            self._step += 1
            uncached = self._prefill()
            if uncached and cfg.prefill_s_per_token > 0:
                await trio.sleep(uncached * cfg.prefill_s_per_token)
            results: list[tuple[MockRequest, list[int], str | None, int | str | None]] = []
            for req in list(self.active.values()):
                if req.cached_tokens is None:
                    continue  # admitted during the prefill: prefilled next step
                if (cfg.reject is not None and cfg.reject(req)) or req.n != 1:
                    results.append((req, [], "reject", None))
                    continue
                verdict: bool | vllm.RequestError = (
                    False if cfg.error_finish is None else cfg.error_finish(req)
                )
                if req.lora_error is not None:
                    verdict = vllm.RequestError("lora", req.lora_error)
                if verdict:
                    if isinstance(verdict, vllm.RequestError):
                        req.error = verdict
                    results.append((req, [], "error", None))
                    continue
                if (req.pooling is not None) != (cfg.pooler is not None):
                    # A pooling request to a generation model, or the reverse: vLLM's
                    # frontend refuses it; the engine core fails it.
                    results.append((req, [], "error", None))
                    continue
                if req.pooling is not None:  # pooled in one step, FINAL_ONLY
                    results.append((req, [], "stop", None))
                    continue
                toks, reason, stop = self._advance(req)
                results.append((req, toks, reason, stop))
            for req, _, reason, _ in results:
                if reason is not None:
                    self.active.pop(req.request_id, None)
                    self.finished.append(req.request_id)
                    if reason in ("stop", "length") and req.generated:
                        # The finished request's computed tokens stay cached (vLLM caches
                        # full blocks as they fill; the last sampled token has no KV yet).
                        self.cache.store(req.prompt_token_ids + req.generated[:-1])
            self._publish_events()
            self._last_idle_sent = False
            if cfg.protocol == "vllm":
                await self._send_vllm(results)
            else:
                await self._send_ts(
                    [(r, t, "abort" if f == "reject" else f) for r, t, f, _ in results]
                )

    def _prefill(self) -> int:
        """Look up and cache the prompts of the requests admitted since the last step; return
        how many prompt tokens they had uncached (the prefill's work)."""
        new = [req for req in self.active.values() if req.cached_tokens is None]
        uncached = 0
        cache = self.cache
        hashes = [cache.hashes(req.prompt_token_ids) for req in new]
        for req, h in zip(new, hashes, strict=True):  # all looked up before any is cached:
            req.cached_tokens = cache.lookup(req.prompt_token_ids, h)  # a block is cached
            uncached += len(req.prompt_token_ids) - req.cached_tokens  # once it is computed
        for req, h in zip(new, hashes, strict=True):
            cache.store(req.prompt_token_ids, h)
        return uncached

    # -- output encoding -----------------------------------------------------------------

    async def _push(self, frames: list[bytes], client: int = 0) -> None:
        assert self._sockets is not None
        async with self._out_locks[client]:
            await self._sockets.outputs[client].send_multipart(frames)

    def _stats(self) -> dict[str, Any] | None:
        if not self.config.stats:
            return None
        running = len(self.active)
        adapters: dict[str, int] = {}
        for req in self.active.values():
            if req.lora is not None:
                adapters[req.lora[0]] = adapters.get(req.lora[0], 0) + 1
        pc = self.cache.take_stats()
        return {
            "num_running_reqs": running,
            "running_lora_adapters": adapters,
            "waiting_lora_adapters": {},
            "num_waiting_reqs": 0,
            "num_skipped_waiting_reqs": 0,
            "step_counter": self._step,
            "current_wave": self._current_wave,
            "kv_cache_usage": min(1.0, running / 128),
            "prefix_cache_stats": {
                "reset": pc.reset,
                "requests": pc.requests,
                "queries": pc.queries,
                "hits": pc.hits,
                "preempted_requests": 0,
                "preempted_queries": 0,
                "preempted_hits": 0,
            },
            "connector_prefix_cache_stats": None,
            "kv_cache_eviction_events": [],
            "spec_decoding_stats": None,
            "kv_connector_stats": None,
            "cudagraph_stats": None,
            "perf_stats": None,
        }

    def _logprobs(self, req: MockRequest, toks: list[int], aux: list[bytes]) -> list[Any] | None:
        if req.logprobs is None or not toks:
            return None
        k = req.logprobs
        rows = len(toks)
        ids = np.zeros((rows, k + 1), dtype=np.int32)
        lps = np.zeros((rows, k + 1), dtype=np.float32)
        ranks = np.ones(rows, dtype=np.int64)
        lo, hi = self.config.token_range
        for r, tok in enumerate(toks):
            ids[r, 0] = tok
            lps[r, 0] = -0.25 - 0.01 * (tok % 7)
            for c in range(1, k + 1):
                ids[r, c] = tok if c == 1 else lo + (tok + c) % (hi - lo)
                lps[r, c] = lps[r, 0] - (c - 1) * 0.5
        return [self._tensor(ids, aux), self._tensor(lps, aux), self._tensor(ranks, aux), None]

    def _pooled(self, pooler: MockPooler, req: MockRequest, aux: list[bytes]) -> list[Any]:
        vec = pooler.pool(req.prompt_token_ids, req.pooling)
        triple = self._tensor(vec, aux)
        if pooler.fault == "malformed":  # one byte short of its shape
            aux.append(vec.tobytes()[:-1])
            triple = [vec.dtype.name, list(vec.shape), len(aux)]
        return triple

    @staticmethod
    def _tensor(arr: np.ndarray[Any, Any], aux: list[bytes]) -> list[Any]:
        if arr.nbytes < _AUX_THRESHOLD_BYTES:
            return encode_tensor_inline(arr)
        aux.append(arr.tobytes())
        return [arr.dtype.str, list(arr.shape), len(aux)]

    async def _send_vllm(
        self, results: Sequence[tuple[MockRequest, list[int], str | None, int | str | None]]
    ) -> None:
        """One envelope per frontend client that has outputs this step (vLLM's
        ``update_from_output``); the scheduler stats ride on the first one only, or on an
        envelope of their own to client 0 when no client has outputs."""
        by_client: dict[int, list[tuple[MockRequest, list[int], str | None, int | str | None]]]
        by_client = {}
        for result in results:
            by_client.setdefault(result[0].client_index, []).append(result)
        if not by_client:
            by_client[0] = []
        stats = self._stats()
        for client, group in by_client.items():
            await self._send_vllm_to(client, group, stats)
            stats = None

    async def _send_vllm_to(
        self,
        client: int,
        results: Sequence[tuple[MockRequest, list[int], str | None, int | str | None]],
        stats: dict[str, Any] | None,
    ) -> None:
        aux: list[bytes] = []
        outs = []
        codes = {"stop": 0, "length": 1, "abort": 2, "error": 3, "reject": 3}
        finished: list[str] = []
        for req, toks, reason, stop in results:
            prefill = None
            if len(req.generated) == len(toks) and reason != "reject":
                cached = req.cached_tokens or 0
                prefill = vllm.PrefillStats(
                    num_prompt_tokens=len(req.prompt_token_ids),
                    num_computed_tokens=len(req.prompt_token_ids) - cached,
                    num_cached_tokens=cached,
                    num_local_cached_tokens=cached,
                )
            if reason in ("reject", "error"):
                finished.append(req.request_id)
            pooled = None
            if reason == "stop" and req.pooling is not None and self.config.pooler is not None:
                pooled = self._pooled(self.config.pooler, req, aux)
            outs.append(
                vllm.EngineCoreOutput(
                    request_id=req.request_id,
                    new_token_ids=toks,
                    new_logprobs=self._logprobs(req, toks, aux),
                    pooling_output=pooled,
                    finish_reason=None if reason is None else codes[reason],
                    stop_reason=stop,
                    prefill_stats=prefill,
                    error=req.error if reason == "error" else None,
                    # vLLM's scheduler echoes the request's trace context on its outputs
                    trace_headers=getattr(req.raw, "trace_headers", None),
                    kv_transfer_params=_kv_echo(req) if reason is not None else None,
                )
            )
        env = vllm.EngineCoreOutputs(
            engine_index=self.config.engine_index,
            outputs=outs,
            timestamp=trio.current_time(),
            finished_requests=finished or None,
        )
        payload = bytearray(encoder.encode(env))
        if stats is not None:
            # Re-encode with the full stats map (the decoder struct models only three keys).
            arr = msgspec.msgpack.decode(bytes(payload))
            arr[2] = stats
            arr.append("default")  # vLLM 0.32's 9th element, weight_version
            payload = bytearray(encoder.encode(arr))
        await self._push([bytes(payload), *aux], client)

    async def _send_idle(self) -> None:
        assert self._sockets is not None
        if self.config.protocol == "vllm":
            await self._send_vllm([])
            if self.config.data_parallel_size > 1:
                env = vllm.EngineCoreOutputs(
                    engine_index=self.config.engine_index, wave_complete=self._current_wave
                )
                await self._push([encoder.encode(env)])
                self._current_wave += 1
        elif self.config.load_columns:
            await self._send_ts([])

    async def _send_ts(self, results: Sequence[tuple[MockRequest, list[int], str | None]]) -> None:
        assert self._sockets is not None
        cfg = self.config
        batch = ts.BatchTokenIDOutSlim(
            rids=[r.request_id for r, _, _ in results],
            output_ids=[t for _, t, _ in results],
            finished_reasons=[f or "" for _, _, f in results],
            prompt_tokens=[len(r.prompt_token_ids) for r, _, _ in results],
            completion_tokens=[len(r.generated) for r, _, _ in results],
            cached_tokens=[r.cached_tokens or 0 for r, _, _ in results],
            output_token_logprobs_val=[
                [-0.25 - 0.01 * (x % 7) for x in t] if r.logprobs is not None else []
                for r, t, _ in results
            ],
            output_token_logprobs_idx=[
                list(t) if r.logprobs is not None else [] for r, t, _ in results
            ],
            engine_index=cfg.engine_index,
            num_running=len(self.active),
            num_waiting=0,
            kv_active_pages=len(self.active),
            kv_total_pages=400 if cfg.load_columns else 0,
        )
        payload = encoder.encode(batch)
        if not cfg.load_columns:
            arr = msgspec.msgpack.decode(payload)
            payload = encoder.encode(arr[:10])
        await self._push([payload])


async def run_until_signal(engine: MockEngine) -> None:
    """Run ``engine`` until SIGINT/SIGTERM (or until it stops on its own)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("mock engine: %s, exiting", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await engine.run()
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m smg_trio.mock.engine`` (:func:`smg_trio.mock.cli.main`)."""
    from smg_trio.mock.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
