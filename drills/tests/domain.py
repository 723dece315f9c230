"""A kernel's domain, declared once, and the cases drawn from it: every pair of values crossed.

A grader's hand-picked cases each cross one bound (D = 256, PAGE = 1, V strides unlike K's). A kernel
can pass every one of them and still fail where two meet: D = 256 with a page below 16, V's strides
with a GQA group, a zero-length prefix with far-apart rows. A `Domain` names the axes of what a launcher
admits (each a tuple of the values at its boundaries: the smallest and largest admitted, one past each
tile and loop bound of the reference, 0 where a length may be 0, each dtype, each stride pattern), the
rules that tie axes together (Hq a multiple of Hkv, a context that fits its pages), and draws a pairwise
covering set of cases: every pair of values of every two axes meets in at least one case, whenever some
case that keeps the rules holds that pair.

The draw is seeded from the grader's stream (`seeded`), so a default run grades the same cases and
`SEED=1 make test` grades other ones. `Domain.check_each` runs a check on every case and names the
failing case's axis values in the message, so a learner sees which combination broke.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from drills.tests import seeded


@dataclass(frozen=True)
class Rule:
    """A constraint on the axes it names: test(*values in that order) -> bool; why says it in words."""

    axes: tuple[str, ...]
    test: Callable[..., bool]
    why: str = ""


def rule(*axes: str, why: str = ""):
    """Decorator form: `@rule("Hq_Hkv", "D", why=...)` over `def _(g, D): ...` gives a Rule."""

    def make(fn):
        return Rule(tuple(axes), fn, why)

    return make


# A pair of values of two axes: (axis index a, value index i, axis index b, value index j), a < b.
Pair = tuple[int, int, int, int]

_CANDIDATES = 12  # cases grown per pick of the greedy cover
_NODE_LIMIT = 20_000  # a completion search that visits more assignments gives up on that pair


def fmt(value) -> str:
    """A value as a case's description shows it: torch.bfloat16 -> bf16, (8, 2) -> 8x2, [0, 17] -> [0,17]."""
    text = str(value)
    if text.startswith("torch."):
        short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
        return short.get(text[6:], text[6:])
    if isinstance(value, tuple):
        return "x".join(fmt(v) for v in value)
    if isinstance(value, list):
        return "[" + ",".join(fmt(v) for v in value) + "]"
    return text


@dataclass
class Domain:
    """The domain of one public function: axes -> boundary values, rules over them, and scalar limits
    (a tile size, a smallest page) that single cases read by name (domain["min_page"])."""

    axes: dict[str, tuple]
    rules: tuple[Rule, ...] = ()
    limits: dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        self.axes = {name: tuple(values) for name, values in self.axes.items()}
        for name, values in self.axes.items():
            if not values:
                raise ValueError(f"axis {name} has no values")
        for r in self.rules:
            unknown = [a for a in r.axes if a not in self.axes]
            if unknown:
                raise ValueError(f"rule {r.why or r.test} names axes {unknown} that the domain lacks")
        self.rules = tuple(self.rules)

    def __getitem__(self, name: str):
        """An axis's values, or a limit: the single-bound cases draw their sizes here."""
        if name in self.axes:
            return self.axes[name]
        return self.limits[name]

    def without(self, **dropped: Iterable) -> Domain:
        """The same domain with some values left out (a case this machine cannot hold)."""
        axes = {n: tuple(v for v in vs if v not in tuple(dropped.get(n, ()))) for n, vs in self.axes.items()}
        return Domain(axes, self.rules, self.limits)

    # --- Checking an assignment against the rules ---------------------------------------------------

    def admits(self, case: dict) -> bool:
        """Whether every rule whose axes the (partial) case assigns holds."""
        return all(r.test(*(case[a] for a in r.axes)) for r in self.rules if all(a in case for a in r.axes))

    def _admits_indices(self, names, assigned: dict[int, int]) -> bool:
        case = {names[a]: self.axes[names[a]][i] for a, i in assigned.items()}
        return self.admits(case)

    # --- Pairs --------------------------------------------------------------------------------------

    def all_pairs(self) -> set[Pair]:
        names = list(self.axes)
        return {
            (a, i, b, j)
            for a, b in itertools.combinations(range(len(names)), 2)
            for i in range(len(self.axes[names[a]]))
            for j in range(len(self.axes[names[b]]))
        }

    def pairs_of(self, case: dict) -> set[Pair]:
        """The pairs a case covers (case: axis name -> value)."""
        names = list(self.axes)
        index = [self.axes[n].index(case[n]) for n in names]
        return {(a, index[a], b, index[b]) for a, b in itertools.combinations(range(len(names)), 2)}

    def _complete(self, start: dict[int, int], uncovered: set[Pair], rng: random.Random):
        """An assignment of every axis extending `start` that keeps the rules, each value picked to cover
        the most uncovered pairs (ties at random), backtracking when a rule fails; None when none exists."""
        names = list(self.axes)
        if not self._admits_indices(names, start):
            return None
        rest = [a for a in range(len(names)) if a not in start]
        rng.shuffle(rest)
        visited = 0

        def gain(assigned, a, i):
            return sum(
                ((min(a, x), i if a < x else u, max(a, x), u if a < x else i) in uncovered)
                for x, u in assigned.items()
            )

        def search(assigned, k):
            nonlocal visited
            visited += 1
            if visited > _NODE_LIMIT:
                return None
            if k == len(rest):
                return dict(assigned)
            a = rest[k]
            order = list(range(len(self.axes[names[a]])))
            rng.shuffle(order)
            order.sort(key=lambda i: -gain(assigned, a, i))
            for i in order:
                assigned[a] = i
                if self._admits_indices(names, assigned):
                    found = search(assigned, k + 1)
                    if found is not None:
                        return found
                del assigned[a]
            return None

        return search(dict(start), 0)

    def cases(self, stream: int) -> list[dict]:
        """A pairwise covering list of cases (axis name -> value), deterministic for a stream and SEED.

        Every pair of values of two axes that some rule-keeping case holds is in at least one case; a
        pair no such case holds (D = 16 with a rule that D = 16 comes only with MHA, say) is left out."""
        rng = random.Random(seeded(stream))
        names = list(self.axes)
        uncovered = self.all_pairs()
        out = []
        while uncovered:
            # A few candidates, each grown from an uncovered pair; the one covering the most new pairs is
            # kept (a greedy cover: far fewer cases than the product, near the largest two axes' product).
            best, best_gain = None, 0
            for pair in rng.sample(sorted(uncovered), min(_CANDIDATES, len(uncovered))):
                a, i, b, j = pair
                found = self._complete({a: i, b: j}, uncovered, rng)
                if found is None:
                    uncovered.discard(pair)  # no case keeping the rules holds it
                    continue
                case = {names[x]: self.axes[names[x]][found[x]] for x in range(len(names))}
                gain = len(self.pairs_of(case) & uncovered)
                if gain > best_gain:
                    best, best_gain = case, gain
            if best is not None:
                out.append(best)
                uncovered -= self.pairs_of(best)
        return out

    # --- Running a check on every case --------------------------------------------------------------

    def describe(self, case: dict) -> str:
        return ", ".join(f"{name}={fmt(case[name])}" for name in self.axes if name in case)

    def check_each(self, cases: list[dict], check: Callable[[dict], object]) -> None:
        """check(case) on every case, in order; the first failure names the case's axis values (an
        AssertionError keeps its message after them; any other error gets them as a note)."""
        for n, case in enumerate(cases, 1):
            where = f"generated case {n} of {len(cases)} ({self.describe(case)})"
            try:
                check(case)
            except AssertionError as e:
                raise AssertionError(f"{where}: {e}") from None
            except Exception as e:
                e.add_note(f"in the {where}")
                raise


def checks_besides(namespace: dict, name: str) -> tuple[str, ...]:
    """Every check of a grader's module (its globals()) but `name`: the `passes` of the Mistake naming a
    failure that only a generated combination shows, so that it is named only when each bound, crossed
    alone by its own check, holds."""
    return tuple(n for n, f in namespace.items() if n.startswith("test_") and callable(f) and n != name)
