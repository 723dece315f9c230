"""T4, your file: online softmax, and the merge of two partial (m, l) states.

Fill in the three kernels below; the launchers under them are complete. Read
drills/content/t4_online_softmax.md first: every TODO names the section that teaches it.
Grade with `make test L=t4`. Start by deleting the `raise NotImplementedError` line in each public
function (softmax_stats, softmax_stats_trace, merge_stats, online_softmax).

    softmax_stats:  M * N * elt bytes read (+ 8 * M written)       # (64, 1_048_576) fp16: 134 MB
    online_softmax: 3 * M * N * elt bytes moved (read, read again, write); floor 2 * M * N * elt
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills import validate


@triton.jit
def softmax_stats_kernel(
    x_ptr,  # [M, N], rows stride_xm elements apart
    m_ptr,  # [splits, M] fp32: max of each (split, row)
    l_ptr,  # [splits, M] fp32: sum of exp(x - m) over the split's columns
    trace_m_ptr,  # [M, cdiv(N, BLOCK)] fp32: m after each block; touched only when TRACE
    trace_l_ptr,  # [M, cdiv(N, BLOCK)] fp32: l after each block; touched only when TRACE
    M,
    N,
    cols_per_split,  # a multiple of BLOCK, so splits cut the row between blocks
    stride_xm,
    BLOCK: tl.constexpr,
    TRACE: tl.constexpr,
):
    # TODO(section 3.1 "One program per (row, split)"): the row (widened to int64) and the split from the
    # two program ids; this program's columns [lo, hi) with hi = min(lo + cols_per_split, N) (an empty
    # split has hi <= lo); the start of the row, x_ptr + row * stride_xm.

    # TODO(section 3.2 "The empty state"): m = -inf and l = 0, fp32 scalars.

    # TODO(section 3.3 "One block at a time"): for each block of BLOCK columns in [lo, hi): load it as
    # fp32, lanes at or past hi reading -inf; fold it into (m, l): the new max, the rescale
    # alpha = exp(m_old - m_new), the block's exp(x - m_new) summed; while the max is still -inf, shift
    # by 0 instead (section 3.3 says why). When TRACE, store (m, l) at trace[row, start // BLOCK].

    # TODO(section 3.1 "One program per (row, split)"): store this split's (m, l) at [split, row] of
    # m_ptr and l_ptr.
    pass


@triton.jit
def merge_stats_kernel(
    m_a_ptr,
    l_a_ptr,  # [n] fp32: state a
    m_b_ptr,
    l_b_ptr,  # [n] fp32: state b, over other columns of the same rows
    m_ptr,
    l_ptr,  # [n] fp32: the state of both together
    n,
    BLOCK: tl.constexpr,
):
    # TODO(section 3.4 "Merging two states"): BLOCK lanes per program, masked at n; load both states
    # (masked lanes as the empty state), m = max(m_a, m_b), each l rescaled to m and added; two empty
    # states must give the empty state, not NaN. Store m and l.
    pass


@triton.jit
def softmax_normalize_kernel(
    x_ptr,  # [M, N], rows stride_xm elements apart
    m_ptr,  # [M] fp32: the row's final max
    l_ptr,  # [M] fp32: the row's final sum
    out_ptr,  # [M, N], rows stride_om elements apart
    N,
    cols_per_split,
    stride_xm,
    stride_om,
    BLOCK: tl.constexpr,
):
    # TODO(section 3.5 "Writing p"): the row and this split's columns [lo, hi) as in softmax_stats_kernel;
    # load the row's final (m, l); for each block, p = exp(x - m) / l stored in out's dtype, masked at hi.
    # A row of only -inf (m = -inf, l = 0) gets zeros, never NaN.
    pass


def _block_and_split(N, block, splits):
    """The block size and the columns each split owns (a multiple of the block)."""
    per_split = triton.cdiv(N, splits)
    if block is None:
        block = min(triton.next_power_of_2(per_split), 4096)
    return block, triton.cdiv(per_split, block) * block


def _warps(block):
    return 8 if block >= 4096 else 4


def _launch_stats(x, block, splits):
    """Partial states [splits, M] (no checks: the benchmark times this)."""
    M, N = x.shape
    block, cols_per_split = _block_and_split(N, block, splits)
    m_part = torch.empty(splits, M, dtype=torch.float32, device=x.device)  # [splits, M]
    l_part = torch.empty_like(m_part)
    softmax_stats_kernel[(M, splits)](
        x,
        m_part,
        l_part,
        m_part,
        l_part,  # no trace: its pointers are never touched
        M,
        N,
        cols_per_split,
        x.stride(0),
        BLOCK=block,
        TRACE=False,
        num_warps=_warps(block),
    )
    return m_part, l_part


def _launch_merge(m_a, l_a, m_b, l_b):
    m = torch.empty_like(m_a)
    l = torch.empty_like(l_a)
    n = m_a.numel()
    if n:
        merge_stats_kernel[(triton.cdiv(n, 1024),)](m_a, l_a, m_b, l_b, m, l, n, BLOCK=1024)
    return m, l


def _merge_splits(m_part, l_part):
    """Fold [splits, M] partial states into [M] by halving: merge is associative, so a tree of merges
    gives the state of the whole row, in log2(splits) launches."""
    while m_part.shape[0] > 1:
        half = m_part.shape[0] // 2  # splits is a power of two
        m_part, l_part = _launch_merge(m_part[:half], l_part[:half], m_part[half:], l_part[half:])
    return m_part[0], l_part[0]


def _launch_normalize(x, m, l, out, block, splits):
    M, N = x.shape
    block, cols_per_split = _block_and_split(N, block, splits)
    softmax_normalize_kernel[(M, splits)](
        x,
        m,
        l,
        out,
        N,
        cols_per_split,
        x.stride(0),
        out.stride(0),
        BLOCK=block,
        num_warps=_warps(block),
    )
    return out


def _launch_online_softmax(x, block, splits, out):
    m_part, l_part = _launch_stats(x, block, splits)
    m, l = _merge_splits(m_part, l_part)
    return _launch_normalize(x, m, l, out, block, splits)


def _pow2_int(name, value, most):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not (validate.is_pow2(value) and value <= most):
        raise ValueError(f"{name} = {value} must be a power of two from 1 to {most}")


def _check_rows(x, block, splits):
    validate.tensor("x", x, 2, (torch.float16, torch.bfloat16, torch.float32))
    validate.same_device(x=x)
    validate.last_dim_contiguous(x=x)
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x must have at least one row and one column, got shape {tuple(x.shape)}")
    if block is not None:
        _pow2_int("block", block, 65536)
    _pow2_int("splits", splits, 1024)


def softmax_stats(x, block=None, splits=1):
    """Per-row softmax statistics of x, computed in one pass over column blocks.

    x       [M, N], float16, bfloat16 or float32, last dim contiguous (rows may be strided)
    block   columns per step, a power of two; default min(next_pow2(N / splits), 4096)
    splits  programs per row, a power of two: each scans N / splits columns and the partial states
            are merged with merge_stats' rule; extra splits past the row's end are empty states

    Returns (m, l), each [M] float32: m = max_j x[i, j], l = sum_j exp(x[i, j] - m) (natural exp), so
    logsumexp = m + log(l). A row whose entries are all -inf gets m = -inf, l = 0 (no NaN).
    """
    raise NotImplementedError(
        "t4 is not started: fill in the kernels in drills/mine/t4_online_softmax.py, then delete this line (read drills/content/t4_online_softmax.md)"
    )
    _check_rows(x, block, splits)
    return _merge_splits(*_launch_stats(x, block, splits))


def softmax_stats_trace(x, block):
    """The state (m, l) of every row after each block of `block` columns, left to right.

    x      [M, N], float16, bfloat16 or float32, last dim contiguous
    block  a power of two; block = 1 reproduces the element-by-element trace of the explainer

    Returns (m_trace, l_trace), each [M, cdiv(N, block)] float32; the last column is softmax_stats(x).
    """
    raise NotImplementedError(
        "t4 is not started: fill in the kernels in drills/mine/t4_online_softmax.py, then delete this line (read drills/content/t4_online_softmax.md)"
    )
    _check_rows(x, None, 1)
    _pow2_int("block", block, 65536)
    M, N = x.shape
    steps = triton.cdiv(N, block)
    m_trace = torch.empty(M, steps, dtype=torch.float32, device=x.device)  # [M, steps]
    l_trace = torch.empty_like(m_trace)
    m = torch.empty(1, M, dtype=torch.float32, device=x.device)  # [1 split, M]
    l = torch.empty_like(m)
    softmax_stats_kernel[(M, 1)](
        x,
        m,
        l,
        m_trace,
        l_trace,
        M,
        N,
        steps * block,
        x.stride(0),
        BLOCK=block,
        TRACE=True,
    )
    return m_trace, l_trace


def merge_stats(m_a, l_a, m_b, l_b):
    """Merge two softmax states over disjoint parts of the same rows.

    m_a, l_a  float32, any shape, contiguous: max and sum of exp(x - m_a) over part a of each row
    m_b, l_b  float32, the same shape, contiguous: the same over part b
    The empty state is (m, l) = (-inf, 0); merging with it changes nothing. The kernel reads the four
    as flat arrays, so a strided view is refused (pass .contiguous()).

    Returns (m, l) of a and b together: m = max(m_a, m_b), l = l_a e^(m_a - m) + l_b e^(m_b - m).
    """
    raise NotImplementedError(
        "t4 is not started: fill in the kernels in drills/mine/t4_online_softmax.py, then delete this line (read drills/content/t4_online_softmax.md)"
    )
    named = dict(m_a=m_a, l_a=l_a, m_b=m_b, l_b=l_b)
    for name, t in named.items():
        validate.tensor(name, t, None, (torch.float32,))
    validate.same_device(**named)
    for name, t in named.items():
        if t.shape != m_a.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, but m_a has {tuple(m_a.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    return _launch_merge(m_a, l_a, m_b, l_b)


def online_softmax(x, block=None, splits=1, out=None):
    """Softmax over the last dim of x: one pass for the row statistics (m, l), a second that writes p.

    x       [M, N], float16, bfloat16 or float32, last dim contiguous (rows may be strided)
    block   columns per step, a power of two; default min(next_pow2(N / splits), 4096)
    splits  programs per row in both passes, a power of two (see softmax_stats)
    out     optional [M, N] of x's dtype, last dim contiguous, written in place; it may be x itself, but
            its rows must not overlap each other or partly overlap x

    Returns out [M, N] with out[i, j] = exp(x[i, j] - m_i) / l_i. A row of only -inf gets zeros
    (torch.softmax gives NaN there).
    """
    raise NotImplementedError(
        "t4 is not started: fill in the kernels in drills/mine/t4_online_softmax.py, then delete this line (read drills/content/t4_online_softmax.md)"
    )
    _check_rows(x, block, splits)
    if out is None:
        out = torch.empty_like(x)
    validate.tensor("out", out, 2, (x.dtype,))
    validate.same_device(x=x, out=out)
    validate.last_dim_contiguous(out=out)
    if out.shape != x.shape:
        raise ValueError(f"out must have x's shape {tuple(x.shape)}, got {tuple(out.shape)}")
    M, N = x.shape
    # Each (row, split) program writes its own columns of out: rows that share memory are written twice.
    if M > 1 and out.stride(0) < N:
        raise ValueError(
            f"out's rows overlap: row stride {out.stride(0)} < N = {N} (strides {tuple(out.stride())})"
        )
    # out may be x itself (each lane reads its element before writing it), but not a shifted view of x:
    # a program would read a row another program has already overwritten.
    if (out.data_ptr(), out.stride()) != (x.data_ptr(), x.stride()) and validate.shares_memory(out, x):
        raise ValueError("out overlaps x's memory: it may be x itself or separate memory, not a shifted view")
    return _launch_online_softmax(x, block, splits, out)
