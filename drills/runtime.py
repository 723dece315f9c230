"""Runtime selection: compiled Triton on a CUDA GPU, Triton's interpreter on the CPU otherwise.

Triton reads TRITON_INTERPRET when `@triton.jit` runs, that is when a kernel module is imported, so
`select()` must run before any lesson module is imported. `drills/__init__.py` calls it for that
reason; everything else asks `current()` what was chosen.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Runtime:
    interpreter: bool  # True: kernels run in Triton's interpreter on CPU tensors
    device: str  # "cuda" or "cpu": where lesson tensors must live
    gpu_name: str | None  # e.g. "NVIDIA H200"; None under the interpreter
    triton_version: str

    @property
    def banner(self) -> str:
        if self.interpreter:
            return f"runtime: Triton interpreter on CPU (Triton {self.triton_version}; small shapes, bf16 tl.dot exact)"
        return f"runtime: {self.gpu_name} with compiled Triton {self.triton_version}"


def _interpreter_forced() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def _no_gpu_here() -> bool:
    """True when this machine certainly has no GPU torch could use: Linux or macOS with no NVIDIA or AMD
    device node. Deciding that without importing torch saves a command like `make test` on a laptop
    about a second and a half: the process that grades only starts others, and they import torch."""
    if not sys.platform.startswith(("linux", "darwin")):
        return False
    nodes = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")
    return not any(os.path.exists(node) for node in nodes)


@functools.cache
def select() -> Runtime:
    """Decide once per process; a TRITON_INTERPRET=1 already in the environment is respected."""
    if _interpreter_forced() or _no_gpu_here():
        use_gpu = False
    else:
        import torch  # imported here so that `import drills.runtime` alone stays cheap

        use_gpu = torch.cuda.is_available()
    if not use_gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton  # after the variable is set, so that triton's knobs see it

    if not use_gpu and os.environ.get("DRILLS_FRONTEND_CACHE", "1") != "0":
        # The interpreter's front-end objects built once per shape, not once per op and program: the same
        # results, a quarter less time in every interpreted kernel (drills/frontend_cache.py).
        # DRILLS_FRONTEND_CACHE=0 runs Triton's own front end, to measure the difference.
        from drills import frontend_cache

        frontend_cache.install()

    return Runtime(
        interpreter=not use_gpu,
        device="cuda" if use_gpu else "cpu",
        gpu_name=_gpu_name() if use_gpu else None,
        triton_version=triton.__version__,
    )


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def current() -> Runtime:
    return select()
