"""Drills on the GPU attention kernels behind LLM inference.

Importing the package chooses the runtime (GPU or Triton interpreter) and does nothing else: it has to
happen before any `@triton.jit` in drills.mine / drills.solutions runs, and every lesson module lives
inside this package, so this is the one place that is guaranteed to run first.
"""

from drills.runtime import select as _select_runtime

_select_runtime()
