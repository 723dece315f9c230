"""T5 reference: FlashAttention forward, with GQA, causal masking aligned to the bottom right, and lse.

Attention is softmax(Q K^T * scale) V. Written plainly it materialises the [Nq, Nk] score matrix per
head; this kernel never does. One program owns BLOCK_M query rows, walks K and V in blocks of BLOCK_N
keys, keeps an online softmax per row (T4) and writes each output row once. Its cost is arithmetic:

    FLOPs = 4 * B * H * Nq * Nk * D     # two matmuls (Q K^T and P V) of 2 * Nq * Nk * D each per head
          (about half of that when causal: key blocks above the diagonal are skipped, not masked)

Read top to bottom: the per-block update (`_attend_kv_block`), the kernel (grid (cdiv(Nq, BLOCK_M), B * H)),
the block-size table, then the launcher that validates, allocates and launches.
Explainer: drills/content/t5_flash_attention.md.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from drills import validate


@triton.jit
def _attend_kv_block(
    acc,
    l_i,
    m_i,  # running state: [BLOCK_M, D] fp32, [BLOCK_M], [BLOCK_M] (m in base-2 units)
    q,  # [BLOCK_M, D]
    kt_ptrs,  # [D, BLOCK_N] pointers to K^T for keys 0..BLOCK_N-1 of this head
    v_ptrs,  # [BLOCK_N, D] pointers to V for keys 0..BLOCK_N-1 of this head
    start_n,
    offs_m,
    offs_n,
    qk_scale,  # scale * log2(e)
    Nk,
    causal_shift,
    stride_kn,
    stride_vn,
    MASKED: tl.constexpr,  # True only on blocks that cross the diagonal or the end of the keys
    CAUSAL: tl.constexpr,
):
    # Section 3.4 "One key block": scores, online softmax update, P V.
    cols = start_n + offs_n  # [BLOCK_N] key positions
    if MASKED:
        in_range = cols < Nk  # the last block of keys is usually partial
        kt = tl.load(kt_ptrs + start_n * stride_kn, mask=in_range[None, :], other=0.0)  # [D, BLOCK_N]
        v = tl.load(v_ptrs + start_n * stride_vn, mask=in_range[:, None], other=0.0)  # [BLOCK_N, D]
    else:
        kt = tl.load(kt_ptrs + start_n * stride_kn)  # [D, BLOCK_N]
        v = tl.load(v_ptrs + start_n * stride_vn)  # [BLOCK_N, D]
    s = tl.dot(q, kt)  # [BLOCK_M, BLOCK_N] raw q . k, fp32
    if MASKED:
        visible = in_range[None, :]
        if CAUSAL:
            # Section 3.5 "Causal": query i sees key j when j <= i + Nk - Nq.
            visible = visible & (cols[None, :] <= offs_m[:, None] + causal_shift)
        s = tl.where(visible, s, float("-inf"))  # a zero-filled key would still score 0, not -inf

    # Scaling the row max (BLOCK_M multiplies) instead of the tile lets s * qk_scale - m fuse into one FMA.
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # [BLOCK_M]
    if MASKED:
        # A row that has seen no key yet has m = -inf; exp2(-inf - (-inf)) would be NaN, so subtract 0.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new  # every row sees every key of an unmasked block, so m_new is finite
    p = tl.math.exp2(s * qk_scale - m_ref[:, None])  # [BLOCK_M, BLOCK_N] = e^(score - m)
    alpha = tl.math.exp2(m_i - m_ref)  # shrinks what was summed under the old max
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)  # [BLOCK_M, D]
    return acc, l_i, m_new


@triton.jit
def flash_attention_kernel(
    q_ptr,  # [B, H, Nq, D], last dimension contiguous
    k_ptr,  # [B, Hkv, Nk, D]
    v_ptr,  # [B, Hkv, Nk, D]
    out_ptr,  # [B, H, Nq, D], possibly a strided view
    lse_ptr,  # [B, H, Nq] fp32 (only written when STORE_LSE)
    scale,
    Nq,
    Nk,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    stride_lb,
    stride_lh,
    H,
    GROUP: tl.constexpr,  # query heads per KV head, H // Hkv
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    STORE_LSE: tl.constexpr,
    ROWS_INT64: tl.constexpr,  # a row index times its row stride can pass 2**31 (section 3.1)
):
    # Section 3.1 "One program": BLOCK_M query rows of one (batch, head). One grid axis, the only one
    # CUDA lets pass 65535 programs (B * H alone passes it at B = 1024, H = 64); the query blocks of a
    # head are neighbours on it, so programs running together share that head's K and V in L2.
    num_m = tl.cdiv(Nq, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_m
    pid_bh = pid // num_m
    b = (pid_bh // H).to(tl.int64)  # widened: b * stride_qb passes 2**31 on large batches
    h = (pid_bh % H).to(tl.int64)
    kvh = h // GROUP  # contiguous grouping: heads 0..GROUP-1 share KV head 0
    if ROWS_INT64:
        # Row strides widened too: a query or key index times its row stride passes 2**31 once a view's
        # rows lie far apart (tokens of one layer in a large pool), where int32 would wrap to a negative
        # offset. Only then: in int64 the key loop's addresses cost 12-16% of the kernel's time.
        stride_qm = tl.cast(stride_qm, tl.int64)
        stride_kn = tl.cast(stride_kn, tl.int64)
        stride_vn = tl.cast(stride_vn, tl.int64)
        stride_om = tl.cast(stride_om, tl.int64)
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] query positions
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, D)  # [D]
    row_ok = offs_m < Nq  # the last query block is usually partial

    q = tl.load(
        q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )  # [BLOCK_M, D], stays in registers for the whole loop
    # Section 3.2 "K read transposed": K^T as a [D, BLOCK_N] tile, just by swapping which stride
    # goes with which axis. No copy, no tl.trans: the dot reads it as the transposed matrix.
    kt_ptrs = k_ptr + b * stride_kb + kvh * stride_kh + offs_d[:, None] + offs_n[None, :] * stride_kn
    v_ptrs = v_ptr + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]

    # Section 3.3 "exp2": e^x = 2^(x * log2 e), so folding log2(e) into the scale makes every exponential
    # a single exp2 and keeps m in base-2 units until the end.
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)

    # Section 3.5 "Causal": which key blocks this query block visits. Keys [0, full_end) are seen by
    # every row of the block and need no mask; keys [full_end, hi) cross the diagonal (or the end of
    # the keys) and are masked; keys >= hi are seen by no row and are never loaded.
    causal_shift = Nk - Nq  # bottom-right alignment: query i sees keys j <= i + causal_shift
    if CAUSAL:
        hi = tl.minimum(Nk, tl.maximum(m0 + BLOCK_M + causal_shift, 0))
        # m0 < Nq, so m0 + causal_shift + 1 <= Nk: the unmasked part never runs past the keys.
        full_end = tl.maximum(m0 + causal_shift + 1, 0) // BLOCK_N * BLOCK_N
    else:
        hi = Nk
        full_end = Nk // BLOCK_N * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_kv_block(
            acc,
            l_i,
            m_i,
            q,
            kt_ptrs,
            v_ptrs,
            start_n,
            offs_m,
            offs_n,
            qk_scale,
            Nk,
            causal_shift,
            stride_kn,
            stride_vn,
            MASKED=False,
            CAUSAL=CAUSAL,
        )
    for start_n in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _attend_kv_block(
            acc,
            l_i,
            m_i,
            q,
            kt_ptrs,
            v_ptrs,
            start_n,
            offs_m,
            offs_n,
            qk_scale,
            Nk,
            causal_shift,
            stride_kn,
            stride_vn,
            MASKED=True,
            CAUSAL=CAUSAL,
        )

    # Section 3.6 "Normalise once, store real rows": a row that saw no key (Nq > Nk, causal) has
    # l = 0 and acc = 0; dividing by 1 instead of 0 makes it 0, and its lse -inf, never NaN.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]  # [BLOCK_M, D]
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453  # base 2 -> natural log: times ln(2)
        tl.store(lse_ptr + b * stride_lb + h * stride_lh + offs_m, lse, mask=row_ok)


def _config(D: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for head dim D. Small blocks under the interpreter
    keep CPU tests fast (BLOCK_M != BLOCK_N on purpose: two masked key blocks per diagonal); on a GPU,
    the shapes of Triton's fused-attention tutorial for Hopper, scaled down where D makes tiles large."""
    import drills.runtime

    if drills.runtime.current().interpreter:
        return 32, 16, 4, 1
    if D <= 64:
        return 128, 64, 4, 3
    if D == 128:
        return 128, 64, 8, 3
    return 64, 32, 4, 2  # D = 256: a [128, 256] fp32 accumulator would not fit in registers


def _launch(q, k, v, causal, scale, out, lse=None, config=None):
    """Launch without checks: the benchmark times this, the public function adds the checks.
    out [B, H, Nq, D] and lse [B, H, Nq] fp32 (or None) may be strided views whose last dimension is
    contiguous (the kernel steps along D and along lse's Nq by 1); config overrides _config."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    BLOCK_M, BLOCK_N, num_warps, num_stages = config or _config(D)
    # One axis: up to 2**31 - 1 programs, where axes 1 and 2 stop at 65535 (section 3.1).
    grid = (triton.cdiv(Nq, BLOCK_M) * B * H,)
    # Row offsets in int64 only for views whose rows lie far apart (section 3.1): int64 row strides made
    # the full rows at D = 128 12-16% slower (H100, Triton 3.6). A row index, masked rows included,
    # stays below `rows`.
    rows = max(Nq, Nk) + max(BLOCK_M, BLOCK_N)
    rows_int64 = rows * max(q.stride(2), k.stride(2), v.stride(2), out.stride(2)) >= 2**31
    flash_attention_kernel[grid](
        q,
        k,
        v,
        out,
        out if lse is None else lse,  # out stands in for lse when none is asked for
        scale,
        Nq,
        Nk,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        0 if lse is None else lse.stride(0),
        0 if lse is None else lse.stride(1),
        H,
        GROUP=H // Hkv,
        D=D,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        CAUSAL=causal,
        STORE_LSE=lse is not None,
        ROWS_INT64=rows_int64,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out if lse is None else (out, lse)


def flash_attention(q, k, v, causal=False, scale=None, return_lse=False):
    """Attention softmax(q k^T * scale) v without materialising the scores (FlashAttention forward).

    q      [B, H, Nq, D], float16 or bfloat16, last dimension contiguous (other strides are free)
    k, v   [B, Hkv, Nk, D], q's dtype; Hkv divides H; query head h uses KV head h // (H // Hkv)
    causal query i sees key j when j <= i + Nk - Nq (aligned to the bottom right, as FlashAttention-2);
           when Nq > Nk the first Nq - Nk query rows see no key: their output is 0 and their lse -inf
    scale  softmax scale, a positive float; default 1 / sqrt(D)
    D      a power of two from 16 to 256

    Returns out [B, H, Nq, D] in q's dtype, and with return_lse=True also lse [B, H, Nq] fp32, the
    natural-log log-sum-exp of each row's scaled (and masked) scores.
    """
    _check_inputs(q, k, v, causal, scale, return_lse)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [B, H, Nq, D]
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None  # [B, H, Nq]
    return _launch(q, k, v, causal, float(scale), out, lse)


def _check_inputs(q, k, v, causal, scale, return_lse):
    validate.tensor("q", q, 4, (torch.float16, torch.bfloat16))
    validate.tensor("k", k, 4, (q.dtype,))
    validate.tensor("v", v, 4, (q.dtype,))
    validate.same_device(q=q, k=k, v=v)
    B, H, Nq, D = q.shape
    if k.shape[0] != B:
        raise ValueError(f"k has batch {k.shape[0]} (k.shape[0]) but q has {B}")
    if v.shape != k.shape:
        raise ValueError(f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)}")
    if k.shape[3] != D:
        raise ValueError(f"k head dim {k.shape[3]} (k.shape[3]) must equal q's head dim {D}")
    if not (validate.is_pow2(D) and 16 <= D <= 256):
        raise ValueError(
            f"head dim D = {D} (q.shape[3]) must be a power of two from 16 to 256 "
            "(pad with zero columns: they change no score)"
        )
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"H = {H} (q.shape[1]) must be a multiple of Hkv = {Hkv} (k.shape[1])")
    if Nq < 1 or Nk < 1:
        raise ValueError(f"Nq = {Nq} (q.shape[2]) and Nk = {Nk} (k.shape[2]) must both be at least 1")
    validate.last_dim_contiguous(q=q, k=k, v=v)
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite positive number, got {scale}")
