"""Python's cyclic garbage collector, kept out of the engine's loop and out of CUDA-graph capture.

    paused()   a context: the collector off inside it, back on after as it was

The step loop makes objects, not cycles, so reference counting frees them; but the collector scans every
object alive, the engine's included, and one full collection took 118 ms on the H200's host (measured on
the C1 traffic, 2026-12-03), a third of the run it fell into. Serving engines keep it out of their loops
too: vLLM freezes the heap after warm-up (vllm/utils/gc_utils.py, freeze_gc_heap). During a capture a
collection is worse than slow: a dead cycle that holds CUDA memory, pinned memory or events frees them
mid-capture, and the capture fails (graphs.py collects once, then captures with the collector paused).
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
