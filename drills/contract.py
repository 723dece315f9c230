"""The stub contract: drills/mine/<stem>.py exposes the solution's public names with the same
signatures and docstrings; until the learner starts, its public functions raise NotImplementedError
with one line naming the file to edit and the explainer to read; and every top-level definition of
the stub that holds no TODO (a launcher, an input check, a config) is the solution's own code, so a
retuned `num_warps` in the solution cannot leave the stub launching the old configuration.

Loading a file and telling a stub from a learner's work is drills/stubs.py's job (the learner's process
uses it too); the numbering that ties explainer, grader, mutants and stub together is
drills/pitfall_numbering.py's, which `make contract` runs beside this contract.

Which stub is checked (contract_stub): the committed one (git HEAD), unless drills/mine/<stem>.py
differs from it and is still a stub, holding every not-started raise the committed stub holds (the line
`make test` draws between "not started" and begun): then the working file, the stub being edited. A
learner's file stops being a stub when its raise is deleted, so a learner's work never fails
`make contract`; a file not committed yet is read as it is. DRILLS_CONTRACT_STUB=head or =worktree
overrides the rule.

The contract ties each grader's cases to its reference's tiles (bounds_problems): every `tl.constexpr`
parameter of every Triton kernel of drills/solutions/<stem>.py (a tile size, a loop bound, a flag) is a
key of the grader's module-level `BOUNDS`, mapped to the names of the grader's test functions that cross
it (a size one past a tile or a loop bound, the widest admitted value; a flag run both ways), and `BOUNDS`
has "grid" for the test of the grid at the largest sizes. A constexpr that is no bound at all (a switch
the launcher fixes) goes in `BOUNDS_GAPS` with a reason that starts with "no bound:"; any other gap listed
there is reported until a case crosses it. So a new tile size or constexpr in a reference fails
`make contract` until the grader names a case that crosses it.
"""

from __future__ import annotations

import ast
import copy
import difflib
import importlib
import importlib.util
import inspect
import os
import tempfile
import tokenize
from io import StringIO
from pathlib import Path

from drills.lessons import ROOT, Lesson
from drills.stubs import (
    is_kernel,
    is_not_started_raise,
    load_from_file,
    not_started_message,
    not_started_raises,
    pristine_stub_source,
    public_api,
)


def _python(obj):
    return obj.fn if is_kernel(obj) else obj


STUB_ENV = "DRILLS_CONTRACT_STUB"  # "head" or "worktree": which stub the contract reads, overriding the rule


def contract_stub(lesson: Lesson) -> tuple[str, str]:
    """(the stub source the contract checks, where it came from, in words).

    A contributor edits the stub in drills/mine/<stem>.py, where a learner writes their solution, so the
    file alone does not say whose it is. The rule: the committed stub (git HEAD), unless the working file
    differs from it and still holds each of its not-started raises (at least one): `make test` calls such
    a file "not started", so it is the stub being edited, and the contract reads it. A learner's file
    stops being a stub when its raise is deleted (the stub's first instruction), and from then on the
    contract reads the committed stub, so a learner's work never fails `make contract`. A stub not
    committed yet (a new lesson, or no git) is read from the working tree. DRILLS_CONTRACT_STUB=head or
    =worktree overrides the rule."""
    rel = lesson.stub.relative_to(ROOT).as_posix()
    committed = pristine_stub_source(lesson, committed_only=True)
    if committed is None:
        return lesson.stub.read_text(), f"{rel} as in the working tree (not committed yet)"
    forced = os.environ.get(STUB_ENV, "").strip().lower()
    if forced == "head" or not lesson.stub.exists():
        return committed, f"{rel} as committed (git HEAD)"
    working = lesson.stub.read_text()
    if forced == "worktree":
        return working, f"{rel} as in the working tree ({STUB_ENV}=worktree)"
    if working == committed:
        return committed, f"{rel} as committed (git HEAD), the same as the working file"
    have, want = not_started_raises(working, lesson), not_started_raises(committed, lesson) or 0
    if have is not None and have >= max(want, 1):
        return working, (
            f"{rel} as in the working tree: it differs from git HEAD and still holds every not-started raise, "
            f"so it is taken for the stub being edited ({STUB_ENV}=head checks the committed one)"
        )
    return committed, (
        f"{rel} as committed (git HEAD): the working file has begun (a not-started raise deleted, or it does "
        f"not parse), so it is taken for a learner's work ({STUB_ENV}=worktree checks it instead)"
    )


def _todo_comments(source: str) -> list[tuple[int, int]]:
    """(line, column) of each comment that holds a TODO: those parts of the stub are the learner's."""
    return [
        tok.start
        for tok in tokenize.generate_tokens(StringIO(source).readline)
        if tok.type == tokenize.COMMENT and "TODO" in tok.string
    ]


def _defined_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement (or class member) defines: def, class, or assignment."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
    )
    return [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]


def _definitions(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    found = {}
    for node in body:
        for name in _defined_names(node):
            found[name] = node  # the last definition wins, as when Python runs the module
    return found


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _holding_todo(body: list[ast.stmt], todos: list[tuple[int, int]], end: int) -> set[int]:
    """Indices of the statements of body that hold a TODO comment. A comment belongs to a statement
    when it lies between the statement's first line and the next statement's, indented deeper than
    the statement (a TODO after a function's last line, as in `raise ...` then `# TODO ...`, is the
    function's; one at the statement's own indentation before the next def is nobody's)."""
    held = set()
    for i, node in enumerate(body):
        stop = _first_line(body[i + 1]) if i + 1 < len(body) else end
        for line, col in todos:
            inside = _first_line(node) <= line <= node.end_lineno
            trailing = node.end_lineno < line < stop and col > node.col_offset
            if inside or trailing:
                held.add(i)
    return held


class _DropNotStarted(ast.NodeTransformer):
    def __init__(self, stub_file: str):
        self.stub_file = stub_file

    def generic_visit(self, node):
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            kept = [s for s in body if not is_not_started_raise(s, self.stub_file)]
            node.body = kept or [ast.Pass()]
        return node


def _without_docstrings(node: ast.AST) -> ast.AST:
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            n.body = body[1:] or [ast.Pass()]
    return node


def _first_difference(stub: ast.stmt, solution: ast.stmt) -> str:
    """The first line where the two definitions differ as code, for the contract's message."""
    have, want = ast.unparse(stub).splitlines(), ast.unparse(solution).splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=have, b=want, autojunk=False).get_opcodes():
        if tag != "equal":
            stub_line = have[i1].strip() if i1 < i2 else "(nothing)"
            solution_line = want[j1].strip() if j1 < j2 else "(nothing)"
            return f"stub has {stub_line!r} where the solution has {solution_line!r}"
    return "they differ in a way ast.unparse does not show"


def drifted_definitions(stub_source: str, solution_source: str, stub_file: str) -> list[str]:
    """Top-level definitions (def, class, assignment) of the stub that hold no TODO comment, also exist
    in the solution, and differ from it as code: compared with ast.dump, so comments and formatting
    may differ but docstrings may not. The stub's `raise NotImplementedError(...)` naming stub_file
    (drills/mine/<stem>.py) is left out of the comparison. A class that holds a TODO is compared
    member by member (its methods without a TODO must match), header included."""
    todos = _todo_comments(stub_source)
    drop = _DropNotStarted(stub_file)

    def compare(have_body, want_body, end, prefix=""):
        problems = []
        want = _definitions(want_body)
        held = [node for i, node in enumerate(have_body) if i in _holding_todo(have_body, todos, end)]
        for name, node in _definitions(have_body).items():
            if name not in want:
                continue
            theirs = want[name]
            if any(node is h for h in held):
                if isinstance(node, ast.ClassDef) and isinstance(theirs, ast.ClassDef):

                    def header(cls):  # bases, keywords and decorators: the body is compared below
                        return ast.dump(ast.ClassDef(**{**vars(cls), "body": []}))

                    if header(node) != header(theirs):
                        problems.append(
                            f"{prefix}{name}: the stub's class header differs from the solution's"
                        )
                    stop = next((_first_line(n) for n in have_body if _first_line(n) > node.end_lineno), end)
                    problems += compare(node.body, theirs.body, stop, prefix=f"{prefix}{name}.")
                continue
            ours = drop.visit(copy.deepcopy(node))
            if ast.dump(ours) == ast.dump(theirs):
                continue
            if ast.dump(_without_docstrings(ours)) == ast.dump(_without_docstrings(theirs)):
                problems.append(f"{prefix}{name}: stub docstring differs from the solution's")
            else:
                problems.append(
                    f"{prefix}{name} (stub line {_first_line(node)}) holds no TODO, so it must be the "
                    f"solution's code, but it differs: "
                    f"{_first_difference(_without_docstrings(ours), _without_docstrings(theirs))}"
                )
        return problems

    return compare(
        ast.parse(stub_source).body, ast.parse(solution_source).body, len(stub_source.splitlines()) + 1
    )


# --- Bounds: every constexpr of the reference's kernels is crossed by a named case of the grader ---

_KERNEL_DECORATORS = {"jit", "autotune", "heuristics"}  # triton.jit and the wrappers stacked on it
NO_BOUND = "no bound:"  # the start of a BOUNDS_GAPS reason for a constexpr that bounds nothing


def _is_kernel_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node  # @triton.autotune(...) is a call
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
    return name in _KERNEL_DECORATORS


def reference_constexprs(source: str) -> dict[str, list[str]]:
    """{constexpr parameter name: the kernels that declare it} over the source's Triton kernels: functions
    decorated with triton.jit (or triton.autotune / triton.heuristics), parameters whose annotation
    holds `constexpr`."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or not any(
            _is_kernel_decorator(d) for d in node.decorator_list
        ):
            continue
        args = node.args
        for arg in args.posonlyargs + args.args + args.kwonlyargs:
            if arg.annotation is not None and "constexpr" in ast.unparse(arg.annotation):
                found.setdefault(arg.arg, []).append(node.name)
    return found


def _has_kernel(source: str) -> bool:
    return any(
        isinstance(n, ast.FunctionDef) and any(_is_kernel_decorator(d) for d in n.decorator_list)
        for n in ast.walk(ast.parse(source))
    )


def bounds_problems(lesson: Lesson, solution_source: str | None = None, grader=None) -> list[str]:
    """Where the grader's BOUNDS and BOUNDS_GAPS leave a constexpr of the reference's kernels uncrossed,
    or name a test the grader does not have; [] when they agree. solution_source: the reference to read
    (default: its file); grader: the grader module, or any object with its attributes (default:
    drills.tests.test_<stem>), so that a test can plant a constexpr or a name without writing a file."""
    source = lesson.solution.read_text() if solution_source is None else solution_source
    if grader is None:
        try:
            grader = importlib.import_module(f"drills.tests.{lesson.tests.stem}")
        except Exception as exc:  # the grader is checked by make test; here only its tables are read
            return [
                f"{lesson.id}: {lesson.tests.name} does not import, so its BOUNDS cannot be read: {exc!r}"
            ]
    constexprs = reference_constexprs(source)
    if not constexprs and not _has_kernel(source):
        return []  # no Triton kernel (L3, C1): nothing to cross
    name = lesson.tests.name
    bounds = dict(getattr(grader, "BOUNDS", {}))
    gaps = dict(getattr(grader, "BOUNDS_GAPS", {}))
    tests = {n for n, obj in vars(grader).items() if n.startswith("test") and callable(obj)}
    problems = []
    for const, kernels in sorted(constexprs.items()):
        where = f"{lesson.id}: constexpr {const} (of {', '.join(kernels)})"
        if const in bounds:
            continue
        if const not in gaps:
            problems.append(
                f"{where} is in neither BOUNDS nor BOUNDS_GAPS of {name}: add the tests that cross it "
                f"(one past its tile or loop bound, its widest admitted value; a flag both ways) to BOUNDS"
            )
        elif not str(gaps[const]).startswith(NO_BOUND):
            problems.append(
                f"{where}: no case of {name} crosses it ({gaps[const]}): add one and name it in BOUNDS"
            )
    for key, names in sorted(bounds.items()):
        if key != "grid" and key not in constexprs:
            problems.append(
                f"{lesson.id}: BOUNDS of {name} has {key}, which no kernel of "
                f"{lesson.solution.relative_to(ROOT).as_posix()} declares: rename or remove it"
            )
        if isinstance(names, str) or not names:
            problems.append(f"{lesson.id}: BOUNDS[{key!r}] of {name} must be a non-empty tuple of test names")
            continue
        for test in names:
            if test not in tests:
                problems.append(
                    f"{lesson.id}: BOUNDS[{key!r}] of {name} names {test}, which is no test function of it: "
                    f"fix the name"
                )
    for const in sorted(set(gaps) & set(bounds)):
        problems.append(f"{lesson.id}: {const} is in both BOUNDS and BOUNDS_GAPS of {name}: keep one")
    if "grid" not in bounds:
        problems.append(
            f'{lesson.id}: BOUNDS of {name} has no "grid": name the test that checks the grid at the '
            f"largest sizes"
        )
    return problems


PAIRWISE_TEST = "test_pairwise_domain_cases_match_the_oracle"
# Lessons with kernels whose graders do not draw cases from a Domain yet, each with why. The Triton
# basics cross their one size axis with hand-picked cases; the others are to add DOMAIN = Domain(...)
# from the launcher's limits and PAIRWISE_TEST (drills/tests/domain.py; L2's grader is the model).
DOMAIN_PENDING = {
    "t1": "Triton basics: one size axis, crossed by hand-picked cases",
    "t2": "Triton basics: one size axis, crossed by hand-picked cases",
    "t3": "Triton basics: one size axis per dimension, crossed by hand-picked cases",
    # Not drawn from a Domain yet: each is to add DOMAIN and the pairwise check, then leave this set.
}


def domain_problems(lesson: Lesson, solution_source: str | None = None, grader=None) -> list[str]:
    """Where a grader of a lesson with Triton kernels does not declare its DOMAIN as a Domain
    (drills/tests/domain.py) or lacks the check that runs its pairwise cases; [] when it has both."""
    source = lesson.solution.read_text() if solution_source is None else solution_source
    if lesson.id in DOMAIN_PENDING or not _has_kernel(source):
        return []
    if grader is None:
        try:
            grader = importlib.import_module(f"drills.tests.{lesson.tests.stem}")
        except Exception:  # bounds_problems reports a grader that does not import
            return []
    from drills.tests.domain import Domain

    problems = []
    if not isinstance(getattr(grader, "DOMAIN", None), Domain):
        problems.append(
            f"{lesson.id}: {lesson.tests.name} declares no DOMAIN = Domain(...) (drills/tests/domain.py): "
            f"name what the launcher admits, from drills/validate.py's limits"
        )
    if not callable(getattr(grader, PAIRWISE_TEST, None)):
        problems.append(
            f"{lesson.id}: {lesson.tests.name} has no {PAIRWISE_TEST}: run DOMAIN.cases(...) against the "
            f"oracle with DOMAIN.check_each"
        )
    return problems


def check(lesson: Lesson, stub_file: Path | None = None, solution_file: Path | None = None) -> list[str]:
    """Problems with the lesson's stub against its solution; an empty list means the contract holds.

    The stub is the one contract_stub chooses, or stub_file; the solution is drills/solutions/<stem>.py,
    or solution_file (tests check copies without touching either). The grader's BOUNDS and domain are
    checked against the solution (bounds_problems, domain_problems); the pitfall numbering is
    drills/pitfall_numbering.py's. When the contract fails on a stub that contract_stub chose, the last
    problem says which file that was."""
    problems = []
    if solution_file is None:
        solution = importlib.import_module(lesson.module("solutions"))
        solution_source = lesson.solution.read_text()
    else:
        solution = load_from_file(solution_file, f"drills.solutions._contract_{lesson.stem}")
        solution_source = solution_file.read_text()
    if stub_file is not None:
        stub_source, origin = stub_file.read_text(), None
    else:
        stub_source, origin = contract_stub(lesson)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{lesson.stem}.py"
        path.write_text(stub_source)
        stub = load_from_file(path, f"drills.mine._pristine_{lesson.stem}")
    want, have = public_api(solution), public_api(stub)
    for name in sorted(set(want) - set(have)):
        problems.append(f"stub lacks public name {name}")
    for name in sorted(set(have) - set(want)):
        problems.append(f"stub has {name}, which the solution does not")
    for name in sorted(set(want) & set(have)):
        w, h = _python(want[name]), _python(have[name])
        if inspect.signature(w) != inspect.signature(h):
            problems.append(
                f"{name}: stub signature {inspect.signature(h)} != solution {inspect.signature(w)}"
            )
        if inspect.getdoc(w) != inspect.getdoc(h):
            problems.append(f"{name}: stub docstring differs from the solution's")
    message = not_started_message(stub)
    if message is None:
        problems.append("the untouched stub does not raise NotImplementedError")
    else:
        if "\n" in message.strip():
            problems.append("the stub's NotImplementedError message is longer than one line")
        for needle in (f"drills/mine/{lesson.stem}.py", f"drills/content/{lesson.stem}.md"):
            if needle not in message:
                problems.append(f"the stub's NotImplementedError message does not name {needle}")
    for problem in drifted_definitions(stub_source, solution_source, f"drills/mine/{lesson.stem}.py"):
        if problem not in problems:  # a public docstring is reported once, by the check above
            problems.append(problem)
    problems += bounds_problems(lesson, solution_source)
    problems += domain_problems(lesson, solution_source)
    if problems and origin is not None:
        problems.append(f"(the stub checked: {origin})")
    return problems
