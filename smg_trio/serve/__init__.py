"""Process-level composition: engines, worker manager and HTTP server in one nursery."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from functools import partial

import attrs
import trio

from smg_trio.gateway.config import GatewayHttpConfig
from smg_trio.gateway.http.app import create_app, serve_http
from smg_trio.gateway.http.tenants import SharedLedger, TenantGate, load_tenants
from smg_trio.gateway.http.tracing import Tracing, open_tracing
from smg_trio.gateway.openai.errors import ApiError
from smg_trio.serve.admin import admin_blueprint
from smg_trio.serve.admin_schema import ADMIN_OPERATIONS
from smg_trio.serve.commands import (
    EngineLaunch,
    build_engine_command,
    reject_handshake_collisions,
)
from smg_trio.serve.config import EngineLaunchConfig, GatewayConfig, cache_aware_config
from smg_trio.serve.control import CONTROL_SOCKET, control_app
from smg_trio.serve.discovery import DiscoveryWatcher
from smg_trio.serve.engine_control import add_engine_control_routes
from smg_trio.serve.launcher import EngineExited, exit_cause, run_engine_process
from smg_trio.serve.lora_routes import add_lora_routes
from smg_trio.serve.lora_setup import check_static_adapters, register_static_adapters
from smg_trio.serve.progress import StartupProgress
from smg_trio.serve.supervisor import FrontendGroup, _Slots, listening_socket, run_directory
from smg_trio.tokenizer.hub import is_hub_id
from smg_trio.transport.sockdir import default_socket_dir
from smg_trio.transport.tcp import TcpOptions
from smg_trio.worker.confine import WorkerConfinement, hf_hub_cache, is_loopback_host
from smg_trio.worker.manager import WorkerManager, WorkerSpec, WorkerState

__all__ = [
    "DRAIN_FLUSH_S",
    "ENGINE_RESTART_LIMIT",
    "EngineLaunchConfig",
    "GatewayConfig",
    "ServeHandle",
    "open_gateway",
    "serve",
]

log = logging.getLogger(__name__)

#: After the grace period, how long requests ended with a ``draining`` error get to write it.
DRAIN_FLUSH_S = 2.0
#: A launched engine that exits at runtime is restarted (its worker re-handshakes), at most
#: this many times per window; one more exit fails ``serve`` so that its own supervisor (systemd,
#: Kubernetes) sees it instead of a gateway that stays up with nothing to serve.
ENGINE_RESTART_LIMIT = 5
ENGINE_RESTART_WINDOW_S = 600.0
#: Restart backoff: 1 s, doubling per recent restart, at most this.
ENGINE_RESTART_MAX_DELAY_S = 30.0


@attrs.frozen
class ServeHandle:
    """What ``await nursery.start(serve, config)`` returns: the bound HTTP address, the worker
    manager, the registered startup workers (in ``config`` order), and the discovery-file
    watcher (``None`` without ``config.discovery_file``)."""

    host: str
    port: int
    manager: WorkerManager
    workers: tuple[WorkerState, ...]
    discovery: DiscoveryWatcher | None = None
    #: With ``config.api_server_count > 1``: the frontend processes (``manager`` is then the
    #: supervisor's, client 0 of every engine, and serves no inference itself).
    frontends: FrontendGroup | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    async def drain(self, grace_s: float) -> None:
        """Stop taking requests (readiness 503, new requests 503 ``draining``) and give the
        in-flight ones ``grace_s`` seconds to finish. Those still running then end with a 503
        ``draining`` error (an SSE error event and ``[DONE]`` for streams; their engines get
        ABORT), with up to :data:`DRAIN_FLUSH_S` seconds to write it. Cancel the serve nursery
        afterwards to stop. With frontend processes, each one drains its own requests
        (SIGTERM) and this returns once all of them exited."""
        self.manager.start_draining()
        if self.frontends is not None:
            await self.frontends.drain()
            return
        with trio.move_on_after(grace_s):
            await self.manager.wait_idle()
        failed = self.manager.fail_inflight(
            ApiError(503, "the gateway is shutting down", code="draining")
        )
        if failed:
            log.warning("shutdown grace period over: ended %d request(s) in flight", failed)
            with trio.move_on_after(DRAIN_FLUSH_S):
                await self.manager.wait_idle()


def _http_config(config: GatewayConfig) -> GatewayHttpConfig:
    return GatewayHttpConfig(
        api_key=config.api_key,
        max_n=config.max_n,
        responses_store_size=config.responses_store_size,
        max_sequences_per_request=config.max_sequences_per_request,
        max_tokens_per_request=config.max_tokens_per_request,
        max_concurrent_requests=config.max_concurrent_requests,
        queue_size=config.queue_size,
        queue_timeout_s=config.queue_timeout_s,
        write_timeout_s=config.write_timeout_s,
        enable_http2=config.enable_http2,
        fast_http1=config.fast_http1,
        tool_call_parser=config.tool_call_parser,
        enable_auto_tool_choice=config.enable_auto_tool_choice,
        enable_prompt_tokens_details=config.enable_prompt_tokens_details,
        trust_request_chat_template=config.trust_request_chat_template,
        default_chat_template_kwargs=config.default_chat_template_kwargs,
        response_role=config.response_role,
        enable_log_requests=config.enable_log_requests,
        max_log_len=config.max_log_len,
        allowed_origins=tuple(config.allowed_origins),
        allowed_methods=tuple(config.allowed_methods),
        allowed_headers=tuple(config.allowed_headers),
        allow_credentials=config.allow_credentials,
        structured_outputs_backend=config.structured_outputs_backend,
    )


async def start_tracing(
    config: GatewayConfig, nursery: trio.Nursery, process: str
) -> Tracing | None:
    """``--otlp-traces-endpoint``'s tracer, its export task started in ``nursery`` (``None``
    without the flag). Raises ``TracingUnavailable`` without OpenTelemetry."""
    if config.otlp_traces_endpoint is None:
        return None
    tracing = open_tracing(config.otlp_traces_endpoint, process=process)
    if tracing is not None:
        await nursery.start(tracing.run)
        log.info("tracing: spans go to %s", tracing.endpoint)
    return tracing


def tenant_gate(config: GatewayConfig, shared: SharedLedger | None = None) -> TenantGate | None:
    """The tenants of ``--api-keys-file`` and ``--tenant-api-key`` (read now), or ``None``;
    ``shared``: the frontends' common ledger. Raises ``TenantsError``."""
    table = load_tenants(config.api_keys_file, config.tenant_api_keys)
    return None if table is None else TenantGate(table, shared)


def _confinement(config: GatewayConfig) -> WorkerConfinement:
    """The allow-lists of :class:`GatewayConfig`: what the operator named at startup counts
    as allowed (the socket dir, the ``worker_urls``' directories, the model directories, the
    handshake override's host), plus the ``allowed_*`` settings."""
    eng = config.engines
    socket_dirs = [(eng.socket_dir if eng else None) or default_socket_dir()]
    hosts = list(config.allowed_engine_hosts)
    for url in config.worker_urls:
        path = url.removeprefix("ipc://")
        if url.startswith("ipc://") and path.startswith("/"):
            socket_dirs.append(os.path.dirname(os.path.normpath(path)))
        elif url.startswith("tcp://"):  # a remote-engine worker named at startup
            host = url.removeprefix("tcp://").rpartition(":")[0]
            if host and not is_loopback_host(host):
                hosts.append(host.strip("[]"))
    socket_dirs += config.allowed_socket_dirs
    # an engine's model that is a hub id is no directory: the gateway's snapshot of it is
    # config.model_path, and the hub cache holds it
    engine_dir = eng.model if eng and eng.model and not is_hub_id(eng.model) else None
    models = [p for p in (config.model_path, engine_dir) if p]
    models += (
        config.allowed_model_dirs if config.allowed_model_dirs is not None else [hf_hub_cache()]
    )
    override = config.zmq_handshake_address
    if override and override.startswith("tcp://"):
        host = override.removeprefix("tcp://").rpartition(":")[0]
        if host and not is_loopback_host(host):
            hosts.append(host.strip("[]"))
    return WorkerConfinement(socket_dirs=socket_dirs, model_dirs=models, engine_hosts=hosts)


def _log_admin_access(config: GatewayConfig, admin_key: str | None) -> None:
    if admin_key is not None:
        return
    if config.allow_insecure_admin:
        log.warning(
            "--allow-insecure-admin: anyone who can reach %s may add and remove workers (and "
            "so receive prompts) without a key; use it for single-user development only",
            config.host,
        )
    else:
        log.info(
            "no --admin-api-key or --api-key: POST/DELETE /workers are refused (403); "
            "GET /workers, /workers/jobs and /get_loads are open"
        )


def _with_log_level(launch: EngineLaunch, eng: EngineLaunchConfig) -> EngineLaunch:
    """``--engine-log-level``: the forwarding filter, and vLLM's own level (so that ``debug``
    makes it log debug lines) unless ``VLLM_LOGGING_LEVEL`` is set already."""
    level = logging.getLevelNamesMapping()[eng.engine_log_level.upper()]
    env = dict(launch.env)
    if eng.backend == "vllm" and "VLLM_LOGGING_LEVEL" not in os.environ:
        env["VLLM_LOGGING_LEVEL"] = eng.engine_log_level.upper()
    return attrs.evolve(launch, log_level=level, env=env)


def _launch_plan(config: GatewayConfig) -> list[tuple[str, EngineLaunch]]:
    eng = config.engines
    if eng is None:
        return []
    if eng.model is None:
        raise ValueError("serve needs --model")
    launches = [
        build_engine_command(
            eng.backend,
            eng.model,
            port=eng.worker_base_port + i,
            socket_dir=eng.socket_dir,
            engine_args=eng.engine_args,
            python=eng.python,
            mock_script=eng.mock_script,
        )
        for i in range(eng.dp_size)
    ]
    launches = [_with_log_level(launch, eng) for launch in launches]
    reject_handshake_collisions([launch.worker_url for launch in launches])
    return [(launch.worker_url, launch) for launch in launches]


def _check_mock_script(path: str, model: str) -> None:
    """Compile the mock's script as the mock will (a ``MockScriptError``, a ``ValueError``,
    names the file and the rule), so that a bad one fails before any engine launches."""
    from smg_trio.mock.script import load_script
    from smg_trio.tokenizer import Tokenizer

    load_script(path, Tokenizer.from_dir(model))


@attrs.define
class _EngineRun:
    """The engine process of one launched worker, as its supervisor and watcher share it."""

    scope: trio.CancelScope | None = None  # the current run; cancelling it stops the engine
    alive: bool = False  # the process is running (not yet reaped)
    planned: bool = False  # the current run is being stopped to start a fresh one at once

    def relaunch(self) -> None:
        """Stop the running process so that its supervisor starts a fresh one at once (not
        counted as an exit): an engine handshakes once per process."""
        if self.alive and self.scope is not None:
            self.planned = True
            self.scope.cancel()


async def _supervise_engine(
    launch: EngineLaunch,
    url: str,
    on_exit: Callable[[EngineExited], None],
    registered: set[str],
    run: _EngineRun | None = None,
    force_stop: trio.Event | None = None,
) -> None:
    """Run one launched engine; restart it when it exits after its worker registered (with
    backoff, at most :data:`ENGINE_RESTART_LIMIT` times per window). An exit before
    registration, or one restart too many, raises :class:`EngineExited` and fails serve.
    Cancelling ``run.scope`` (see :func:`_stop_unresponsive_engine`) stops the engine's
    process group, which counts as an exit."""
    name = url.rsplit("/", 1)[-1]
    run = run or _EngineRun()
    restarts: list[float] = []

    def exited(exc: EngineExited) -> None:
        run.alive = False
        on_exit(exc)

    while True:
        try:
            with trio.CancelScope() as scope:
                run.scope, run.alive = scope, True
                await run_engine_process(launch, name=name, on_exit=exited, force_stop=force_stop)
            run.alive = False
            raise EngineExited(name, -1, ["stopped by smg_trio: its engine client died"])
        except EngineExited as exc:
            if run.planned:
                run.planned = False
                log.info("relaunching the engine for %s for its new registration", url)
                continue
            if url not in registered:
                raise
            now = trio.current_time()
            restarts = [t for t in restarts if now - t < ENGINE_RESTART_WINDOW_S]
            if len(restarts) >= ENGINE_RESTART_LIMIT:
                log.error(
                    "engine for %s exited %d times in %.0f s; giving up",
                    url,
                    len(restarts) + 1,
                    ENGINE_RESTART_WINDOW_S,
                )
                raise
            delay = min(2.0 ** len(restarts), ENGINE_RESTART_MAX_DELAY_S)
            restarts.append(now)
            log.error(
                "engine for %s %s; its worker is unhealthy; restarting it in %.0f s",
                url,
                exit_cause(exc.returncode),
                delay,
            )
            await trio.sleep(delay)


async def _follow_launched(manager: WorkerManager, url: str, run: _EngineRun) -> None:
    """For the life of serve, the worker at a launched engine's ``url``: its engine is
    stopped to relaunch it when it stalls (:func:`_stop_unresponsive_engine`), and relaunched
    when a worker is added at ``url`` again after a removal (``DELETE`` then ``POST
    /workers``, a rolling update): the engine handshook with the first registration only, and
    the new one waits for a handshake that only a fresh process sends."""
    current: str | None = None
    watch = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        while True:
            changed = manager.registry.changed
            worker = manager.registry.get_by_url(url)
            if isinstance(worker, WorkerState) and worker.worker_id != current:
                if current is not None:
                    log.info("worker %r was added again; relaunching its engine", url)
                    run.relaunch()
                current = worker.worker_id
                watch.cancel()  # the previous worker's watch
                watch = trio.CancelScope()
                nursery.start_soon(_watch_engine, worker, run, watch)
            await changed.wait()


async def _watch_engine(worker: WorkerState, run: _EngineRun, scope: trio.CancelScope) -> None:
    with scope:
        await _stop_unresponsive_engine(worker, run)


async def _stop_unresponsive_engine(worker: WorkerState, run: _EngineRun) -> None:
    """Stop a launched engine whose client died while its process still runs (silence
    timeout, dead sentinel, a stuck send), so that its supervisor relaunches it: a stalled
    engine never dials in again by itself."""
    while True:
        changed = worker.client_changed
        client = worker.engine_client
        if client is not None:
            engine_run = run.scope  # the process this client talks to
            await client.dead_event.wait()
            if run.alive and run.scope is engine_run and engine_run is not None:
                log.error(
                    "engine for %s is unresponsive (%s); stopping it to relaunch it",
                    worker.spec.url,
                    client.dead_reason,
                )
                engine_run.cancel()
        await changed.wait()


async def serve(
    config: GatewayConfig,
    *,
    force_stop: trio.Event | None = None,
    task_status: trio.TaskStatus[ServeHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the gateway (and, with ``config.engines``, its engines) until cancelled.

    ``await nursery.start(serve, config)`` returns a :class:`ServeHandle` once the HTTP
    listener is bound and every configured worker registered. Cancelling the nursery stops the
    server, cancels every worker's nursery and stops engine process groups (no orphans): each
    gets SIGTERM, then SIGKILL after ``ENGINE_STOP_GRACE_S`` seconds, or at once once
    ``force_stop`` is set (the CLI sets it on a second signal).
    Raises ``EngineExited`` if a launched engine dies before its worker registered, and
    ``SmgError`` if a worker fails to register; ``ValueError`` for a bad plan (a bad
    ``mock_script`` among them) before anything launches.
    """
    plan = _launch_plan(config)
    eng = config.engines
    if eng is not None and eng.mock_script is not None and eng.model is not None:
        await trio.to_thread.run_sync(_check_mock_script, eng.mock_script, eng.model)
    if config.lora_modules:  # before any engine starts: a bad adapter fails fast
        await check_static_adapters(config.lora_modules, _confinement(config))
    with ExitStack() as stack:
        await _serve_in(config, plan, stack, force_stop, task_status)


async def _serve_in(
    config: GatewayConfig,
    plan: list[tuple[str, EngineLaunch]],
    stack: ExitStack,
    force_stop: trio.Event | None,
    task_status: trio.TaskStatus[ServeHandle],
) -> None:
    eng = config.engines
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(
            nursery,
            policy=config.policy,
            cache=cache_aware_config(config),
            ready_timeout_s=config.worker_startup_timeout_s,
            silence_timeout_s=config.engine_silence_timeout_s,
            confinement=_confinement(config),
            max_finished_jobs=config.max_finished_jobs,
            job_ttl_s=config.job_ttl_s,
            worker_wait_timeout_s=config.worker_wait_timeout_s,
            client_count=config.api_server_count + 1 if config.api_server_count > 1 else 1,
            chat_template=config.chat_template,
            chat_template_content_format=config.chat_template_content_format,
            tcp=TcpOptions(
                advertise_host=config.zmq_advertise_host,
                heartbeat_ivl_s=config.zmq_heartbeat_interval_s,
                heartbeat_timeout_s=config.zmq_heartbeat_timeout_s,
                allowed_uids=config.allowed_engine_uids,
            ),
        )
        registered: set[str] = set()
        runs: dict[str, _EngineRun] = {}
        specs: list[WorkerSpec] = []
        runtime = (
            "vllm"
            if eng is not None and eng.backend == "mock"
            else (eng.backend if eng else config.backend)
        )
        model_path = (eng.model if eng else None) or config.model_path
        for url, launch in plan:

            def on_exit(exc: EngineExited, url: str = url) -> None:
                manager.kill_worker_client(url, str(exc))

            runs[url] = _EngineRun()
            nursery.start_soon(
                _supervise_engine, launch, url, on_exit, registered, runs[url], force_stop
            )
            spec = WorkerSpec(
                url=url,
                model_path=model_path,
                model_id=config.served_model_name,
                runtime_type=runtime,
                dp_size=launch.engine_count,
                reasoning_parser=config.reasoning_parser,
                tool_call_parser=config.tool_call_parser,
            )
            manager.launched[url] = spec
            specs.append(spec)
        for url in config.worker_urls:
            specs.append(
                WorkerSpec(
                    url=url,
                    model_path=model_path,
                    model_id=config.served_model_name,
                    runtime_type=config.backend,
                    zmq_handshake_address=(
                        None if url.startswith("tcp://") else config.zmq_handshake_address
                    ),
                    dp_size=config.zmq_engine_count,
                    reasoning_parser=config.reasoning_parser,
                    tool_call_parser=config.tool_call_parser,
                )
            )
        # as in smg, the shared --api-key also gates the control plane unless it has its own key
        admin_key = config.admin_api_key if config.admin_api_key is not None else config.api_key
        _log_admin_access(config, admin_key)
        admin = admin_blueprint(
            manager, admin_api_key=admin_key, allow_insecure=config.allow_insecure_admin
        )
        add_engine_control_routes(admin, manager)
        add_lora_routes(admin, manager, max_lora_rank=config.max_lora_rank)
        run_dir: str | None = None
        if config.api_server_count > 1:
            run_dir = stack.enter_context(
                run_directory((eng.socket_dir if eng else None) or default_socket_dir())
            )
            listen = stack.enter_context(listening_socket(config.host, config.port))
            host, port = listen.getsockname()[:2]
            slots = _Slots(manager)
            control = control_app(manager, admin, slots)
            await nursery.start(
                partial(serve_http, control, bind=f"unix:{os.path.join(run_dir, CONTROL_SOCKET)}")
            )
        else:
            tracing = await start_tracing(config, nursery, "gateway")
            app = create_app(
                manager,
                _http_config(config),
                operations=ADMIN_OPERATIONS,
                tracing=tracing,
                tenants=tenant_gate(config),
            )
            app.register_blueprint(admin)
            binds: list[str] = await nursery.start(serve_http, app, config.host, config.port)
            host, _, port_text = binds[0].removeprefix("http://").rpartition(":")
            host, port = host.strip("[]"), int(port_text)
            log.info("smg_trio listening on http://%s:%d", host, port)
        workers = []
        progress = StartupProgress(
            manager,
            [spec.url for spec in specs],
            launched=list(runs),
            interval_s=config.startup_progress_interval_s,
        )
        nursery.start_soon(progress.run)
        try:
            for spec in specs:
                log.info("registering worker %r", spec.url)
                worker = await manager.register(spec)
                progress.mark_ready(spec.url)
                workers.append(worker)
                registered.add(spec.url)
                if spec.url in runs:
                    nursery.start_soon(_follow_launched, manager, spec.url, runs[spec.url])
        finally:
            progress.finish()
        await register_static_adapters(manager, config.lora_modules, config.max_lora_rank)
        discovery = None
        if config.discovery_file is not None:
            defaults = {
                "model_path": model_path,
                "model_id": config.served_model_name,
                "runtime_type": runtime,
                "dp_size": config.zmq_engine_count,
                "reasoning_parser": config.reasoning_parser,
                "tool_call_parser": config.tool_call_parser,
            }
            discovery = DiscoveryWatcher(manager, config.discovery_file, defaults)
            await nursery.start(discovery.run)
        frontends = None
        if run_dir is not None:
            frontends = FrontendGroup(
                config, config.api_server_count, run_dir, listen, manager.confinement
            )
            frontends.manager = manager
            load = frontends.load
            manager.remote_inflight = lambda w: load.total(slots(w.worker_id))
            await nursery.start(frontends.run)
            log.info(
                "smg_trio listening on http://%s:%d with %d frontend processes",
                host,
                port,
                config.api_server_count,
            )
        task_status.started(ServeHandle(host, port, manager, tuple(workers), discovery, frontends))
        if workers or discovery is not None:
            log.info("gateway ready on http://%s:%d: %d worker(s)", host, port, len(workers))
        else:
            log.info(
                "smg_trio ready with no workers: add them with POST /workers (with an admin key, "
                "or --allow-insecure-admin) or start with --discovery-file; /readiness is 503 "
                "until one is ready"
            )


@asynccontextmanager
async def open_gateway(config: GatewayConfig) -> AsyncIterator[ServeHandle]:
    """``async with open_gateway(config) as handle:`` runs :func:`serve` for the block."""
    async with trio.open_nursery() as nursery:
        handle: ServeHandle = await nursery.start(serve, config)
        try:
            yield handle
        finally:
            nursery.cancel_scope.cancel()
