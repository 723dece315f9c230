"""Recording Triton kernel launches: which kernels a learner's function launched, with what grid and
which compile-time (constexpr) arguments. The check that a result comes from the learner's own kernel
is built on it, and so are checks of a launch's shape (T5 must visit more than one key block).

Every launch, compiled (`JITFunction.run`) or interpreted (`InterpretedFunction.run`), goes through
`run` with warmup=False, also when an autotuner or heuristics wrapper sits in front, so patching that
method on both classes, only inside the `with` block, sees them all.

When the grader talks to the learner's code in another process (drills/grading), `record_launches`
asks that process to record; the `Launch` records come back the same way.
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


def _grid(grid, args, kwargs) -> tuple:
    try:
        if callable(grid):
            return ()  # an autotuned grid depends on the chosen config; not recorded
        grid = tuple(int(g) for g in grid)
        return grid + (1,) * (3 - len(grid))
    except Exception:
        return ()


def describe(fn_self, args, kwargs) -> Launch:
    fn = getattr(fn_self, "fn", None)
    simple = (bool, int, float, str)
    constexprs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup") and isinstance(v, simple)}
    return Launch(
        getattr(fn, "__module__", "?"),
        getattr(fn, "__name__", "?"),
        _grid(kwargs.get("grid"), args, kwargs),
        constexprs,
    )


@contextlib.contextmanager
def count_triton_launches():
    """Record every Triton kernel launched in this process inside the block."""
    launches = Launches()
    patched = []
    for cls in _kernel_classes():
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            if not kwargs.get("warmup", False):
                launches.calls.append(describe(self, args, kwargs))
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
