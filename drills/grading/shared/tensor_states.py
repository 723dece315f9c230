"""Comparing two states of a call's tensors, on both sides of the process boundary: the learner's
process compares a call's run with its programs visited in reverse against the first run (a write race,
learner/run_call.py), and the grader's process compares the launch-disabled and poisoned runs that come
back as provenance evidence (grader/provenance.py). One definition of "differ" for both.
"""

from __future__ import annotations


def differs(a, b) -> bool:
    """Two results differ (NaN equal to NaN; float noise below 1e-3 ignored, as atomics may reorder)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if a.is_floating_point():
        return not torch.isclose(a.float(), b.float(), rtol=1e-3, atol=1e-3, equal_nan=True).all().item()
    return not torch.equal(a, b)


def count_diff(a, b) -> int:
    import torch

    if a.is_floating_point():
        return int((~torch.isclose(a.float(), b.float(), rtol=1e-3, atol=1e-3, equal_nan=True)).sum())
    return int((a != b).sum())


def compare_states(before: list, after: list, names: list, results_a: list, results_b: list) -> str | None:
    """Where the second state differs from the first (None: nowhere). before/after: the arguments'
    storages as typed tensors, in the same order, named by names; results: the returned tensors."""
    for name, x, y in zip(names, before, after):
        if differs(x, y):
            return f"argument `{name}`: {count_diff(x, y)} elements differ"
    if len(results_a) != len(results_b):
        return f"the call returned {len(results_b)} tensors instead of {len(results_a)}"
    for i, (x, y) in enumerate(zip(results_a, results_b)):
        if differs(x, y):
            return f"the returned tensor #{i}: {count_diff(x, y)} elements differ"
    return None
