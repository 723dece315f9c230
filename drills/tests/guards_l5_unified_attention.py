"""L5's bad device values (drills/tests/guards.py): L4's, with a window, sinks and a split band."""

from __future__ import annotations

import torch

from drills.tests import guards_l4_paged_prefill
from drills.tests.guards import GuardCase


def cases(device) -> list[GuardCase]:
    """L4's cases through unified_attention with a window, sinks and a band split in two (the merge
    must keep an invalid row's zeros and -inf)."""
    from drills.solutions.l5_unified_attention import UnifiedPlan

    sinks = lambda Hq: torch.linspace(-1.0, 2.0, Hq)  # noqa: E731
    return guards_l4_paged_prefill.cases(
        device, "l5_unified_attention", window=6, sinks=sinks, plan=UnifiedPlan(num_splits=2)
    )
