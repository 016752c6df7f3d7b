"""smg_trio's own hypercorn serve loop: hypercorn's trio worker with the fixes, for its servers only.

``hypercorn.trio.serve`` builds hypercorn's ``TCPServer`` (and, through it, ``H11Protocol``)
itself, so a fix could only reach it by patching those classes for every server in the process,
including a host program's own. :func:`serve` is hypercorn 0.18's ``worker_serve``
(``hypercorn/trio/run.py``: lifespan, listeners with the config's backlog, the binds reported,
the shutdown trigger, the graceful timeout) with :class:`GatewayTCPServer`, whose fixes live in
subclasses: :mod:`~smg_trio.gateway.server.hypercorn_close` (the connection close, the
stuck-write sweeps) and :mod:`~smg_trio.gateway.server.hypercorn_errors` (protocol errors in
the OpenAI envelope). :data:`FIXES` lists every fix; :func:`check_fixes` runs before the first
server starts and raises :class:`~smg_trio.gateway.server.fixes.FixTargetMissing` when a name a
fix relies on is gone. hypercorn's classes are never modified.
"""

from __future__ import annotations

import functools
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from random import randint
from typing import Any, Final

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from smg_trio.gateway.server import (
    direct,
    fast_http1,
    faults,
    hypercorn_close,
    hypercorn_errors,
)
from smg_trio.gateway.server.accept import serve_batched
from smg_trio.gateway.server.fast_http1 import FastHttp1
from smg_trio.gateway.server.fixes import Fix
from smg_trio.gateway.server.hypercorn_close import (
    BLOCKED_WRITE_GRACE_S,
    ClosingTCPServer,
    Connections,
)
from smg_trio.gateway.server.hypercorn_errors import EnvelopeProtocolWrapper

__all__ = ["FIXES", "GatewayTCPServer", "check_fixes", "serve"]

log = logging.getLogger(__name__)


class GatewayTCPServer(ClosingTCPServer):
    """The connection of smg_trio's servers: closed under its send lock, tracked for the
    stuck-write sweeps, HTTP/1.1 protocol errors in the OpenAI envelope, and any fault while
    serving it kept in it (:func:`~smg_trio.gateway.server.faults.contain`)."""

    protocol_wrapper = EnvelopeProtocolWrapper

    async def run(self) -> None:
        with faults.connection_scope():
            try:
                await super().run()
            except BaseException as exc:  # its faults end here; Cancelled goes on
                faults.contain("HTTP connection", exc)


#: This loop's own reliance on hypercorn (the pieces of ``worker_serve`` it reuses).
LOOP_FIX: Final = Fix(
    name="smg_trio's serve loop (gateway/server/serve.py)",
    verified={"hypercorn": "0.18"},
    targets=(
        "hypercorn.trio.run:worker_serve",
        "hypercorn.trio.lifespan:Lifespan.handle_lifespan",
        "hypercorn.trio.lifespan:Lifespan.wait_for_startup",
        "hypercorn.trio.lifespan:Lifespan.wait_for_shutdown",
        "hypercorn.trio.worker_context:WorkerContext",
        "hypercorn.trio.statsd:StatsdLogger",
        "hypercorn.config:Config.create_sockets",
        "hypercorn.config:Config.set_statsd_logger_class",
        "hypercorn.utils:raise_shutdown",
        "hypercorn.utils:ShutdownError",
        "hypercorn.utils:repr_socket_addr",
        "hypercorn.utils:wrap_app",
    ),
)

#: Every hypercorn/h11 fix of smg_trio's servers.
FIXES: Final = (LOOP_FIX, hypercorn_close.FIX, hypercorn_errors.FIX, direct.FIX, fast_http1.FIX)


@functools.cache
def check_fixes() -> None:
    """Check every fix's targets (once per process, when it passes); raises
    :class:`~smg_trio.gateway.server.fixes.FixTargetMissing` naming the first one gone."""
    for fix in FIXES:
        fix.check()


async def serve(
    app: Any,
    config: Config,
    *,
    write_timeout_s: float = math.inf,
    fast_http1: bool = True,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` as ``hypercorn.trio.serve(app, config)`` does, on
    :class:`GatewayTCPServer` connections; with ``fast_http1``, plain-TCP connections start
    on the fast path (:mod:`~smg_trio.gateway.server.fast_http1`), which hands any request it
    does not serve, and the rest of its connection, to a :class:`GatewayTCPServer`.

    Reports the bound base URLs through ``task_status``. Runs until cancelled or until
    ``shutdown_trigger()`` returns; in-flight requests then get ``config.graceful_timeout``
    seconds. A write blocked for ``write_timeout_s`` seconds drops its connection. When
    stopping (at once when cancelled, after the graceful timeout when triggered), writes still
    blocked after a short grace are closed, so the server always stops.
    """
    check_fixes()
    if config.quic_bind:
        raise ValueError("smg_trio's server does not serve HTTP/3 (quic_bind)")
    connections = Connections()
    stopping, stopped = trio.Event(), trio.Event()

    async def trigger() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        stopping.set()

    async with trio.open_nursery() as nursery:
        if math.isfinite(write_timeout_s):
            nursery.start_soon(connections.drop_stalled_writes, write_timeout_s)

        async def run_server(task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await _worker_serve(
                    app,
                    config,
                    connections,
                    fast_http1=fast_http1,
                    shutdown_trigger=trigger,
                    task_status=task_status,
                )
            finally:
                stopped.set()
            nursery.cancel_scope.cancel()  # it ended by itself (shutdown_trigger)

        binds: list[str] = await nursery.start(run_server)
        task_status.started(binds)
        try:
            await stopping.wait()  # triggered: in-flight requests get the graceful timeout
            with trio.move_on_after(config.graceful_timeout):
                await stopped.wait()
        finally:
            # Stopping: a write blocked on a client that stopped reading would hold its
            # connection, and so the server, open for as long as that client stays connected.
            # Swept until the server has stopped, not once: a response's last message is sent
            # under a shield, so a write can start (and block) after stopping began.
            stuck = 0
            with trio.CancelScope(shield=True):  # each sweep bounded by BLOCKED_WRITE_GRACE_S
                while not stopped.is_set():
                    stuck += await connections.close_blocked_writes()
                    with trio.move_on_after(BLOCKED_WRITE_GRACE_S):
                        await stopped.wait()
            if stuck:
                log.warning("closed %d connection(s) whose client stopped reading", stuck)


async def _worker_serve(
    app: Any,
    config: Config,
    connections: Connections,
    *,
    fast_http1: bool,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """hypercorn 0.18's ``hypercorn.trio.run.worker_serve`` for TCP listeners, with
    :class:`GatewayTCPServer` connections (plain ones first on the fast path)."""
    raw_app = app
    app = wrap_app(app, config.wsgi_max_body_size, "asgi")
    config.set_statsd_logger_class(StatsdLogger)

    lifespan_state: LifespanState = {}
    lifespan = Lifespan(app, config, lifespan_state)
    max_requests = None
    if config.max_requests is not None:
        max_requests = config.max_requests + randint(0, config.max_requests_jitter)
    context = WorkerContext(max_requests)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()

        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            for sock in (*sockets.secure_sockets, *sockets.insecure_sockets):
                sock.listen(config.backlog)

            listeners: list[trio.SSLListener[trio.SocketStream]] = []
            plain: list[socket.socket] = []  # served by serve_batched
            binds = []
            if sockets.secure_sockets:
                ssl_context = config.create_ssl_context()
                for sock in sockets.secure_sockets:
                    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                    listeners.append(
                        trio.SSLListener(listener, ssl_context, https_compatible=True)  # type: ignore[arg-type]
                    )
                    binds.append(f"https://{repr_socket_addr(sock.family, sock.getsockname())}")
            for sock in sockets.insecure_sockets:
                plain.append(sock)
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            for bind in binds:
                await config.log.info(f"Running on {bind} (CTRL + C to quit)")

            task_status.started(binds)
            fast: FastHttp1 | None = None
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    if shutdown_trigger is not None:
                        nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    handler = partial(
                        GatewayTCPServer,
                        app,
                        config,
                        context,
                        ConnectionState(lifespan_state.copy()),
                        connections=connections,
                    )
                    plain_handler: Callable[[Any], Awaitable[None]] = handler
                    if fast_http1:

                        async def hand_over(stream: Any) -> None:
                            await handler(stream)

                        fast = FastHttp1(
                            raw_app, config, context, lifespan_state, connections, hand_over
                        )
                        plain_handler = fast.serve
                    if listeners:
                        nursery.start_soon(
                            partial(
                                trio.serve_listeners,
                                handler,
                                listeners,
                                handler_nursery=server_nursery,
                            )
                        )
                    if plain:
                        nursery.start_soon(
                            partial(
                                serve_batched, plain_handler, plain, handler_nursery=server_nursery
                            )
                        )
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, other_errors = error.split((ShutdownError, KeyboardInterrupt))
                if other_errors is not None:
                    raise other_errors from None
            finally:
                await context.terminated.set()
                if fast is not None:
                    fast.close_idle()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout

        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
