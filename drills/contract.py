"""The stub contract: drills/mine/<stem>.py exposes the solution's public names with the same
signatures and docstrings, and until the learner starts, its public functions raise
NotImplementedError with one line naming the file to edit and the explainer to read."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import subprocess
import sys
import tempfile
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
    return [None for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


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
            return None
    return None


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
        return subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None if committed_only else lesson.stub.read_text()


def check(lesson: Lesson) -> list[str]:
    """Problems with the lesson's stub against its solution; an empty list means the contract holds."""
    problems = []
    solution = importlib.import_module(lesson.module("solutions"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{lesson.stem}.py"
        path.write_text(pristine_stub_source(lesson))
        stub = load_from_file(path, f"drills.mine._pristine_{lesson.stem}")
    want, have = public_api(solution), public_api(stub)
    for name in sorted(set(want) - set(have)):
        problems.append(f"stub lacks public name {name}")
    for name in sorted(set(have) - set(want)):
        problems.append(f"stub has {name}, which the solution does not")
    for name in sorted(set(want) & set(have)):
        w, h = _python(want[name]), _python(have[name])
        if inspect.signature(w) != inspect.signature(h):
            problems.append(f"{name}: stub signature {inspect.signature(h)} != solution {inspect.signature(w)}")
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
    return problems
