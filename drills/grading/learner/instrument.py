"""Triton instrumented in the learner's process (patched once per process, switched per call):

- every launch is counted, optionally recorded (drills/grading/shared/launches.py), optionally turned into a
  no-op (the launch-disabled run of a provenance check), and the bytes it left in each tensor it was
  given are kept (what the grader compares the call's result with);
- under the interpreter, every load and store lane is checked against the memory of the kernel's tensor
  arguments (an out-of-bounds access becomes an error naming the learner's line instead of a segfault),
  masked-off lanes of a load without `other=` read what fresh memory holds (NaN while graded, the finite
  pattern in the provenance check's finite run: undefined on a GPU), programs can be visited in
  reverse, and bf16 is computed as a GPU computes it (drills/grading/learner/bf16.py), where Triton's own
  interpreter returns garbage;
- torch.empty and friends return NaN-filled memory, so output never written shows.
"""

from __future__ import annotations

import linecache
import os
import re
import sys

from drills.grading.learner import semantic_cache
from drills.grading.learner.bf16 import exact_bf16_dot
from drills.grading.learner.write_races import program_number
from drills.grading.shared.errors import GridTooLarge, OutOfBoundsAccess
from drills.grading.shared.wire import as_bytes_view, tensors_in

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _where_now(graded_file: str) -> tuple[str, int, str] | None:
    graded = os.path.realpath(graded_file)
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name and os.path.realpath(name) == graded:
            return name, frame.f_lineno, linecache.getline(name, frame.f_lineno).strip()
        frame = frame.f_back
    return None


def _relative(path: str) -> str:
    try:
        return os.path.relpath(path, ROOT) if os.path.realpath(path).startswith(ROOT + os.sep) else path
    except ValueError:
        return path


class TritonWatch:
    """Patches Triton in this process once; per call, the grader's options switch its behaviour."""

    def __init__(self, graded_file: str):
        self.graded_file = graded_file
        self.reverse = False  # visit programs in reverse order (interpreter only)
        self.disabled = False  # turn every launch into a no-op
        self.recording: list | None = None  # Launch records, when asked
        self.launched = 0  # launches during the current call
        self.in_launch = 0  # > 0 while a launch runs
        self.stored: dict | None = None  # storage address -> its bytes after the last launch given it
        self.ranges: list[tuple[str, int, int]] = []  # (argument name, first byte, end) of the running kernel
        self.read: set | None = (
            None  # first bytes of the storages some load read from (compiled: some launch was given), when asked
        )
        self.access = None  # write_races.AccessLog of the running launch, when the call checks the order
        # [(first byte, end)] of the storages whose loads the grader asked for (launches.record_loads), and
        # the record of them: (launch of the call, target, program (x, y, z), the byte offsets from the
        # storage's first byte of the load's active lanes (of all its lanes when none is on), whether any was)
        self.loads_of: list | None = None
        self.loads_seen: list = []
        self.overlapped = False  # some launch of the call had programs touching each other's memory
        self.interpreter = os.environ.get("TRITON_INTERPRET", "0") == "1"
        self.recorder = None  # the torch op recorder of the call being run, if any
        self.stored_into: set = set()  # first bytes of the storages the running launch stores into
        self._patch_launch()
        if self.interpreter:
            self._patch_interpreter()

    def _patch_launch(self):
        from drills.grading.shared.launches import _kernel_classes, check_grid, describe

        watch = self
        for cls in _kernel_classes():
            original = cls.run

            def run(self, *args, _original=original, **kwargs):
                if kwargs.get("warmup", False):
                    return _original(self, *args, **kwargs)
                watch.launched += 1
                _refuse_python_arguments(self, args, kwargs)
                if watch.recording is not None:
                    launch = describe(self, args, kwargs)
                    fn = getattr(self, "fn", None)
                    code = getattr(fn, "__code__", None)
                    if code is not None and os.path.realpath(code.co_filename) == os.path.realpath(
                        watch.graded_file
                    ):
                        launch = type(launch)(watch.module_name, launch.name, launch.grid, launch.constexprs)
                    else:
                        launch = type(launch)(
                            f"(not your file) {launch.module}", launch.name, launch.grid, launch.constexprs
                        )
                    watch.recording.append(launch)
                # Before anything runs, also with launches disabled (a dry run at the largest sizes): a
                # grid a GPU refuses fails here on every machine.
                try:
                    check_grid(self, args, kwargs)
                except GridTooLarge as err:  # named at the learner's launch line, as a bad access is
                    where = _where_now(watch.graded_file)
                    if where is not None:
                        err.args = (f"{err}, at {_relative(where[0])}:{where[1]}: {where[2]}",)
                        err.drills_where = where
                    raise
                if watch.disabled:
                    return None
                if watch.interpreter:
                    names = list(getattr(self, "arg_names", []) or [])
                    watch.ranges = _tensor_ranges(names, args, kwargs)
                    if watch.access is not None:
                        watch.access.reset()
                        watch.access.shared = not watch.ranges  # accesses it cannot place
                watch.in_launch += 1  # torch ops from here on are Triton's own (the interpreter's copies)
                watch.stored_into = set()
                try:
                    value = _original(self, *args, **kwargs)
                finally:
                    watch.in_launch -= 1
                if watch.recorder is not None and watch.interpreter:
                    watch.recorder.launched(list(args) + list(kwargs.values()), watch.stored_into)
                if watch.access is not None and watch.interpreter and watch.access.overlapping():
                    watch.overlapped = True
                given = None
                if watch.read is not None and not watch.interpreter:
                    # Compiled Triton hides its loads: a storage some launch was given stands for one it
                    # read. An answer computed elsewhere and copied in is still given none of the inputs.
                    given = _storages(tensors_in(list(args) + list(kwargs.values())))
                    watch.read.update(given)
                if watch.stored is not None:  # what this launch left in each tensor it was given
                    given = given or _storages(tensors_in(list(args) + list(kwargs.values())))
                    for storage in given.values():
                        watch.stored[storage[0].data_ptr()] = _u8(storage[0]).clone()
                return value

            for name in ("__name__", "__qualname__", "__doc__", "__module__"):
                setattr(run, name, getattr(original, name, None))
            cls.run = run
        if self.interpreter:
            _check_interpreted_grids()

    def _patch_interpreter(self):
        import numpy as np
        from triton.runtime import interpreter as interp

        watch = self
        grid_code = interp.GridExecutor.__call__.__code__

        def grid_range(*args):
            r = range(*args)
            if watch.reverse and sys._getframe(1).f_code is grid_code:
                return r[::-1]
            return r

        interp.range = grid_range  # the module's own `range`: GridExecutor's program loops read it
        _wrap_int32_as_a_gpu_does(interp)
        _memoize_np_dtypes(interp)
        _dot_sizes_as_a_gpu_compiles(interp)
        _patch_language_once(interp)
        _values_stay_in_kernels(interp, self.graded_file)
        _constexpr_functions_take_constexprs()
        semantic_cache.install(interp)
        exact_bf16_dot(interp)

        builder = type(interp.interpreter_builder)
        load, store = builder.create_masked_load, builder.create_masked_store

        def check(ptrs, mask, what):
            # A launch given no tensor is checked too: its addresses can only be integers made pointers
            # (a data_ptr() passed as a number), memory it was not given, whose loads and stores the
            # record of what each launch read and wrote would not see.
            data = np.asarray(ptrs.data, dtype=np.uint64)
            active = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
            if watch.loads_of and what == "load":
                # The active lanes; a load with none, every lane: it still costs its program the tile's
                # arithmetic on a GPU (a key block above the diagonal loaded under a causal mask).
                on = active.ravel()
                lanes = data.ravel()[on] if on.any() else data.ravel()
                builder = interp.interpreter_builder
                for target, (start, end) in enumerate(watch.loads_of):
                    inside = (lanes >= np.uint64(start)) & (lanes < np.uint64(end))
                    if inside.any():
                        watch.loads_seen.append(
                            (
                                watch.launched,
                                target,
                                tuple(int(i) for i in builder.grid_idx),
                                (lanes[inside] - np.uint64(start)).tolist(),
                                bool(on.any()),
                            )
                        )
            if not active.any():
                return
            size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
            p = data[active]
            if watch.access is not None:
                builder = interp.interpreter_builder
                watch.access.record(what, p, size, program_number(builder.grid_idx, builder.grid_dim))
            if watch.read is not None and what == "load":  # which tensors the kernel really reads
                for _, start, end in watch.ranges:
                    if start not in watch.read and ((p >= np.uint64(start)) & (p < np.uint64(end))).any():
                        watch.read.add(start)
            # Nearly every access stays inside one tensor: its lowest and highest lanes decide that in one
            # pass, and the per-lane test below only runs when they do not.
            low, high = int(p.min()), int(p.max()) + size
            if what == "store" and watch.recorder is not None:  # which tensors the launch writes
                watch.stored_into.update(
                    start for _, start, end in watch.ranges if start < high and low < end
                )
            if any(start <= low and high <= end for _, start, end in watch.ranges):
                return
            inside = np.zeros(p.shape, dtype=bool)
            for _, start, end in watch.ranges:
                inside |= (p >= np.uint64(start)) & (p + np.uint64(size) <= np.uint64(end))
            if inside.all():
                return
            bad = p[~inside]
            first = int(bad[0])
            name, distance = _nearest(watch.ranges, first, size)
            where = _where_now(watch.graded_file)
            said = (
                f"out of bounds {what} of {name} ({distance}): {bad.size} of {p.size} active lanes point "
                "outside every tensor the kernel was given"
                if watch.ranges
                else f"out of bounds {what}: the kernel was given no tensor, so its {bad.size} active lanes "
                "point at memory made from an integer (an address passed as a number); pass the tensors"
            )
            err = OutOfBoundsAccess(
                said + (f", at {_relative(where[0])}:{where[1]}: {where[2]}" if where else "")
            )
            err.drills_where = where
            raise err

        def create_masked_load(self, ptrs, mask, other, *rest):
            check(ptrs, mask, "load")
            if other is None:
                dtype_tt = ptrs.get_element_ty()
                if dtype_tt.is_floating():
                    # What fresh memory holds in this run: NaN, or the finite pattern of the provenance
                    # check's second run, so that a file telling a grading by these lanes takes another
                    # path in one of the two runs that must agree (provenance.poison_disagrees).
                    dtype_np = interp._get_np_dtype(dtype_tt)
                    other = interp.TensorHandle(
                        np.full(np.shape(ptrs.data), POISON["value"], dtype=dtype_np), dtype_tt
                    )
            return load(self, ptrs, mask, other, *rest)

        def create_masked_store(self, ptrs, value, mask, *rest):
            check(ptrs, mask, "store")
            return store(self, ptrs, value, mask, *rest)

        builder.create_masked_load = create_masked_load
        builder.create_masked_store = create_masked_store
        for name in ("create_atomic_rmw",):
            original = getattr(builder, name, None)
            if original is None:
                continue

            def atomic(self, op, ptr, val, mask, *rest, _original=original):
                check(ptr, mask, "atomic")
                return _original(self, op, ptr, val, mask, *rest)

            setattr(builder, name, atomic)
        cas = getattr(builder, "create_atomic_cas", None)
        if cas is not None:

            def atomic_cas(self, *args, _original=cas):
                if watch.access is not None:
                    watch.access.shared = True  # a compare-and-swap: programs sharing memory
                return _original(self, *args)

            builder.create_atomic_cas = atomic_cas


class PythonArgument(TypeError):
    """A kernel launched with a Python function among its arguments."""


def _refuse_python_arguments(kernel, args, kwargs) -> None:
    """A Python function (a lambda, a plain def, a bound method, a partial, an object with __call__)
    handed to a kernel, as a constexpr or not: the interpreter calls it as Python with the kernel's
    values, inside the launch, where it can keep them or share them between programs; a GPU's compiler
    refuses it. A @triton.jit function is not one of them (Triton compiles it into the kernel). The grid,
    which may be a function of the launch's meta-parameters, is Triton's own."""
    import torch
    import triton.language as tl
    from triton.runtime.jit import KernelInterface

    names = list(getattr(kernel, "arg_names", []) or [])
    items = list(zip(names + [f"argument {i}" for i in range(len(names), len(args))], args))
    items += [(k, v) for k, v in kwargs.items() if k != "grid"]
    for name, value in _flat_arguments(items):
        if isinstance(value, tl.constexpr):
            value = value.value
        stand_in = _tensor_stand_in(value)
        if stand_in is not None:
            # worded as the grader words a result computed out of the kernel's sight, so the screen names it
            raise PythonArgument(
                "the output did not come from your kernel: an object standing in for a tensor runs as Python "
                f"inside the launch ({getattr(kernel, '__name__', 'the kernel')} was given {name} = {stand_in}, "
                "whose methods Triton calls while it copies the launch's arguments, out of the grader's "
                "sight; a GPU launch reads only its address); pass the torch.Tensor itself"
            )
        # anything Python can call (an object of a class with __call__ too), but Triton's own kernels
        if callable(value) and not isinstance(value, (KernelInterface, torch.Tensor, type)):
            # worded as the grader words a result computed out of the kernel's sight, so the screen names it
            raise PythonArgument(
                "the output did not come from your kernel: a Python function runs as Python inside the launch "
                f"({getattr(kernel, '__name__', 'the kernel')} was given {name} = "
                f"{getattr(value, '__name__', type(value).__name__)}, which a GPU's compiler refuses); pass a "
                "@triton.jit function, or compute in the kernel's body"
            )


def _flat_arguments(items):
    """(name, value) of each argument, a tuple's members as `name[i]` (Triton takes tuples of tensors)."""
    for name, value in items:
        if isinstance(value, tuple):
            yield from _flat_arguments([(f"{name}[{i}]", v) for i, v in enumerate(value)])
        else:
            yield name, value


def _tensor_stand_in(value) -> str | None:
    """What stands in for a tensor among a launch's arguments, or None: an object with data_ptr (Triton
    takes anything with one for a pointer) that is not one of torch's own tensor classes, alone or under
    Triton's wrappers (triton.reinterpret's TensorWrapper, a TensorDescriptor's base). The interpreter
    calls such an object's methods (untyped_storage(), its storage's cpu(), new_empty()) from its own code
    while it copies the arguments, where torch's ops are Triton's own: a C function there, a
    functools.partial of torch.add, computes unseen. A subclass of torch.Tensor may override them too, and
    so may a plain tensor's own attributes (`t.size = ...` shadows Tensor.size)."""
    import torch

    seen = 0
    while not isinstance(value, torch.Tensor) and seen < 4:
        base = getattr(value, "base", None)  # Triton's wrappers keep the tensor as .base
        if base is None or type(value).__module__.split(".")[0] != "triton":
            break
        value, seen = base, seen + 1
    if isinstance(value, torch.Tensor):
        if type(value).__module__.split(".")[0] != "torch":
            return f"a tensor of the class {type(value).__name__}"
        # a method replaced on the tensor itself (`src.size = functools.partial(...)`): Triton's copy calls it
        replaced = sorted(k for k in (getattr(value, "__dict__", None) or {}) if hasattr(type(value), k))
        if replaced:
            return (
                f"a tensor whose {', '.join(replaced[:3])} {'was' if len(replaced) == 1 else 'were'} replaced"
            )
        return None
    if hasattr(value, "data_ptr"):
        return f"an object of the class {type(value).__name__}"
    return None


def _check_interpreted_grids() -> None:
    """The interpreter's GridExecutor resolves a callable grid itself (an autotuner's `lambda META`), on
    arguments the launch patch may fail to rebuild: every grid it is about to run passes CUDA's limits
    here too, where it sets the grid's size."""
    from triton.runtime import interpreter as interp

    from drills.grading.shared.launches import grid_problem

    builder = type(interp.interpreter_builder)
    original = builder.set_grid_dim
    if getattr(original, "drills_checked", False):
        return

    def set_grid_dim(self, nx, ny, nz):
        executor = sys._getframe(1).f_locals.get("self")  # GridExecutor.__call__'s self: the kernel's name
        name = getattr(getattr(executor, "fn", None), "__name__", "the kernel")
        problem = grid_problem((int(nx), int(ny), int(nz)), name)
        if problem is not None:
            raise GridTooLarge(problem)
        return original(self, nx, ny, nz)

    set_grid_dim.drills_checked = True
    builder.set_grid_dim = set_grid_dim


def _wrap_int32_as_a_gpu_does(interp) -> None:
    """Triton's interpreter checks every int32 add, sub and mul for overflow (computed again in int64 and
    compared): a third of an L4 kernel's time in the interpreter. A GPU checks nothing and wraps, and
    so does the interpreter's own int32 arithmetic once the check is off. The graders catch an offset
    left int32 as a GPU run would show it: the wrapped address, out of the tensor (an out-of-bounds
    access naming the line) or on the wrong element (the wrong value)."""
    import dataclasses

    builder = interp.interpreter_builder
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _dot_sizes_as_a_gpu_compiles(interp) -> None:
    """The interpreter lets tl.dot take any shape (its smallest is 1 x 1 x 1); NVIDIA's compiler refuses
    a K below 16 (32 for 8-bit operands), the depth of one tensor-core instruction. With its rule here, a
    kernel whose dot a GPU would not compile fails on the CPU too, with the compiler's own message. M and
    N may be small: the compiler pads them (Triton 3.2 and later)."""
    builder = interp.interpreter_builder
    fns = getattr(builder, "codegen_fns", None)
    if not isinstance(fns, dict) or "min_dot_size" not in fns:
        return

    def min_dot_size(lhs_type, rhs_type):  # (m, n, k)
        return (1, 1, 32) if lhs_type.scalar.primitive_bitwidth == 8 else (1, 1, 16)

    fns["min_dot_size"] = min_dot_size


def _memoize_np_dtypes(interp) -> None:
    """The interpreter maps a Triton dtype to its numpy dtype by building a table of twenty entries on
    every call, tens of thousands of times per kernel (a twentieth of its time): the map never changes,
    so each answer is kept."""
    original = getattr(interp, "_get_np_dtype", None)
    if original is None or getattr(original, "drills_memoized", False):
        return
    known: dict = {}

    def np_dtype(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = value = original(tt_dtype)
            return value
        except TypeError:  # not hashable: as Triton computes it
            return original(tt_dtype)

    np_dtype.drills_memoized = True
    interp._get_np_dtype = np_dtype


class KernelValueToPython(TypeError):
    """A kernel's float value made a Python number in the kernel's body."""


def _values_stay_in_kernels(interp, graded_file: str) -> None:
    """Triton's interpreter gives a kernel's tensors Python's conversions a GPU's compiler has none of:
    str(), repr(), format() and f-strings print the values (numpy's text of the block), and int() or
    float() of a float scalar hands over the number. A kernel's body could then compute in Python on
    the text or the number (math.exp, a parse, a sum) and put the answer back with tl.where, all out of
    every check's sight, in a kernel no GPU compiles. Both are refused where the learner's file asks
    (print a kernel's values with tl.device_print); Triton's own messages still get the compiler's text,
    type and shape. An integer scalar stays a Python number (a loop bound, range(n)), and an `if` on a
    scalar works as before."""
    import triton.language as tl

    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "drills_values_stay", False):
        return
    typed = tl.core.tensor.__str__  # the compiler's text: dtype[shape], no values
    graded = os.path.realpath(graded_file)

    def text(self, *spec):
        code = sys._getframe(1).f_code
        if os.path.realpath(code.co_filename or "") == graded:
            raise KernelValueToPython(
                "the output did not come from your kernel: text made of a kernel's values runs as Python inside "
                "the launch (str(), repr(), format(), print() or an f-string of a tensor in a @triton.jit "
                "body, which the interpreter fills with the values and a GPU's compiler does not); show "
                "them with tl.device_print, and compute with triton.language"
            )
        return typed(self)

    def index(self):
        if self.dtype.is_floating():
            raise KernelValueToPython(
                "the output did not come from your kernel: a float value made a Python number runs as Python "
                "inside the launch (int() or float() of a kernel's float tensor, which a GPU's compiler "
                "refuses); compute with triton.language in the @triton.jit body"
            )
        return int(self.handle.data.squeeze())  # as Triton's own: a scalar is a (1,) array from Triton 3.9

    def patch_tensor(tensor, scope):
        original(tensor, scope)
        for name, fn in (("__str__", text), ("__repr__", text), ("__format__", text), ("__index__", index)):
            scope.set_attr(tensor, name, fn)

    patch_tensor.drills_values_stay = True
    interp._patch_lang_tensor = patch_tensor


def _constexpr_functions_take_constexprs() -> None:
    """A @triton.constexpr_function runs at compile time on constexprs: a GPU's compiler hands it no
    tensor it could compute on (an op on one needs the code generator, an `if` on one has no value). The
    interpreter calls it as plain Python with whatever the kernel passes, its tensors too, so a kernel
    could recover a float by bisection on `if x > mid` there and compute on it in Python (math, a loop),
    out of every check's sight, in a kernel no GPU compiles. A kernel's tensor given to one is refused."""
    import triton.language as tl

    try:  # by the module's full name: triton.runtime's `jit` may be the decorator, not the module
        from triton.runtime.jit import ConstexprFunction as klass
    except ImportError:  # a Triton without constexpr functions
        return
    if getattr(klass.__call__, "drills_constexprs_only", False):
        return
    original = klass.__call__

    def tensors(values, depth=0) -> bool:
        for value in values:
            if isinstance(value, tl.tensor):
                return True
            if isinstance(value, (tuple, list)) and depth < 4 and tensors(value, depth + 1):
                return True
        return False

    def call(self, *args, **kwargs):
        if tensors(args) or tensors(kwargs.values()):
            name = getattr(getattr(self, "fn", None), "__name__", "a constexpr_function")
            raise KernelValueToPython(
                "the output did not come from your kernel: a @triton.constexpr_function given a kernel's "
                f"tensor runs as Python on its values under the interpreter ({name}), which a GPU's "
                "compiler refuses (it runs such a function on constexprs only); give it constexprs (a "
                "shape, a dtype, a tl.constexpr parameter), and compute with triton.language in the "
                "@triton.jit body"
            )
        return original(self, *args, **kwargs)

    call.drills_constexprs_only = True
    klass.__call__ = call


def _patch_language_once(interp) -> None:
    """Triton's interpreter patches triton.language when a kernel starts (undone when it returns), and
    again on every call of a @triton.jit helper from the kernel (tl.max and tl.zeros are helpers too): a
    scan of every member of the language modules, a fifth of T5's grading time. Within one kernel run
    only the first patch of a module changes anything (nothing is undone before the kernel returns, and
    a repeat sets the same functions again), so a helper whose modules are already patched skips it."""
    import triton.language as tl

    core = tl.core
    if not all(hasattr(interp, name) for name in ("_patch_lang", "_LangPatchScope", "InterpretedFunction")):
        return  # another Triton: leave it as it is
    patch_lang, grid_call = interp._patch_lang, interp.GridExecutor.__call__
    helper_code = interp.InterpretedFunction.__call__.__code__
    patched: list[set] = []  # the language modules patched since the running kernel started

    def languages(fn) -> set:  # by identity alone: tl and tl.core are modules (inspect.ismodule cost a third)
        return {id(v) for v in fn.__globals__.values() if v is tl or v is core}

    def run_grid(self, *args, **kwargs):
        patched.append(languages(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def patch_once(fn):
        if not patched or sys._getframe(1).f_code is not helper_code:
            return patch_lang(fn)
        needed = languages(fn)
        if needed and needed <= patched[-1]:
            return interp._LangPatchScope()  # Triton drops a helper's scope unrestored anyway
        scope = patch_lang(fn)
        patched[-1] |= needed
        return scope

    interp.GridExecutor.__call__ = run_grid
    interp._patch_lang = patch_once


def _tensor_ranges(names, args, kwargs) -> list[tuple[str, int, int]]:
    ranges = []
    items = list(zip(names, args)) + list(kwargs.items())
    for name, value in items:
        if hasattr(value, "untyped_storage") and hasattr(value, "data_ptr"):
            storage = value.untyped_storage()
            start = storage.data_ptr()
            ranges.append((name, start, start + storage.nbytes()))
    return ranges


def _nearest(ranges, ptr: int, size: int) -> tuple[str, str]:
    best = None
    for name, start, end in ranges:
        if ptr >= end:
            n = (ptr - end) // size + 1
            d, text = ptr - end, f"{n} element{'s' if n != 1 else ''} past its end"
        elif ptr < start:
            n = (start - ptr + size - 1) // size
            d, text = start - ptr, f"{n} element{'s' if n != 1 else ''} before its start"
        else:
            d, text = 0, "straddling its end"
        if best is None or d < best[0]:
            best = (d, name, text)
    if best is None or best[0] > 1 << 40:
        return "any argument", "a wild address"
    return best[1], best[2]


# What torch.empty returns in the learner's process: NaN, so that output a kernel never wrote shows; a
# different value while launches are disabled, so that a kernel whose output is NaN is not taken for
# no kernel at all; and a finite pattern in one more run of a provenance check, whose result must agree
# with the NaN run's wherever that is not NaN: a file that tells a grading by its fresh memory
# (`probe != probe`) takes the same path in both, or shows (provenance.poison_disagrees).
POISON = {"value": float("nan")}
DISABLED_POISON = 7777.0
FINITE_POISON = 0.0  # what fresh pages hold in a plain run
# The ops that return fresh memory, by their aten:: name.
EMPTIES = {"aten::" + n for n in "empty empty_like empty_strided new_empty new_empty_strided".split()}


_FRESH: list = []  # the fresh-memory mode's class, once poison_empty() made it


def poison_empty() -> None:
    """While fresh_memory() lasts (each of the grader's calls, serve_calls.py), fresh float memory
    (torch.empty and friends, on the CPU) holds POISON["value"]. Done by a dispatch mode rather than by
    wrapping torch.empty: torch's functions stay torch's own, so asking what torch.empty is tells nothing.
    Only during calls: a mode makes every torch op pass through Python, tens of microseconds each."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class FreshMemory(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            schema = getattr(func, "_schema", None)
            if (
                schema is not None
                and schema.name in EMPTIES
                and isinstance(out, torch.Tensor)
                and out.is_floating_point()
                and out.numel()
                and out.device.type == "cpu"
            ):
                out.fill_(POISON["value"])  # below every mode: no op a recorder sees
            return out

    _FRESH[:] = [FreshMemory]


def fresh_memory():
    """A context in which fresh float memory is poisoned (nothing happens before poison_empty())."""
    import contextlib

    return _FRESH[0]() if _FRESH else contextlib.nullcontext()


def _flat(values):
    """The numbers of a (nested) list, as Tensor.tolist returns them, or a number alone."""
    if isinstance(values, (list, tuple)):
        for v in values:
            yield from _flat(v)
    else:
        yield values


def _storages(tensors) -> dict:
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        out.setdefault(s.data_ptr(), (s, t))
    return out


def _u8(storage):
    return as_bytes_view(storage)


# torch ops that only allocate, move, view or convert data: a launcher may use them on float tensors.
# Named by their qualified aten:: name (the schema's), never by a short name: a custom op registered
# as `mylib::clone` is not aten's clone, and computes out of sight like any other op of its own.
MOVES = {
    "aten::" + name
    for name in """empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros
    ones_like full full_like new_full fill fill_ zero_ copy copy_ clone _to_copy to view _unsafe_view reshape
    _reshape_alias expand expand_as as_strided as_strided_ permute transpose transpose_ t contiguous
    select slice unsqueeze unsqueeze_ squeeze squeeze_ flatten unflatten split split_with_sizes chunk
    narrow detach alias lift_fresh lift_fresh_copy set_ resize_ unbind movedim swapaxes
    _local_scalar_dense item""".split()
}

# Tensor methods that copy values to Python or numpy without an op a dispatch mode sees.
HOST_READS = {"tolist", "numpy", "__array__", "__dlpack__"}
# Tensor methods that run a Python function on each element, with no op a dispatch mode sees: the floats
# computed in Python.
PYTHON_EACH = {"apply_", "map_", "map2_"}
# Tensor methods that turn the values into text: torch formats them with every mode switched off
# (torch._tensor_str), so the values read, and the ops computing the text, are out of a mode's sight;
# the text parsed back is the floats on the host, as tolist() hands them over.
HOST_TEXT = {"__repr__", "__str__", "__format__"}

# Ops whose output holds none of their inputs' values (a fresh tensor shaped like one): it is not float
# memory for having been made from a float tensor.
DATA_FREE = EMPTIES | {
    "aten::" + n for n in "zeros zeros_like new_zeros ones ones_like new_ones full full_like new_full".split()
}
# How many flags computed from float memory a call may read to the host: a launcher's argument checks
# (`if bad.any(): raise`) read a few, one bit each; the values themselves never. More is the answer
# read out bit by bit.
FLAG_READS = 16

# Ops that hand Python a number read from a tensor's metadata, never from its values: the rest that return
# a Python scalar (torch.equal, allclose) read the values (Recorder.host_value).
METADATA = re.compile(
    r"::(sym_)?(size|stride|numel|storage_offset|dim|dense_dim|sparse_dim|_nnz|_dimI|_dimV|is_same_size|"
    r"is_set_to|is_coalesced|is_pinned|is_conj|is_neg|_is_zerotensor|is_contiguous|is_strides_like_format|"
    r"is_non_overlapping_and_dense|q_scale|q_zero_point|q_per_channel_axis|qscheme|is_complex|"
    r"is_floating_point|is_signed|is_inference|is_leaf|is_same|_has_same_storage_numel|"
    r"_has_compatible_shallow_copy_type|output_nr|_version|get_device)\b"
)

# Integer ops on floats' bits that compute nothing: an AND picks bit fields (L5's check of its sinks reads
# the exponent as `bits & 0x7F800000`, then compares), and with AND alone, which only clears bits, no sum or
# product can be built. Their results are still float memory, read to the host as such.
BIT_MASKS = {"aten::bitwise_and"}

# In-place ops that change a tensor's shape or storage, not the bytes in its memory.
RESHAPES = {
    "aten::" + name
    for name in "set_ resize_ resize_as_ as_strided_ transpose_ unsqueeze_ squeeze_ t_ detach_".split()
}

_TORCH_DIR = None
_GRADING_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME_KIND: dict = {}  # code object -> "torch" (torch or the grader: look further out), "own", "other"
_OWN_CODE: set = set()  # the code of Triton's functions that move a launch's arguments, and nothing else


def _triton_copy_code() -> set:
    """The code objects of the interpreter's functions that copy a launch's arguments to the host and
    back (and of the functions nested in them): the only torch ops Triton itself runs during a launch.
    Named by identity, not by file: Triton's frames also call hooks (a kernel's pre-run hooks, an
    autotuner's pre_hook), whose torch ops are the learner's computing. Empty where there is no
    interpreter: a compiled launch runs no torch op of its own."""
    import types

    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:
        return set()
    codes: set = set()

    def add(code):
        if code not in codes:
            codes.add(code)
            for const in code.co_consts:
                if isinstance(const, types.CodeType):
                    add(const)

    for name in ("_init_args_hst", "_restore_args_dev"):
        code = getattr(getattr(GridExecutor, name, None), "__code__", None)
        if code is not None:
            add(code)
    return codes


def _frame_kind(code) -> str:
    kind = _FRAME_KIND.get(code)
    if kind is None:
        name = os.path.abspath(code.co_filename or "")
        if code in _OWN_CODE:
            kind = "own"
        elif name.startswith((_TORCH_DIR, _GRADING_DIR)):
            kind = "torch"
        else:
            kind = "other"
        _FRAME_KIND[code] = kind
    return kind


def tritons_own(watch: TritonWatch) -> bool:
    """Whether the torch op running now is Triton's own: a launch runs, and the nearest caller outside
    torch and the grader is the interpreter copying the launch's arguments (_triton_copy_code). A plain
    Python function the kernel's body calls, and a hook Triton calls around the body (a pre-run hook,
    an autotuner's pre_hook or post_hook, a launch hook), computing with torch, is the learner's
    computing, launch or not."""
    global _TORCH_DIR
    if not watch.in_launch:
        return False
    if _TORCH_DIR is None:
        import torch

        _OWN_CODE.update(_triton_copy_code())
        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        kind = _frame_kind(frame.f_code)
        if kind != "torch":
            return kind == "own"
        frame = frame.f_back
    return False


def torch_compute_recorder(watch: TritonWatch):
    """A torch dispatch mode that records every torch op outside Triton's own code that computes floats
    from floats (an add, a matmul, a softmax, an index_put of values), or writes integers into a float
    tensor's memory (an index_put_ or copy_ into an int16 view of it): what a launcher never needs, and
    what computing the answer beside a kernel takes. provenance.judge refuses a result made that way."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    def floats(value) -> bool:  # complex numbers are floats too (an add in complex64 is an add)
        return any(t.is_floating_point() or t.is_complex() for t in tensors_in(value))

    def ptr(t) -> int:
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # a tensor with no storage of its own
            return -1

    _PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__

    class HostReads(TorchFunctionMode):
        """Tensor.tolist (and numpy's ways in) copy values to Python with no op a dispatch mode sees: a
        float tensor's, or an integer view of a float tensor's memory, is reported to the call's
        recorder (values read to the host, where an answer can be computed in plain Python). A function
        mode, not a patched Tensor.tolist: torch's methods stay torch's own."""

        def __init__(self, recorder):
            super().__init__()
            self.recorder = recorder

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", None) in PYTHON_EACH and floats(list(args)):
                self.recorder.note(f"{func.__name__} (a Python function run on the floats)")
            elif getattr(func, "__name__", None) in HOST_TEXT and args and isinstance(args[0], torch.Tensor):
                t, how = args[0], func.__name__.strip("_")
                if t.is_floating_point() or t.is_complex():
                    self.recorder.note(f"{how} (floats read to the host as text)")
                elif self.recorder.float_bits(t):
                    self.recorder.derived_read(f"{how} as text", t)
            elif getattr(func, "__name__", None) in HOST_READS and args and isinstance(args[0], torch.Tensor):
                t = args[0]
                if t.is_floating_point() or t.is_complex():
                    self.recorder.note(f"{func.__name__} (floats read to the host)")
                elif self.recorder.float_bits(t):
                    values = func(*args, **(kwargs or {}))
                    self.recorder.derived_read(func.__name__, t, values)
                    return values
            return func(*args, **(kwargs or {}))

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[str] = []
            # storage of a copy -> storages it was copied from (a launcher's .contiguous() of an input,
            # say): a kernel that reads the copy reads the input (run_call._unread_inputs)
            self.copied_from: dict[int, set[int]] = {}
            # storages that hold floats, or values computed from them: an int view of one, and what
            # any op made from one (an int tensor `bits + 0`, a comparison's flags) are float memory too
            self.float_memory: set[int] = set()
            self.flags_read = 0  # flags computed from float memory read to the host (FLAG_READS)

        def note(self, name: str) -> None:
            if not tritons_own(watch) and name not in self.seen:
                self.seen.append(name)

        def float_bits(self, tensor) -> bool:
            """A non-float tensor over float memory: an integer view of a float tensor (its bits read or
            written as integers), or any tensor an op computed from float memory."""
            return (
                not (tensor.is_floating_point() or tensor.is_complex()) and ptr(tensor) in self.float_memory
            )

        def launched(self, given, stored_into: set) -> None:
            """After a launch: the integer tensors it stored into hold values computed from float memory
            when it was given any (a kernel that copies floats' bits into an int32 tensor, whose tolist()
            then hands them to Python), as an op's result over float memory does."""
            tensors = tensors_in(given)
            if any(t.is_floating_point() or t.is_complex() or ptr(t) in self.float_memory for t in tensors):
                for t in tensors:
                    if not (t.is_floating_point() or t.is_complex()) and ptr(t) in stored_into:
                        self.float_memory.add(ptr(t))

        def derived_read(self, how: str, tensor, values=None) -> None:
            """Values computed from float memory read to the host: a few flags (bool, or integers that are
            all 0 or 1, as a kernel's int32 flags come back) are a launcher's argument check; anything
            else, or more flags than FLAG_READS, is the answer taken to Python. values: what was read."""
            flags = tensor.dtype == torch.bool or (
                values is not None and all(v in (0, 1) for v in _flat(values))
            )
            if flags and self.flags_read + tensor.numel() <= FLAG_READS:
                self.flags_read += tensor.numel()
                return
            what = "flags" if flags else "values"
            self.note(f"{how} ({what} computed from floats read to the host)")

        def host_value(self, name: str, short: str, func, args, inputs, out) -> None:
            """Values that leave an op for Python other than through item(): a Python scalar an op returns
            (torch.equal, allclose: a bool, no _local_scalar_dense under it), or the size of a result
            that depends on the values (nonzero, a boolean mask's selection, unique: its length is a
            count). From float memory, each is values read to the host: a bool or a size of bool flags
            counts as flags, as a flag's item() does, and anything else is the values themselves."""
            if isinstance(out, (bool, int, float, complex)) and not METADATA.search(name):
                sources = [t for t in inputs if t.is_floating_point() or t.is_complex() or self.float_bits(t)]
                if sources and isinstance(out, bool):
                    self.flags_to_host(short, 1)
                elif sources:
                    self.note(f"{short} (values computed from floats read to the host)")
            if torch.Tag.dynamic_output_shape not in getattr(func, "tags", ()):
                return
            if name.startswith("aten::index"):  # only a boolean mask among the indices sizes the result
                inputs = [t for t in tensors_in(list(args[1:])) if t.dtype in (torch.bool, torch.uint8)]
            for t in inputs:
                if t.is_floating_point() or t.is_complex():
                    self.note(f"{short} (floats read to the host through its result's size)")
                elif t.dtype == torch.bool and self.float_bits(t):
                    self.flags_to_host(short, t.numel(), " through its result's size")
                elif self.float_bits(t):
                    self.note(
                        f"{short} (values computed from floats read to the host through its result's size)"
                    )

        def flags_to_host(self, how: str, count: int, through: str = "") -> None:
            """count flags computed from float memory read to the host: a launcher's check reads a few."""
            if self.flags_read + count <= FLAG_READS:
                self.flags_read += count
                return
            self.note(f"{how} (flags computed from floats read to the host{through})")

        def __enter__(self):
            watch.recorder = self
            self.host_reads = HostReads(self)
            self.host_reads.__enter__()
            return super().__enter__()

        def __exit__(self, *exc):
            watch.recorder = None
            try:
                return super().__exit__(*exc)
            finally:
                self.host_reads.__exit__(*exc)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            schema = getattr(func, "_schema", None)
            name = schema.name if schema is not None else str(func)  # "aten::add", "mylib::clone"
            # how the screen names it: "add" for aten's, the full name for an op of someone's own
            short = name.split("::", 1)[-1] if name.startswith("aten::") else name
            # A tensor subclass with a __torch_dispatch__ of its own runs Python under this op with this
            # mode off the stack (func above called it): whatever it computes there goes unseen, so the
            # op is computing, whatever its name (a detach that adds).
            if any(t is not torch.Tensor and t.__torch_dispatch__ is not _PLAIN_DISPATCH for t in types):
                self.note(f"{short} (on a tensor subclass whose own code runs under it)")
            inputs = tensors_in(list(args) + list(kwargs.values()))
            outputs = tensors_in(out if isinstance(out, (list, tuple)) else [out])
            own = tritons_own(watch)
            sources = {ptr(t) for t in inputs}
            for t in inputs:
                if t.is_floating_point() or t.is_complex():
                    self.float_memory.add(ptr(t))
            # Integers over float memory (a float tensor's bits viewed as int32, its values converted or
            # quantized, what any op computed from them): arithmetic on them is float arithmetic in
            # another dtype (a float add is an add of exponent-shifted integers); bool flags are a check.
            bits = any(t.dtype != torch.bool and self.float_bits(t) for t in inputs)
            # Computed from float memory (views and results alike): the output is float memory too, so
            # `(x.view(torch.int32) + 0).tolist()` reads floats to the host as x.tolist() does.
            derived = name not in DATA_FREE and any(ptr(t) in self.float_memory for t in inputs)
            for t in outputs:
                dst = ptr(t)
                if dst not in sources:  # a new storage; one freed before may have had its address
                    self.float_memory.discard(dst)
                if t.is_floating_point() or t.is_complex() or derived:
                    self.float_memory.add(dst)
            if not own and name in MOVES:
                for t in outputs:
                    dst = ptr(t)
                    if dst in sources:  # written in place (copy_): it now holds its sources too
                        self.copied_from.setdefault(dst, set()).update(sources - {dst})
                    else:  # a new storage; start afresh
                        self.copied_from[dst] = set(sources)
            if name == "aten::_local_scalar_dense":
                # A float read to the host (item(), float()): a launcher reads lengths, never values;
                # an answer computed in Python from the values is out of every other check's sight.
                if floats(list(args)):
                    self.note("item (a float read to the host)")
                else:
                    for t in inputs:
                        if self.float_bits(t):
                            self.derived_read("item", t, [out])
            elif not own:
                self.host_value(name, short, func, args, inputs, out)
            if own:
                return out
            written = []
            if schema is not None:  # the tensors the op writes: its mutable arguments (self of index_put_)
                values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args) :]]
                for a, v in zip(schema.arguments, values):
                    if a.alias_info is not None and a.alias_info.is_write:
                        written += tensors_in([v])
            if name not in RESHAPES and any(map(self.float_bits, written)):
                label = f"{short} (integers written into a float tensor's memory)"
                if label not in self.seen:
                    self.seen.append(label)
            elif name not in MOVES and floats(inputs) and floats(outputs) and short not in self.seen:
                self.seen.append(short)
            elif (
                name not in MOVES
                and name not in RESHAPES
                and name not in BIT_MASKS
                and (
                    (bits and any(t.dtype != torch.bool for t in outputs))
                    or (floats(inputs) and any(t.dtype != torch.bool and not floats([t]) for t in outputs))
                )
            ):
                # integers computed from floats, or from their bits (an argmax, a quantize, an add of
                # int64 views): what a float op computes, taken through integers
                label = f"{short} (integers computed from floats or their bits)"
                if label not in self.seen:
                    self.seen.append(label)
            return out

    return Recorder()
