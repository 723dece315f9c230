"""A static check of the learner's file before it is graded: code that asks where it runs is refused.

A file that tests for the interpreter, TRITON_INTERPRET, the runtime, the environment, the grader's
modules or the call stack can take a different path when graded than when used, so its grade would
mean nothing. So is code that computes out of the grader's sight (numpy on the tensors' memory, torch
with the grader's record of its ops switched off). Such code is refused before any check runs, with the
line and the reason on one screen.

The course's own given code does choose tile sizes by runtime (t3's `_config`, t5's block picker), so a
construct is allowed where the learner's file keeps a definition exactly as the reference has it
(compared as code, as the stub contract compares given code), and nowhere else.
"""

from __future__ import annotations

import ast
from pathlib import Path

# Modules whose import alone says the file looks at its grading or its runtime.
MODULES = (
    "drills.runtime",
    "drills.grading",
    "drills.tests",
    "drills.solutions",
    "drills.mutants",
    "triton.runtime.interpreter",
    "triton.knobs",
    "pytest",
    "_pytest",
    "gc",
    "inspect",
    "faulthandler",
    "traceback",
    # Computing out of the grader's sight: numpy on the tensors' memory, or torch with the grader's op
    # recorder switched off (its dispatch internals); a launcher allocates, views and copies in torch.
    "numpy",
    "torch.utils._python_dispatch",
    "torch._C",
    # Work out of the op recorder's sight: another thread or process computing the answer (the recorder
    # watches the calling thread), or C code reached directly.
    "threading",
    "_thread",
    "concurrent",
    "multiprocessing",
    "subprocess",
    "asyncio",
    "ctypes",
    "signal",
    # Files: a launcher reads and writes tensors, not files; a file that probes what it may open (the
    # references, the repository) can tell that it is graded.
    "pathlib",
    "io",
    "shutil",
    "tempfile",
    "glob",
    "site",
    "sysconfig",
    "importlib",
    "builtins",
    # Other array libraries: they compute out of the recorder's sight
    "cupy",
    "jax",
    "numba",
    "scipy",
    "pandas",
    "tensorflow",
    # The clock and the machine's state: how long a launch took, how many threads run, tell the grader apart
    "time",
    "timeit",
    "resource",
    "platform",
    # The operating system: a launcher needs none of it, and a failed mkdir or open tells the sandbox apart
    "os",
)
# Attribute and function names that read where the code runs, or reach the grader's objects.
NAMES = {
    "interpreter": "asks whether Triton's interpreter runs it",
    "is_interpreter": "asks whether Triton's interpreter runs it",
    "InterpretedFunction": "looks at Triton's interpreter",
    "GridExecutor": "looks at Triton's interpreter",
    "interpreter_builder": "looks at Triton's interpreter",
    "environ": "reads the process environment",
    "getenv": "reads the process environment",
    "environb": "reads the process environment",
    "modules": "reads sys.modules (the grader's modules are there)",
    "argv": "reads the command line the grader started",
    "orig_argv": "reads the command line the grader started",
    "_getframe": "walks the call stack (the grader's frames)",
    "f_back": "walks the call stack (the grader's frames)",
    "f_globals": "reads another module's globals through a frame",
    "getppid": "asks which process started it",
    "addaudithook": "touches the grader's audit hook",
    "grading": "looks for the grader's modules",
    "knobs": "reads Triton's settings (whether it interprets)",
    "find_spec": "looks for a module by name",
    "__wrapped__": "looks behind a function the grader may have wrapped",
    "__closure__": "reads a function's hidden state",
    "__globals__": "reads another module's globals through a function",
    "__builtins__": "reaches the built-ins by another way",
    "__qualname__": "reads a function's qualified name (the grader's wrappers)",
    "__code__": "reads a function's code object (the grader's wrappers)",
    "co_filename": "reads where a function was defined (the grader's wrappers)",
    "__subclasses__": "walks the class tree",
    "numpy": "computes on the host with numpy, out of the grader's sight",
    "__array__": "computes on the host with numpy, out of the grader's sight",
    "_python_dispatch": "switches off the grader's record of torch's ops",
    "_disable_current_modes": "switches off the grader's record of torch's ops",
    "__torch_dispatch__": "switches off the grader's record of torch's ops",
    "_C": "reaches torch's C internals (the grader's record of torch's ops)",
    "multiprocessing": "computes in another process, out of the grader's sight",
    "DataLoader": "computes in worker processes, out of the grader's sight",
    "fork": "computes in another process or thread, out of the grader's sight",
    "Thread": "computes in another thread, out of the grader's sight",
    "ThreadPoolExecutor": "computes in another thread, out of the grader's sight",
    "popen": "starts a program",
    "system": "starts a program",
    "posix_spawn": "starts a program",
    "__file__": "reads where the file lies (to open what lies beside it)",
    "__dict__": "reaches a module's or a class's namespace by another way",
    "__mro__": "walks the class tree",
    "__bases__": "walks the class tree",
    "__base__": "walks the class tree",
    "_get_current_dispatch_mode": "looks for the grader's record of torch's ops",
    "compile": "compiles code the check cannot read (torch.compile generates its own kernels)",
    "elapsed_time": "reads the clock",
    "perf_counter": "reads the clock",
    "get_num_threads": "reads how the process is set up",
    "cpu_count": "reads how the process is set up",
    "sched_getaffinity": "reads how the process is set up",
    "getpid": "reads how the process is set up",
    "read_text": "reads a file",
    "read_bytes": "reads a file",
    "write_text": "writes a file",
    "write_bytes": "writes a file",
    "listdir": "lists a folder",
    "scandir": "lists a folder",
    "exists": "asks whether a file exists",
}
# Tensor tests a launcher never needs, and the way to look at fresh memory, which is poisoned while graded
# (math.isfinite on a Python number, to check an argument, is fine).
FRESH = {"isnan", "isinf", "isfinite", "isneginf", "isposinf", "nan_to_num"}
# Built-in functions that reach files or the interpreter's state directly.
CALLS = {
    "open": "opens a file",
    "breakpoint": "starts a debugger",
    "input": "reads the terminal",
}
# Built-ins that reach an attribute or a namespace by a name built at run time: what the names above
# would otherwise be hidden in.
DYNAMIC = {"getattr", "hasattr", "setattr", "delattr"}
NAMESPACES = {"vars", "globals", "locals", "dir"}
WORDS = (
    "TRITON_INTERPRET",
    "drills.grading",
    "drills.tests",
    "PYTEST",
    "pytest",
    "DRILLS_",
    "/proc",
    "_python_dispatch",
    "dispatch_mode",
)


def _top_defs(tree: ast.Module) -> dict[str, str]:
    return {
        node.name: ast.dump(node)
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def _folded(node: ast.AST) -> str | None:
    """The string a concatenation of string constants builds ("drills." + "grad" + "ing"), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.JoinedStr):
        parts = [_folded(v) if not isinstance(v, ast.FormattedValue) else "" for v in node.values]
        return "".join(p or "" for p in parts)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and node.args
        and isinstance(node.args[0], (ast.List, ast.Tuple))
    ):
        parts = [_folded(e) for e in node.args[0].elts]
        if all(p is not None for p in parts):
            return "".join(parts)
    return None


def _why(node: ast.AST) -> str | None:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in MODULES):
                return f"imports {name}"
        if isinstance(node, ast.ImportFrom):  # `from sys import modules as M`: the name under another
            for a in node.names:
                if a.name in NAMES:
                    return NAMES[a.name]
                if a.name in CALLS:
                    return CALLS[a.name]
    if isinstance(node, ast.Attribute) and node.attr in NAMES:
        return NAMES[node.attr]
    if (
        isinstance(node, ast.Attribute)
        and node.attr in FRESH
        and not (isinstance(node.value, ast.Name) and node.value.id == "math")
    ):
        return f"tests tensor values with {node.attr} on the host (fresh memory is poisoned while graded)"
    if isinstance(node, ast.Name) and node.id in NAMES and node.id != "modules":
        return NAMES[node.id]
    text = _folded(node) if isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call)) else None
    if text:
        for word in WORDS:
            if word in text:
                return f"names {word!r}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
        return CALLS[node.func.id]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("__import__", "exec", "eval", "compile")
    ):
        return f"calls {node.func.id}() (code the check cannot read)"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in DYNAMIC and (len(node.args) < 2 or not isinstance(node.args[1], ast.Constant)):
            return f"calls {node.func.id}() with a name built at run time"
        if node.func.id in DYNAMIC and node.args[1].value in NAMES:
            return NAMES[node.args[1].value]
        if node.func.id in DYNAMIC and isinstance(node.args[1].value, str) and node.args[1].value in CALLS:
            return CALLS[node.args[1].value]
        if node.func.id in NAMESPACES:
            return f"reads a namespace with {node.func.id}()"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
    ):
        return "imports a module by name at run time"
    return None


def refusals(source: str, reference_source: str | None, filename: str = "<file>") -> list[str]:
    """One line per construct refused, empty when the file may be graded. reference_source: the
    lesson's reference, whose unchanged definitions and module-level statements are allowed."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []  # the import reports it, with its line
    allowed_defs, allowed_top = {}, set()
    if reference_source:
        try:
            ref = ast.parse(reference_source)
            allowed_defs = _top_defs(ref)
            allowed_top = {ast.dump(n) for n in ref.body}
        except SyntaxError:
            pass
    lines = source.splitlines()
    found = []
    for top in tree.body:
        name = getattr(top, "name", None)
        if name is not None and allowed_defs.get(name) == ast.dump(top):
            continue  # given code, exactly as the reference has it
        if ast.dump(top) in allowed_top:
            continue
        for node in ast.walk(top):
            why = _why(node)
            if why is not None:
                line = getattr(node, "lineno", top.lineno)
                code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
                found.append(f"line {line}: `{code}` {why}")
                break  # one line per top-level statement is enough to say why
    return found


def check_file(path: str | Path, reference: str | Path | None) -> list[str]:
    source = Path(path).read_text(errors="replace")
    ref = Path(reference).read_text(errors="replace") if reference and Path(reference).exists() else None
    return refusals(source, ref, str(path))


def kernel_names(reference: str | Path) -> list[str]:
    """The top-level functions the reference decorates with @triton.jit: the learner's file must define
    each as a Triton kernel too (the graders launch some of them directly, kernel[grid](...))."""
    try:
        tree = ast.parse(Path(reference).read_text(errors="replace"))
    except (OSError, SyntaxError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            names.append(node.name)
    return names
