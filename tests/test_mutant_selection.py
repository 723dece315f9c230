"""make mutants' coverage-guided selection (drills/grading/grader/selection.py, drills/mutants/grade.py):
which statements a mutant changed, which checks can see them, and the comparison with a full grading that
must catch a selection that changed a verdict."""

from __future__ import annotations

import json
import textwrap

import pytest

from drills.grading.grader import pytest_run, selection
from drills.lessons import find
from drills.mutants import Mutant
from drills.mutants.grade import disagreement, grade_selected

SOURCE = textwrap.dedent(
    '''\
    import math

    LIMIT = 4


    def helper(x, scale=2):
        """Doc."""
        if x > LIMIT:
            return x * scale
        total = sum(
            v for v in range(x)
        )
        return total


    @staticmethod
    def decorated():
        return 1
    '''
)


def line_of(text: str, source: str = SOURCE) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if text in line)


def test_a_changed_condition_is_placed_on_its_statement():
    mutated = SOURCE.replace("if x > LIMIT:", "if x >= LIMIT:")
    n = line_of("if x > LIMIT:")
    assert selection.changed_lines(SOURCE, mutated) == [(n, n)]


def test_a_change_inside_a_multiline_statement_covers_the_whole_statement():
    # A trace reports the line of whichever part of a statement runs: every line of it counts.
    mutated = SOURCE.replace("v for v in range(x)", "v for v in range(x + 1)")
    first = line_of("total = sum(")
    last = first + 2  # the closing parenthesis
    assert selection.changed_lines(SOURCE, mutated) == [(first, last)]


def test_an_inserted_statement_is_placed_between_its_neighbours():
    mutated = SOURCE.replace("    return total\n", "    total += 1\n    return total\n")
    ranges = selection.changed_lines(SOURCE, mutated)
    assert ranges and all(lo >= line_of("total = sum(") for lo, _ in ranges)
    assert selection.sees([line_of("return total")], ranges)


@pytest.mark.parametrize(
    "old, new",
    [
        ("LIMIT = 4", "LIMIT = 5"),  # module level: runs at import, before any check
        ("def helper(x, scale=2):", "def helper(x, scale=3):"),  # a default is evaluated at import
        ("@staticmethod", "@classmethod"),  # a decorator
    ],
)
def test_changes_that_run_at_import_select_every_check(old, new):
    assert selection.changed_lines(SOURCE, SOURCE.replace(old, new)) is selection.EVERY_CHECK


def test_only_checks_that_never_ran_the_changed_statement_are_assumed():
    coverage = {
        "order": ["a", "b", "c", "d"],
        "cases": {
            "a": {"id": "a", "check": "a", "outcome": "passed", "message": "", "lines": [8, 9]},
            "b": {"id": "b", "check": "b", "outcome": "passed", "message": "", "lines": [10, 13]},
            "c": {"id": "c", "check": "c", "outcome": "passed", "message": "", "lines": []},  # ran nothing
            "d": {"id": "d", "check": "d", "outcome": "passed", "message": "", "lines": None},  # unknown
        },
    }
    assert [c["id"] for c in selection.assumed(coverage, [(9, 9)])] == ["b"]
    assert selection.assumed(coverage, selection.EVERY_CHECK) == []


@pytest.fixture(scope="module")
def t1_coverage(tmp_path_factory):
    """T1's reference graded once with its lines traced, as make mutants does."""
    out = tmp_path_factory.mktemp("coverage") / "t1.json"
    result = pytest_run.grade(find("t1"), impl="solutions", extra=[f"--drills-coverage={out}"])
    assert result.passed, result.screen()
    return json.loads(out.read_text())


def test_a_control_flow_mutant_keeps_the_checks_that_reach_it(t1_coverage, tmp_path):
    """The mask dropped from the store: every check that ran the store is still run, and among them the
    one that fails on it."""
    lesson = find("t1")
    reference = lesson.solution.read_text()
    mutant = Mutant("store_unmasked", "1. the store unmasked", "x + y, mask=mask)", "x + y)")
    mutated = mutant.apply(reference)
    ranges = selection.changed_lines(reference, mutated)
    store = line_of("tl.store(out_ptr + offs", reference)
    assert ranges == [(store, store)]
    left_out = {c["id"] for c in selection.assumed(t1_coverage, ranges)}
    ran_store = {i for i, c in t1_coverage["cases"].items() if c["lines"] and store in c["lines"]}
    assert ran_store and not (ran_store & left_out)
    assert any(i.split("[")[0] == "test_last_block_is_masked" for i in ran_store)


def test_the_full_run_catches_a_planted_unsound_selection(t1_coverage, tmp_path):
    """A plan that leaves out the very check that kills the mutant: the selected run passes where the
    full one fails, and the comparison make mutants makes says so. The honest plan agrees."""
    lesson = find("t1")
    reference = lesson.solution.read_text()
    mutated = Mutant("mask_off", "5. mask off by one", "mask = offs < n", "mask = offs <= n").apply(reference)
    path = tmp_path / "honest" / f"{lesson.stem}.py"
    path.parent.mkdir()
    path.write_text(mutated)

    class Done:  # grade_selected takes the coverage as a future
        def result(self):
            return t1_coverage

    honest, ran, unsound = grade_selected(lesson, path, mutated, None, Done(), tmp_path, compare=True)
    assert honest.state == "failing" and ran is not None and unsound is None

    whole = pytest_run.grade(lesson, file=path)
    # Every check assumed to pass but one that refuses bad input: nothing that sees the mutant runs.
    every = [
        {k: c[k] for k in ("id", "check", "outcome", "message")}
        for c in t1_coverage["cases"].values()
        if c["check"] != "test_launcher_rejects_bad_input"
    ]
    plan = tmp_path / "unsound.json"
    plan.write_text(json.dumps(every))
    planted = pytest_run.grade(lesson, file=path, extra=[f"--drills-assume={plan}"])
    assert planted.state == "passing"
    assert disagreement(planted, whole) is not None
