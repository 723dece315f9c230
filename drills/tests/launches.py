"""Counting Triton kernel launches: the check that a learner's file computes its result with its own
Triton kernel, not with torch (a fallback, or a copy of the grader's oracle) that gives the same numbers.

Every launch, compiled (`JITFunction.run`) or interpreted (`InterpretedFunction.run`), goes through
`run` with warmup=False, also when an autotuner or heuristics wrapper sits in front, so patching that
method on both classes, only inside the `with` block, sees them all.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class Launches:
    kernels: list[tuple[str, str]] = field(default_factory=list)  # (module, kernel name), one per launch

    def __len__(self) -> int:
        return len(self.kernels)

    def from_module(self, module_name: str) -> list[str]:
        return [name for module, name in self.kernels if module == module_name]


def _kernel_classes() -> list[type]:
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # a Triton without the interpreter
        return classes
    return classes + [InterpretedFunction]


@contextlib.contextmanager
def count_triton_launches():
    """Record every Triton kernel launched inside the block: `with count_triton_launches() as launches:`."""
    launches = Launches()
    patched = []
    for cls in _kernel_classes():
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            if not kwargs.get("warmup", False):
                fn = getattr(self, "fn", None)
                launches.kernels.append((getattr(fn, "__module__", "?"), getattr(fn, "__name__", "?")))
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


def assert_runs_a_triton_kernel(impl, call, what: str) -> None:
    """call() must launch at least one @triton.jit kernel defined in the module under test (impl)."""
    with count_triton_launches() as launches:
        call()
    if launches.from_module(impl.__name__):
        return
    others = sorted({f"{module}.{name}" for module, name in launches.kernels})
    elsewhere = f" (it launched only kernels from other files: {', '.join(others)})" if others else ""
    raise AssertionError(
        f"{what} returned without launching a Triton kernel of your file{elsewhere}: right numbers "
        "computed with torch (a fallback, or a copy of the grader's oracle) do not count; launch your "
        "@triton.jit kernel from the launcher")
