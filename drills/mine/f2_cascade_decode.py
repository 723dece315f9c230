"""F2, your file: Cascade attention: a shared prefix read once.

Fill in `cascade_decode_kernel` below; the launcher and the checks are complete. Read
drills/content/f2_cascade_decode.md first: every TODO names the section that teaches it. Grade with
`make test L=f2`. Start by deleting the `raise NotImplementedError` line in cascade_decode.
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
    # TODO(section 3.1 "One program per block"): the BLOCK element offsets this program owns, from its
    # program id widened to int64, [BLOCK].

    # TODO(section 3.2 "The last block"): a mask that is False past element n - 1; load x and store 2 * x,
    # both under the mask.
    pass


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
    raise NotImplementedError(
        "f2 is not started: fill in cascade_decode_kernel in drills/mine/f2_cascade_decode.py, then delete this line (read drills/content/f2_cascade_decode.md)"
    )
    validate.tensor("x", x, 1, DTYPES)
    validate.same_device(x=x)
    validate.contiguous(x=x)
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out  # nothing to compute; a grid of zero programs is not launched
    return _launch(x, out)
