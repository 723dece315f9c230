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


def explainer_pitfalls(explainer_text: str) -> list[int]:
    """Numbers of the pitfalls listed as `N. **...**` in the explainer's pitfalls section."""
    import re

    section = re.search(r"^## \d+\. Pitfalls.*?(?=^## |\Z)", explainer_text, re.M | re.S)
    if section is None:
        return []
    return [int(n) for n in re.findall(r"^(\d+)\. \*\*", section.group(0), re.M)]


def pitfall_mismatches(stem: str, explainer_text: str) -> list[str]:
    """Where the explainer's pitfall list and the lesson's mutants disagree: a pitfall with no mutant,
    or a mutant naming no listed pitfall (`N. ...`, or another lesson's `L2 pitfall N: ...`)."""
    import re

    listed = explainer_pitfalls(explainer_text)
    mutants = load_mutants(stem)
    covered = set()
    problems = []
    for m in mutants:
        own = re.match(r"(\d+)\. ", m.pitfall)
        if own and int(own.group(1)) in listed:
            covered.add(int(own.group(1)))
        elif not re.match(r"[A-Z]\d+ pitfall \d+", m.pitfall):
            problems.append(f"mutant {m.name} names no pitfall of the explainer: {m.pitfall!r}")
    problems += [f"pitfall {n} of the explainer has no mutant" for n in listed if n not in covered]
    if mutants and not listed:
        problems.append("the explainer has no numbered pitfalls section")
    return problems
