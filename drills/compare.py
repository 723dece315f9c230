"""The one comparison every grader uses: an output against an fp32 oracle.

`allclose` with a loose absolute tolerance passes an all-zeros output when the true values are small
(KernelBench shipped that bug), so three checks must all hold:
  1. no NaN or inf where the oracle is finite;
  2. relative error of the whole tensor, ||out - ref|| / ||ref||, below `rel` (zeros give 1.0);
  3. every element within atol + rtol * |ref|.
A failure says what went wrong in words and where, naming the dimensions (sequence, head, ...).
"""

from __future__ import annotations

import torch

# (atol, rtol, rel): elementwise tolerance and whole-tensor relative error, by output dtype.
TOLERANCES = {
    torch.float32: (1e-4, 1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2, 2e-2),
}


def _where(index: tuple[int, ...], dims: tuple[str, ...] | None) -> str:
    if dims and len(dims) == len(index):
        return ", ".join(f"{d}={i}" for d, i in zip(dims, index))
    return str(index)


def mismatch(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dims: tuple[str, ...] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    rel: float | None = None,
) -> str | None:
    """None when `actual` matches `expected`; otherwise a few lines saying what is wrong and where."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    d_atol, d_rtol, d_rel = TOLERANCES.get(actual.dtype, TOLERANCES[torch.float16])
    atol, rtol, rel = (
        (d_atol if atol is None else atol),
        (d_rtol if rtol is None else rtol),
        (d_rel if rel is None else rel),
    )
    a = actual.detach().float().cpu()
    e = expected.detach().float().cpu()

    bad_values = ~torch.isfinite(a) & torch.isfinite(e)
    if bad_values.any():
        first = tuple(bad_values.nonzero()[0].tolist())
        return (
            f"{int(bad_values.sum())} NaN/inf values where the reference is finite; "
            f"first at [{_where(first, dims)}] = {a[first].item()}"
        )

    ref_norm = e.norm().item()
    rel_err = (a - e).norm().item() / max(ref_norm, 1e-30)
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    over = err > bound
    if rel_err <= rel and not over.any():
        return None

    worst = tuple(divmod_index(int(err.argmax()), a.shape))
    lines = [
        f"relative error ||out - ref|| / ||ref|| = {rel_err:.3g} (allowed {rel:g}); "
        f"||out|| / ||ref|| = {a.norm().item() / max(ref_norm, 1e-30):.3g}",
        f"{int(over.sum())} of {over.numel()} elements off by more than {atol:g} + {rtol:g} * |ref|; "
        f"largest error {err.max().item():.3g} at [{_where(worst, dims)}]: got {a[worst].item():.5g}, "
        f"expected {e[worst].item():.5g}",
    ]
    if over.any():
        first = tuple(over.nonzero()[0].tolist())
        lines.append(
            f"first mismatch at [{_where(first, dims)}]: got {a[first].item():.5g}, expected {e[first].item():.5g}"
        )
    return "\n".join(lines)


def divmod_index(flat: int, shape: torch.Size) -> list[int]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return index[::-1]


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dims: tuple[str, ...] | None = None, **tol
) -> None:
    problem = mismatch(actual, expected, dims, **tol)
    if problem is not None:
        raise AssertionError(problem)


def assert_untouched(
    buffer: torch.Tensor, canary: float, keep: torch.Tensor, what: str, dims: tuple[str, ...] | None = None
) -> None:
    """Every element outside `keep` (bool mask) must still hold `canary`: nothing wrote past its rows."""
    outside = ~keep
    changed = outside & ~(buffer == canary)
    if changed.any():
        first = tuple(changed.nonzero()[0].tolist())
        raise AssertionError(
            f"{int(changed.sum())} canary elements of {what} were overwritten; "
            f"first at [{_where(first, dims)}] = {buffer[first].item()}"
        )
