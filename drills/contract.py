"""The stub contract: drills/mine/<stem>.py exposes the solution's public names with the same
signatures and docstrings; until the learner starts, its public functions raise NotImplementedError
with one line naming the file to edit and the explainer to read; and every top-level definition of
the stub that holds no TODO (a launcher, an input check, a config) is the solution's own code, so a
retuned `num_warps` in the solution cannot leave the stub launching the old configuration."""

from __future__ import annotations

import ast
import copy
import difflib
import importlib
import importlib.util
import inspect
import subprocess
import sys
import tempfile
import tokenize
from io import StringIO
from pathlib import Path
from types import ModuleType

from drills.lessons import ROOT, Lesson


def is_kernel(obj) -> bool:
    return hasattr(obj, "fn")  # @triton.jit (or the interpreter's wrapper) keeps the Python function in .fn


def public_api(module: ModuleType) -> dict[str, object]:
    """Functions, classes and Triton kernels defined in the module whose names do not start with _."""
    api = {}
    for name, obj in vars(module).items():
        fn = obj.fn if is_kernel(obj) else obj
        if name.startswith("_") or not (inspect.isfunction(fn) or inspect.isclass(fn)):
            continue
        if fn.__module__ == module.__name__:
            api[name] = obj
    return api


def _python(obj):
    return obj.fn if is_kernel(obj) else obj


def _probe_args(obj) -> list:
    sig = inspect.signature(obj)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    return [
        None
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def not_started_message(module: ModuleType) -> str | None:
    """The stub's one-line message if calling a public function raises NotImplementedError, else None.

    Calling with None for every argument is safe: an untouched stub raises before touching them, and a
    started one rejects None in its validation.
    """
    for name, obj in public_api(module).items():
        if is_kernel(obj):
            continue  # kernels are filled in, not called
        try:
            obj(*_probe_args(obj))
        except NotImplementedError as exc:
            return str(exc) or f"{name} raises NotImplementedError"
        except Exception:
            continue  # a given class (C1's Sequence) rejects None: the raise may be in a later name
    return None


def deleted_a_stub_raise(path: str | Path, lesson: Lesson) -> bool:
    """Whether the file holds fewer of the stub's not-started raises than the stub: such a file is
    started even though some function still raises NotImplementedError (a staged lesson is begun
    where its first stage is: F1's merge_states, with plan()'s raise still in place)."""
    stub_file = f"drills/mine/{lesson.stem}.py"

    def count(source: str) -> int:
        return sum(_is_not_started_raise(n, stub_file) for n in ast.walk(ast.parse(source)))

    try:
        stub = pristine_stub_source(lesson)
        return stub is not None and count(Path(path).read_text()) < count(stub)
    except (OSError, SyntaxError, ValueError):
        return False


def load_from_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit looks the module up while decorating
    spec.loader.exec_module(module)
    return module


def pristine_stub_source(lesson: Lesson, committed_only: bool = False) -> str | None:
    """The stub as committed (git HEAD), so a learner's edits do not break `make check`; the working
    file when this is not a git checkout or the stub is not committed yet, or None then when
    committed_only (`make reset` must not take the learner's own file for the stub)."""
    rel = lesson.stub.relative_to(ROOT).as_posix()
    try:
        return subprocess.run(
            ["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None if committed_only else lesson.stub.read_text()


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


def _is_not_started_raise(node: ast.stmt, stub_file: str) -> bool:
    """`raise NotImplementedError("... drills/mine/<stem>.py ...")`: the line the learner deletes first."""
    exc = node.exc if isinstance(node, ast.Raise) else None
    return (
        isinstance(exc, ast.Call)
        and isinstance(exc.func, ast.Name)
        and exc.func.id == "NotImplementedError"
        and any(
            isinstance(a, ast.Constant) and isinstance(a.value, str) and stub_file in a.value
            for a in exc.args
        )
    )


class _DropNotStarted(ast.NodeTransformer):
    def __init__(self, stub_file: str):
        self.stub_file = stub_file

    def generic_visit(self, node):
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            kept = [s for s in body if not _is_not_started_raise(s, self.stub_file)]
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


def check(lesson: Lesson, stub_file: Path | None = None, solution_file: Path | None = None) -> list[str]:
    """Problems with the lesson's stub against its solution; an empty list means the contract holds.

    The stub is the committed one (pristine_stub_source), or stub_file; the solution is
    drills/solutions/<stem>.py, or solution_file (tests check copies without touching either)."""
    problems = []
    if solution_file is None:
        solution = importlib.import_module(lesson.module("solutions"))
        solution_source = lesson.solution.read_text()
    else:
        solution = load_from_file(solution_file, f"drills.solutions._contract_{lesson.stem}")
        solution_source = solution_file.read_text()
    stub_source = stub_file.read_text() if stub_file is not None else pristine_stub_source(lesson)
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
    return problems
