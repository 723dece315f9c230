"""T2 reference: fused softmax over the last dimension of x [M, N].

    out[m, j] = exp(x[m, j] - max_m) / sum_k exp(x[m, k] - max_m),   max_m = max_k x[m, k]

Written as five PyTorch ops (max, subtract, exp, sum, divide), softmax reads 5MN + 2M elements and writes
3MN + 2M. Fused into one kernel, one program per row reads its row once and writes it once:

    bytes = 2 * M * N * element_size   # (8192, 4096) fp16: 134 MB, >= 28 us at 4.8 TB/s

Rows of up to MAX_BLOCK columns stay in registers between the max, the sum and the store. Longer rows
(a 128k-token vocabulary) take three passes over blocks of MAX_BLOCK columns: the max, then the sum,
then the store, reading the row three times. T4 merges the first two passes into one.

A row that is -inf everywhere has no distribution; like torch.softmax, its output is NaN.
Read top to bottom: the kernel, then the launcher. Explainer: drills/content/t2_softmax.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills import validate

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_BLOCK = 16384  # the longest row kept in registers: 64 KB of fp32 spread over 16 warps


@triton.jit
def _load_block(row_ptr, cols, N):
    # Padded columns load as -inf: they never win the max, and exp(-inf - max) adds 0 to the sum.
    return tl.load(row_ptr + cols, mask=cols < N, other=float("-inf")).to(tl.float32)


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
    # Section 3.1 "One program per row": widened to int64, because row * stride passes 2**31 on large inputs.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    out_row = out_ptr + row * stride_om
    cols = tl.arange(0, BLOCK)  # [BLOCK]

    if ONE_BLOCK:
        # Section 3.2 "Padded columns": N is rarely a power of two, BLOCK always is.
        x = _load_block(x_row, cols, N)  # [BLOCK] fp32
        # Section 3.3 "Subtracting the max": z <= 0, so exp(z) <= 1 cannot overflow.
        z = x - tl.max(x, axis=0)  # [BLOCK]
        num = tl.exp(z)  # [BLOCK]; 0 on padded columns
        y = num / tl.sum(num, axis=0)  # [BLOCK]
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < N)
    else:
        # Section 3.4 "Rows longer than one block": three passes over the row's num_blocks blocks.
        num_blocks = tl.cdiv(N, BLOCK)
        # Pass 1: the row max, kept per lane and reduced once at the end.
        m_lanes = tl.full([BLOCK], float("-inf"), dtype=tl.float32)  # [BLOCK]
        for b in range(0, num_blocks):
            m_lanes = tl.maximum(m_lanes, _load_block(x_row, b * BLOCK + cols, N))
        m = tl.max(m_lanes, axis=0)  # scalar
        # Pass 2: the sum of exp(x - m), the max now known.
        l_lanes = tl.zeros([BLOCK], dtype=tl.float32)  # [BLOCK]
        for b in range(0, num_blocks):
            l_lanes += tl.exp(_load_block(x_row, b * BLOCK + cols, N) - m)
        l = tl.sum(l_lanes, axis=0)  # scalar
        # Pass 3: read the row once more and store each block normalised.
        for b in range(0, num_blocks):
            c = b * BLOCK + cols  # [BLOCK]
            p = tl.exp(_load_block(x_row, c, N) - m) / l  # [BLOCK]
            tl.store(out_row + c, p.to(out_ptr.dtype.element_ty), mask=c < N)


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
