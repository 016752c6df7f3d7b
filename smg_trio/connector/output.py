"""An engine client's output loop (receive, decode, dispatch, wake), waves and silence watchdog."""

from __future__ import annotations

import math

import trio

from smg_trio.connector.aborts import ClientAborts
from smg_trio.connector.state import log
from smg_trio.errors import DecodeError, EngineDeadError, TransportError
from smg_trio.protocol.types import EngineBatch, EngineLoad

__all__ = ["ENGINE_CORE_DEAD", "MAX_CONSECUTIVE_DECODE_ERRORS", "ClientOutput"]

#: The single output frame a dying engine sends (vLLM ``EngineCoreProc``, TokenSpeed on close).
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
#: One undecodable message is dropped; this many in a row means the stream is garbage.
MAX_CONSECUTIVE_DECODE_ERRORS = 3
#: The output loop handles up to this many waiting messages before it lets other tasks run.
#: A saturated gateway finds many: each stream then takes all its steps of the burst in one
#: merged event (64 against 16: c=256 CPU per token -7%, TTFT p99 -37%; docs/performance.md).
_OUTPUT_BURST = 64


class ClientOutput(ClientAborts):
    """The output loop and what it drives (request wake-ups, lockstep waves, the watchdog)."""

    async def _wake_group(self, wave: int) -> None:
        frames = self.protocol.encode_start_wave(wave)
        if frames is None:
            return
        for identity in self._identities:
            await self._send(identity, frames)

    async def _wake_group_background(self, wave: int) -> None:
        """A wake the output loop asked for (``start_wave``). Runs in the client's nursery, so
        a failed send must not escape: ``_send`` has already latched the client dead."""
        try:
            await self._wake_group(wave)
        except EngineDeadError:
            log.debug("wake of wave %d not sent: engine is dead", wave)

    def _dispatch(self, batch: EngineBatch) -> None:
        self._dispatching = True
        try:
            self._dispatch_batch(batch)
        finally:
            self._dispatching = False
            if self._pending_aborts:
                self._flush_aborts()

    def _wake_queued(self) -> None:
        """Wake every request that the messages drained in this wake-up gave outputs (or
        ended), once each. A consumer that fell behind the engine (several steps waiting on
        the socket) then takes them all at once: a stream writes them in one socket write
        rather than one per step, which is how a saturated gateway catches up. When it keeps
        up, a drain holds one step and nothing waits longer than the decode of that step."""
        to_wake = self._to_wake
        if not to_wake:
            return
        self._to_wake = {}
        self._dispatching = True
        try:
            for entry in to_wake:
                entry.wake()
        finally:
            self._dispatching = False
            if self._pending_aborts:
                self._flush_aborts()

    def _dispatch_batch(self, batch: EngineBatch) -> None:
        router = self._router
        slot = router.slot_for_index(batch.engine_index)
        if batch.utility is not None:
            self._utility.resolve(batch.utility)
        if batch.load is not None and slot is not None:
            load = batch.load
            if batch.outputs and not router.inflight[slot]:
                # Outputs only of requests this client does not own (a previous life's, or
                # ones it retired): the counts include requests being ABORTed, and no later
                # stats need reach this client to correct them (vLLM sends them with a
                # client's own outputs). Shed them, as an emptied rank does on release.
                load = EngineLoad(0, 0, load.kv_cache_usage)
            router.loads[slot] = load
        if batch.prefix_cache_queries:
            self.prefix_cache_queries += batch.prefix_cache_queries
            self.prefix_cache_hits += batch.prefix_cache_hits
        registry = self._registry
        to_wake = self._to_wake
        # Ids to tell ABORT again, per engine: one message each (not one task and message per
        # output: under a disconnect storm every retired request's in-flight outputs did that,
        # hundreds of sends competing with the ABORTs that mattered).
        reabort: dict[bytes, dict[str, None]] | None = None
        if self._aborted:
            self._expire_aborted(trio.current_time())
        for out in batch.outputs:
            entry = registry.get(out.request_id)
            if entry is None:
                known = self._aborted.get(out.request_id)
                identity = known[0] if known is not None else None
                if identity is None and out.finish_reason is None and slot is not None:
                    # An id this client never sent, still running: a previous life's request
                    # (this frontend restarted, and the engine kept its outputs for this
                    # socket). Nobody waits for it: ABORT it, once (remembered below).
                    identity = self._identities[slot]
                    self._remember_aborted(out.request_id, identity)
                    log.info(
                        "aborting %s: an engine request this client does not know", out.request_id
                    )
                if identity is not None:
                    if out.finish_reason is None:
                        if self._may_reabort(out.request_id, identity):
                            reabort = reabort or {}
                            reabort.setdefault(identity, {})[out.request_id] = None
                    else:
                        self._aborted.pop(out.request_id, None)
                continue
            entry.put(out)
            to_wake[entry] = None
            if out.finish_reason is not None:
                del registry[out.request_id]
                router.release(entry.rank, out.request_id)
        for rid in batch.finished_request_ids:
            entry = registry.pop(rid, None)
            if entry is not None:
                router.release(entry.rank, rid)
                if entry.end():
                    to_wake[entry] = None
        if self._waves is not None:
            if batch.wave_complete is not None:
                self._waves.wave_complete(batch.wave_complete)
            if batch.start_wave is not None and self._nursery is not None:
                self._nursery.start_soon(
                    self._wake_group_background, self._waves.start_wave(batch.start_wave)
                )
        if reabort and self._nursery is not None:
            for identity, rids in reabort.items():
                self._nursery.start_soon(self._send_aborts, identity, list(rids))

    async def _silence_watchdog(self) -> None:
        """Fail the in-flight requests when the engine has sent nothing for the silence window
        while requests are pending; idle silence is fine. One timer per window, not a deadline
        update per message: the output loop only records the time of each output."""
        timeout = self._silence_timeout_s
        if not math.isfinite(timeout):
            return
        with self._watchdog_scope:
            await self._watch_silence(timeout)

    async def _watch_silence(self, timeout: float) -> None:
        while self._dead is None and not self._closed:
            deadline = self._last_output + timeout
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            if not self._registry:
                self._last_output = trio.current_time()  # idle: restart the window
                continue
            # The engine may be stalled rather than gone: ask it to drop the requests (best
            # effort, never blocking) before they are failed here.
            self._abort_all_nowait()
            self._die(
                EngineDeadError(
                    f"no engine output for {timeout:g} s with "
                    f"{len(self._registry)} request(s) in flight"
                )
            )
            return

    async def _output_loop(self) -> None:
        """Receive, decode and dispatch engine outputs until the client dies or closes."""
        with trio.CancelScope() as scope:
            self._recv_scope = scope  # cancelled by _die
            try:
                await self._receive_outputs()
            finally:
                self._wake_queued()  # nothing queued is left unwoken, however the loop ends
        self._recv_scope = None

    async def _receive_outputs(self) -> None:
        """Every message waiting is handled in one wake-up (a checkpoint every
        ``_OUTPUT_BURST`` messages keeps a flood fair), and the requests it fed are woken
        before the loop waits or yields (:meth:`_wake_queued`)."""
        sock = self._sockets.output
        decode = self.protocol.decode_batch
        errors = 0
        burst = 0
        while self._dead is None:
            try:
                if burst >= _OUTPUT_BURST:
                    burst = 0
                    self._wake_queued()
                    await trio.lowlevel.checkpoint()
                frames = sock.recv_multipart_nowait()
                if frames is None:
                    burst = 0
                    self._wake_queued()
                    await sock.wait_readable()
                    continue
                burst += 1
            except (TransportError, trio.ClosedResourceError) as exc:
                if not self._closed:
                    self._die(EngineDeadError(f"engine output socket failed: {exc}"))
                return
            self._last_output = trio.current_time()
            if len(frames) == 1 and frames[0] == ENGINE_CORE_DEAD:
                self._die(EngineDeadError("engine core dead (ENGINE_CORE_DEAD sentinel)"))
                return
            try:
                batch = decode(frames)
            except DecodeError as exc:
                errors += 1
                log.warning("dropping undecodable engine output (%d in a row): %s", errors, exc)
                if errors >= MAX_CONSECUTIVE_DECODE_ERRORS:
                    self._die(EngineDeadError(f"{errors} consecutive undecodable outputs: {exc}"))
                    return
                continue
            errors = 0
            self._dispatch(batch)
