"""A frontend process's workers (``--api-server-count`` > 1): a mirror of the supervisor's
worker table whose engine clients attach to the engines that the supervisor (client 0)
handshook, each through this frontend's own ipc pair."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import msgspec
import trio

from smg_trio.backend import ServedModel, WorkerLease
from smg_trio.connector.client import attach_engine_client
from smg_trio.connector.tasks import TASKS_TIMEOUT_S, learn_tasks
from smg_trio.errors import EngineError, SmgError
from smg_trio.protocol.addresses import worker_addresses
from smg_trio.protocol.handshake import EngineCoreReadyResponse
from smg_trio.protocol.vllm import VllmProtocol
from smg_trio.routing.cache_aware import RouteRequest
from smg_trio.transport.handshake import EngineRegistration
from smg_trio.worker.manager import WorkerManager
from smg_trio.worker.model_files import load_model
from smg_trio.worker.registry import WorkerConflictError
from smg_trio.worker.shared_load import SharedLoad
from smg_trio.worker.spec import WorkerSpec
from smg_trio.worker.state import WorkerState
from smg_trio.worker.supervise import REBIND_BACKOFF_S

__all__ = ["ATTACH_PATIENCE_S", "AttachedWorker", "FrontendManager"]

log = logging.getLogger(__name__)

#: How long a frontend's startup waits for a ready worker's engines to connect to its fresh
#: sockets: a live engine's ZMQ I/O thread connects within moments, a stalled one (SIGSTOP)
#: never; past this the frontend serves without it (it attaches once they connect).
ATTACH_PATIENCE_S = 10.0


@attrs.define(eq=False, kw_only=True)
class AttachedWorker(WorkerState):
    """A mirrored worker: what the supervisor last said of it (``entry``), woken by
    ``entry_changed``; its load score counts every frontend's requests (``shared``)."""

    entry: dict[str, Any] = attrs.field(factory=dict)
    entry_changed: trio.Event = attrs.field(factory=trio.Event)
    shared: SharedLoad | None = None
    #: Its model could not be loaded here: it never attaches (see ``last_error``).
    load_failed: bool = False
    #: This attach has waited :data:`ATTACH_PATIENCE_S` for the engines to connect: the
    #: frontend's startup no longer waits for it.
    attach_stalled: bool = False

    #: This frontend is removing it (it left the table).
    leaving: bool = False

    def update(self, entry: dict[str, Any]) -> None:
        """Take the supervisor's new entry and wake the attach loop. A worker the supervisor
        drains takes no new requests here, and stays attached for those in flight."""
        self.entry = entry
        if entry.get("status") == "draining" and self.status in ("ready", "unhealthy"):
            self.status = "draining"
        self.metadata.update(entry.get("metadata") or {})
        held = entry.get("held")
        self.held = held if held in ("sleeping", "paused") else None  # engine control
        changed, self.entry_changed = self.entry_changed, trio.Event()
        changed.set()

    def load_score(self) -> float:
        """As :meth:`WorkerState.load_score`, with the requests of every frontend counted."""
        score = super().load_score()
        if self.shared is not None:
            score = max(score, float(self.shared.total(self.entry.get("slot", -1))))
        return score


def _registrations(entry: dict[str, Any]) -> list[EngineRegistration]:
    return [
        EngineRegistration(
            identity=bytes.fromhex(e["identity"]),
            index=e["index"],
            ready=msgspec.convert(e["ready"], EngineCoreReadyResponse),
        )
        for e in entry["engines"]
    ]


class FrontendManager(WorkerManager):
    """The backend of frontend client ``client_index``: registration happens in the
    supervisor, and :meth:`apply` reconciles this process with its worker table (adding,
    re-attaching after an engine restart, draining removed workers)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        client_index: int,
        client_count: int,
        shared: SharedLoad | None = None,
        report_unresponsive: Callable[[str, int, str], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(nursery, client_count=client_count, **kwargs)
        self.routes_requests = True
        self.client_index = client_index
        self.shared = shared
        #: Tells the supervisor (worker id, generation, reason) that an engine this frontend
        #: drives stopped answering: the supervisor's own client is idle and never sees it.
        self.report_unresponsive = report_unresponsive
        self._table: dict[str, Any] = {}
        #: URLs whose new entry waits for the worker it replaces to be gone here.
        self._deferred: set[str] = set()

    @contextmanager
    def lease(
        self, model_id: str, exclude: Collection[str] = (), route: RouteRequest | None = None
    ) -> Iterator[WorkerLease]:
        worker: WorkerState | None = None
        try:
            with super().lease(model_id, exclude, route) as lease:
                worker = self.get_worker(lease.worker_id)
                self._publish(worker)
                yield lease
        finally:
            self._publish(worker)

    def _publish(self, worker: WorkerState | None) -> None:
        if self.shared is not None and isinstance(worker, AttachedWorker):
            self.shared.publish(worker.entry.get("slot", -1), worker.inflight)

    def apply(self, table: dict[str, Any]) -> None:
        """Reconcile with one published table."""
        self._table = table
        self.loras.replace(table.get("lora_adapters") or [])
        if table.get("draining") and not self.draining:
            self.start_draining()
        entries = {e["id"]: e for e in table.get("workers", [])}
        for worker in self.workers:
            if worker.worker_id not in entries and worker.status != "removed":
                if isinstance(worker, AttachedWorker):
                    if worker.leaving:
                        continue
                    worker.leaving = True
                log.info("worker %r left the table; draining it here", worker.url)
                self._nursery.start_soon(self.remove_worker, worker.worker_id)
        for worker_id, entry in entries.items():
            known = self.get_worker(worker_id)
            if isinstance(known, AttachedWorker):
                known.update(entry)
            elif known is None and entry["url"] not in self._deferred:
                try:
                    self._adopt(entry)
                except WorkerConflictError as exc:
                    # a replacement (same URL or handshake address, new id): the old worker
                    # still drains here, and its ipc pair is still bound
                    holder = self.get_worker(exc.existing_id)
                    if holder is None:  # pragma: no cover - the registry names a member
                        raise
                    self._deferred.add(entry["url"])
                    self._nursery.start_soon(self._adopt_after, holder, entry["url"])

    async def _adopt_after(self, holder: WorkerState, url: str) -> None:
        """Adopt the entry that replaces ``holder`` once ``holder`` has drained, left the
        registry and detached here (so that its sockets are closed), then re-apply."""
        try:
            while True:
                changed = self.registry.changed
                if holder.worker_id not in self.registry:
                    break
                await changed.wait()
            await holder.stopped.wait()
        finally:
            self._deferred.discard(url)
        log.info("worker %r: the worker it replaces is gone here; attaching the new one", url)
        self.apply(self._table)

    def _adopt(self, entry: dict[str, Any]) -> None:
        spec = WorkerSpec(
            url=entry["url"],
            model_path=entry["model_path"],
            model_id=entry["model_id"],
            runtime_type=entry["runtime"],
            zmq_handshake_address=entry["handshake"],
            dp_size=entry["dp_size"],
            reasoning_parser=entry["reasoning_parser"],
            tool_call_parser=entry["tool_call_parser"],
        )
        addrs = worker_addresses(
            spec.url,
            entry["handshake"],
            client_index=self.client_index,
            client_count=self.client_count,
        )
        worker = AttachedWorker(
            url=spec.url,
            model_id=entry["model_id"],
            runtime=entry["runtime"],
            worker_id=entry["id"],
            dp_size=entry["dp_size"],
            handshake_address=entry["handshake"],
            spec=spec,
            addresses=addrs,
            shared=self.shared,
        )
        worker.update(entry)
        self.registry.register(worker)
        self._nursery.start_soon(self._attach_loop, worker)

    def _model_source(self, worker: AttachedWorker) -> tuple[str, str | None, str | None] | None:
        """Where ``worker``'s model comes from: ``(model_path, reasoning_parser,
        tool_call_parser)`` as the supervisor serves it (the table's ``models``), else as the
        worker's spec names it; ``None`` for a worker that joins a model (no ``model_path``)
        that the supervisor has not published yet."""
        served = (self._table.get("models") or {}).get(worker.model_id)
        if served is not None and served["model_path"] is not None:
            return served["model_path"], served["reasoning_parser"], served["tool_call_parser"]
        spec = worker.spec
        if spec.model_path is None:
            return None
        return spec.model_path, spec.reasoning_parser, spec.tool_call_parser

    async def _load(self, worker: AttachedWorker) -> None:
        while (source := self._model_source(worker)) is None:
            if worker.model_id in self.models:
                return
            await worker.entry_changed.wait()  # the next table
        if worker.model_id in self.models:
            return
        path, reasoning_parser, tool_call_parser = source
        tok, (eos, extra), max_len, pooling, defaults = await trio.to_thread.run_sync(
            load_model,
            path,
            self.confinement.model_dirs,
            self.chat_template,
            self.chat_template_content_format,
        )
        if worker.model_id not in self.models:
            self.models[worker.model_id] = ServedModel(
                model_id=worker.model_id,
                tokenizer=tok,
                protocol=VllmProtocol(self.client_index),
                max_model_len=worker.entry.get("max_model_len") or max_len or 2048,
                eos_token_id=eos,
                extra_eos_token_ids=list(extra),
                reasoning_parser=reasoning_parser,
                tool_call_parser=tool_call_parser,
                model_path=path,
                pooling=pooling,
                sampling_defaults=defaults,
            )

    async def _attach_loop(self, worker: AttachedWorker) -> None:
        """Attach for each generation the supervisor reports ready; detach when the worker
        leaves ``ready`` or a new generation (a restarted engine) comes."""
        worker.scope = scope = trio.CancelScope()
        worker.stopped = stopped = trio.Event()
        try:
            with scope:
                try:
                    await self._load(worker)
                except (OSError, SmgError, ValueError) as exc:
                    worker.last_error = f"{type(exc).__name__}: {exc}"
                    worker.load_failed = True
                    log.error("worker %r: cannot load its model: %s", worker.url, exc)
                    return
                async with trio.open_nursery() as nursery:
                    if self.kv_feed is not None:  # every frontend hears the engines itself
                        nursery.start_soon(self.kv_feed.run_worker, worker)
                    while True:
                        await self._attach_once(worker)
        finally:
            worker.set_client(None)
            stopped.set()

    def _report(self, worker: AttachedWorker, generation: int, reason: str) -> None:
        if self.report_unresponsive is not None:
            reason = f"frontend {self.client_index}: {reason}"
            self._nursery.start_soon(self._send_report, worker.worker_id, generation, reason)

    async def _send_report(self, worker_id: str, generation: int, reason: str) -> None:
        assert self.report_unresponsive is not None
        with trio.move_on_after(10):
            await self.report_unresponsive(worker_id, generation, reason)

    async def wait_attached(self) -> None:
        """Return once every worker the supervisor reports ready is attached here (or
        failed to load its model here, and so never will be, or whose engines have not
        connected within :data:`ATTACH_PATIENCE_S`: a stalled engine)."""
        while True:
            changed = self.registry.changed
            pending = [
                w
                for w in self.workers
                if isinstance(w, AttachedWorker)
                and w.entry.get("status") == "ready"
                and w.engine_client is None
                and not w.load_failed
                and not w.attach_stalled
            ]
            if not pending:
                return
            await changed.wait()

    async def _attach_once(self, worker: AttachedWorker) -> None:
        entry = worker.entry
        if entry["status"] != "ready" or not entry["engines"]:
            if worker.status == "ready":
                worker.status = "unhealthy"
            await worker.entry_changed.wait()
            return
        generation = entry["generation"]
        model = self.models.get(worker.model_id)
        if model is not None and entry.get("max_model_len"):
            model.max_model_len = entry["max_model_len"]
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                # a new generation (a restarted engine) or a worker no longer ready detaches
                # (a worker the supervisor drains stays attached for its requests in flight)
                while worker.entry["generation"] == generation and (
                    worker.entry["status"] in ("ready", "draining")
                ):
                    await worker.entry_changed.wait()
                client = worker.engine_client
                reason = worker.entry.get("last_error")
                if client is not None and reason:
                    client.kill(reason)  # in-flight requests end with the supervisor's reason
                nursery.cancel_scope.cancel()

            async def patience() -> None:
                await trio.sleep(ATTACH_PATIENCE_S)
                if worker.engine_client is None:
                    log.warning(
                        "worker %r: its engines have not connected to frontend %d after %g s "
                        "(a stalled engine?); serving without it until they do",
                        worker.url,
                        self.client_index,
                        ATTACH_PATIENCE_S,
                    )
                    worker.attach_stalled = True
                    self.registry.touch()

            worker.attach_stalled = False
            nursery.start_soon(watch)
            nursery.start_soon(patience)
            slot = entry.get("slot", -1)
            # the DP-rank choice counts every frontend's requests on each rank
            ranks = self.shared.ranks(slot) if self.shared is not None and slot >= 0 else None
            try:
                async with attach_engine_client(
                    VllmProtocol(self.client_index),
                    worker.addresses,
                    _registrations(entry),
                    silence_timeout_s=self.silence_timeout_s,
                    shared_load=ranks,
                ) as client:
                    worker.set_client(client)
                    # beside the attach, as the manager does (never holding it)
                    nursery.start_soon(learn_tasks, client, TASKS_TIMEOUT_S, worker.url)
                    worker.circuit.reset()
                    worker.status = "ready"
                    await client.dead_event.wait()
                    worker.last_error = str(client.dead_reason)
                    if not nursery.cancel_scope.cancel_called:  # seen here, not told
                        self._report(worker, generation, str(client.dead_reason))
            except (EngineError, OSError) as exc:
                worker.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("worker %r: attach failed: %s", worker.url, exc)
            nursery.cancel_scope.cancel()
        worker.set_client(None)
        if worker.status == "ready":
            worker.status = "unhealthy"
        await trio.sleep(REBIND_BACKOFF_S)
