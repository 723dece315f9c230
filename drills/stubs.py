"""What a lesson's stub is, and how a lesson's file is loaded: the learner process's loader.

A stub's public functions raise NotImplementedError with one line naming the file to edit and the
explainer to read (`not_started_message` finds it by calling each with None for every argument); a file
that holds fewer of those raises than the committed stub is a learner's work (`deleted_a_stub_raise`).
`load_from_file` imports a file as a module of a given name, as the learner's process (grading/learner/)
and the learner tools do; `pristine_stub_source` is the stub as committed. It imports nothing of the
grader's, the contract's or the mutants'.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
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
    try:
        stub = pristine_stub_source(lesson)
        have = not_started_raises(Path(path).read_text(), lesson)
    except OSError:
        return False
    want = not_started_raises(stub, lesson) if stub is not None else None
    return have is not None and want is not None and have < want


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


def not_started_raises(source: str, lesson: Lesson) -> int | None:
    """How many not-started raises (naming drills/mine/<stem>.py) the source holds; None if it does not parse."""
    stub_file = f"drills/mine/{lesson.stem}.py"
    try:
        return sum(is_not_started_raise(n, stub_file) for n in ast.walk(ast.parse(source)))
    except (SyntaxError, ValueError):
        return None


def is_not_started_raise(node: ast.stmt, stub_file: str) -> bool:
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
