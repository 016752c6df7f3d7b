"""Running the gateway under trio: signals drain, then stop; the ready line."""

from __future__ import annotations

import logging
import os
import signal
from functools import partial
from typing import Any

import trio

log = logging.getLogger("smg_trio")


#: After a second SIGINT/SIGTERM, how long serve may take to return before the process exits.
FORCED_EXIT_AFTER_S = 15.0


async def _run_gateway(config: Any) -> None:
    from smg_trio.serve import ServeHandle, serve
    from smg_trio.serve.heap import settle_heap

    handle: ServeHandle | None = None
    force_stop = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # The signal watcher outlives serve's own stop (engines get up to 10 s to exit), so a
        # second signal is still heard while engines stop.
        async with trio.open_nursery() as watcher:
            async with trio.open_nursery() as nursery:

                async def drain_then_stop(drain_scope: trio.CancelScope) -> None:
                    with drain_scope:
                        if handle is not None:
                            await handle.drain(config.shutdown_grace_period_s)
                    nursery.cancel_scope.cancel()

                async def on_signal() -> None:
                    # Watched from the start: a signal during a slow engine startup stops at
                    # once. The first SIGINT/SIGTERM drains; another one stops now: it skips
                    # what is left of the drain and SIGKILLs the engines without their grace.
                    drain_scope: trio.CancelScope | None = None
                    async for signum in signals:
                        name = signal.Signals(signum).name
                        if drain_scope is None:
                            log.info("received %s: draining (send it again to stop now)", name)
                            drain_scope = trio.CancelScope()
                            nursery.start_soon(drain_then_stop, drain_scope)
                        elif not force_stop.is_set():
                            log.info("received %s again: stopping now", name)
                            drain_scope.cancel()
                            force_stop.set()
                            watcher.start_soon(exit_if_stuck)

                async def exit_if_stuck() -> None:
                    # The last resort of a second signal: the engines are SIGKILLed at once,
                    # so serve returns within moments; if something still holds it (a
                    # connection the server cannot close), the process exits anyway.
                    await trio.sleep(FORCED_EXIT_AFTER_S)
                    log.error(
                        "still stopping %g s after the second signal; exiting now",
                        FORCED_EXIT_AFTER_S,
                    )
                    logging.shutdown()
                    os._exit(1)

                watcher.start_soon(on_signal)
                handle = await nursery.start(partial(serve, config, force_stop=force_stop))
                # Everything built at startup lives as long as the process: frozen, a full
                # collection scans only what requests create. Measured under the abort storm
                # (bench/abort_storm.py): unfrozen, full collections of 25-110 ms stalled the
                # event loop and with it every ABORT of their round.
                settle_heap()
                models = ", ".join(m.model_id for m in handle.manager.list_models())
                print(f"smg_trio ready on {handle.base_url} (models: {models or 'none yet'})",
                      flush=True)  # fmt: skip
            watcher.cancel_scope.cancel()  # serve has stopped
