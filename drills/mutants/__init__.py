"""Mutants: small source edits of a reference solution, each reproducing one classic mistake that the
lesson's explainer warns about. `drills/mutants/<stem>.py` declares `MUTANTS`, a list of Mutant; the
lesson's grader must fail every one. Adding a mutant is adding one entry."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, e.g. "interleaved_grouping"
    pitfall: str  # the explainer's pitfall it stands for, in words
    old: str  # exact text in drills/solutions/<stem>.py (must occur exactly once)
    new: str  # what it becomes
    gpu_only: bool = False  # only a GPU run can expose it (e.g. int32 overflow on a > 4 GB cache)

    def apply(self, source: str) -> str:
        count = source.count(self.old)
        if count != 1:
            raise ValueError(f"mutant {self.name}: its text occurs {count} times in the solution, not once")
        return source.replace(self.old, self.new)


def load_mutants(stem: str) -> list[Mutant]:
    """The lesson's declared mutants, or [] when drills/mutants/<stem>.py does not exist."""
    import importlib
    import importlib.util

    name = f"drills.mutants.{stem}"
    if importlib.util.find_spec(name) is None:
        return []
    return list(importlib.import_module(name).MUTANTS)
