"""T5, your file: FlashAttention forward, with GQA, causal masking aligned to the bottom right, and lse.

Fill in `_attend_kv_block` and `flash_attention_kernel` below; the block-size table and the launcher
under them are complete. Read drills/content/t5_flash_attention.md first: every TODO names the section
that teaches it. Grade with `make test L=t5`. Start by deleting the `raise NotImplementedError` line in
flash_attention. The grader goes in three stages (make test and make progress say which you are in):
non-causal with H = Hkv and no lse, then causal, then GQA (KV head h // GROUP) and the lse store.

    FLOPs = 4 * B * H * Nq * Nk * D     # two matmuls (Q K^T and P V) of 2 * Nq * Nk * D each per head
          (about half of that when causal: key blocks above the diagonal are skipped, not masked)
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
    # TODO(section 3.4 "One key block"): load the K^T tile [D, BLOCK_N] and the V tile [BLOCK_N, D] of
    # keys start_n .. start_n + BLOCK_N - 1; only when MASKED, mask the keys at or past Nk (other = 0).

    # TODO(section 3.4 "One key block"): s = q @ K^T, raw and fp32 [BLOCK_M, BLOCK_N]. When MASKED, set
    # to -inf every score of a key past Nk and, if CAUSAL, every key j > i + causal_shift
    # (section 3.5 "Causal").

    # TODO(section 3.3 "exp2" and 3.4 "One key block"): the online softmax update in base 2: the new
    # running max m_new, p = exp2(s * qk_scale - m_new), alpha = exp2(m_i - m_new), then l_i and
    # acc (rescaled by alpha, plus p @ v with p cast to v's dtype). When MASKED, a row may still have
    # m_new = -inf: subtract 0 instead (section 3.5 "Causal", rows that see nothing).
    # Return (acc, l_i, m_new).
    pass


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
    # TODO(section 3.1 "One program"): this program's query block pid_m and pid_bh = b * H + h from
    # its one program id (pid = pid_bh * cdiv(Nq, BLOCK_M) + pid_m), then batch b and head h, widened
    # to int64, and the four row strides too when ROWS_INT64; its KV head (contiguous grouping); the
    # offsets offs_m, offs_n, offs_d; load q [BLOCK_M, D] with the rows at or past Nq masked to 0.

    # TODO(section 3.2 "K read transposed"): pointers kt_ptrs [D, BLOCK_N] to K^T (through K's strides,
    # no tl.trans) and v_ptrs [BLOCK_N, D], both for keys 0..BLOCK_N-1 of this KV head.

    # TODO(section 3.3 "exp2"): qk_scale = scale * log2(e); the state m_i = -inf, l_i = 0, acc = 0 (fp32).

    # TODO(section 3.5 "Causal"): causal_shift = Nk - Nq, and the key range: [0, full_end) unmasked,
    # [full_end, hi) masked, nothing at or past hi. When CAUSAL, full_end = m0 + causal_shift + 1 clipped
    # at 0, then rounded down to a whole block, and hi = m0 + BLOCK_M + causal_shift clipped to [0, Nk]:
    # both go negative when Nq > Nk (without CAUSAL: full_end = Nk rounded down to a whole block,
    # hi = Nk). Then two loops over key blocks calling _attend_kv_block (MASKED=False, then True).

    # TODO(section 3.6 "Normalise once, store real rows"): out = acc / l (rows with l = 0 stay 0), store
    # the rows before Nq in out's dtype; if STORE_LSE, store lse = (m + log2 l) * ln 2 (natural log).
    pass


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
    raise NotImplementedError(
        "t5 is not started: fill in flash_attention_kernel and _attend_kv_block in drills/mine/t5_flash_attention.py, then delete this line (read drills/content/t5_flash_attention.md)"
    )
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
