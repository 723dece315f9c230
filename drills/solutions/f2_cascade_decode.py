"""F2 reference: Cascade attention: a shared prefix read once.

What the kernel is for, and its bytes or FLOPs formula. The scaffold's placeholder doubles a vector, one
read and one write per element, so its time is bytes over bandwidth:

    bytes = 2 * n * element_size   # read x, write out

Read top to bottom: the kernel, then the launcher that validates, allocates and computes the grid.
Explainer: drills/content/f2_cascade_decode.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills import validate

DTYPES = (torch.float16, torch.float32)


@triton.jit
def cascade_decode_kernel(
    x_ptr,  # [n]
    out_ptr,  # [n]
    n,  # number of elements
    BLOCK: tl.constexpr,  # elements per program, a power of two (tl.arange needs one)
):
    # Section 3.1 "One program per block": this program owns elements [pid * BLOCK, (pid + 1) * BLOCK).
    pid = tl.program_id(0).to(tl.int64)  # int64: pid * BLOCK passes 2**31 on large inputs
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    # Section 3.2 "The last block": BLOCK need not divide n, so the last program masks its tail.
    mask = offs < n  # [BLOCK]
    x = tl.load(x_ptr + offs, mask=mask)  # [BLOCK]
    tl.store(out_ptr + offs, 2 * x, mask=mask)


def _launch(x, out, BLOCK=1024, num_warps=4):
    """Launch without the input checks: a benchmark times this, cascade_decode adds the checks."""
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK),)  # rounded up: the last block may be partly filled
    cascade_decode_kernel[grid](x, out, n, BLOCK=BLOCK, num_warps=num_warps)
    return out


def cascade_decode(x):
    """out = 2 * x, elementwise (the scaffold's placeholder: say what the lesson computes, with shapes).

    x  [n], float16 or float32, contiguous, on the runtime's device

    Returns out [n], x's dtype.
    """
    validate.tensor("x", x, 1, DTYPES)
    validate.same_device(x=x)
    validate.contiguous(x=x)
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out  # nothing to compute; a grid of zero programs is not launched
    return _launch(x, out)
