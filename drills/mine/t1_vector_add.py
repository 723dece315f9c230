"""T1, your file: a first Triton kernel, out = x + y on 1-D tensors.

Fill in `vector_add_kernel` and the grid in `_launch` below; the checks in `vector_add` are complete.
Read drills/content/t1_vector_add.md first: every TODO names the section that teaches it.
Grade with `make test L=t1`. Start by deleting the `raise NotImplementedError` line in vector_add.

    bytes = 3 * n * element_size   # n = 2**28 fp16: 3 * 268,435,456 * 2 = 1.61 GB, >= 335 us at 4.8 TB/s
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
    # TODO(section 3.1 "Program ids"): which block this program owns: its program id along axis 0,
    # widened to int64.

    # TODO(section 3.2 "Offsets"): the BLOCK element offsets this program owns, [BLOCK].

    # TODO(section 3.3 "Masks"): a mask that is False past the last element; load x and y and store
    # x + y, all three under the mask.
    pass


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    """Launch without the input checks: the benchmark times this (and tries other BLOCKs), vector_add adds
    the checks. Only BLOCK is checked here, since only callers of _launch choose it."""
    if isinstance(BLOCK, bool) or not isinstance(BLOCK, int) or not validate.is_pow2(BLOCK):
        raise ValueError(f"BLOCK = {BLOCK!r} must be a power of two: tl.arange(0, BLOCK) needs one")
    n = x.numel()
    # TODO(section 3.4 "The grid"): a 1-tuple, the number of programs needed to cover all n elements
    # with BLOCK elements each (the last block may be partly filled).
    grid = None
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
    raise NotImplementedError(
        "t1 is not started: fill in vector_add_kernel and the grid in drills/mine/t1_vector_add.py, then delete this line (read drills/content/t1_vector_add.md)"
    )
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
