"""Which checks can see a mutant: the grader's side of coverage-guided mutant grading (`make mutants`).

A check that executes none of the lines a mutant changed runs exactly the reference's code, so its
verdict is the reference's. The reference is graded once with line coverage on (the learner's process
traces the graded file, kernel lines included: Triton's interpreter runs a kernel's code under its
file's name and line numbers), and the map "check -> reference lines it executed" is cached under
`.drills/coverage/`, keyed by the content of the reference, its grader and the harness. A mutant is then
graded with the checks that cannot see it left out and recorded with the reference's outcome; the
diagnosis reads the whole pattern as if they had run.

It stays exact by falling back to every check:
- when a mutant changes a line outside every function (module level), or a `def` or decorator line:
  what runs at import, or a signature's defaults, reaches every check;
- when a changed line is not inside a statement the trace can see (a new statement is taken to sit
  between the statements around it, and a check that ran either of those runs it);
- when a selected check times out or the learner's process crashes (the caller grades again in full);
- on a GPU, where a compiled kernel's lines never run in Python (coverage is only recorded under the
  interpreter).
The source check is not a check here: it runs when the file is loaded, before any check.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
from pathlib import Path

from drills.lessons import ROOT, Lesson

CACHE_DIR = ROOT / ".drills" / "coverage"
EVERY_CHECK = None  # changed_lines' answer when every check must run


def harness_files() -> list[Path]:
    """What a grading's verdicts depend on besides the reference and its grader."""
    # Every folder of the harness (grader/, learner/, shared/), and what the learner's process loads
    # beside it: a stub's loader and the interpreter's front end.
    loaded = [ROOT / "drills" / name for name in ("stubs.py", "frontend_cache.py")]
    return (
        sorted((ROOT / "drills" / "grading").rglob("*.py"))
        + loaded
        + sorted((ROOT / "drills" / "tests").glob("*.py"))
    )


def cache_key(lesson: Lesson) -> str:
    digest = hashlib.sha256()
    for path in [lesson.solution, lesson.tests, *harness_files()]:
        digest.update(str(Path(path).relative_to(ROOT)).encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def cache_path(lesson: Lesson) -> Path:
    return CACHE_DIR / f"{lesson.stem}-{cache_key(lesson)}.json"


def load_coverage(lesson: Lesson) -> dict | None:
    path = cache_path(lesson)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "cases" in data and "order" in data else None


def save_coverage(lesson: Lesson, data: dict) -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    for old in CACHE_DIR.glob(f"{lesson.stem}-*.json"):  # one map per lesson: the current one
        old.unlink(missing_ok=True)
    tmp = cache_path(lesson).with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(cache_path(lesson))


# --- What a mutant changed, in the reference's line numbers ----------------------------------------


def _statements(tree: ast.AST) -> list[tuple[ast.stmt, tuple | None]]:
    """Every statement with the chain of its enclosing function and class definitions (None at module
    level, or the innermost function's node)."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                found.append((child, function))
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            visit(child, inner)

    visit(tree, None)
    return found


def _header_end(stmt: ast.stmt) -> int:
    """The last line of a statement's own code: a compound statement's header ends before its body."""
    bodies = [getattr(stmt, name, None) for name in ("body", "orelse", "finalbody", "handlers", "cases")]
    starts = [b[0].lineno for b in bodies if isinstance(b, list) and b and hasattr(b[0], "lineno")]
    if starts:
        return min(starts) - 1
    return stmt.end_lineno or stmt.lineno


def changed_lines(reference: str, mutated: str) -> list[tuple[int, int]] | None:
    """The line ranges of the reference whose execution a check needs to see the mutant: one range per
    statement the mutant touched ((first line, last line) of that statement's own code). EVERY_CHECK
    (None) when the change reaches code outside functions, a def or decorator line, or cannot be placed."""
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return EVERY_CHECK
    old, new = reference.splitlines(), mutated.splitlines()
    touched: set[int] = set()
    for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i1 == i2:  # lines inserted between reference lines i1 and i1 + 1 (1-based)
            touched.update(n for n in (i1, i1 + 1) if 1 <= n <= len(old))
        else:
            touched.update(range(i1 + 1, i2 + 1))
    if not touched:
        return []
    statements = _statements(tree)
    ranges: set[tuple[int, int]] = set()
    for line in sorted(touched):
        text = old[line - 1].strip()
        if not text or text.startswith("#"):
            continue  # a blank line or a comment runs nothing
        inner = None  # the innermost statement whose own code holds this line
        for stmt, function in statements:
            if stmt.lineno <= line <= _header_end(stmt):
                if inner is None or stmt.lineno >= inner[0].lineno:
                    inner = (stmt, function)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                d.lineno <= line <= (d.end_lineno or d.lineno) for d in stmt.decorator_list
            ):
                return EVERY_CHECK  # a decorator
        if inner is None:
            return EVERY_CHECK  # inside a multi-line expression the statements do not place
        stmt, function = inner
        if function is None or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return EVERY_CHECK  # module level, or a def line (its defaults run at import)
        ranges.add((stmt.lineno, _header_end(stmt)))
    return sorted(ranges)


def sees(lines: list[int] | set[int], ranges: list[tuple[int, int]]) -> bool:
    """Whether a check that executed `lines` ran a statement in one of the ranges."""
    return any(lo <= n <= hi for n in lines for lo, hi in ranges)


def assumed(coverage: dict, ranges: list[tuple[int, int]] | None) -> list[dict]:
    """The reference's cases that cannot see the change: [{id, check, outcome, message}], in the
    grader's order. Empty when every check must run."""
    if ranges is None:
        return []
    out = []
    for case_id in coverage["order"]:
        case = coverage["cases"].get(case_id)
        if case is None or not case.get("lines"):
            continue  # a check that ran nothing of the file is run: it may read the file some other way
        if case["outcome"] not in ("passed", "skipped"):
            continue
        if not sees(case["lines"], ranges):
            out.append({k: case[k] for k in ("id", "check", "outcome", "message")})
    return out
