"""The worker manager: adds workers (their registration workflow in its nursery), removes them
with drain, and is the gateway's backend view (leases, served models, readiness)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

import attrs
import trio

from smg_trio.backend import (
    NoWorkerAvailable,
    Readiness,
    RoutingSnapshot,
    ServedModel,
    WorkerLease,
)
from smg_trio.connector.client import ENGINE_SILENCE_DEATH_TIMEOUT_S, EngineClient
from smg_trio.errors import ConflictError, EngineError, SmgError, ValidationError
from smg_trio.lora import LoraRegistry
from smg_trio.protocol.addresses import WorkerAddresses
from smg_trio.routing.cache_aware import CacheAwareConfig
from smg_trio.transport.handshake import READY_TIMEOUT_S
from smg_trio.transport.tcp import TcpOptions
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.jobs import (
    DEFAULT_JOB_TTL_S,
    DEFAULT_MAX_FINISHED_JOBS,
    JobTable,
    RegistrationJob,
)
from smg_trio.worker.kv_feed import KvFeed, routing_snapshot
from smg_trio.worker.lora_affinity import LoraAffinity
from smg_trio.worker.model_files import check_model_files
from smg_trio.worker.policies import (
    DEFAULT_POLICY,
    CacheAwarePolicy,
    LoadBalancingPolicy,
    RouteRequest,
    make_policy,
)
from smg_trio.worker.registration import RegistrationTiming
from smg_trio.worker.registration_flow import registration_definition, run_registration
from smg_trio.worker.registry import WorkerConflictError, WorkerRegistry
from smg_trio.worker.spec import (
    Runtime,
    WorkerSpec,
    model_id_for,
    resolve_hub_spec,
    validate_spec,
    warn_remote_tcp,
)
from smg_trio.worker.state import WorkerState
from smg_trio.workflow import WorkflowEngine

__all__ = ["RegistrationJob", "WorkerManager", "WorkerSpec", "WorkerState"]

log = logging.getLogger(__name__)

#: How long removal waits for a worker's in-flight requests before cancelling them.
DRAIN_TIMEOUT_S = 30.0
#: How long a request for a known model waits for a ready worker before its 503
#: (``--worker-wait-timeout-secs``).
WORKER_WAIT_TIMEOUT_S = 10.0
#: How often a removal re-reads the other processes' in-flight counts while it drains.
REMOTE_DRAIN_POLL_S = 0.05
#: How long a model stays known (requests wait, then 503; not 404) after its last worker left.
MODEL_GRACE_S = 10.0
#: Waiters for a ready worker re-check at least this often (the circuit breaker half-opens
#: with time, which no event reports).
_WAIT_RECHECK_S = 0.25


class WorkerManager:
    """Owns every worker's connection nursery and implements the gateway backend.

    Construct inside a nursery: ``manager = WorkerManager(nursery, policy="round_robin")``.
    Cancelling that nursery stops every worker (sockets closed, in-flight requests failed).
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        policy: str = DEFAULT_POLICY,
        cache: CacheAwareConfig | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        silence_timeout_s: float = ENGINE_SILENCE_DEATH_TIMEOUT_S,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        confinement: WorkerConfinement | None = None,
        max_finished_jobs: int = DEFAULT_MAX_FINISHED_JOBS,
        job_ttl_s: float = DEFAULT_JOB_TTL_S,
        registration_timing: RegistrationTiming | None = None,
        worker_wait_timeout_s: float = WORKER_WAIT_TIMEOUT_S,
        model_grace_s: float = MODEL_GRACE_S,
        client_count: int = 1,
        tcp: TcpOptions | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
    ) -> None:
        self._nursery = nursery
        #: ``--chat-template`` (Jinja source) and ``--chat-template-content-format``: every
        #: model's tokenizer is loaded with them.
        self.chat_template = chat_template
        self.chat_template_content_format = chat_template_content_format
        #: Frontend clients per engine (``--api-server-count`` + 1 under a supervisor): this
        #: manager is client 0 and its INIT names every client's ipc pair.
        self.client_count = client_count
        #: What worker specs may touch (default: :meth:`WorkerConfinement.default`).
        self.confinement = confinement or WorkerConfinement.default()
        tcp = tcp or TcpOptions()
        #: How ``tcp://`` workers are set up; their engines may connect from loopback and the
        #: confinement's engine hosts.
        self.tcp = attrs.evolve(
            tcp, allowed_hosts=(*tcp.allowed_hosts, *self.confinement.engine_hosts)
        )
        self.policy: LoadBalancingPolicy = make_policy(policy, cache=cache)
        #: Whether this process routes requests (so it needs the engines' KV events): not the
        #: supervisor of several frontends, which subscribe themselves.
        self.routes_requests = client_count == 1
        #: ``cache_aware``'s KV event feed (one subscription per publishing engine).
        self.kv_feed: KvFeed | None = None
        if isinstance(self.policy, CacheAwarePolicy):
            self.kv_feed = KvFeed(
                self.policy.router, self.confinement, can_bind=client_count == 1, tcp=self.tcp
            )
        self.ready_timeout_s = ready_timeout_s
        self.silence_timeout_s = silence_timeout_s
        self.drain_timeout_s = drain_timeout_s
        #: Requests that other processes hold on a worker (the frontends of
        #: ``--api-server-count``): a removal drains them too.
        self.remote_inflight: Callable[[WorkerState], int] | None = None
        #: The specs of workers whose engines ``serve`` launched, by URL: a worker added at
        #: one of them again is served by that engine (relaunched), so it must keep what the
        #: engine was started with (:meth:`validate_spec`).
        self.launched: dict[str, WorkerSpec] = {}
        self.worker_wait_timeout_s = worker_wait_timeout_s
        self.model_grace_s = model_grace_s
        self.registry = WorkerRegistry()
        #: The LoRA adapters served (a change wakes the frontends' table long-poll).
        self.loras = LoraRegistry(on_change=self.registry.touch)
        #: Which workers hold which adapters: a request for one prefers them.
        self.lora_affinity = LoraAffinity()
        #: Registration jobs; finished ones expire by count and age.
        self.jobs = JobTable(max_finished=max_finished_jobs, ttl_s=job_ttl_s)
        #: Models with a registered worker whose tokenizer loaded.
        self.models: dict[str, ServedModel] = {}
        #: Models whose last worker left: (the served model if it had loaded, known until).
        self._retired: dict[str, tuple[ServedModel | None, float]] = {}
        self._draining = False
        self.timing = registration_timing or RegistrationTiming()
        self.engine = WorkflowEngine()
        self.definition = registration_definition(self)

    # -- GatewayBackend ------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        """Readiness goes 503 and new requests are refused (waiting ones too)."""
        self._draining = True
        self.registry.touch()

    def list_models(self) -> Sequence[ServedModel]:
        """Models with at least one ready (routable) worker."""
        return [m for m in self.models.values() if self.registry.workers_for(m.model_id)]

    def _retired_entry(self, model_id: str) -> tuple[ServedModel | None, float] | None:
        entry = self._retired.get(model_id)
        if entry is not None and trio.current_time() >= entry[1]:
            del self._retired[model_id]
            return None
        return entry

    def known_models(self) -> Sequence[str]:
        """Models with a registered worker (ready or not) or whose last worker left less than
        ``model_grace_s`` ago."""
        known = dict.fromkeys(self.registry.models())
        for model_id in list(self._retired):
            if model_id not in known and self._retired_entry(model_id) is not None:
                known[model_id] = None
        return list(known)

    def get_model(self, model_id: str) -> ServedModel | None:
        """The served model (tokenizer loaded) of a known model (see :meth:`known_models`)."""
        served = self.models.get(model_id)
        if served is not None:
            return served
        entry = self._retired_entry(model_id)
        return None if entry is None else entry[0]

    async def wait_for_worker(self, model_id: str, *, exclude: Collection[str] = ()) -> None:
        """Return once a worker of ``model_id`` (not in ``exclude``) is routable, without a
        checkpoint when one already is (so a :meth:`lease` right after sees the same state).
        A known model without one waits up to ``worker_wait_timeout_s`` (a rolling update, a
        restarting engine); then, or at once for an unknown model, raises
        :class:`NoWorkerAvailable`. Returns early while draining (the lease refuses)."""
        registry = self.registry
        if self._draining or registry.workers_for(model_id, exclude):
            return
        self._check_not_held(model_id)
        with trio.move_on_after(self.worker_wait_timeout_s):
            while model_id in self.known_models():
                changed = registry.changed
                with trio.move_on_after(_WAIT_RECHECK_S):
                    await changed.wait()
                if self._draining or registry.workers_for(model_id, exclude):
                    return
        raise NoWorkerAvailable(
            f"no ready worker for model {model_id!r} (waited up to "
            f"{self.worker_wait_timeout_s:g} s)"
        )

    def _check_not_held(self, model_id: str) -> None:
        """A model whose workers are held asleep or paused (engine control) and none other is
        ready gets its 503 at once: no worker comes back before an admin wakes one."""
        workers = self.registry.list(model_id)
        held = sorted({w.held for w in workers if w.held is not None})
        if held and not any(w.status in ("pending", "ready") and w.held is None for w in workers):
            raise NoWorkerAvailable(
                f"every worker of model {model_id!r} is {' or '.join(held)} "
                "(an admin wakes it with /wake_up or /resume)"
            )

    @contextmanager
    def lease(
        self, model_id: str, exclude: Collection[str] = (), route: RouteRequest | None = None
    ) -> Iterator[WorkerLease]:
        if self._draining:
            raise NoWorkerAvailable("the gateway is draining")
        adapter = None if route is None else route.lora_name
        affinity = self.lora_affinity
        worker, rank = self.registry.select_engine(
            model_id,
            self.policy,
            exclude,
            route,
            None if adapter is None else lambda ws: affinity.prefer(ws, adapter),
        ) or (
            None,
            None,
        )
        if not isinstance(worker, WorkerState) or worker.engine_client is None:
            raise NoWorkerAvailable(f"no healthy worker for model {model_id!r}")
        if adapter is not None:
            affinity.record(worker, adapter)
        client = worker.engine_client
        worker.inflight += 1
        if worker.idle.is_set():
            worker.idle = trio.Event()
        try:
            yield WorkerLease(worker_id=worker.worker_id, client=client, rank_hint=rank)
        except EngineError:
            worker.circuit.record_failure()
            raise
        else:
            worker.circuit.record_success()
        finally:
            worker.inflight -= 1
            if worker.inflight == 0:
                worker.idle.set()

    def routing_snapshot(self) -> RoutingSnapshot | None:
        """``cache_aware``'s index and feed counters (``/metrics``), or ``None`` under
        another policy."""
        if not isinstance(self.policy, CacheAwarePolicy):
            return None
        return routing_snapshot(self.policy.router, self.kv_feed)

    def fail_inflight(self, error: BaseException) -> int:
        """End every in-flight request on every worker with ``error`` (each then sends its
        engine ABORT as usual); the workers stay up. Returns how many requests were failed."""
        failed = 0
        for w in self.workers:
            if w.engine_client is not None:
                failed += w.engine_client.fail_inflight(error)
        return failed

    async def wait_idle(self) -> None:
        """Return once no worker has requests in flight."""
        while True:
            busy = [w for w in self.workers if w.inflight > 0]
            if not busy:
                return
            await busy[0].idle.wait()

    def readiness(self) -> Readiness:
        total = len(self.registry)
        healthy = sum(1 for w in self.registry if w.healthy)
        verdict = Readiness.evaluate(draining=self._draining, healthy=healthy, total=total)
        held = sorted({w.held for w in self.registry if w.held is not None})
        if verdict.reason == "insufficient healthy workers" and held:
            # put to sleep or paused over the engine control routes: say so, and how back
            reason = f"{verdict.reason} (held {' or '.join(held)}: POST /wake_up or /resume)"
            return attrs.evolve(verdict, reason=reason)
        return verdict

    # -- registration --------------------------------------------------------------------

    def validate_spec(self, spec: WorkerSpec) -> tuple[Runtime, WorkerAddresses]:
        """Step 1 and 2 of registration, synchronously (so ``POST /workers`` can 400 at once):
        the fields, and the :attr:`confinement` rules that need no I/O (see
        :func:`~smg_trio.worker.spec.validate_spec`). Raises ``ValidationError``."""
        return validate_spec(
            spec,
            confinement=self.confinement,
            tcp=self.tcp,
            client_count=self.client_count,
            launched=self.launched.get(spec.url),
            get_model=self.get_model,
        )

    async def check_spec(self, spec: WorkerSpec) -> WorkerSpec:
        """:meth:`validate_spec` plus the checks that need the filesystem (off the event
        loop): ``model_path`` and each model file it holds resolve inside the model roots.
        ``POST /workers`` calls it first so that such a spec is a 400, not a failed job; the
        registration re-checks every file as it reads it. Returns the spec to add: a Hugging
        Face id in ``model_path`` (or in ``model_id`` alone, for a model not yet served)
        becomes its snapshot in the hub cache (never fetched: see docs/models.md). Raises
        ``ValidationError``."""
        joins = spec.model_path is None and spec.model_id is not None
        if not joins or self.get_model(spec.model_id or "") is None:
            spec = await trio.to_thread.run_sync(resolve_hub_spec, spec)
        elif spec.revision is not None:
            raise ValidationError(
                f"revision needs model_path: model_id alone joins {spec.model_id!r} as it is "
                "served, with its tokenizer",
                param="revision",
            )
        self.validate_spec(spec)
        await trio.to_thread.run_sync(
            check_model_files, spec.model_path, self.confinement.model_dirs
        )
        return spec

    def add_worker(self, spec: WorkerSpec) -> RegistrationJob:
        """Validate (raises ``ValidationError``), reserve the worker, and start its registration
        workflow in the manager's nursery. Returns the job at once."""
        runtime, addrs = self.validate_spec(spec)
        worker = WorkerState(
            url=spec.url,
            model_id=model_id_for(spec),
            runtime=runtime,
            dp_size=spec.dp_size,
            handshake_address=addrs.handshake,
            spec=spec,
            addresses=addrs,
        )
        try:
            self.registry.register(worker)
        except WorkerConflictError as exc:
            param = "url" if exc.existing_url == spec.url else "zmq_handshake_address"
            raise ConflictError(str(exc), param=param, code="worker_conflict") from exc
        if spec.runtime_type is None:
            log.info("worker %r has no runtime_type: vllm", spec.url)
        if addrs.is_tcp:
            warn_remote_tcp(spec.url)
        job = RegistrationJob(job_id=str(uuid.uuid4()), spec=spec, worker_id=worker.worker_id)
        self.jobs.add(job)
        self._nursery.start_soon(run_registration, self, job, worker)
        return job

    async def register(self, spec: WorkerSpec) -> WorkerState:
        """Add a worker and wait until its registration finished. Raises ``SmgError`` with the
        job's error if it failed."""
        job = self.add_worker(spec)
        await job.done.wait()
        if job.status != "succeeded":
            raise SmgError(f"worker {spec.url} failed to register: {job.error}")
        assert job.worker_id is not None
        worker = self.registry.get(job.worker_id)
        assert isinstance(worker, WorkerState)
        return worker

    @property
    def workers(self) -> list[WorkerState]:
        """Every registered worker, in registration order."""
        return [w for w in self.registry if isinstance(w, WorkerState)]

    def engine_clients(self) -> Sequence[tuple[str, EngineClient]]:
        """``(model_id, client)`` of every worker whose engine client is alive (metrics)."""
        return [
            (w.model_id, c) for w in self.workers if (c := w.engine_client) is not None and c.alive
        ]

    def get_worker(self, worker_id: str) -> WorkerState | None:
        """The worker with this id, or ``None``."""
        w = self.registry.get(worker_id)
        return w if isinstance(w, WorkerState) else None

    def _forget(self, worker: WorkerState, *, retire: bool = True) -> None:
        """Drop ``worker``. If it was its model's last, the model stays known for
        ``model_grace_s`` (``retire``: a removal, a rolling update) or, for a registration that
        failed and so never served, goes at once (an earlier removal's grace still holds)."""
        if worker.worker_id in self.registry:
            self.registry.remove(worker.worker_id)
        worker.status = "removed"
        model_id = worker.model_id
        if not self.registry.list(model=model_id):
            if not retire:
                self.models.pop(model_id, None)
                return
            # Still known for a grace period: requests wait for a re-added worker, then 503.
            served = self.models.pop(model_id, None)
            if served is None and (entry := self._retired_entry(model_id)) is not None:
                served = entry[0]
            self._retired[model_id] = (served, trio.current_time() + self.model_grace_s)
            for other in list(self._retired):
                self._retired_entry(other)  # forget the expired ones

    def kill_worker_client(self, url: str, reason: str) -> None:
        """Fail a worker's in-flight requests now (its engine process exited)."""
        w = self.registry.get_by_url(url)
        if isinstance(w, WorkerState) and w.engine_client is not None:
            w.engine_client.kill(reason)

    async def remove_worker(self, worker_id: str) -> bool:
        """Drain (new requests go elsewhere; in-flight ones get up to ``drain_timeout_s``), then
        cancel the worker's nursery: handshakes stop, sockets close, remaining requests fail.
        Returns False for an unknown id."""
        worker = self.get_worker(worker_id)
        if worker is None:
            return False
        log.info("removing worker %r (%s): draining it", worker.url, worker_id)
        worker.status = "draining"
        remote = self.remote_inflight
        if worker.inflight > 0 or (remote is not None and remote(worker) > 0):
            with trio.move_on_after(self.drain_timeout_s):
                if worker.inflight > 0:
                    await worker.idle.wait()
                # other processes' requests (the frontends'): their counts are shared
                # memory, with no wake-up, so they are polled
                while remote is not None and remote(worker) > 0:  # noqa: ASYNC110
                    await trio.sleep(REMOTE_DRAIN_POLL_S)
        worker.registration_scope.cancel()
        worker.scope.cancel()
        self._forget(worker)
        return True
