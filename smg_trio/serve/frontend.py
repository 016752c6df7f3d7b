"""One frontend process of ``serve --api-server-count N`` (``python -m smg_trio.serve.frontend
RUN_DIR INDEX``): the HTTP gateway on the supervisor's listening socket, as engine client
INDEX of the workers in the supervisor's table."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import attrs
import httpx
import trio
from quart_trio import QuartTrio

from smg_trio.gateway.http.app import create_app, gateway_of, serve_http
from smg_trio.gateway.http.tenants import SharedLedger
from smg_trio.logfmt import setup_logging
from smg_trio.serve.admin_schema import ADMIN_OPERATIONS
from smg_trio.serve.config import GatewayConfig, cache_aware_config
from smg_trio.serve.control import (
    CONTROL_SOCKET,
    FRONTEND_BEATS,
    FRONTEND_READY,
    RESPONSES_STORE,
    TENANTS,
    ControlClient,
    admin_proxy_blueprint,
)
from smg_trio.serve.heap import settle_heap
from smg_trio.serve.metrics_merge import merge_expositions
from smg_trio.worker.attached import FrontendManager
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.shared_load import SharedLoad

__all__ = [
    "FRONTEND_READY",
    "LOCAL_METRICS_PATH",
    "frontend_socket",
    "load_config",
    "load_confinement",
    "main",
    "run_frontend",
]

log = logging.getLogger(__name__)

#: This process's own exposition, on its unix socket (``/metrics`` merges every frontend's).
LOCAL_METRICS_PATH = "/_smg/metrics"
#: How long ``/metrics`` waits for another frontend's exposition before leaving it out.
PEER_METRICS_TIMEOUT_S = 2.0


def frontend_socket(run_dir: str, index: int) -> str:
    """The unix socket of frontend ``index`` (its local metrics)."""
    return os.path.join(run_dir, f"frontend-{index}.sock")


def load_confinement(run_dir: str) -> WorkerConfinement | None:
    """The supervisor's allow-lists, as it wrote them (``None``: derive them from the config)."""
    raw = json.loads(Path(run_dir, "config.json").read_text()).get("confinement")
    if raw is None:
        return None
    return WorkerConfinement(
        socket_dirs=tuple(raw["socket_dirs"]),
        model_dirs=tuple(raw["model_dirs"]),
        engine_hosts=tuple(raw["engine_hosts"]),
    )


def load_config(run_dir: str) -> tuple[GatewayConfig, int, int]:
    """The gateway config, frontend count and listening descriptor the supervisor wrote."""
    raw = json.loads(Path(run_dir, "config.json").read_text())
    fields = {a.name: a for a in attrs.fields(GatewayConfig)}
    kwargs: dict[str, Any] = {}
    for name, value in raw["config"].items():
        if name not in fields or name == "engines":
            continue
        kwargs[name] = tuple(value) if isinstance(value, list) else value
    return GatewayConfig(**kwargs), int(raw["count"]), int(raw["listen_fd"])


class _FrontendAsgi:
    """The frontend's ASGI app: ``GET /metrics`` merges every frontend's exposition;
    ``GET /_smg/metrics`` is this process's own, on its private unix socket only (``local``;
    on the public port it is an unknown route); the rest is the gateway app."""

    def __init__(self, app: Any, run_dir: str, index: int, count: int, *, local: bool) -> None:
        self.app = app
        self._paths = ("/metrics", LOCAL_METRICS_PATH) if local else ("/metrics",)
        self.extensions = app.extensions  # serve_http reads the gateway's config from it
        self._run_dir = run_dir
        self._index = index
        self._count = count

    async def _peer(self, index: int, out: list[str]) -> None:
        path = frontend_socket(self._run_dir, index)
        with trio.move_on_after(PEER_METRICS_TIMEOUT_S):
            try:
                transport = httpx.AsyncHTTPTransport(uds=path)
                async with httpx.AsyncClient(transport=transport, timeout=None) as client:
                    resp = await client.get(f"http://frontend{LOCAL_METRICS_PATH}")
                if resp.status_code == 200:
                    out.append(resp.text)
            except httpx.HTTPError as exc:
                log.debug("frontend %d's metrics not read: %s", index, exc)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path not in self._paths or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        body, content_type = gateway_of(self.app).metrics.render()
        if path == "/metrics":
            texts = [body.decode()]
            async with trio.open_nursery() as nursery:
                for i in range(1, self._count + 1):
                    if i != self._index:
                        nursery.start_soon(self._peer, i, texts)
            body = merge_expositions(texts)
        headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _watch_lifeline() -> None:
    """stdin is a pipe only the supervisor holds: end of file means it is gone (even by
    SIGKILL), and this frontend exits at once (it owns no other process). Not
    ``PR_SET_PDEATHSIG``: it fires when the spawning *thread* exits, and trio spawns from a
    worker thread that ends when idle."""
    while True:
        await trio.lowlevel.wait_readable(0)
        if not os.read(0, 4096):
            log.error("the supervisor is gone; exiting")
            logging.shutdown()
            os._exit(1)


async def _beat(fd: int, interval: float) -> None:
    """A byte to the supervisor's heartbeat pipe each ``interval`` while this event loop
    runs: a loop that stops running (blocked, SIGSTOPped) goes silent, and the supervisor
    kills and restarts this frontend (``--frontend-stall-timeout-secs``)."""
    async with trio.lowlevel.FdStream(fd) as beats:
        while True:
            try:
                await beats.send_all(b".")
            except trio.BrokenResourceError:
                return  # the supervisor stopped listening (it is shutting down)
            await trio.sleep(interval)


async def _sync_table(manager: FrontendManager, control: ControlClient, first: trio.Event) -> None:
    etag = ""
    while True:
        try:
            with trio.fail_after(30):
                table, etag = await control.table(etag)
        except (httpx.HTTPError, trio.TooSlowError) as exc:
            log.warning("worker table not read from the supervisor: %s", exc)
            await trio.sleep(0.5)
            continue
        manager.apply(table)
        first.set()


async def run_frontend(
    config: GatewayConfig, run_dir: str, index: int, count: int, fd: int, beats: int | None = None
) -> None:
    """Serve as frontend ``index`` (1..``count``) until SIGTERM/SIGINT (drain, then stop);
    ``beats``: the supervisor's heartbeat pipe, if it watches for a stall."""
    from smg_trio.gateway.openai.errors import ApiError
    from smg_trio.serve import (
        DRAIN_FLUSH_S,
        _confinement,
        _http_config,
        start_tracing,
        tenant_gate,
    )

    shared = SharedLoad(os.path.join(run_dir, "load"), count, index - 1)
    control = ControlClient(os.path.join(run_dir, CONTROL_SOCKET))
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_lifeline)
            if beats is not None:
                interval = config.frontend_stall_timeout_s / FRONTEND_BEATS
                nursery.start_soon(_beat, beats, interval)
            manager = FrontendManager(
                nursery,
                client_index=index,
                client_count=count + 1,
                shared=shared,
                report_unresponsive=control.report_unresponsive,
                policy=config.policy,
                cache=cache_aware_config(config),
                ready_timeout_s=config.worker_startup_timeout_s,
                silence_timeout_s=config.engine_silence_timeout_s,
                confinement=load_confinement(run_dir) or _confinement(config),
                worker_wait_timeout_s=config.worker_wait_timeout_s,
                chat_template=config.chat_template,
                chat_template_content_format=config.chat_template_content_format,
            )
            # one Responses store for every frontend: a response stored here is found there
            http_config = attrs.evolve(
                _http_config(config),
                responses_store_path=os.path.join(run_dir, RESPONSES_STORE),
            )
            tracing = await start_tracing(config, nursery, f"frontend-{index}")
            # the tenants' limits hold for every frontend together: one ledger in the run dir
            tenants = tenant_gate(
                config, SharedLedger(os.path.join(run_dir, TENANTS), count, index - 1)
            )
            app = create_app(
                manager, http_config, operations=ADMIN_OPERATIONS, tracing=tracing, tenants=tenants
            )
            app.register_blueprint(admin_proxy_blueprint(control))
            # serve_http takes any ASGI app that carries the gateway's extensions
            asgi = cast(QuartTrio, _FrontendAsgi(app, run_dir, index, count, local=False))
            local = cast(QuartTrio, _FrontendAsgi(app, run_dir, index, count, local=True))
            first = trio.Event()
            nursery.start_soon(_sync_table, manager, control, first)
            await first.wait()
            with trio.fail_after(max(60.0, config.worker_startup_timeout_s)):
                await manager.wait_attached()
            await nursery.start(partial(serve_http, asgi, bind=f"fd://{fd}"))
            await nursery.start(
                partial(serve_http, local, bind=f"unix:{frontend_socket(run_dir, index)}")
            )
            settle_heap()  # this process serves and nothing else
            sys.stdout.write(f"{FRONTEND_READY} {index} pid {os.getpid()}\n")
            sys.stdout.flush()
            async for _ in signals:
                break
            log.info("frontend %d draining", index)
            manager.start_draining()
            with trio.move_on_after(config.shutdown_grace_period_s):
                await manager.wait_idle()
            failed = manager.fail_inflight(
                ApiError(503, "the gateway is shutting down", code="draining")
            )
            if failed:
                log.warning("frontend %d: ended %d request(s) in flight", index, failed)
                with trio.move_on_after(DRAIN_FLUSH_S):
                    await manager.wait_idle()
            nursery.cancel_scope.cancel()
    with trio.CancelScope(shield=True):
        await control.aclose()
    shared.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m smg_trio.serve.frontend RUN_DIR INDEX [HEARTBEAT_FD]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3):
        sys.stderr.write("usage: python -m smg_trio.serve.frontend RUN_DIR INDEX [HEARTBEAT_FD]\n")
        return 2
    run_dir, index = args[0], int(args[1])
    beats = int(args[2]) if len(args) == 3 else None
    setup_logging(
        os.environ.get("SMG_TRIO_FRONTEND_LOG_LEVEL", "INFO"),
        os.environ.get("SMG_TRIO_FRONTEND_LOG_FORMAT", "text"),
        text_format=f"%(asctime)s %(levelname)s frontend-{index} %(name)s: %(message)s",
        fields={"frontend": index},
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per control call
    config, count, fd = load_config(run_dir)
    trio.run(run_frontend, config, run_dir, index, count, fd, beats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
