"""F1 reference: split-KV (flash-decoding) paged decode with a planner.

L2's grid (B, Hkv) starves the GPU at small batch: B = 1 gives 8 programs for 132 SMs. Here a
sequence's tokens are cut into `num_splits` chunks, one program per (sequence, KV head, chunk); each
writes a partial output and its log-sum-exp, and a second kernel merges them with the online-softmax
rescale. `plan()` picks the split count on the host, before the step, as FlashInfer's plan() does.

    bytes = 2 (K and V) * sum(context_lens) * Hkv * D * 2 (fp16), plus the partials:
            B * Hq * num_splits * (D + 1) * 4 bytes written and read back (small beside the KV)

Read top to bottom: the planner, the split kernel, the merge kernels, the launcher.
Explainer: drills/content/f1_split_kv_decode.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word, record_error
from drills.launch import launch, next_pow2, prepare

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): exp2 is the hardware instruction
LN2 = 0.6931471805599453
BLOCK_N = 16  # tokens per tile: the smallest tl.dot tile, as in L2 (a chunk is a multiple of it)
MIN_CHUNK = 64  # tokens: the smallest chunk the planner makes
H200_SMS = 132  # used for planning when no GPU is present (the interpreter)


@dataclass(frozen=True)
class DecodePlan:
    num_splits: int  # chunks per sequence; 1 means no second pass
    chunk: int  # tokens per chunk, a multiple of BLOCK_N; split s covers [s * chunk, (s + 1) * chunk)
    max_len: int  # the longest context the plan covers


def plan(context_lens, num_kv_heads, page_size, num_sms=None, num_splits=None) -> DecodePlan:
    """Choose how many chunks each sequence's KV is cut into (host side, before the step).

    context_lens  [B] ints >= 0 (a list, or a 1-D integer tensor; 0 is a padding sequence); num_kv_heads Hkv,
                  an int >= 1;
                  page_size PAGE, a power of two from 1 to 128
    num_sms       SMs to fill (an int >= 1), default the current GPU's (132, an H200's, without a GPU)
    num_splits    force a split count (an int >= 1; teaching and tests); otherwise split only when B * Hkv programs
                  cannot fill the GPU (about 4 programs per SM), in chunks of at least 64 tokens

    Chunks are whole tiles of BLOCK_N tokens, so the plan's num_splits is the nearest count that gives
    every split of the longest sequence at least one token (never more than asked for).
    """
    lens = validate.decode_plan_args(
        context_lens, num_kv_heads, page_size, num_sms, num_splits
    )  # [B] ints >= 0
    max_len = max(lens)
    max_tiles = max(1, triton.cdiv(max_len, BLOCK_N))  # a batch of padding sequences still gets one split
    if num_splits is None:
        if num_sms is None:
            num_sms = (
                torch.cuda.get_device_properties().multi_processor_count
                if torch.cuda.is_available()
                else H200_SMS
            )
        # About four resident programs per SM keep enough page loads in flight (measured on an H200:
        # B=64, ctx=1024 is 512 programs and runs best unsplit; B=1 runs best at 8 x 64 programs).
        num_splits = max(1, (4 * num_sms) // (len(lens) * num_kv_heads))
        num_splits = min(
            num_splits, max(1, triton.cdiv(max_len, MIN_CHUNK))
        )  # tiny chunks cost more to merge
    # More splits than tiles would leave the longest with empty splits.
    num_splits = min(num_splits, max_tiles)
    chunk = triton.cdiv(max_tiles, num_splits) * BLOCK_N
    return DecodePlan(num_splits=max(1, triton.cdiv(max_len, chunk)), chunk=chunk, max_len=max_len)


_make_plan = plan  # split_kv_decode's `plan` argument shadows the function's name


@triton.jit
def split_kv_kernel(
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    v_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    block_tables_ptr,  # [B, max_pages] int32
    context_lens_ptr,  # [B] int32
    o_ptr,  # final out [B, Hq, D] when SPLITS == 1, else partials [B, Hq, SPLITS, D] fp32
    lse_ptr,  # [B, Hq] or [B, Hq, SPLITS] fp32, natural log
    qk_scale,  # softmax scale * log2(e)
    chunk,  # tokens per split
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_bt,
    num_blocks,  # k_cache.shape[0]: the device guard's bound for block ids
    max_pages,  # block_tables.shape[1]: the device guard's bound for ctx, in pages
    err_ptr,  # [4] int64, the device error word (drills/device_errors.py)
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    GUARD: tl.constexpr,  # section 3.7: contain bad device values (False only to time the guard's cost)
):
    # Section 3.1 "The grid": one program per (sequence, KV head, split).
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    if GUARD:
        # Section 3.7 "A kernel that trusts nothing": a length the table row cannot hold would walk past
        # the row into another sequence's block ids, and one past the plan's splits would lose its tail
        # unseen. Every split of such a row reads nothing: o = 0, lse = -inf, and the merge stores zeros.
        ctx_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)
        ctx_planned = ctx <= tl.num_programs(2).to(tl.int64) * chunk  # int64: splits * chunk may pass 2**31
        first = (kvh == 0) & (split == 0)  # one program per sequence records it
        record_error(err_ptr, (ctx_ok == 0) & first, 31, b, ctx)
        record_error(err_ptr, ctx_ok & (ctx_planned == 0) & first, 33, b, ctx)
        ctx = tl.where(ctx_ok & ctx_planned, ctx, 0)
        n_bad = tl.zeros([BLOCK_N], dtype=tl.int32)  # per lane: block ids outside [0, num_blocks) met so far
        first_bad = tl.zeros([BLOCK_N], dtype=tl.int64)
    start = split * chunk
    end = tl.minimum(start + chunk, ctx)  # end <= start for an empty split: the loop does not run

    offs_g = tl.arange(0, GROUP_PAD)
    g_mask = offs_g < GROUP
    q_heads = kvh * GROUP + offs_g  # [GROUP_PAD]: contiguous grouping, as in L2
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )  # [GROUP_PAD, D]

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)  # running max, base-2 units
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, D], dtype=tl.float32)
    bt_row = block_tables_ptr + b * stride_bt
    for t0 in range(start, end, BLOCK_N):
        tok = t0 + offs_n  # [BLOCK_N]
        t_mask = tok < end
        # Section 3.2 "Gathering tokens": each token finds its page; a page smaller than the tile
        # (PAGE < BLOCK_N) spreads one tile over several pages. Widened: block id * stride > 2**31.
        if PAGE >= BLOCK_N:
            phys = tl.load(bt_row + t0 // PAGE).to(tl.int64)  # chunks are tile-aligned: one page per tile
        else:
            phys = tl.load(bt_row + tok // PAGE, mask=t_mask, other=0).to(tl.int64)  # [BLOCK_N]
        if GUARD:
            # Section 3.7: a block id outside the pool is read as block 0 (inside the pool) and the row
            # is zeroed at the end, so no address is formed from it. Kept per lane: no reduction here.
            phys_ok = (phys >= 0) & (phys < num_blocks)
            first_bad = tl.where((n_bad == 0) & (phys_ok == 0), phys, first_bad)
            n_bad += (phys_ok == 0).to(tl.int32)
            phys = tl.where(phys_ok, phys, 0)
        row = phys * stride_kb + (tok % PAGE) * stride_kt  # [BLOCK_N]
        vrow = phys * stride_vb + (tok % PAGE) * stride_vt
        k = tl.load(
            k_cache_ptr + row[:, None] + kvh * stride_kh + offs_d[None, :], mask=t_mask[:, None], other=0.0
        )  # [BLOCK_N, D]
        v = tl.load(
            v_cache_ptr + vrow[:, None] + kvh * stride_vh + offs_d[None, :], mask=t_mask[:, None], other=0.0
        )  # [BLOCK_N, D]
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [GROUP_PAD, BLOCK_N], base-2 logits
        s = tl.where(t_mask[None, :], s, float("-inf"))
        # Section 3.3 "Online softmax per split": the first tile of a non-empty split holds a real
        # token, so m_new is finite from there on.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # Section 3.4 "Empty splits": l_i == 0 means this split saw no token; write o = 0 and lse = -inf so
    # that the merge gives it weight exp(-inf) = 0, never 0/0.
    seen = l_i > 0
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    if GUARD:
        bad_lane = tl.min(tl.where(n_bad > 0, offs_n, BLOCK_N), axis=0)  # BLOCK_N: no bad block id
        bad_id = tl.sum(tl.where(offs_n == bad_lane, first_bad, 0), axis=0)
        record_error(err_ptr, (bad_lane < BLOCK_N) & (kvh == 0), 32, b, bad_id)
        # The row's other splits never saw this block id: lse = +inf (a real one is finite or -inf) tells
        # the merge to store the row as zeros. Unsplit, this is the row itself: zeros and lse -inf.
        o = tl.where(bad_lane < BLOCK_N, 0.0, o)
        poison = tl.where(tl.num_programs(2) > 1, float("inf"), float("-inf"))
        lse = tl.where(bad_lane < BLOCK_N, poison, lse)
    o_rows = o_ptr + b * stride_ob + q_heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])
    if WRITE_LSE:
        tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + split, lse, mask=g_mask)


@triton.jit
def merge_splits_kernel(
    o_part_ptr,  # [B, Hq, SPLITS, D] fp32
    lse_part_ptr,  # [B, Hq, SPLITS] fp32
    out_ptr,  # [B, Hq, D]
    lse_ptr,  # [B, Hq] fp32 (written when WRITE_LSE)
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    stride_fb,
    stride_fh,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    GUARD: tl.constexpr,  # section 3.7: a split that met a bad block id zeroes its row
):
    # Section 3.5 "Merging the splits": the same rescale as online softmax, over split states.
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, D)
    offs_s = tl.arange(0, BLOCK_S)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_mask = s0 + offs_s < num_splits
        lse = tl.load(
            lse_part_ptr + b * stride_lb + h * stride_lh + s0 + offs_s, mask=s_mask, other=float("-inf")
        )  # [BLOCK_S]
        o = tl.load(
            o_part_ptr + b * stride_pb + h * stride_ph + (s0 + offs_s)[:, None] * stride_ps + offs_d[None, :],
            mask=s_mask[:, None],
            other=0.0,
        )  # [BLOCK_S, D]
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        # A padding sequence (ctx = 0) has every split empty, so m_new stays -inf, and exp(-inf - -inf) is NaN:
        # measure from 0 instead; every weight is then exp(-inf) = 0.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_ref)
        w = tl.exp(lse - m_ref)  # [BLOCK_S]; empty splits have lse = -inf, weight 0
        w_sum = w_sum * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    if GUARD:
        # Section 3.7: m = +inf only when a split met a bad block id (its lse = +inf, and inf - inf made
        # the sums NaN): the row stores zeros and lse -inf, as a padding sequence does.
        acc = tl.where(m < float("inf"), acc, 0.0)
        w_sum = tl.where(m < float("inf"), w_sum, 0.0)
    seen = w_sum > 0  # [1]: False only for a padding sequence, whose output is 0 and lse -inf
    w_safe = tl.where(seen, w_sum, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, (acc / w_safe).to(out_ptr.dtype.element_ty))
    if WRITE_LSE:
        lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))
        tl.store(lse_ptr + b * stride_fb + h * stride_fh + tl.arange(0, 1), lse_out)


@triton.jit
def merge_states_kernel(
    o_a_ptr,
    lse_a_ptr,
    o_b_ptr,
    lse_b_ptr,
    o_ptr,
    lse_ptr,  # o [R, D], lse [R], all contiguous
    R,
    err_ptr,  # [4] int64, the device error word (drills/device_errors.py)
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GUARD: tl.constexpr,  # section 3.7: a NaN or +inf lse gives its row zeros and lse -inf
):
    # Section 3.5: two states (o, lse) over disjoint key sets -> the state over their union.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = rows < R
    rows64 = rows.to(tl.int64)
    offs_d = tl.arange(0, D)
    lse_a = tl.load(lse_a_ptr + rows64, mask=r_mask, other=float("-inf"))
    lse_b = tl.load(lse_b_ptr + rows64, mask=r_mask, other=float("-inf"))
    ptrs = rows64[:, None] * D + offs_d[None, :]
    o_a = tl.load(o_a_ptr + ptrs, mask=r_mask[:, None], other=0.0).to(tl.float32)
    o_b = tl.load(o_b_ptr + ptrs, mask=r_mask[:, None], other=0.0).to(tl.float32)
    m = tl.maximum(lse_a, lse_b)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # both empty: keep exp() away from -inf - -inf
    w_a = tl.exp(lse_a - m_safe)
    w_b = tl.exp(lse_b - m_safe)
    w = w_a + w_b
    o = (w_a[:, None] * o_a + w_b[:, None] * o_b) / tl.where(w > 0, w, 1.0)[:, None]
    lse = tl.where(w > 0, m_safe + tl.log(w), float("-inf"))
    if GUARD:
        # Section 3.7: a log-sum-exp is finite, or -inf for an empty part. NaN or +inf (NaN < inf is
        # False) made the weights inf / inf above: such a row stores zeros and lse -inf.
        bad_a = r_mask & ((lse_a < float("inf")) == 0)
        bad_b = r_mask & ((lse_b < float("inf")) == 0)
        first_a = tl.min(tl.where(bad_a, rows, R), axis=0)  # R: no bad row here
        first_b = tl.min(tl.where(bad_b, rows, R), axis=0)
        record_error(err_ptr, first_a < R, 34, first_a, first_a)
        record_error(err_ptr, first_b < R, 35, first_b, first_b)
        o = tl.where((bad_a | bad_b)[:, None], 0.0, o)
        lse = tl.where(bad_a | bad_b, float("-inf"), lse)
    tl.store(o_ptr + ptrs, o.to(o_ptr.dtype.element_ty), mask=r_mask[:, None])
    tl.store(lse_ptr + rows64, lse, mask=r_mask)


def merge_states(o_a, lse_a, o_b, lse_b, check=None):
    """Merge two attention states over disjoint key sets into the state over their union.

    o_a, o_b      [..., D] normalised partial outputs (same shape and dtype)
    lse_a, lse_b  [...] float32 log-sum-exp of each part's scaled scores, natural log; -inf = empty
    check         also check that no lse is NaN or +inf: None (default) on the CPU only, where it costs
                  no device sync; True on a GPU too; False never (the kernel then stores such a row as
                  zeros with lse -inf, and raise_device_errors() names the argument)
    Any of the four may be a strided view: the kernel reads contiguous copies.
    Returns (o [..., D] in o_a's dtype, lse [...] float32).
    """
    for name, t in (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b)):
        validate.tensor(name, t)
    validate.tensor("o_a", o_a, dtypes=(torch.float16, torch.bfloat16, torch.float32))
    validate.tensor("o_b", o_b, dtypes=(o_a.dtype,))
    validate.tensor("lse_a", lse_a, dtypes=(torch.float32,))
    validate.tensor("lse_b", lse_b, dtypes=(torch.float32,))
    validate.same_device(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    if o_a.dim() < 1 or o_b.shape != o_a.shape:
        raise ValueError(f"o_b shape {tuple(o_b.shape)} must equal o_a shape {tuple(o_a.shape)}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.shape != o_a.shape[:-1]:
            raise ValueError(
                f"{name} must have shape {tuple(o_a.shape[:-1])} (o_a without its last dim), got {tuple(t.shape)}"
            )
    D = o_a.shape[-1]
    if not (validate.is_pow2(D) and D <= 256):
        raise ValueError(f"head dim D = {D} (o_a.shape[-1]) must be a power of two up to 256")
    if validate.device_values_checked(check, lse_a):
        for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
            bad = (t < float("inf")).logical_not().flatten()  # NaN or +inf
            if bad.any():
                i = int(bad.nonzero()[0])
                raise ValueError(
                    f"{name} holds {float(t.flatten()[i])} at flat index {i}: a log-sum-exp is finite, or -inf "
                    "for an empty part"
                )
    o_a, o_b = o_a.contiguous(), o_b.contiguous()
    lse_a, lse_b = lse_a.contiguous(), lse_b.contiguous()
    o = torch.empty_like(o_a)
    lse = torch.empty_like(lse_a)
    R = lse_a.numel()
    BLOCK_R = 16
    merge_states_kernel[(triton.cdiv(R, BLOCK_R),)](
        o_a, lse_a, o_b, lse_b, o, lse, R, error_word(o_a.device), D=D, BLOCK_R=BLOCK_R, GUARD=True
    )
    return o, lse


def _launch(q, k_cache, v_cache, block_tables, context_lens, scale, decode_plan, out, lse, guard=True):
    """Launch without checks (the benchmark times this). lse is None or [B, Hq] fp32. guard=False drops
    the device guard (section 3.7), only so that the benchmark can time what it costs."""
    B, Hq, D = q.shape
    _, PAGE, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    splits = decode_plan.num_splits
    # Measured on an H200 against 16/64/128/256-token tiles and 2-8 warps: one 16-token tile with 2
    # warps and 5 loads in flight is fastest at every batch size once the grid is full (as in L2).
    common = dict(
        GROUP=group,
        GROUP_PAD=max(16, next_pow2(group)),
        PAGE=PAGE,
        D=D,
        BLOCK_N=BLOCK_N,
        num_warps=2,
        num_stages=5,
        GUARD=guard,
    )
    head = (q, k_cache, v_cache, block_tables, context_lens)
    guard_args = (k_cache.shape[0], block_tables.shape[1], error_word(q.device))
    kv_args = (scale * LOG2E, decode_plan.chunk, q.stride(0), q.stride(1), *k_cache.stride()[:3])
    kv_args += v_cache.stride()[:3]
    # launch() calls the compiled binary directly once it has seen this specialisation (section 3.6).
    if splits == 1:  # nothing to merge: write the final output directly
        lse_arg = lse if lse is not None else out  # unused pointer when WRITE_LSE is False
        lse_strides = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
        launch(
            split_kv_kernel,
            (B, Hkv, 1),
            (
                *head,
                out,
                lse_arg,
                *kv_args,
                out.stride(0),
                out.stride(1),
                0,
                *lse_strides,
                block_tables.stride(0),
                *guard_args,
            ),
            WRITE_LSE=lse is not None,
            **common,
        )
        return out
    # The partials, contiguous in one allocation: [B, Hq, S, D] outputs, then [B, Hq, S] lse.
    n_out = B * Hq * splits * D
    partials = torch.empty(n_out + B * Hq * splits, dtype=torch.float32, device=q.device)
    o_part, lse_part = partials, partials[n_out:]  # the kernels index them through the strides below
    part_strides = (Hq * splits * D, splits * D, D)
    lse_part_strides = (Hq * splits, splits)
    # Both launches are prepared before the first starts: the merge is then queued a few microseconds
    # after the split kernel, which may run for only 15 us (B = 1, ctx = 4096), so the GPU never waits.
    split = prepare(
        split_kv_kernel,
        (B, Hkv, splits),
        (
            *head,
            o_part,
            lse_part,
            *kv_args,
            *part_strides,
            *lse_part_strides,
            block_tables.stride(0),
            *guard_args,
        ),
        WRITE_LSE=True,
        **common,
    )
    lse_arg, lse_strides = (lse, (lse.stride(0), lse.stride(1))) if lse is not None else (lse_part, (0, 0))
    merge = prepare(
        merge_splits_kernel,
        (B, Hq),
        (
            o_part,
            lse_part,
            out,
            lse_arg,
            splits,
            *part_strides,
            *lse_part_strides,
            out.stride(0),
            out.stride(1),
        )
        + lse_strides,
        # Up to 64 splits per step: the merge has only B * Hq programs, so fewer, wider loads win.
        D=D,
        BLOCK_S=min(64, max(16, next_pow2(splits))),
        WRITE_LSE=lse is not None,
        GUARD=guard,
        num_warps=4,
    )
    split()
    merge()
    return out


def split_kv_decode(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    scale=None,
    plan=None,
    out=None,
    return_lse=False,
    check=None,
):
    """Paged decode attention with split-KV: L2's inputs and result, fast at any batch size.

    q             [B, Hq, D], float16 or bfloat16 (a strided view is fine)
    k_cache       [num_blocks, PAGE, Hkv, D], q's dtype, PAGE a power of two from 1 to 128; v_cache likewise.
                  Strided views are fine (one layer of a bigger pool), but the two must share no element
    block_tables  [B, max_pages] int32, each row contiguous; ids of the pages a sequence uses in
                  [0, num_blocks); entries past a sequence's last page are never read
    context_lens  [B] int32, contiguous, 0 <= context_lens[b] <= max_pages * PAGE; 0 marks a padding
                  sequence (a batch padded to a captured graph's size): nothing is read, out 0 and lse -inf
    scale         softmax scale, a finite number > 0, default 1 / sqrt(D)
    plan          a DecodePlan from plan() covering these lengths, its max_len at most max_pages * PAGE
                  (plan() reads the lengths on the host once per step); made here from context_lens when
                  None, which reads them from the device
    out           optional [B, Hq, D] of q's dtype (a strided view is fine), written in place
    return_lse    also return lse [B, Hq] float32, the natural-log log-sum-exp of each head's scaled scores
    check         also check the lengths (against the table and the plan) and the live block ids: None
                  (default) on the CPU only, where it costs no device sync; True on a GPU too; False never

    With a plan, no check reads device memory unless asked, so the call can be captured in a CUDA graph
    and replayed with new values in the same buffers (plan for the longest length the graph will see).
    Returns out, or (out, lse).
    """
    B, Hq, Hkv, D, PAGE = validate.paged_decode_inputs(
        q, k_cache, v_cache, block_tables, context_lens, scale, out, min_page=1, max_page=128, check=check
    )
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if plan is None:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "plan is None while a CUDA graph is captured: plan() reads the lengths on the host, which "
                "capture forbids; call plan() before capturing and pass plan="
            )
        plan = _make_plan(context_lens, Hkv, PAGE)
    elif not isinstance(plan, DecodePlan):
        raise TypeError(f"plan must be a DecodePlan from plan(), got {type(plan).__name__}")
    else:
        splits, chunk, max_len = plan.num_splits, plan.chunk, plan.max_len
        if not (type(splits) is int and type(chunk) is int and type(max_len) is int):  # the messages:
            validate.positive_int("plan.num_splits", splits)
            validate.positive_int("plan.chunk", chunk)
            validate.non_negative_int("plan.max_len", max_len)
        if splits < 1 or chunk < 1 or max_len < 0:
            validate.positive_int("plan.num_splits", splits)
            validate.positive_int("plan.chunk", chunk)
            validate.non_negative_int("plan.max_len", max_len)
        if chunk % BLOCK_N or splits * chunk < max_len:
            raise ValueError(
                f"plan.chunk = {plan.chunk} must be a multiple of BLOCK_N = {BLOCK_N}, and "
                f"plan.num_splits = {plan.num_splits} chunks must cover plan.max_len = {plan.max_len}"
            )
        if splits > validate.MAX_GRID_YZ:  # splits are grid axis 2, which CUDA caps
            raise ValueError(
                f"plan.num_splits = {splits} must be at most {validate.MAX_GRID_YZ} (grid axis 2)"
            )
        if splits * chunk >= 2**31:  # a split's first token, split * chunk, is an int32 in the kernel
            raise ValueError(
                f"plan.num_splits * plan.chunk = {splits * chunk} must be below 2**31: token positions are int32"
            )
        capacity = block_tables.shape[1] * PAGE
        if max_len > capacity:  # the plan saw a length the table cannot hold: no device read needed
            raise ValueError(
                f"plan.max_len = {max_len} is past the block table's capacity max_pages * PAGE = "
                f"{capacity}: a sequence of the planned batch is longer than its table row"
            )
        if validate.device_values_checked(check, context_lens):
            validate.context_lens_fit(context_lens, max_len, "the plan's max_len")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device) if return_lse else None
    _launch(q, k_cache, v_cache, block_tables, context_lens, float(scale), plan, out, lse)
    return (out, lse) if return_lse else out
