"""Tests of two maintainer tools: the stub contract (drills/contract.py), with its rule that a stub's
definitions without a TODO are the solution's code and its check that each grader's BOUNDS name a case
crossing every constexpr of its reference's kernels; and the mutation engine, which finds a mutant's
`old` in the solution as code, so that reformatting a solution keeps every mutant applying
(drills/mutants/__init__.py). Not a lesson's grader: it runs in `make check`, on copies in temporary
folders; the real stubs and solutions are only read."""

from __future__ import annotations

import ast
import importlib
import io
import re
import subprocess
import tokenize
import types

import pytest

from drills import contract
from drills.lessons import LESSONS, ROOT, find
from drills.mutants import Mutant, MutantError, load_mutants, mutate, titled_pitfalls

L2 = find("l2")
STUB_FILE = "drills/mine/x.py"  # what the not-started raise of the synthetic stubs below names


def committed(path) -> str:
    """The file as committed (a stub and its solution are kept in step at each commit), or the working
    file outside a git checkout."""
    rel = path.relative_to(ROOT).as_posix()
    proc = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else path.read_text()


def committed_pair(lesson, tmp_path, stub_source=None):
    """The committed stub (or stub_source) and solution of the lesson, written under tmp_path."""
    (tmp_path / "mine").mkdir(parents=True, exist_ok=True)
    (tmp_path / "solutions").mkdir(parents=True, exist_ok=True)
    stub, solution = tmp_path / "mine" / f"{lesson.stem}.py", tmp_path / "solutions" / f"{lesson.stem}.py"
    stub.write_text(stub_source if stub_source is not None else committed(lesson.stub))
    solution.write_text(committed(lesson.solution))
    return stub, solution


# --- The stub contract: definitions without a TODO are the solution's code ------------------------------


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.id)
def test_untouched_stub_keeps_the_contract(lesson, tmp_path):
    stub, solution = committed_pair(lesson, tmp_path)
    assert contract.check(lesson, stub_file=stub, solution_file=solution) == []


def test_retuned_num_warps_in_the_launcher_breaks_the_contract(tmp_path):
    source = committed(L2.stub)
    launch = re.search(r"^def _launch\(.*?(?=^def )", source, re.M | re.S).group(0)
    warps = re.search(r"warps = (\d+)", launch)  # L2 picks its warps from the page tile's size
    assert warps, "L2's _launch no longer picks its warps: pick another value for this test to change"
    drifted = source.replace(launch, launch.replace(warps.group(0), f"warps = {2 * int(warps.group(1))}", 1))
    before = contract.check(L2, *committed_pair(L2, tmp_path / "untouched"))
    after = contract.check(L2, *committed_pair(L2, tmp_path / "drifted", drifted))
    new = [p for p in after if p not in before]
    assert len(new) == 1 and new[0].startswith("_launch ") and "warps" in new[0], after


def test_kernel_holding_todos_may_differ_from_the_solution(tmp_path):
    source = committed(L2.stub)
    kernel = re.search(r"^@triton\.jit\ndef paged_decode_kernel\(.*?(?=^def )", source, re.M | re.S).group(0)
    assert "# TODO" in kernel
    started = source.replace(kernel, kernel.replace("    pass\n", "    b = tl.program_id(0)\n"))
    assert started != source
    stub, solution = committed_pair(L2, tmp_path, started)
    assert contract.check(L2, stub_file=stub, solution_file=solution) == []


def test_formatting_and_comments_may_differ_but_code_may_not():
    solution = "def f(a, b):\n    return a + b\n\n\nBLOCK = 128\n"
    assert (
        contract.drifted_definitions(
            "def f(a,b):  # why\n    return (a+b)\n\n\nBLOCK = 128\n", solution, STUB_FILE
        )
        == []
    )
    problems = contract.drifted_definitions(
        "def f(a, b):\n    return a - b\n\n\nBLOCK = 64\n", solution, STUB_FILE
    )
    assert [p.split(" ")[0] for p in problems] == ["f", "BLOCK"], problems
    assert "'return a - b'" in problems[0] and "'return a + b'" in problems[0]


def test_docstring_of_a_private_helper_must_match():
    problems = contract.drifted_definitions(
        'def _f():\n    """Old."""\n    return 1\n', 'def _f():\n    """New."""\n    return 1\n', STUB_FILE
    )
    assert problems == ["_f: stub docstring differs from the solution's"]


def test_not_started_raise_is_left_out_and_a_trailing_todo_exempts():
    solution = "def f(x):\n    return x\n\n\ndef g(x):\n    return 2 * x\n"
    stub = (
        "def f(x):\n    raise NotImplementedError('x is not started: edit drills/mine/x.py')\n    return x\n\n\n"
        "def g(x):\n    raise NotImplementedError('x is not started: edit drills/mine/x.py')\n"
        "    # TODO: return twice x.\n"
    )
    assert contract.drifted_definitions(stub, solution, STUB_FILE) == []
    other = stub.replace("    return x\n", "    return -x\n")
    assert [p.split(" ")[0] for p in contract.drifted_definitions(other, solution, STUB_FILE)] == ["f"]


def test_class_holding_a_todo_is_compared_method_by_method():
    solution = "class C:\n    def a(self):\n        return 1\n\n    def b(self):\n        return 2\n"
    stub = (
        "class C:\n    def a(self):\n        pass  # TODO: return 1\n\n    def b(self):\n        return 3\n"
    )
    assert [p.split(" ")[0] for p in contract.drifted_definitions(stub, solution, STUB_FILE)] == ["C.b"]


# --- Bounds: every constexpr of a reference's kernels is crossed by a case its grader names ------------


def _grader_of(lesson, **overrides):
    """The lesson's grader as a namespace (its BOUNDS, BOUNDS_GAPS and test functions), with overrides."""
    grader = importlib.import_module(f"drills.tests.{lesson.tests.stem}")
    return types.SimpleNamespace(**{**vars(grader), **overrides})


def test_new_constexpr_without_a_bounds_entry_is_reported():
    source = committed(L2.solution)
    assert "    GUARD: tl.constexpr," in source, (
        "L2's kernel no longer has GUARD: plant the new one elsewhere"
    )
    assert contract.bounds_problems(L2, source) == []
    planted = source.replace(
        "    GUARD: tl.constexpr,", "    GUARD: tl.constexpr,\n    SPLIT: tl.constexpr,", 1
    )
    problems = contract.bounds_problems(L2, planted)
    assert len(problems) == 1 and "SPLIT" in problems[0] and "paged_decode_kernel" in problems[0], problems
    # Listed as a gap, it is still reported unless the reason says it bounds nothing.
    gaps = {**_grader_of(L2).BOUNDS_GAPS, "SPLIT": "a case with several splits is still to write"}
    assert len(contract.bounds_problems(L2, planted, _grader_of(L2, BOUNDS_GAPS=gaps))) == 1
    gaps["SPLIT"] = "no bound: a switch the launcher fixes"
    assert contract.bounds_problems(L2, planted, _grader_of(L2, BOUNDS_GAPS=gaps)) == []


def test_bounds_naming_a_missing_test_is_reported():
    bounds = dict(_grader_of(L2).BOUNDS)
    bounds["PAGE"] = (*bounds["PAGE"], "test_pages_that_no_one_wrote")
    problems = contract.bounds_problems(L2, committed(L2.solution), _grader_of(L2, BOUNDS=bounds))
    assert len(problems) == 1 and "test_pages_that_no_one_wrote" in problems[0], problems
    del bounds["grid"]
    problems = contract.bounds_problems(L2, committed(L2.solution), _grader_of(L2, BOUNDS=bounds))
    assert any('"grid"' in p for p in problems), problems


# --- The mutation engine: old is found as code ------------------------------------------------------


def _fstring_depths(tokens):
    """For each token, whether it lies inside an f-string (Python 3.12 splits f-strings into tokens)."""
    start, end = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
    depth, inside = 0, []
    for tok in tokens:
        if tok.type == start:
            depth += 1
        inside.append(depth > 0)
        if tok.type == end:
            depth -= 1
    return inside


def _insert(source: str, inserts: list[tuple[tuple[int, int], str]]) -> str:
    """source with each text inserted at its (row, col), rows counted from 1."""
    lines = source.splitlines(keepends=True)
    for (row, col), text in sorted(inserts, reverse=True):
        lines[row - 1] = lines[row - 1][:col] + text + lines[row - 1][col:]
    return "".join(lines)


def spaced(source: str) -> str:
    """One more space after every operator and bracket: `f(a, b=1)` becomes `f( a,  b= 1)`."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    inserts = [
        (tok.end, " ")
        for tok, in_f in zip(tokens, _fstring_depths(tokens))
        if tok.type == tokenize.OP and not in_f
    ]
    return _insert(source, inserts)


def wrapped_with_comments(source: str) -> str:
    """Every bracketed list broken after each `(` and `,`, with a comment at the end of each piece: a
    re-wrapped line with comments inside every mutant's span that has brackets."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    inserts, depth = [], 0
    for n, (tok, in_f) in enumerate(zip(tokens, _fstring_depths(tokens))):
        if tok.type != tokenize.OP or in_f:
            continue
        if tok.string in "([{":
            depth += 1
        elif tok.string in ")]}":
            depth -= 1
        following = tokens[n + 1]
        if (
            depth > 0
            and tok.string in ("(", ",")
            and following.start[0] == tok.end[0]
            and following.type not in (tokenize.NL, tokenize.COMMENT)
        ):
            inserts.append((tok.end, "  # reformatted\n" + " " * 12))
    return _insert(source, inserts)


def reindented(source: str) -> str:
    """Every line's indentation doubled, except the lines inside a multi-line string."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    inside_strings = {
        row
        for tok in tokens
        if tok.type == tokenize.STRING
        for row in range(tok.start[0] + 1, tok.end[0] + 1)
    }
    lines = source.splitlines(keepends=True)
    for n, line in enumerate(lines, start=1):
        if n not in inside_strings:
            lines[n - 1] = line[: len(line) - len(line.lstrip(" "))] + line
    return "".join(lines)


def dump(source: str) -> str:
    return ast.dump(ast.parse(source))


MUTANTS = [(lesson, m) for lesson in LESSONS for m in load_mutants(lesson.stem)]


@pytest.mark.parametrize("reformat", [spaced, wrapped_with_comments, reindented], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "lesson", [lesson for lesson in LESSONS if load_mutants(lesson.stem)], ids=lambda lesson: lesson.id
)
def test_every_mutant_applies_to_a_reformatted_solution(lesson, reformat):
    source = lesson.solution.read_text()
    reformatted = reformat(source)
    assert reformatted != source and dump(reformatted) == dump(source)
    for m in load_mutants(lesson.stem):
        # Mutating the reformatted solution is the same code as reformatting the mutated one.
        assert dump(m.apply(reformatted)) == dump(reformat(m.apply(source))), m.name


@pytest.mark.parametrize("lesson, mutant", MUTANTS, ids=[f"{lesson.id}-{m.name}" for lesson, m in MUTANTS])
def test_engine_gives_the_plain_replacement_on_todays_solution(lesson, mutant):
    source = lesson.solution.read_text()
    if source.count(mutant.old) != 1:
        pytest.skip(f"{mutant.name}: its old text is not once in the solution as text (only as code)")
    assert mutant.apply(source) == source.replace(mutant.old, mutant.new)


def test_mutate_gives_every_mutant_of_a_lesson_its_source():
    results = mutate("t2")
    assert [r.mutant for r in results] == load_mutants("t2_softmax")
    assert all(r.problem is None and r.source != find("t2").solution.read_text() for r in results)


SOURCE = """def f(a, b):
    x = foo(a, b)  # why
    y = foo(a, "s")
    return x + y
"""


def test_old_that_occurs_twice_raises_with_the_mutant_name():
    with pytest.raises(MutantError, match=r"mutant twice_here: .* 2 times"):
        Mutant("twice_here", "1. x", "foo(a,", "bar(a,").apply(SOURCE)


def test_old_that_never_occurs_raises_with_the_mutant_name():
    with pytest.raises(MutantError, match=r"mutant nowhere: .* 0 times"):
        Mutant("nowhere", "1. x", "foo(b, a)", "bar(b, a)").apply(SOURCE)


def test_comment_and_line_break_inside_the_match_are_replaced():
    source = SOURCE.replace("foo(a, b)", "foo(a,  # first\n            b)")
    out = Mutant("m", "1. x", "x = foo(a, b)", "x = bar(a, b)").apply(source)
    assert "x = bar(a, b)  # why\n" in out and "# first" not in out


def test_other_quotes_and_a_trailing_comma_still_match():
    source = SOURCE.replace('foo(a, "s")', "foo(a, 's',)")
    assert "y = bar(a)\n" in Mutant("m", "1. x", 'y = foo(a, "s")', "y = bar(a)").apply(source)


def test_whole_line_old_matches_a_statement_and_follows_its_indentation():
    m = Mutant("m", "1. x", '    y = foo(a, "s")\n', "    if a:\n        y = 0\n")
    out = m.apply(reindented(SOURCE))
    assert "        if a:\n            y = 0\n" in out
    assert dump(out) == dump(reindented(m.apply(SOURCE)))
    with pytest.raises(MutantError, match="0 times"):  # not a statement there: `return y` is not `y`
        Mutant("m", "1. x", "    y\n", "    0\n").apply(SOURCE)


def test_repeated_trailing_comment_keeps_the_solutions_comment():
    source = SOURCE.replace("# why", "# why it is")
    out = Mutant("m", "1. x", "x = foo(a, b)  # why", "x = bar(a, b)  # why").apply(source)
    assert "x = bar(a, b)  # why it is\n" in out


def test_pitfalls_without_a_title_need_no_mutant():
    text = (
        "## 5. Pitfalls and self-test\n\n1. **One.** Caught by `test_a`.\n2. **Two.** Caught by `test_b`.\n"
        "3. L2's pitfalls carry over.\n\nAnswers: 1) 1.\n"
    )
    assert titled_pitfalls(text) == [1, 2]
