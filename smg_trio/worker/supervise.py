"""A worker's connection supervisor: it owns the worker's handshake ROUTER for the worker's
whole life, serves each engine client until the engine dies, then re-binds the data plane
and waits for the restarted engine to dial in again."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from smg_trio.connector.client import open_engine_client
from smg_trio.connector.tasks import learn_tasks
from smg_trio.errors import EngineError
from smg_trio.protocol.types import EngineProtocol
from smg_trio.transport.topology import HandshakeSocket, bind_handshake_socket
from smg_trio.worker.confine import escape
from smg_trio.worker.spec import PROTOCOLS
from smg_trio.worker.state import WorkerState

if TYPE_CHECKING:
    from smg_trio.worker.manager import WorkerManager

__all__ = ["REBIND_BACKOFF_S", "supervise"]

log = logging.getLogger(__name__)

#: Pause between data-plane re-binds after an engine died or a re-handshake failed.
REBIND_BACKOFF_S = 0.5


async def supervise(
    manager: WorkerManager,
    worker: WorkerState,
    *,
    task_status: trio.TaskStatus[Callable[[], Awaitable[None]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Own the worker's handshake ROUTER for the worker's whole life, and its connection.

    Reports (``nursery.start``) once the ROUTER is bound, with the function that makes one
    handshake attempt: it starts :func:`_connect_loop` in this task's nursery and returns
    once the first handshake completed, or raises its error (the registration's
    ``handshake`` step, retried by the workflow). The connection then lives here: it serves
    until the engine dies, marks the worker unhealthy, re-binds the data plane and waits
    for the restarted engine to dial in again.

    The ROUTER is bound once: a restarted engine sends HELLO once, often before the
    gateway has noticed the death (or between two handshake attempts), and a re-bind of
    that socket would lose it (the engine would then wait minutes for an INIT).
    """
    protocol: EngineProtocol = PROTOCOLS[worker.runtime]()
    # A fresh scope per start: a failed bind attempt has used up the previous one.
    worker.scope = scope = trio.CancelScope()
    if worker.status in ("draining", "removed"):
        scope.cancel()
    worker.stopped = stopped = trio.Event()
    try:
        with scope:
            async with (
                bind_handshake_socket(worker.addresses.handshake) as hs,
                trio.open_nursery() as nursery,
            ):

                async def connect() -> None:
                    try:
                        await nursery.start(_connect_loop, manager, worker, protocol, hs)
                    except (EngineError, OSError) as exc:
                        worker.last_error = f"{type(exc).__name__}: {exc}"
                        log.warning("worker %r: %s", worker.spec.url, escape(worker.last_error))
                        raise

                task_status.started(connect)
                if manager.kv_feed is not None and manager.routes_requests:
                    nursery.start_soon(manager.kv_feed.run_worker, worker)
                await trio.sleep_forever()
    finally:
        stopped.set()


async def _connect_loop(
    manager: WorkerManager,
    worker: WorkerState,
    protocol: EngineProtocol,
    handshake: HandshakeSocket,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    connected = False
    while True:
        try:
            async with (
                open_engine_client(
                    protocol,
                    worker.addresses,
                    engine_count=worker.spec.dp_size,
                    ready_timeout_s=manager.ready_timeout_s,
                    silence_timeout_s=manager.silence_timeout_s,
                    handshake=handshake,
                    tcp=manager.tcp if worker.addresses.is_tcp else None,
                ) as client,
                trio.open_nursery() as side,
            ):
                # Learnt beside the registration, never holding it: an engine that does
                # not answer utility calls is taken as generate-only after the bound.
                side.start_soon(
                    learn_tasks, client, manager.timing.tasks_timeout_s, worker.spec.url
                )
                worker.set_client(client)
                worker.last_error = None
                # A fresh handshake proves the engine healthy: failures of the dead
                # engine's requests must not keep the restarted one out for 60 s.
                worker.circuit.reset()
                if worker.status == "unhealthy":
                    worker.status = "ready"
                    log.info("worker %r reconnected", worker.spec.url)
                if not connected:
                    connected = True
                    task_status.started()
                await client.dead_event.wait()
                side.cancel_scope.cancel()
                worker.last_error = str(client.dead_reason)
        except (EngineError, OSError) as exc:
            if not connected:
                raise  # to the registration's handshake attempt
            worker.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("worker %r: %s", worker.spec.url, escape(worker.last_error))
        worker.set_client(None)
        if worker.status == "ready":
            worker.status = "unhealthy"
        await trio.sleep(REBIND_BACKOFF_S)
