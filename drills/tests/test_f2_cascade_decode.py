"""Grader for F2, Cascade attention: a shared prefix read once. Each test is named for the mistake it catches.

Run: make test L=f2 (your drills/mine) or make test L=f2 IMPL=solutions. The scaffold's checks
grade its placeholder (out = 2 * x): replace them with the lesson's (CONTRIBUTING.md, "The grader").
"""

from __future__ import annotations

import pytest
import torch

from drills.compare import assert_close
from drills.grading.diagnose import Mistake
from drills.grading.launches import assert_runs_a_triton_kernel
from drills.tests import seeded, sizes

DIMS = ("i",)


def make_x(n, dtype, device, stream):
    gen = torch.Generator().manual_seed(seeded(stream))
    return torch.randn(n, generator=gen).to(dtype).to(device)  # [n]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_last_block_is_masked(impl, runtime, dtype):
    """n one past a multiple of the launcher's BLOCK = 1024: the last program's block holds one element,
    which must be written, and nothing past it."""
    n = sizes(runtime, 1025, (1 << 20) + 1)
    x = make_x(n, dtype, runtime.device, stream=1)
    assert_close(impl.cascade_decode(x), 2 * x.float(), DIMS)


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: cascade_decode must compute them with your Triton kernel, not with torch."""
    x = make_x(100, torch.float32, runtime.device, stream=2)
    assert_runs_a_triton_kernel(impl, lambda: impl.cascade_decode(x), "cascade_decode")


# --- Stages (optional): a steep lesson's checks in the order its stub's TODOs are filled in ----------
# A module-level STAGES, a list of drills.grading.report.Stage (CONTRIBUTING.md, "Stages"); none yet.

# --- Diagnosis: which pitfall of drills/content/f2_cascade_decode.md a pattern of results points to ---------
# One Mistake per way a pitfall shows (the rules: drills/grading/diagnose.py's docstring); make contract
# checks that every titled pitfall has one and that each names a pitfall the explainer lists.

MISTAKES: list[Mistake] = []
