"""T3 reference: tiled matrix multiplication with tl.dot.

C = A @ B for A [M, K] and B [K, N] in float16 or bfloat16, with any strides. Every product is summed
in fp32 and C is rounded to the input dtype once, at the end. The work, counted once:

    FLOPs = 2 * M * N * K               # a multiply and an add per term; 4096^3: 137.4 GFLOP
    bytes >= 2 * (M*K + K*N + M*N)      # each matrix read or written once in fp16; 4096^3: 100.7 MB

That is 1365 FLOP per byte at 4096^3, against the 206 an H200 can feed (989 TFLOP/s over 4.8 TB/s):
a large matmul is limited by the tensor cores, not by memory.

Read top to bottom: the kernel (a 1-D grid, one program per [BLOCK_M, BLOCK_N] tile of C, tiles visited
in grouped order), the table of block sizes, then the launcher that validates, allocates and launches.
Explainer: drills/content/t3_matmul.md.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import drills.runtime
from drills import validate


@triton.jit
def matmul_kernel(
    a_ptr,  # [M, K], any strides
    b_ptr,  # [K, N], any strides
    c_ptr,  # [M, N], any strides
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,  # rows of C per program
    BLOCK_N: tl.constexpr,  # columns of C per program
    BLOCK_K: tl.constexpr,  # step of the K loop: >= 16, the K of one fp16 tensor-core instruction
    GROUP_M: tl.constexpr,  # tile rows per group of the launch order (1 gives plain row-major order)
):
    # Section 3.1 "Which tile": program pid owns tile (pid_m, pid_n). Tiles go in groups of GROUP_M
    # tile rows, column by column inside a group, so programs that run together share A and B in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (pid // tiles_per_group) * GROUP_M  # first tile row of this program's group
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)  # the last group can be shorter
    r = pid % tiles_per_group  # position inside the group, counted down each column
    pid_m = first_m + r % rows_in_group
    pid_n = r // rows_in_group

    # Section 3.2 "Pointers from strides": element [i, j] of X lives at x_ptr + i * stride_xi + j * stride_xj.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of A and C
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of B and C
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    # Rows past M and columns past N wrap onto real ones: the loads stay in bounds without a mask, and
    # what those rows and columns compute is never stored.
    a_rows = offs_m % M
    b_cols = offs_n % N
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BLOCK_M, BLOCK_K]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + b_cols[None, :] * stride_bn  # [BLOCK_K, BLOCK_N]

    # Section 3.3 "The K loop": fp32 accumulator, one [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] dot per step.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp16 would drop small terms of a long sum
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K  # [BLOCK_K]: the last step reaches past K
        # Both operands are zeroed past K: 0 * NaN is still NaN.
        a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(a, b, acc)  # acc + a @ b on tensor cores, summed in fp32
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Section 3.4 "Storing the tile": round once, then store only rows < M and columns < N.
    c = acc.to(c_ptr.dtype.element_ty)  # [BLOCK_M, BLOCK_N]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn  # [BLOCK_M, BLOCK_N]
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


# Block sizes chosen on the host by case, not autotuned: under the interpreter autotuning would run every
# candidate on the CPU. Section 3.6 "Choosing the blocks" explains the numbers.
_CONFIGS = {
    # CPU: few, large-ish programs keep the interpreter fast; every dim >= 16 as on a GPU.
    "interpreter": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1),
    # GPU, small C: 64 x 64 tiles make 8x as many programs as 128 x 256 would, to fill the SMs.
    "small": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=4),
    # GPU, large C (Hopper): big tiles for reuse, 8 warps (two warpgroups), 3 loads in flight.
    "large": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
}


def _check_config(cfg):
    """A configuration the kernel can compile: every tl.dot dimension a power of two >= 16 (section 3.5)."""
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not validate.is_pow2(value) or value < 16:
            raise ValueError(
                f"config {key} = {value!r} must be a power of two >= 16: tl.arange needs a power of "
                f"two, and tl.dot a K of at least 16 (section 3.5)"
            )
    group = cfg.get("GROUP_M")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"config GROUP_M = {group!r} must be a positive int")


def _byte_span(t):
    """[first byte, one past the last byte] of the memory t's elements lie in (t non-empty)."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _elements_overlap(t):
    """Whether two elements of the 2-D tensor t share memory: i * s0 + j * s1 = i' * s0 + j' * s1 for
    some (i, j) != (i', j'). The smallest such step is (s1 / g, -s0 / g) with g = gcd(s0, s1)."""
    (n0, n1), (s0, s1) = t.shape, t.stride()
    if (n0 > 1 and s0 == 0) or (n1 > 1 and s1 == 0):
        return True
    if n0 < 2 or n1 < 2:
        return False
    g = math.gcd(s0, s1)
    return s1 // g < n0 and s0 // g < n1


def _config(M, N):
    if drills.runtime.current().interpreter:
        return _CONFIGS["interpreter"]
    return _CONFIGS["large"] if M >= 1024 and N >= 1024 else _CONFIGS["small"]


def _launch(a, b, out, config=None):
    """Launch without the input checks: the benchmark times this, the public function adds the checks.
    config: a dict like those in _CONFIGS (the sweep passes its own); by default chosen by size. Only the
    configuration is checked here, since only callers of _launch choose it."""
    M, K = a.shape
    N = b.shape[1]
    cfg = config or _config(M, N)
    _check_config(cfg)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    matmul_kernel[grid](
        a,
        b,
        out,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        **cfg,
    )
    return out


def matmul(a, b, out=None):
    """C = a @ b, products summed in fp32 and rounded once to the inputs' dtype.

    a    [M, K], float16 or bfloat16, any strides (a transposed view is fine)
    b    [K, N], a's dtype, any strides
    out  optional [M, N] of a's dtype, any strides under which no two elements share memory, written in
         place; it must not overlap a or b

    Returns out [M, N].
    """
    validate.tensor("a", a, 2, (torch.float16, torch.bfloat16))
    validate.tensor("b", b, 2, (a.dtype,))
    named = dict(a=a, b=b)
    if out is not None:
        named["out"] = validate.tensor("out", out, 2, (a.dtype,))
    validate.same_device(**named)
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"b.shape[0] = {b.shape[0]} must equal a.shape[1] = {K}, the inner dimension K")
    N = b.shape[1]
    if min(M, N, K) == 0:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must be non-empty: M, N and K >= 1")
    if out is not None and out.shape != (M, N):
        raise ValueError(f"out must have shape (M, N) = {(M, N)}, got {tuple(out.shape)}")
    validate.offsets_fit_int32(**named)
    if out is not None:
        # Each element of C is stored by one program: two elements at one address would be stored twice,
        # and C written over A or B would change inputs that other programs have not read yet.
        if _elements_overlap(out):
            raise ValueError(
                f"out's elements overlap: strides {tuple(out.stride())} for shape {tuple(out.shape)}"
            )
        for name in ("a", "b"):
            (t_start, t_end), (out_start, out_end) = _byte_span(named[name]), _byte_span(out)
            if out_start < t_end and t_start < out_end:
                raise ValueError(f"out overlaps {name}'s memory: C must be written to memory of its own")
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    return _launch(a, b, out)
