"""A static check of the learner's file before it is graded: only what a kernel launcher needs is allowed.

A file that tests for the interpreter, TRITON_INTERPRET, the runtime, the environment, the grader's
modules or the call stack can take a different path when graded than when used, so its grade would
mean nothing. So is code that computes out of the grader's sight (numpy on the tensors' memory, torch
with the grader's record of its ops switched off, floats decoded in Python). A blacklist of such
constructs always misses one, so the check is an allowlist: a learner's file imports only the modules a
launcher needs (ALLOWED, and the course's helper modules its lesson's reference imports), and none of
the ways Python reaches past the names it reads (dunder attributes, getattr with a name built at run
time, exec and its kin, bytes literals). Each refusal names the line and says what to write instead, on
one screen, before any check runs.

The course's own given code does choose tile sizes by runtime (t3's `_config`, t5's block picker), so a
construct is allowed where the learner's file keeps a definition exactly as the reference has it
(compared as code, as the stub contract compares given code), and nowhere else.
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

# The modules a kernel launcher needs: torch and Triton, and the standard library's pure helpers.
ALLOWED = (
    "torch",
    "triton",
    "triton.language",
    "math",
    "array",
    "dataclasses",
    "typing",
    "collections",
    "functools",
    "itertools",
    "heapq",
    "bisect",
    "enum",
    "__future__",
)
# The course's helpers every lesson may import; a lesson's reference may import more (its own folder's
# modules, the engine's), which its learner's file may import too (course_modules).
COURSE = ("drills.launch", "drills.validate", "drills.device_errors")
# Never a learner's import, even where a reference imports it: it says how the file is run (the given
# code that picks tiles by runtime is allowed only as the reference has it).
NEVER = ("drills.runtime", "drills.grading", "drills.tests", "drills.solutions", "drills.mutants")
ALLOWED_TEXT = (
    "torch, triton, math, array, dataclasses, typing, collections, functools, itertools, heapq, bisect, enum"
)
# Attribute and function names that read where the code runs, or reach the grader's objects.
NAMES = {
    "interpreter": "asks whether Triton's interpreter runs it",
    "is_interpreter": "asks whether Triton's interpreter runs it",
    "InterpretedFunction": "looks at Triton's interpreter",
    "GridExecutor": "looks at Triton's interpreter",
    # Triton's kernel classes: an interpreted kernel is none of them (isinstance(k, triton.JITFunction))
    "JITFunction": "asks which kind of kernel Triton made (the interpreter makes another): launch it plainly",
    "KernelInterface": "asks which kind of kernel Triton made (the interpreter makes another): launch it plainly",
    "JITCallable": "asks which kind of kernel Triton made (the interpreter makes another): launch it plainly",
    "InterpreterError": "looks at Triton's interpreter",
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
    "driver": "reads Triton's driver (the interpreter has none, a GPU has one)",
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
    # Files reached through the allowed modules: a file that writes what it saw in one run and reads it
    # in another (an answer computed in a plain run, loaded while graded) computes out of the grader's sight
    "save": "writes a file (torch.save): a launcher reads and writes only tensors",
    "from_file": "reads a file into a tensor: a launcher reads and writes only tensors",
    "tofile": "writes a file: a launcher reads and writes only tensors",
    "fromfile": "reads a file: a launcher reads and writes only tensors",
    "serialization": "reads and writes files (torch's serialization): a launcher needs none",
    "hub": "downloads and loads files (torch.hub): a launcher needs none",
    "package": "reads and writes files (torch.package): a launcher needs none",
    "load_library": "loads compiled code the check cannot read",
    "profiler": "writes trace files (a profiler): a launcher needs none",
    "onnx": "writes files (torch.onnx): a launcher needs none",
    "distributed": "talks to other processes (torch.distributed), out of the grader's sight",
    # Hooks: Triton calls them during a launch, so what they compute would pass for Triton's own work
    "add_pre_run_hook": "runs code in a kernel's hook: compute in the kernel's body and launch it plainly",
    "pre_run_hooks": "runs code in a kernel's hook: compute in the kernel's body and launch it plainly",
    "pre_hook": "runs code in a hook around a launch: compute in the kernel's body and launch it plainly",
    "post_hook": "runs code in a hook around a launch: compute in the kernel's body and launch it plainly",
    "launch_enter_hook": "runs code in a launch hook: compute in the kernel's body and launch it plainly",
    "launch_exit_hook": "runs code in a launch hook: compute in the kernel's body and launch it plainly",
    "jit_cache_hook": "runs code in a compiler hook: compute in the kernel's body and launch it plainly",
    "jit_post_compile_hook": "runs code in a compiler hook: compute in the kernel's body and launch it plainly",
    "CompiledKernel": "reaches Triton's compiled kernels (their launch hooks): launch the kernel plainly",
    "autotune": "autotunes (its hooks and benchmarks run code around each launch): pick the tile on the host",
    "Autotuner": "autotunes (its hooks and benchmarks run code around each launch): pick the tile on the host",
    "heuristics": "runs code before each launch (triton.heuristics): compute the value in the launcher",
    "Heuristics": "runs code before each launch (triton.heuristics): compute the value in the launcher",
    "register_hook": "runs code in a hook: a launcher calls its kernels plainly",
    # The interpreter's own storage of a kernel's values: numpy arrays, computed on out of every op's sight
    # (a plain function the kernel calls adds them in numpy), in a kernel a GPU does not compile
    "handle": "reaches the interpreter's storage of a kernel's values (numpy, out of the grader's sight; a "
    "GPU compiles no such kernel): compute with triton.language in the @triton.jit body",
    # Ways past the op recorder inside torch itself
    "library": "registers a torch op of its own (the grader names ops by their aten:: name)",
    "utils": "reaches torch's utilities (its dispatch internals, its worker processes)",
    "attrgetter": "reaches an attribute by a name the check cannot read",
    "methodcaller": "reaches an attribute by a name the check cannot read",
    "untyped_storage": "reads a tensor's raw memory (floats decoded on the host, out of the grader's sight)",
    "storage": "reads a tensor's raw memory (floats decoded on the host, out of the grader's sight)",
    "_typed_storage": "reads a tensor's raw memory (floats decoded on the host, out of the grader's sight)",
    # Memory Python reads directly, and Python run on each element: floats computed with neither an op
    # nor a read the grader's record sees (copy_ into a tensor over an array, then the array's items)
    "apply_": "runs a Python function on each element (floats computed in Python, out of the grader's sight)",
    "map_": "runs a Python function on each element (floats computed in Python, out of the grader's sight)",
    "map2_": "runs a Python function on each element (floats computed in Python, out of the grader's sight)",
    # Strings evaluated as code: a string annotation or forward reference (typing evaluates it)
    "get_type_hints": "evaluates annotations as code the check cannot read: a launcher needs none",
    "ForwardRef": "evaluates a string as code the check cannot read: a launcher needs none",
}
# torch's higher-order ops, read on torch's names: each runs a subgraph of torch ops (a branch, a loop body,
# an attention's score function) under a dispatch of its own, which the grader's record of torch's ops does
# not take, so the call would fail with torch's own message about the grader's internals. A launcher needs
# none of them.
HIGHER_ORDER = {
    name: f"runs torch.{name}, a higher-order op (torch computing in a subgraph): the launcher may allocate, "
    "view, copy and convert tensors, and the kernel computes"
    for name in ("cond", "while_loop", "scan", "associative_scan", "flex_attention", "invoke_subgraph")
}
# Tensors over a Python buffer (array.array, bytearray): a float copied in is read there by plain Python,
# out of the grader's sight. Allowed only in a lesson whose reference uses them (C1's host-side step
# inputs are built from arrays of ints).
BUFFERS = {
    "frombuffer": "wraps a Python buffer in a tensor (its floats then read by Python, out of the grader's "
    "sight): torch.tensor(values) copies them",
    "asarray": "may wrap a Python buffer in a tensor (its floats then read by Python, out of the grader's "
    "sight): torch.tensor(values) copies them",
}
# Which kind of device holds the tensors, or whether there is a GPU at all: graded, the tensors are on the
# CPU and the interpreter runs the kernels, so a launcher that branches on it (int64 offsets on the CPU
# only, another path for a GPU) is graded on a path no GPU takes. Allowed only in a lesson whose reference
# reads it (F1-F3 and L5 count a GPU's SMs; F1-F3 ask q.is_cuda before a CUDA graph's capture).
DEVICE_KIND_WHY = (
    "asks which kind of device holds the tensors (graded: the CPU), so the file could take another path "
    "graded than on a GPU: decide from shapes and dtypes; check devices with validate.same_device"
)
DEVICE_KIND = {
    "is_cpu",
    "is_cuda",
    "get_device",
    "is_available",
    "device_count",
    "current_device",
    "get_device_properties",
    "get_device_name",
    "get_device_capability",
}
# torch's modules for a kind of device: any of their functions tells a GPU from the CPU (is_initialized(),
# current_stream(), memory_allocated() answer differently, or raise, where no GPU holds the tensors), so
# only the functions the lesson's reference calls there are allowed (F1-F3 and L5 count a GPU's SMs).
DEVICE_MODULES = {"cuda", "mps", "xpu", "accelerator", "backends", "version", "mtia"}
# What turns a device into text or a number, where its kind shows ("cuda:0" is longer than "cpu", starts
# otherwise, hashes otherwise): a device is handed on (device=q.device) or compared with another device.
DEVICE_TEXT = {
    "str",
    "repr",
    "format",
    "ascii",
    "hash",
    "len",
    "id",
    "print",
    "bool",
    "iter",
    "list",
    "tuple",
}


# The course's runtime (drills.runtime.current()) says how the file is run: the interpreter or a GPU, by
# its banner, its repr, its GPU's name. A lesson's plan may read the runtime's device, the default device of
# its tables (F2); anything else of it, and the course's package reached through another module's
# attribute (validate.drills.runtime) or imported from one, tells a grading from a plain run.
RUNTIME_WHY = (
    "reads the course's runtime beyond its device (the interpreter or a GPU, by its banner, repr or "
    "GPU's name), so the file could take another path when graded: decide from shapes, strides and dtypes"
)
COURSE_PACKAGE_WHY = (
    "reaches the course's package through another module (its runtime says how the file is run): import "
    "the course's helpers by their full name"
)


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
# Built-ins that run code the check cannot read, or reach the interpreter's namespaces: refused wherever
# they are named (handed around as values too, `run = eval`).
CODE = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "dir", "memoryview"}
# Dunder names a file may use: the module's own name (`if __name__ == "__main__"`, `type(x).__name__` in
# a message) and the methods a plain class defines. Every other dunder reaches behind a name (a
# function's closure or globals, a class's subclasses, the built-ins, a module's file).
DUNDER_NAMES = {"__name__", "__slots__", "__all__"}
DUNDER_ATTRS = {"__name__"}
DUNDER_METHODS = set(
    """__init__ __post_init__ __repr__ __str__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __len__
    __iter__ __next__ __getitem__ __setitem__ __contains__ __bool__ __enter__ __exit__ __call__""".split()
)
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


# Strings may name dunders only as the file's own names and methods do ("__main__"): any other reaches an
# attribute or a hook by its name where no attribute node shows it (a class built by type() with a
# "__torch_dispatch__" key, "__builtins__" looked up in a namespace, "{0.__globals__}".format(f)).
DUNDER_IN_TEXT = re.compile(r"__[A-Za-z0-9_]+?__")
DUNDER_TEXT_OK = DUNDER_METHODS | DUNDER_NAMES | {"__main__"}
# A string that is code (an annotation typing evaluates, a forward reference) is checked as code: one
# that parses as an expression and calls, reads an attribute or subscripts something.
CODE_NODES = (ast.Call, ast.Attribute, ast.Subscript)
# An attribute in a str.format field: "{0.handle}", "{x[1].data}"
FORMAT_ATTRIBUTE = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)")


def _format_attributes(text: str, depth: int = 0) -> list[str]:
    """The attributes a str.format template reads (`"{0.handle.data}".format(x)` reads x.handle.data),
    its nested specs' too; [] when it is no template."""
    try:
        fields = list(string.Formatter().parse(text))
    except (ValueError, TypeError):
        return []
    found = []
    for _, field, spec, _ in fields:
        if field:
            found += FORMAT_ATTRIBUTE.findall(field)
        if spec and depth < 3:
            found += _format_attributes(spec, depth + 1)
    return found


def _string_why(text: str, ctx: dict) -> str | None:
    for name in DUNDER_IN_TEXT.findall(text):
        if name not in DUNDER_TEXT_OK:
            return f"names {name} in a string (an attribute or a hook reached by its name): a launcher needs none"
    # A template's fields read attributes as code does, where no attribute node shows them
    for attr in _format_attributes(text) if "{" in text else ():
        if attr in NAMES or attr.startswith("_") or attr in BUFFERS or attr in FILE_ATTRS:
            return (
                f"reads .{attr} through a format string's field, behind a name: format the values the "
                "launcher holds, by name"
            )
    if len(text) > 2000 or not any(c in text for c in "(.["):
        return None
    try:
        code = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    nodes = list(ast.walk(code))
    if not any(isinstance(n, CODE_NODES) for n in nodes):
        return None
    for n in nodes:
        if isinstance(n, ast.Constant):
            continue  # a string in the string: checked as code only once
        why = _why(n, ctx)
        if why is not None:
            return f"holds code in a string ({text[:40]!r}: {why})"
    return None


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


def course_modules(reference_source: str | None) -> set[str]:
    """The course's modules the lesson's learner may import: COURSE, and the drills.* modules its
    reference imports (the engine's for c1, another lesson's where a stub builds on it), NEVER aside."""
    allowed = set(COURSE)
    try:
        tree = ast.parse(reference_source or "")
    except SyntaxError:
        return allowed
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name.startswith("drills.") and not any(name == n or name.startswith(n + ".") for n in NEVER):
                allowed.add(name)
    return allowed


def _module_ok(name: str, course: set[str]) -> bool:
    if name in ALLOWED or name in course:
        return True
    # triton.language's own submodules (libdevice, math) are kernel code
    return name.startswith("triton.language.") and not name.split(".")[-1].startswith("_")


INSTEAD_IMPORT = (
    f"a launcher imports only {ALLOWED_TEXT} and the course's helpers its stub imports: remove it"
)


def _import_why(node: ast.AST, course: set[str]) -> str | None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if not _module_ok(a.name, course):
                return f"imports {a.name}: {INSTEAD_IMPORT}"
        return None
    if not isinstance(node, ast.ImportFrom):
        return None
    if node.level:
        return "imports relatively (from .): import the course's helpers by their full name"
    module = node.module or ""
    for a in node.names:
        full = f"{module}.{a.name}"
        if not (_module_ok(module, course) or _module_ok(full, course)):
            return f"imports {full}: {INSTEAD_IMPORT}"
        if a.name in NAMES:  # `from sys import modules as M`: the name under another
            return NAMES[a.name]
        if a.name == "drills":  # `from drills.validate import drills`: the package, and its runtime
            return COURSE_PACKAGE_WHY
        if a.name in BUFFERS:
            return BUFFERS[a.name]
        if a.name in HIGHER_ORDER and module.split(".")[0] == "torch":  # `from torch import cond`
            return HIGHER_ORDER[a.name]
        if a.name in FILE_ATTRS and module.split(".")[0] != "triton":  # `from torch import load`
            return FILE_ATTRS[a.name]
        if a.name in CALLS:
            return CALLS[a.name]
        if a.name.startswith("_") and module != "__future__":
            return f"imports {full}, a private name: use the module's public functions"
    return None


def _roots(tree: ast.AST) -> set[str]:
    """The names the file binds to the allowed modules (torch, tl, math...): their private attributes
    are internals a launcher never needs (torch._C holds the grader's record of its ops)."""
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            roots |= {a.asname or a.name for a in node.names}
    return roots


def _triton_roots(tree: ast.AST) -> set[str]:
    """The names the file binds to Triton (triton, tl, triton.language's members): `tl.load` is a
    kernel's load; `.load` on anything else reads a file (torch.load, torch.jit.load)."""
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {
                a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "triton"
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
            roots |= {a.asname or a.name for a in node.names}
    return roots


# Attributes that read or write a file everywhere but on Triton's names (tl.load is a kernel's load).
FILE_ATTRS = {"load": "reads a file (torch.load): a launcher reads and writes only tensors"}


def _chain_root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _device_names(tree: ast.AST) -> set[str]:
    """The names the file binds to a tensor's device (`dev = q.device`), and any name that says device."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            if isinstance(node.value, ast.Attribute) and node.value.attr == "device":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Name) and "device" in node.id.lower():
            names.add(node.id)
    return names


def _a_device(node: ast.AST, ctx: dict) -> bool:
    """node is a device itself: x.device of a name (not of a tensor made there: torch.empty(0).device is
    the default device, the CPU's, so comparing with it tells the kind), or a name bound to one."""
    return (
        isinstance(node, ast.Attribute) and node.attr == "device" and _chain_root(node.value) is not None
    ) or (isinstance(node, ast.Name) and node.id in ctx["device_names"])


def _mentions_device(node: ast.AST, ctx: dict) -> bool:
    return any(_a_device(n, ctx) for n in ast.walk(node))


def _raised_messages(tree: ast.AST) -> set[int]:
    """The nodes inside the arguments of the exception a `raise` builds (`raise ValueError(f"q is on
    {q.device}")`), where a device made text is an honest error message: the file cannot read it back
    unless one of its `except` clauses binds the exception (`except ValueError as e: str(e)`), so where
    one does, none. The exception's class itself is not among them (it could be chosen by the device)."""
    if any(isinstance(n, ast.ExceptHandler) and n.name for n in ast.walk(tree)):
        return set()
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for arg in [*node.exc.args, *(k.value for k in node.exc.keywords)]:
                inside |= {id(n) for n in ast.walk(arg)}
    return inside


# What makes a device text: allowed in a raised exception's message (_raised_messages), never a comparison.
DEVICE_TEXT_NODES = (ast.FormattedValue, ast.Call, ast.BinOp)


def _device_kind_why(node: ast.AST, ctx: dict) -> str | None:
    """A device made text or a number, or compared with something that is no device: its kind shows."""
    if isinstance(node, DEVICE_TEXT_NODES) and id(node) in ctx["raised_messages"]:
        return None
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        plain = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if any(_mentions_device(side, ctx) for side in sides) and not all(_a_device(s, ctx) for s in plain):
            return DEVICE_KIND_WHY  # q.device == torch.device(0), len(str(dev)) > 3
    if isinstance(node, ast.Call) and any(
        _mentions_device(a, ctx) for a in [*node.args, *(k.value for k in node.keywords)]
    ):
        fn = node.func
        if (isinstance(fn, ast.Name) and fn.id in DEVICE_TEXT) or (
            isinstance(fn, ast.Attribute) and fn.attr in ("format", "join", "format_map")
        ):
            return DEVICE_KIND_WHY  # str(q.device).startswith("cu"), "{}".format(dev)
    if isinstance(node, ast.FormattedValue) and _mentions_device(node.value, ctx):
        return DEVICE_KIND_WHY  # f"{q.device}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _mentions_device(node.right, ctx):
        return DEVICE_KIND_WHY  # "%s" % q.device
    if (
        isinstance(node, ast.Attribute)
        and node.attr in DEVICE_MODULES
        and _chain_root(node.value) in ctx["roots"]
        and _chain_root(node.value) not in ctx["triton"]
        and id(node) not in ctx["device_module_uses"]
    ):
        return DEVICE_KIND_WHY  # torch.cuda.is_initialized(), cuda = torch.cuda
    return None


# A kernel of the file is launched (kernel[grid](...)), handed to the course's launch(), or called from
# another kernel; anything else asked of it tells the interpreter from a GPU: Triton's interpreter makes
# @triton.jit an InterpretedFunction, with other attributes (no device_caches, src or cache_key; a rewrite
# of its own), another type and another text than a GPU's JITFunction. An attribute set on it is state kept
# between calls.
KERNEL_WHY = (
    "asks what the kernel {name} is, or keeps state on it (the interpreter's kernels differ from a GPU's): "
    "launch it as {name}[grid](...)"
)
KERNEL_ASKS = DEVICE_TEXT | {
    "type",
    "isinstance",
    "issubclass",
    "hasattr",
    "getattr",
    "setattr",
    "delattr",
    "callable",
}


def _kernel_names(tree: ast.Module) -> set[str]:
    """The file's @triton.jit functions, and the names bound to one (`k = paged_decode_kernel`)."""
    names = {n.name for n in tree.body if _jitted(n)}
    for node in ast.walk(tree):  # `_k = triton.jit(_f)`: a kernel made by a call
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and "jit" in ast.unparse(node.value.func)
        ):
            names |= {n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
            names |= {n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _kernel_object_why(node: ast.AST, ctx: dict) -> str | None:
    kernels = ctx["kernels"]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in kernels:
        return KERNEL_WHY.format(name=node.value.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KERNEL_ASKS:
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(arg, ast.Name) and arg.id in kernels:
                return KERNEL_WHY.format(name=arg.id)
    if isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Name) and node.value.id in kernels:
        return KERNEL_WHY.format(name=node.value.id)
    return None


def _why(node: ast.AST, ctx: dict) -> str | None:
    course, roots, called = ctx["course"], ctx["roots"], ctx["called"]
    why = _device_kind_why(node, ctx)
    if why is not None:
        return why
    why = _import_why(node, course)
    if why is not None:
        return why
    if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
        return "holds a bytes literal (data the check cannot read, such as a pickle): a launcher needs none"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        why = _string_why(node.value, ctx)
        if why is not None:
            return why
    if isinstance(node, ast.MatchClass):  # `case object(__globals__=g)` reads g = x.__globals__
        for attr in node.kwd_attrs:
            if (
                (_dunder(attr) and attr not in DUNDER_ATTRS)
                or attr in NAMES
                or attr.startswith("_")
                or (attr in BUFFERS and attr not in ctx["reference_attrs"])
            ):
                return (
                    f"reads .{attr} through a class pattern, behind a name: a launcher uses the names it "
                    "defines or imports"
                )
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, (ast.Store, ast.Del))
        and _chain_root(node.value) in roots
    ) or (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("setattr", "delattr")
        and node.args
        and _chain_root(node.args[0]) in roots
    ):
        # torch.memo = {}: state that lasts between calls where no check of the file's own names looks
        # (an answer kept for a later call), or a library's function replaced under the grader
        return (
            "sets an attribute of a library (torch, triton, math...): keep what the launcher needs in "
            "its own names, and nothing from one call to the next"
        )
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        named = any(
            isinstance(n, ast.Constant) and isinstance(n.value, str) for side in sides for n in ast.walk(side)
        )
        device = any(
            isinstance(n, ast.Attribute) and n.attr == "device" for side in sides for n in ast.walk(side)
        )
        if named and device:
            return DEVICE_KIND_WHY  # str(q.device) == "cpu", q.device == torch.device("cuda")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "current"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "runtime"
        and _chain_root(node.func) not in ctx["triton"]
        and id(node) not in ctx["runtime_device"]
    ):
        return RUNTIME_WHY  # drills.runtime.current() read for anything but .device
    if isinstance(node, ast.Attribute):
        if node.attr == "drills":  # validate.drills: the course's package through a module's attribute
            return COURSE_PACKAGE_WHY
        if _dunder(node.attr) and node.attr not in DUNDER_ATTRS:
            return f"reads .{node.attr}, behind a name: a launcher uses the names it defines or imports"
        if node.attr in NAMES:
            return NAMES[node.attr]
        if node.attr in BUFFERS and node.attr not in ctx["reference_attrs"]:
            return BUFFERS[node.attr]
        if node.attr in DEVICE_KIND and node.attr not in ctx["reference_attrs"]:
            return DEVICE_KIND_WHY
        if (
            node.attr in ("type", "index")
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "device"
        ):
            return DEVICE_KIND_WHY  # q.device.type == "cpu"; no reference reads it
        if node.attr in HIGHER_ORDER and _chain_root(node.value) in roots:
            return HIGHER_ORDER[node.attr]
        if node.attr in FILE_ATTRS and _chain_root(node.value) not in ctx["triton"]:
            return FILE_ATTRS[node.attr]
        if node.attr.startswith("_") and _chain_root(node.value) in roots:
            return f"reads {ast.unparse(node)}, a module's internals: use its public functions"
        if node.attr in FRESH and not (isinstance(node.value, ast.Name) and node.value.id == "math"):
            return f"tests tensor values with {node.attr} on the host (fresh memory is poisoned while graded)"
    if isinstance(node, ast.keyword) and node.arg in NAMES:  # triton.Config(..., pre_hook=...)
        return f"passes {node.arg}=: {NAMES[node.arg]}"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _dunder(node.name):
        if node.name not in DUNDER_METHODS:
            return f"defines {node.name}, a hook into Python or torch: a launcher's classes hold data"
    if isinstance(node, ast.Name):
        if _dunder(node.id) and node.id not in DUNDER_NAMES:
            return f"names {node.id}, behind the module's names: use what the file defines or imports"
        if node.id in CODE:
            return f"names {node.id}() (code or namespaces the check cannot read): write the code itself"
        if node.id in DYNAMIC and id(node) not in called:
            return f"hands {node.id} around: read the attribute by its name (x.name)"
        if node.id in NAMES and node.id != "modules":
            return NAMES[node.id]
    text = _folded(node) if isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call)) else None
    if text:
        for word in WORDS:
            if word in text:
                return f"names {word!r}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        fn = node.func.id
        if fn in CODE:
            return f"calls {fn}() (code or namespaces the check cannot read): write the code itself"
        if fn in CALLS:
            return CALLS[fn]
        if fn in DYNAMIC:
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                return f"calls {fn}() with a name built at run time: read the attribute by its name (x.name)"
            if name.value in BUFFERS and name.value not in ctx["reference_attrs"]:
                return BUFFERS[name.value]
            if name.value == "drills":  # getattr(validate, "drills"): validate.drills by another spelling
                return COURSE_PACKAGE_WHY
            if _dunder(name.value) or name.value in NAMES or name.value in CALLS:
                return NAMES.get(name.value) or CALLS.get(name.value) or f"reaches {name.value} by {fn}()"
        if fn == "type" and len(node.args) + len(node.keywords) > 1:
            return "builds a class at run time (type() with a namespace the check cannot read): write a class"
        if (
            fn in ("type", "isinstance", "callable", "id")
            and node.args
            and _chain_root(node.args[0]) in roots
        ):
            # torch.empty and Tensor.tolist are the grader's wrappers while graded: asking what they are
            # tells a grading apart
            return f"asks what {ast.unparse(node.args[0])} is (a library's function): call it instead"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
    ):
        return "imports a module by name at run time"
    return _kernel_object_why(node, ctx)


def _jitted(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)


def _module_objects(tree: ast.Module) -> set[str]:
    """The names the file's module level binds to Python objects (a list, a dict, an object), not to a
    constant or a constexpr: a GPU's compiler refuses a kernel that reads one, the interpreter shares it across programs."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            value = node.value
            if value is None or all(
                isinstance(n, (ast.Constant, ast.Tuple, ast.Load)) for n in ast.walk(value)
            ):
                continue  # a number, a string or a tuple of them: nothing programs could share
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, (ast.Attribute, ast.Name))
                and (value.func.attr if isinstance(value.func, ast.Attribute) else value.func.id)
                == "constexpr"
            ):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    # A name some function declares `global` is rebound at run time (`_H = None` at the top, an object
    # assigned in the launcher): whatever it holds then is no constant a GPU's compiler could take
    names |= {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    return names


# Python's conversions of a value to a number or to text: in a kernel's body the interpreter hands them
# the kernel's values (a block's numbers as text, a scalar as a Python int), which Python can then compute
# on out of every check's sight; a GPU's compiler converts only constants and constexprs, and makes no text.
KERNEL_NUMBERS = {"int", "float", "bool", "complex"}
KERNEL_TEXT = {"str", "repr", "format", "ascii"}


def _kernel_call_why(
    node: ast.AST,
    plain: set[str],
    objects: set[str] = frozenset(),
    constexprs: set[str] = frozenset(),
    modules: set[str] = frozenset(),
) -> str | None:
    """In a @triton.jit body: a call of a plain Python function of the file, a lambda or a function
    defined there. Triton's compiler refuses each on a GPU; the interpreter runs it as Python, handing
    it the kernel's values, so a kernel that passes on the CPU would not compile where it is used."""
    if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return (
            "defines a function in a kernel's body (Python the interpreter runs and a GPU's compiler "
            "refuses): make it a @triton.jit function of the file and call that"
        )
    if isinstance(node, ast.Name) and node.id in objects and isinstance(node.ctx, ast.Load):
        return (
            f"reads {node.id}, a Python object of the module, in a kernel's body (the interpreter shares it "
            "between programs, a GPU's compiler refuses it): pass it as an argument, or make it a "
            "tl.constexpr"
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in plain:
        return (
            f"calls {node.func.id}(), a plain Python function, from a kernel's body (the interpreter runs "
            "it as Python, a GPU's compiler refuses it): decorate it with @triton.jit or compute in the kernel"
        )
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and _chain_root(node.func) in modules
    ):
        return (
            f"calls {ast.unparse(node.func)}() in a kernel's body, a module's Python (the interpreter runs it "
            "on the kernel's values, math.exp on a lane made a number; a GPU's compiler refuses it): use "
            "triton.language's functions (tl.exp, tl.sqrt)"
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KERNEL_TEXT:
        return (
            f"calls {node.func.id}() in a kernel's body (the interpreter makes a block's values text, a GPU's "
            "compiler makes none): show values with tl.device_print, compute with triton.language"
        )
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in KERNEL_NUMBERS
        and not all(
            isinstance(n, (ast.Constant, ast.UnaryOp, ast.unaryop, ast.BinOp, ast.operator, ast.expr_context))
            or (isinstance(n, ast.Name) and n.id in constexprs)
            for arg in node.args
            for n in ast.walk(arg)
        )
    ):
        return (
            f"calls {node.func.id}() on a kernel's value (the interpreter hands it to Python as a number, a "
            "GPU's compiler converts only constants and tl.constexpr parameters): use .to(tl.int32) or "
            "tl.cast, and compute with triton.language"
        )
    return None


def refusals(source: str, reference_source: str | None, filename: str = "<file>") -> list[str]:
    """One line per construct refused, empty when the file may be graded. reference_source: the
    lesson's reference, whose unchanged definitions and module-level statements are allowed, and whose
    course imports the file may import too."""
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
    reference_attrs = set()
    if reference_source:
        try:
            reference_attrs = {
                n.attr for n in ast.walk(ast.parse(reference_source)) if isinstance(n, ast.Attribute)
            }
        except SyntaxError:
            pass
    ctx = {
        "reference_attrs": reference_attrs,
        "course": course_modules(reference_source),
        "roots": _roots(tree),
        "triton": _triton_roots(tree),
        "called": {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)},
        "device_names": _device_names(tree),
        "raised_messages": _raised_messages(tree),
        "kernels": _kernel_names(tree),
        # torch.cuda.<a function the reference calls>: the module reached for that function alone
        "device_module_uses": {
            id(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute)
            and n.value.attr in DEVICE_MODULES
            and n.attr in reference_attrs
        },
        # drills.runtime.current() calls whose only use is .device (RUNTIME_WHY)
        "runtime_device": {
            id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "device"
        },
    }
    lines = source.splitlines()
    found = []
    # The file's plain functions and classes: a kernel's body may call none of them (Triton's own kinds,
    # @triton.jit and @triton.constexpr_function, are the compiler's to run)
    plain = {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and not any(
            _chain_root(d.func if isinstance(d, ast.Call) else d) in ctx["triton"] for d in n.decorator_list
        )
    }
    objects = _module_objects(tree)
    for top in tree.body:
        name = getattr(top, "name", None)
        if name is not None and allowed_defs.get(name) == ast.dump(top):
            continue  # given code, exactly as the reference has it
        if ast.dump(top) in allowed_top:
            continue
        kernel = _jitted(top)
        kernel_objects = objects
        constexprs = (
            {
                a.arg
                for a in top.args.args + top.args.kwonlyargs
                if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)
            }
            if kernel
            else set()
        )
        if kernel:  # the kernel's parameters and locals shadow the module's names
            bound = {a.arg for a in ast.walk(top.args) if isinstance(a, ast.arg)}
            bound |= {n.id for n in ast.walk(top) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            kernel_objects = objects - bound
        for node in ast.walk(top):
            why = _why(node, ctx)
            if why is None and kernel and node is not top:
                why = _kernel_call_why(
                    node, plain, kernel_objects, constexprs, (ctx["roots"] - ctx["triton"]) - bound
                )
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
