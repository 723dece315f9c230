"""T2, your file: fused softmax over the last dimension of x [M, N].

Fill in `softmax_kernel` below; the launcher under it is complete. Read drills/content/t2_softmax.md
first: every TODO names the section that teaches it. Grade with `make test L=t2`. Start by deleting
the `raise NotImplementedError` line in softmax.

    bytes = 2 * M * N * element_size   # (8192, 4096) fp16: 134 MB, >= 28 us at 4.8 TB/s

A row that is -inf everywhere has no distribution; like torch.softmax, its output must be NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills import validate

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_BLOCK = 16384  # the longest row kept in registers: 64 KB of fp32 spread over 16 warps


@triton.jit
def softmax_kernel(
    x_ptr,  # [M, N], rows stride_xm apart
    out_ptr,  # [M, N], rows stride_om apart
    stride_xm,
    stride_om,
    N,  # columns
    BLOCK: tl.constexpr,  # columns per block, a power of two
    ONE_BLOCK: tl.constexpr,  # N <= BLOCK: the whole row fits in one block
):
    # TODO(section 3.1 "One program per row"): the row this program owns (widened to int64), and
    # pointers to the start of that row in x and in out.

    # TODO(section 3.2 "Padded columns"): when ONE_BLOCK, load the row as [BLOCK] fp32 under a mask,
    # with the padded columns set so that they change neither the max nor the sum.

    # TODO(section 3.3 "Subtracting the max"): subtract the row max, exponentiate, divide by the sum,
    # and store in out's dtype under the same mask.

    # TODO(section 3.4 "Rows longer than one block"): otherwise (not ONE_BLOCK), three passes over the
    # row's cdiv(N, BLOCK) blocks: the max, then the sum of exp(x - max), then the normalised store.
    pass


def _byte_span(t):
    """[first byte, one past the last byte] of the memory t's elements lie in (t non-empty)."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _launch(x, out, BLOCK=None, num_warps=None):
    """Launch without the input checks: the benchmark times this (and tries other settings), softmax adds
    the checks. Only BLOCK is checked here, since only callers of _launch choose it."""
    M, N = x.shape
    if BLOCK is None:
        BLOCK = min(triton.next_power_of_2(N), MAX_BLOCK)
    elif isinstance(BLOCK, bool) or not isinstance(BLOCK, int) or not validate.is_pow2(BLOCK):
        raise ValueError(f"BLOCK = {BLOCK!r} must be a power of two: tl.arange(0, BLOCK) needs one")
    if num_warps is None:
        # More threads for longer rows, so each thread holds at most 32 columns.
        num_warps = 4 if BLOCK <= 2048 else 8 if BLOCK <= 8192 else 16
    softmax_kernel[(M,)](
        x,
        out,
        x.stride(0),
        out.stride(0),
        N,
        BLOCK=BLOCK,
        ONE_BLOCK=N <= BLOCK,
        num_warps=num_warps,
    )
    return out


def softmax(x, out=None):
    """Softmax over the last dimension, computed in fp32, returned in x's dtype.

    x    [M, N], float16, bfloat16 or float32; rows may be strided, columns contiguous
    out  optional [M, N] of x's dtype, rows may be strided, columns contiguous, written in place; it may
         be x itself, but its rows must not overlap each other or partly overlap x

    A row of x that is -inf everywhere gives a row of NaN, as torch.softmax does. Returns out [M, N].
    """
    raise NotImplementedError(
        "t2 is not started: fill in softmax_kernel in drills/mine/t2_softmax.py, then delete this line (read drills/content/t2_softmax.md)"
    )
    validate.tensor("x", x, 2, DTYPES)
    named = dict(x=x)
    if out is not None:
        named["out"] = validate.tensor("out", out, 2, (x.dtype,))
        if out.shape != x.shape:
            raise ValueError(f"out must have x's shape {tuple(x.shape)}, got {tuple(out.shape)}")
    validate.same_device(**named)
    validate.last_dim_contiguous(**named)
    if out is not None and x.numel() > 0:
        M, N = x.shape
        # One program per row writes its row of out: rows that share memory would be written by two programs.
        if M > 1 and out.stride(0) < N:
            raise ValueError(
                f"out's rows overlap: row stride {out.stride(0)} < N = {N} (strides {tuple(out.stride())})"
            )
        # out may be x itself (each program reads its row before writing it), but a shifted view would make
        # a program read a row that another program has already overwritten.
        if (out.data_ptr(), out.stride()) != (x.data_ptr(), x.stride()):
            (x_start, x_end), (out_start, out_end) = _byte_span(x), _byte_span(out)
            if out_start < x_end and x_start < out_end:
                raise ValueError(
                    "out overlaps x's memory: it may be x itself or separate memory, not a shifted view"
                )
    if out is None:
        out = torch.empty_like(x)
    if x.numel() == 0:
        return out  # no rows, or rows of nothing: no program to launch
    return _launch(x, out)
