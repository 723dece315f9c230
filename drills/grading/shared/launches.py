"""Recording Triton kernel launches: which kernels a learner's function launched, with what grid and
which compile-time (constexpr) arguments. The check that a result comes from the learner's own kernel
is built on it, and so are checks of a launch's shape (T5 must visit more than one key block).

Every launch, compiled (`JITFunction.run`) or interpreted (`InterpretedFunction.run`), goes through
`run` with warmup=False, also when an autotuner or heuristics wrapper sits in front, so patching that
method on both classes, only inside the `with` block, sees them all.

When the grader talks to the learner's code in another process (drills/grading), `record_launches`
asks that process to record; the `Launch` records come back the same way.

Every grid is checked against CUDA's limits (GRID_LIMITS) before its launch runs, and
`assert_grids_fit` runs a launcher at its largest sizes with launches turned into no-ops to check them
where no small case reaches.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Launch:
    module: str  # where the kernel's Python function is defined, e.g. "drills.mine.l2_paged_decode"
    name: str  # the kernel's name
    grid: tuple  # the launch grid, padded to 3 dimensions ((4,) -> (4, 1, 1)); () when unknown
    constexprs: dict  # the int/bool/str/float keyword arguments (BLOCK_N=16, num_warps=4, ...)


@dataclass
class Launches:
    calls: list[Launch] = field(default_factory=list)

    @property
    def kernels(self) -> list[tuple[str, str]]:  # (module, kernel name), one per launch
        return [(c.module, c.name) for c in self.calls]

    def __len__(self) -> int:
        return len(self.calls)

    def from_module(self, module_name: str) -> list[str]:
        return [c.name for c in self.calls if c.module == module_name]


def _kernel_classes() -> list[type]:
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # a Triton without the interpreter
        return classes
    return classes + [InterpretedFunction]


# CUDA's limits on a launch grid, in programs (thread blocks) per axis: x up to 2**31 - 1, y and z up to
# 65535 (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"). Triton launches
# grid axis 0 as x, 1 as y, 2 as z, and its interpreter runs any grid.
GRID_LIMITS = (2**31 - 1, 65535, 65535)
# Triton's largest tensor, in elements (TRITON_MAX_TENSOR_NUMEL): a tl.arange or block past it does not compile.
MAX_TENSOR_NUMEL = 2**20


def _bound_arguments(fn_self, args, kwargs) -> dict:
    """The kernel's arguments by name, with the defaults of those not passed: what Triton hands a
    callable grid (META)."""
    import inspect

    bound = {}
    try:
        for name, p in inspect.signature(fn_self.fn).parameters.items():
            if p.default is not inspect.Parameter.empty:
                bound[name] = p.default
    except (AttributeError, TypeError, ValueError):
        pass
    bound.update(zip(list(getattr(fn_self, "arg_names", []) or []), args))
    bound.update({k: v for k, v in kwargs.items() if k not in ("grid", "warmup")})
    return bound


def _grid(grid, args, kwargs, fn_self=None) -> tuple:
    """The launch grid padded to 3 axes; a callable grid (an autotuner's, `lambda META: ...`) is resolved
    on the kernel's arguments as Triton resolves it. () when it cannot be known."""
    try:
        if callable(grid):
            if fn_self is None:
                return ()
            grid = grid(_bound_arguments(fn_self, args, kwargs))
        grid = tuple(int(g) for g in grid)
        return grid + (1,) * (3 - len(grid))
    except Exception:
        return ()


def grid_problem(grid: tuple, name: str = "the kernel") -> str | None:
    """What is wrong with a launch grid by CUDA's limits (a GPU refuses such a launch with "invalid
    argument"), or None when it fits."""
    for axis, (size, limit) in enumerate(zip(grid, GRID_LIMITS)):
        if size <= limit:
            continue
        fix = (
            "put the large dimension on grid axis 0 (up to 2**31 - 1 programs) and the small ones on axes 1 "
            "and 2, or loop over it inside the program"
            if axis
            else "give each program more of the work (a loop inside the program over several blocks)"
        )
        return (
            f"launch grid {tuple(grid)} of {name} is past CUDA's limit on grid axis {axis}: {size} programs, "
            f"where CUDA allows at most {limit} on that axis; a GPU refuses this launch (invalid argument) "
            f"at these sizes: {fix}"
        )
    return None


def check_grid(fn_self, args, kwargs) -> None:
    """Raise GridTooLarge when this launch's grid is past CUDA's limits (before it runs, on every machine)."""
    grid = _grid(kwargs.get("grid"), args, kwargs, fn_self)
    problem = grid_problem(grid, getattr(getattr(fn_self, "fn", None), "__name__", "the kernel"))
    if problem is not None:
        from drills.grading.shared.errors import GridTooLarge

        raise GridTooLarge(problem)


def describe(fn_self, args, kwargs) -> Launch:
    fn = getattr(fn_self, "fn", None)
    simple = (bool, int, float, str)
    constexprs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup") and isinstance(v, simple)}
    return Launch(
        getattr(fn, "__module__", "?"),
        getattr(fn, "__name__", "?"),
        _grid(kwargs.get("grid"), args, kwargs, fn_self),
        constexprs,
    )


@contextlib.contextmanager
def count_triton_launches(run_kernels: bool = True):
    """Record every Triton kernel launched in this process inside the block; with run_kernels=False each
    launch is only recorded (a no-op: nothing runs, nothing is written)."""
    launches = Launches()
    patched = []
    for cls in _kernel_classes():
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            if not kwargs.get("warmup", False):
                launches.calls.append(describe(self, args, kwargs))
                if not run_kernels:
                    return None
            return _original(self, *args, **kwargs)

        patched.append((cls, cls.__dict__.get("run")))
        cls.run = run
    try:
        yield launches
    finally:
        for cls, own in reversed(patched):
            if own is None:
                del cls.run
            else:
                cls.run = own


@contextlib.contextmanager
def record_launches(impl):
    """`with record_launches(impl) as launches:` records the kernels the lesson module `impl` launches
    inside the block, in this process or in the learner's process when impl lives there."""
    remote = getattr(impl, "_drills_record_launches", None)
    if remote is not None:
        with remote() as launches:
            yield launches
        return
    with count_triton_launches() as launches:
        yield launches


@dataclass(frozen=True)
class Load:
    """One tl.load of a watched tensor's storage (record_loads), by one program of one launch."""

    launch: int  # which launch of its call (1 = the first)
    target: int  # which of the tensors record_loads was given
    program: tuple  # the program's (x, y, z) index in the grid
    offsets: list  # the byte offset from the storage's first byte of each of its lanes in that storage:
    # the active lanes, or every lane when none was on (a load wholly masked off still costs its tile's
    # arithmetic on a GPU)
    active: bool  # whether any lane was on


@dataclass
class Loads:
    tensors: list
    loads: list[Load] = field(default_factory=list)

    def indices(self, load: Load, dim: int) -> list[int]:
        """The index along `dim` of the element each lane of `load` reads, in the tensor it was recorded
        for: its element offset from the tensor's first element, divided by the stride of `dim` and
        wrapped at its size (exact for a tensor whose strides nest, contiguous or a permutation of it,
        and for its lanes that fall outside the tensor's own elements, a padding row of its buffer)."""
        t = self.tensors[load.target]
        size, stride, first = t.element_size(), t.stride(dim), t.storage_offset()
        return [(o // size - first) // stride for o in load.offsets]

    def last_rows(self, target: int, dim: int, rows: int) -> dict:
        """Each program's last row of tensor `target` along `dim` (in [0, rows)) that an active load of it
        read: {(launch, program): row}. A causal program's last query row bounds the keys it may see."""
        last: dict = {}
        for load in self.loads:
            if load.target == target and load.active:
                seen = [r for r in self.indices(load, dim) if 0 <= r < rows]
                if seen:
                    key = (load.launch, load.program)
                    last[key] = max(seen + [last.get(key, -1)])
        return last


@contextlib.contextmanager
def record_loads(impl, *tensors):
    """`with record_loads(impl, q, k) as loads:` records, for the calls of the learner's functions made
    inside the block, every load their kernels made from the storage of each tensor given: per load, the
    launch, the program (its grid index) and the byte offset of its active lanes (of every lane when
    none is on). A check of
    which blocks each program visits reads it (a causal program loading key blocks wholly above its
    diagonal costs a GPU twice the arithmetic, and its output is right). Only the interpreter sees
    loads: elsewhere (a GPU, or a module run in this process) `loads` is None."""
    remote = getattr(impl, "_drills_record_loads", None)
    import drills.runtime

    if remote is None or not drills.runtime.current().interpreter:
        yield None
        return
    with remote(tensors) as loads:
        yield loads


def assert_runs_a_triton_kernel(impl, call, what: str) -> None:
    """call() must compute its result with a @triton.jit kernel of the file under test (impl): it must
    launch one defined in that file, and when the learner's code runs in its own process, running the
    same call with every Triton launch turned into a no-op must change the result (else the numbers came
    from torch, or from a copy, and the kernel only ran for show)."""
    calling = getattr(impl, "_drills_calling", None)
    with record_launches(impl) as launches, calling(provenance=True) if calling else contextlib.nullcontext():
        call()
    if launches.from_module(impl.__name__):
        return
    others = sorted({f"{module}.{name}" for module, name in launches.kernels})
    elsewhere = f" (it launched only kernels from other files: {', '.join(others)})" if others else ""
    raise AssertionError(
        f"the output did not come from your kernel: {what} returned without launching a Triton kernel of your "
        f"file{elsewhere}; right numbers computed with torch (a fallback, or a copy of the grader's oracle) "
        "do not count: launch your @triton.jit kernel from the launcher"
    )


def assert_grids_fit(impl, call, what: str) -> Launches:
    """call() runs the lesson's launcher (impl's) at the largest sizes its domain admits, with every Triton
    launch a no-op that is only recorded: no kernel runs, so the check costs what the launcher's Python
    costs, and the tensors may be small along the dimensions no grid axis counts. Every grid must fit
    CUDA's limits (GRID_LIMITS), which Triton's interpreter does not enforce and which the graders' small
    cases never reach. In the learner's process the launch itself raises GridTooLarge (instrument.py);
    the records are checked again here for a launcher run in this process."""
    calling = getattr(impl, "_drills_calling", None)
    if calling is not None:
        with record_launches(impl) as launches, calling(launches=False):
            call()
    else:
        with count_triton_launches(run_kernels=False) as launches:
            call()
    if not launches.calls:
        raise AssertionError(
            f"{what} launched no Triton kernel: launch your @triton.jit kernel from the launcher"
        )
    for c in launches.calls:
        problem = grid_problem(c.grid, c.name)
        if problem is not None:
            from drills.grading.shared.errors import GridTooLarge

            raise GridTooLarge(f"{what}: {problem}")
        # A block sized from the problem (BLOCK = next_power_of_2(n), one program for it all) runs in the
        # interpreter at any size, but Triton compiles no tensor past 2**20 elements: at the largest
        # sizes such a launch fails to compile on a GPU. Launch options (num_warps...) are not blocks.
        for key, value in c.constexprs.items():
            if (
                type(value) is int
                and value > MAX_TENSOR_NUMEL
                and value & (value - 1) == 0
                and not key.startswith("num_")
                and key != "maxnreg"
            ):
                raise AssertionError(
                    f"{what}: {c.name} is launched with {key} = {value}, a block of 2**{value.bit_length() - 1} "
                    f"elements sized from the problem: Triton compiles no tensor of more than 2**20 "
                    f"elements, so a GPU fails to compile this launch. Keep the block at a fixed size and "
                    "give the rest to more programs, or to a loop inside each program"
                )
        # Every grader's largest sizes need more programs than 65535 (65537, 70000, ...), so an axis of
        # exactly 65535 (or of axis 0's own limit) is a grid clamped to fit, min(programs, 65535): it
        # launches, and the work of the programs cut off is never done, which no small case and no dry
        # run would otherwise show.
        for axis, (size, limit) in enumerate(zip(c.grid, GRID_LIMITS)):
            if size in (GRID_LIMITS[1], limit):
                raise AssertionError(
                    f"{what}: launch grid {tuple(c.grid)} of {c.name} holds exactly {size} programs on grid "
                    f"axis {axis}, a grid clamped with min(programs, {size}): it launches, but the programs "
                    f"past CUDA's limit on grid axis {axis} as you clamped it never run, so their part of "
                    "the output is never written. Launch every program the sizes need on grid axis 0 (up "
                    "to 2**31 - 1), or loop inside each program over the blocks past the limit"
                )
    return launches
