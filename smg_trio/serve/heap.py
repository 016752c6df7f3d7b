"""The garbage collector's settings for a process the gateway owns: the CLI's, each frontend's."""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GC_THRESHOLDS", "settle_heap"]

#: ``gc.set_threshold`` for a serving process. The default first-generation threshold (700
#: net allocations) runs a young collection every few requests; with a thousand streams
#: open, the young and middle collections took 9.5% of the gateway's CPU (``perf record`` under
#: ``bench/gateway.py``'s 1000-stream workload) and 2.5% at 50000. Memory is not at stake:
#: objects without cycles are freed by reference counting whatever the threshold; only cyclic
#: garbage waits for the next collection.
GC_THRESHOLDS: Final = (50_000, 10, 10)


def settle_heap() -> None:
    """Call once startup is done, in a process that serves and nothing else (never in an
    embedding program's process: its collector is its own): collect what startup left,
    freeze the rest (tokenizers, templates, the app and the libraries live as long as the
    process, so a full collection need not scan them), and set :data:`GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
