"""make doctor: the versions, the GPU and its compute capability, which runtime runs the kernels
(compiled Triton or its interpreter), and the known traps, each marked as applying here or not, with
what to do about it."""

from __future__ import annotations

import importlib
import re
import sys


def _version(module_name: str) -> str:
    try:
        return importlib.import_module(module_name).__version__
    except ImportError:
        return "not installed"


def _distribution_version(name: str) -> str:
    """An installed distribution's own version (the jupyter meta-package has no __version__)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _older(version: str, than: tuple[int, ...]) -> bool:
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[: len(than)])
    return numbers < than


def doctor_lines() -> list[str]:
    import platform

    import torch

    import drills.runtime

    runtime = drills.runtime.current()
    numpy_version, triton_version = _version("numpy"), _version("triton")
    cuda = torch.cuda.is_available()
    lines = [
        f"python  {platform.python_version()} ({sys.executable})",
        f"torch   {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
        f"triton  {triton_version}",
        f"numpy   {numpy_version}",
    ]
    capability = None
    if cuda:
        capability = torch.cuda.get_device_capability()
        lines.append(
            f"GPU     {torch.cuda.get_device_name()}, compute capability {capability[0]}.{capability[1]} "
            f"(sm_{capability[0]}{capability[1]}), {torch.cuda.device_count()} visible"
        )
    else:
        lines.append("GPU     none (torch.cuda.is_available() is False)")
    if runtime.interpreter:
        why = "TRITON_INTERPRET=1 is set" if cuda else "there is no CUDA GPU"
        lines.append(
            f"runtime Triton's interpreter on the CPU, because {why}: kernels run as Python, on small shapes"
        )
    else:
        lines.append(f"runtime compiled Triton on {runtime.gpu_name}")
    from drills.grading.learner import sandbox

    lines.append(f"sandbox {sandbox.status()}")
    lines.append(
        f"extras  Jupyter (make notebooks): {_distribution_version('jupyter')} (nbclient "
        f"{_distribution_version('nbclient')}); FlashInfer (a benchmark peer): "
        f"{_version('flashinfer')}"
    )

    traps = [
        (
            "bf16 tl.dot and bf16 arithmetic are wrong in Triton's own interpreter (it computes on the "
            "uint16 bits: values near 1e10; seen in Triton 3.6, 3.8 and 3.9)",
            runtime.interpreter,
            "make test computes them exactly in your file's process (bf16 cases run on the CPU too); "
            "a kernel you run yourself under the interpreter outside make test still gets Triton's garbage",
        ),
        (
            "CUDA tensors under the interpreter give all-zero results",
            runtime.interpreter and cuda,
            "create tensors on drills.runtime.current().device (the CPU under the interpreter), or unset "
            "TRITON_INTERPRET to run compiled on this GPU",
        ),
        (
            "fp32 tl.dot runs as TF32 on GPUs (about 1e-3 relative error; the interpreter is exact fp32)",
            cuda and not runtime.interpreter and capability is not None and capability[0] >= 8,
            'pass input_precision="ieee" to tl.dot on fp32 inputs that are compared with an fp32 oracle',
        ),
        (
            "numpy 2.4 or newer breaks Triton 3.6's interpreter (int() of a 1-element array is an error)",
            not _older(numpy_version, (2, 4))
            and numpy_version != "not installed"
            and _older(triton_version, (3, 7)),
            'pip install "numpy<2.4" into this Python (the Makefile\'s .venv pins it)',
        ),
        (
            "Triton 3.9's interpreter refuses a mask that combines a tile of bools with a scalar bool "
            "computed from a load (`(offs < n) & (tl.load(p) >= 0)`: 'mask has unsupported dtype')",
            runtime.interpreter and not _older(triton_version, (3, 9)),
            "turn the scalar into a bound first and compare the tile with it (`first = tl.where(tl.load(p) >= 0, "
            "0, n0)`, then `offs >= first`), as F2's merge does",
        ),
        (
            "tl.dot needs every dimension >= 16 on a GPU, which the interpreter does not check",
            runtime.interpreter,
            "pad small dimensions to 16 (as GROUP_PAD does in L2) before you trust an interpreter pass",
        ),
    ]
    lines.append("known traps:")
    for what, applies, fix in traps:
        lines.append(f"  [{'applies here' if applies else 'not here'}] {what}")
        lines.append(f"      what to do: {fix}")
    return lines


def main() -> int:
    """make doctor: print the report."""
    print("\n".join(doctor_lines()))
    return 0
