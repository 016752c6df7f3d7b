"""settle_heap: a serving process's collector settings (in a child: the test process keeps its own)."""

from __future__ import annotations

import subprocess
import sys


def test_settle_heap_freezes_startup_and_sets_the_thresholds() -> None:
    code = (
        "import gc\n"
        "from smg_trio.serve.heap import GC_THRESHOLDS, settle_heap\n"
        "before = gc.get_threshold()\n"
        "settle_heap()\n"
        "print(before, gc.get_threshold(), gc.get_freeze_count() > 1000, GC_THRESHOLDS)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split(") ")
    assert out[0] == "(700, 10, 10"
    assert out[1] == "(50000, 10, 10"
    assert out[2] == "True (50000, 10, 10)\n"
