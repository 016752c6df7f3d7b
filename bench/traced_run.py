"""Run ``python -m MODULE ARGS`` under ``tracemalloc``; SIGUSR1 writes a snapshot.

For ``bench/abort_storm.py --tracemalloc DIR``: the gateway runs as
``python bench/traced_run.py DIR smg_trio launch ...``; each SIGUSR1 dumps
``DIR/snap-<pid>-<n>.pickle`` (frames: ``SMG_BENCH_TRACEMALLOC_FRAMES``, default 25; 0: no
tracemalloc) after a ``gc.collect()``, so the soak can diff the snapshots of two rounds by
traceback; without tracemalloc, SIGUSR1 writes a census of the cyclic garbage instead
(``DIR/garbage-<pid>-<n>.txt``). Every garbage collection of generation 1 or 2 is logged to ``DIR/gc-<pid>.log``
(``time.time()`` at its end, generation, milliseconds, objects collected).
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import runpy
import signal
import sys
import time
import tracemalloc
from pathlib import Path
from types import FrameType


def census(path: Path) -> None:
    """Collect with ``DEBUG_SAVEALL`` and write how many cyclic-garbage objects of each type
    there were (the cycles that only a full collection frees), most first."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    gc.set_debug(0)
    counts = collections.Counter(type(o).__qualname__ for o in gc.garbage)
    frames = collections.Counter(
        f"{o.f_code.co_filename}:{o.f_code.co_name}" for o in gc.garbage if isinstance(o, FrameType)
    )
    gc.garbage.clear()
    with path.open("w") as f:
        f.write(f"{sum(counts.values())} objects\n")
        f.writelines(f"{n:8d} {name}\n" for name, n in counts.most_common(40))
        f.write("frames:\n")
        f.writelines(f"{n:8d} {name}\n" for name, n in frames.most_common(40))


def main() -> None:
    out = Path(sys.argv[1])
    module = sys.argv[2]
    frames = int(os.environ.get("SMG_BENCH_TRACEMALLOC_FRAMES", "25"))
    if frames:
        tracemalloc.start(frames)
    counter = itertools.count()
    gc_log = open(out / f"gc-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] >= 1:
            ms = (time.perf_counter() - started[0]) * 1000
            gc_log.write(f"{time.time():.6f} {info['generation']} {ms:.2f} {info['collected']}\n")

    gc.callbacks.append(on_gc)

    def dump(signum: int, frame: FrameType | None) -> None:
        if not tracemalloc.is_tracing():
            census(out / f"garbage-{os.getpid()}-{next(counter):03d}.txt")
            return
        gc.collect()
        snap = tracemalloc.take_snapshot()
        snap.dump(str(out / f"snap-{os.getpid()}-{next(counter):03d}.pickle"))

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
