"""Markers the tests share: which process can run a check.

Triton decides at import whether its kernels run in the interpreter or compile for the GPU, once per
process, so a process on a GPU machine cannot also run kernels on CPU tensors. A check that does runs
under the interpreter only, and says so where it is skipped; its GPU counterpart runs there instead.
"""

from __future__ import annotations

import pytest

import drills.runtime

RUNTIME = drills.runtime.current()


def interpreter_only(reason: str):
    """Skip the check where Triton compiles for the GPU, printing why."""
    return pytest.mark.skipif(not RUNTIME.interpreter, reason=reason)


# The engine's tests that step the course's kernels on CPU tensors.
CPU_KERNELS = interpreter_only(
    "runs the kernels on CPU tensors in Triton's interpreter, which a process compiling for the GPU cannot "
    "also do; the test_on_a_gpu_ checks cover the GPU"
)
