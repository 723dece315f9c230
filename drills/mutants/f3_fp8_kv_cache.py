"""F3 mutants: the classic mistakes of drills/content/f3_fp8_kv_cache.md's pitfalls, as edits of the
reference (the rules: drills/mutants/__init__.py). At least one per titled pitfall, its `pitfall`
starting with that pitfall's number, e.g.
Mutant("mask_dropped", "1. no mask on the last block", "mask = offs < n  # [BLOCK]", "mask = offs >= 0")."""

from drills.mutants import Mutant

MUTANTS: list[Mutant] = []
