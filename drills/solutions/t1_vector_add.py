"""T1 reference: a first Triton kernel, out = x + y on 1-D tensors.

Every element is read twice (once from x, once from y) and written once, and there is one add per
element, so the kernel is a pure memory stream and its time is bytes / bandwidth:

    bytes = 3 * n * element_size   # n = 2**28 fp16: 3 * 268,435,456 * 2 = 1.61 GB, >= 335 us at 4.8 TB/s

Read top to bottom: the kernel (one program per BLOCK elements), then the launcher that validates,
allocates and computes the grid. Every later lesson keeps this split: the kernel only computes, the
launcher owns shapes, dtypes and the grid. Explainer: drills/content/t1_vector_add.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills import validate

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def vector_add_kernel(
    x_ptr,  # [n]
    y_ptr,  # [n]
    out_ptr,  # [n], possibly a view into a larger buffer
    n,  # number of elements
    BLOCK: tl.constexpr,  # elements per program, a power of two (tl.arange needs one)
):
    # Section 3.1 "Program ids": this program owns elements [pid * BLOCK, (pid + 1) * BLOCK).
    # Widened to int64: pid * BLOCK passes 2**31 once n does, and int32 would wrap to a negative offset.
    pid = tl.program_id(0).to(tl.int64)

    # Section 3.2 "Offsets": one offset per lane of the block.
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]

    # Section 3.3 "Masks": the last program's block runs past n unless BLOCK divides n.
    mask = offs < n  # [BLOCK]
    x = tl.load(x_ptr + offs, mask=mask)  # [BLOCK]; masked lanes are never read
    y = tl.load(y_ptr + offs, mask=mask)  # [BLOCK]
    tl.store(out_ptr + offs, x + y, mask=mask)  # masked lanes are never written


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    """Launch without the input checks: the benchmark times this (and tries other BLOCKs), vector_add adds
    the checks. Only BLOCK is checked here, since only callers of _launch choose it."""
    if isinstance(BLOCK, bool) or not isinstance(BLOCK, int) or not validate.is_pow2(BLOCK):
        raise ValueError(f"BLOCK = {BLOCK!r} must be a power of two: tl.arange(0, BLOCK) needs one")
    n = x.numel()
    # Section 3.4 "The grid": one program per BLOCK elements, rounded up so the tail gets its program.
    grid = (triton.cdiv(n, BLOCK),)
    vector_add_kernel[grid](x, y, out, n, BLOCK=BLOCK, num_warps=num_warps)
    return out


def vector_add(x, y, out=None):
    """Elementwise sum of two vectors: out[i] = x[i] + y[i].

    x    [n], float16, bfloat16 or float32, contiguous
    y    [n], x's dtype and device, contiguous
    out  optional [n] of x's dtype (a contiguous view into a larger buffer is fine), written in place;
         it may be x or y itself, but must not partly overlap them

    Returns out [n].
    """
    validate.tensor("x", x, 1, DTYPES)
    validate.tensor("y", y, 1, (x.dtype,))
    named = dict(x=x, y=y)
    if out is not None:
        named["out"] = validate.tensor("out", out, 1, (x.dtype,))
    validate.same_device(**named)
    for name, t in named.items():
        if t.shape != x.shape:
            raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(t.shape)}")
    # The kernel adds offs to a base pointer, so the elements must be adjacent.
    validate.last_dim_contiguous(**named)
    if out is not None:
        for name in ("x", "y"):
            # out may be x or y itself (each lane reads its element before writing it), but a shifted view
            # would make a program read elements that another program has already overwritten.
            gap = abs(out.data_ptr() - named[name].data_ptr())
            if 0 < gap < out.numel() * out.element_size():
                raise ValueError(
                    f"out partly overlaps {name}: it may be {name} itself or separate memory, "
                    f"not a shifted view of it"
                )
    if out is None:
        out = torch.empty_like(x)
    if x.numel() == 0:
        return out  # nothing to add; a grid of zero programs is not launched
    return _launch(x, y, out)
