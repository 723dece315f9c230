"""L5 reference: one attention kernel for every step, with sliding windows and attention sinks.

L4's kernel runs prefill chunks and decode rows of one batch in one launch. Two features that new open
models need ride on it here. A sliding window (gpt-oss's 128-token layers, Mistral's, Gemma's): the query
at position p sees only the keys j with p - window < j <= p, so a tile of queries needs only a band of key
tiles, and the loop's bounds come from the window. An attention sink (gpt-oss): each head h has a learned
logit sinks[h] that joins the softmax's denominator and adds nothing to the numerator. Decode rows of a
decode-only batch may also split their band over several programs, merged afterwards as in F1:

    keys read per query tile = its band: at most window + BLOCK_Q - 1 keys (rounded out to whole tiles),
                               against L4's whole prefix
    FLOPs = 4 * Hq * D * sum over new tokens of the keys each sees  # min(position + 1, window) keys each

Read top to bottom: the planner, a tile's block ids, one key tile, the kernel (a program per query tile,
group of heads and split of the band), the merge of split partials, the block-size table, then the
launcher that validates, allocates and launches.
Explainer: drills/content/l5_unified_attention.md.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word, record_error, scan_block_ids
from drills.launch import next_pow2, prepare

MIN_CHUNK = 64  # keys: the smallest share of a band the planner gives one split (F1's rule)
H200_SMS = 132  # used for planning when no GPU is present (the interpreter)


@dataclass(frozen=True)
class UnifiedPlan:
    num_splits: int  # programs per query tile's band; 1: every row is finished in one program, no merge


def _int_list(name, values) -> list[int]:
    """values (a list of ints or a 1-D integer tensor) as a list of ints; a TypeError names `name`."""
    if isinstance(values, torch.Tensor):
        if (
            values.dim() != 1
            or values.dtype.is_floating_point
            or values.dtype in (torch.bool, torch.complex64)
        ):
            raise TypeError(f"{name} must be a 1-D integer tensor, got {values.dtype} {tuple(values.shape)}")
        return values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints or a 1-D integer tensor, got {type(values).__name__}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}[{i}] must be an int, got {type(v).__name__} {v!r}")
    return [int(v) for v in values]


def check_window(window) -> None:
    """window: None or an int >= 1 below 2**31 (key positions are int32 in the kernel)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, numbers.Integral):
        raise TypeError(f"window must be None or an int >= 1, got {type(window).__name__} {window!r}")
    if not 1 <= window < 2**31:
        raise ValueError(f"window must be None or an int from 1 to 2**31 - 1, got {window}")


def plan(
    cu_seqlens_q, context_lens, num_kv_heads, page_size, window=None, num_sms=None, num_splits=None
) -> UnifiedPlan:
    """Choose how many programs share each query tile's band of keys (host side, before the step).

    cu_seqlens_q  [B + 1] ints, as unified_attention's (a list or a 1-D integer tensor)
    context_lens  [B] ints >= 0, as unified_attention's
    num_kv_heads  Hkv, an int >= 1; page_size PAGE, a power of two; window None or an int >= 1
    num_sms       SMs to fill (an int >= 1), default the current GPU's (132, an H200's, without a GPU)
    num_splits    force a split count (an int >= 1 up to 65535; teaching and tests)

    Prefill tiles fill the GPU by themselves, so a batch with any row of more than one new token is not
    split (vLLM's rule). A decode-only batch is split when its B * Hkv programs cannot fill the GPU (about
    four per SM), into shares of at least MIN_CHUNK keys of the longest band: min(context, window).
    """
    ends = _int_list("cu_seqlens_q", cu_seqlens_q)
    lens = validate.decode_plan_args(
        context_lens, num_kv_heads, page_size, num_sms, num_splits, max_page=2**30
    )
    if len(ends) != len(lens) + 1:
        raise ValueError(
            f"cu_seqlens_q must hold len(context_lens) + 1 = {len(lens) + 1} entries, got {len(ends)}"
        )
    check_window(window)
    if num_splits is not None:
        if num_splits > validate.MAX_GRID_YZ:  # splits are grid axis 1, which CUDA caps
            raise ValueError(
                f"num_splits = {num_splits} must be at most {validate.MAX_GRID_YZ} (grid axis 1)"
            )
        return UnifiedPlan(num_splits=num_splits)
    q_lens = [b - a for a, b in zip(ends, ends[1:])]
    if max(q_lens) > 1:
        return UnifiedPlan(num_splits=1)
    bands = [min(n, window or n) for n, q in zip(lens, q_lens) if q == 1]
    if not bands:
        return UnifiedPlan(num_splits=1)  # padding only
    if num_sms is None:
        num_sms = (
            torch.cuda.get_device_properties().multi_processor_count
            if torch.cuda.is_available()
            else H200_SMS
        )
    splits = max(1, (4 * num_sms) // (len(bands) * num_kv_heads))
    splits = min(splits, max(1, triton.cdiv(max(bands), MIN_CHUNK)))  # tiny shares cost more to merge
    return UnifiedPlan(num_splits=splits)


_make_plan = plan  # unified_attention's `plan` argument shadows the function's name


@triton.jit
def _block_ids(table_ptr, start_n, offs_n, ctx, PAGE: tl.constexpr):
    """[BLOCK_N] int32: the physical block of each key of the tile starting at start_n (L4 section 3.3)."""
    cols = start_n + offs_n  # [BLOCK_N] key positions in the sequence
    # Entries past the last page are garbage: not read; keys at or past ctx get block 0, never loaded.
    return tl.load(table_ptr + cols // PAGE, mask=cols < ctx, other=0)


@triton.jit
def _attend_kv_tile(
    acc,
    l_i,
    m_i,  # running state: [BLOCK_M, D] fp32, [BLOCK_M], [BLOCK_M] (m in base-2 units)
    q,  # [BLOCK_M, D]
    k_head_ptr,  # k_cache + kvh * stride_kh: this KV head in block 0, slot 0
    v_head_ptr,  # v_cache + kvh * stride_vh
    phys,  # [BLOCK_N] int32: the physical block of each key of this tile (0 past the last page)
    start_n,
    offs_n,  # [BLOCK_N]
    offs_d,  # [D]
    pos,  # [BLOCK_M] each row's absolute position: it sees keys up to pos
    win_start,  # [BLOCK_M] with a window: keys at or before it are outside the row's window
    ctx,
    qk_scale,  # scale * log2(e)
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    PAGE: tl.constexpr,
    WIDE: tl.constexpr,  # int64 offsets: a cache spans 2**31 elements or more
    SAME_KV: tl.constexpr,  # k_cache and v_cache have the same strides: one offset serves both
    MASKED: tl.constexpr,  # True only on tiles at the band's edges (window start, diagonal, end of keys)
    WINDOW: tl.constexpr,
):
    cols = start_n + offs_n  # [BLOCK_N] key positions in the sequence
    if MASKED:
        in_range = cols < ctx  # the stale tail of the last page, and past it: never read
    if WIDE:
        phys = phys.to(tl.int64)  # widened before multiplying: block id * stride_kb passes 2**31
    slot = cols % PAGE
    off = phys * stride_kb + slot * stride_kt  # [BLOCK_N] where each key's K row starts
    k_rows = k_head_ptr + off
    if SAME_KV:
        v_rows = v_head_ptr + off
    else:
        v_rows = v_head_ptr + phys * stride_vb + slot * stride_vt
    if MASKED:
        k = tl.load(k_rows[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(v_rows[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0)  # [BLOCK_N, D]
    else:
        k = tl.load(k_rows[:, None] + offs_d[None, :])  # [BLOCK_N, D]
        v = tl.load(v_rows[:, None] + offs_d[None, :])  # [BLOCK_N, D]
    s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] raw q . k, fp32
    if MASKED:
        # Section 3.2 "The band": row r sees key j when win_start[r] < j <= pos[r].
        seen = cols[None, :] <= pos[:, None]
        if WINDOW:
            seen = seen & (cols[None, :] > win_start[:, None])
        s = tl.where(seen, s, float("-inf"))

    # T4's update in base 2. A window can hide a whole edge tile from some rows before they met any key
    # (and no sink set their max): measure from 0 then, so exp2(-inf - -inf) never makes a NaN.
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # [BLOCK_M]
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s * qk_scale - m_ref[:, None])  # [BLOCK_M, BLOCK_N] = e^(score - m)
    alpha = tl.math.exp2(m_i - m_ref)  # shrinks what was summed under the old max
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)  # [BLOCK_M, D]
    return acc, l_i, m_new


@triton.jit
def _attend_range(
    acc,
    l_i,
    m_i,
    q,
    k_head_ptr,
    v_head_ptr,
    table_ptr,
    lo,
    hi,  # keys [lo, hi), lo a multiple of BLOCK_N
    offs_n,
    offs_d,
    pos,
    win_start,
    ctx,
    qk_scale,
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    PAGE: tl.constexpr,
    WIDE: tl.constexpr,
    SAME_KV: tl.constexpr,
    MASKED: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Each tile's block ids are loaded one tile ahead, so no K or V copy waits on the table (L4 3.3).
    phys = _block_ids(table_ptr, lo, offs_n, ctx, PAGE)  # [BLOCK_N]
    for start_n in range(lo, hi, BLOCK_N):
        phys_next = _block_ids(table_ptr, start_n + BLOCK_N, offs_n, ctx, PAGE)
        acc, l_i, m_i = _attend_kv_tile(
            acc,
            l_i,
            m_i,
            q,
            k_head_ptr,
            v_head_ptr,
            phys,
            start_n,
            offs_n,
            offs_d,
            pos,
            win_start,
            ctx,
            qk_scale,
            stride_kb,
            stride_kt,
            stride_vb,
            stride_vt,
            PAGE=PAGE,
            WIDE=WIDE,
            SAME_KV=SAME_KV,
            MASKED=MASKED,
            WINDOW=WINDOW,
        )
        phys = phys_next
    return acc, l_i, m_i


@triton.jit
def unified_attention_kernel(
    q_ptr,  # [total_q, Hq, D], the new tokens of every sequence, packed
    k_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    v_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    out_ptr,  # [total_q, Hq, D] (possibly a strided view), or fp32 partials [total_q, Hq, S, D] when split
    lse_ptr,  # [total_q, Hq] or [total_q, Hq, S] fp32 (only written when STORE_LSE)
    sinks_ptr,  # [Hq] fp32 (only read when SINKS)
    block_tables_ptr,  # [B, max_pages] int32
    cu_seqlens_ptr,  # [B + 1] int32
    context_lens_ptr,  # [B] int32
    scale,
    window,  # keys p - window < j <= p (only read when WINDOW)
    num_seqs,
    head_groups,  # Hq // HEADS: programs per tile
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_os,  # between splits' partials (0 unsplit)
    stride_lt,
    stride_lh,
    stride_ls,
    stride_bt,
    total_q,  # q.shape[0]: the device guard's bound for query rows
    num_blocks,  # k_cache.shape[0]: the device guard's bound for block ids
    max_pages,  # block_tables.shape[1]: the device guard's bound for context_lens, in pages
    err_ptr,  # [4] int64, the device error word (drills/device_errors.py)
    GROUP: tl.constexpr,  # query heads per KV head, Hq // Hkv
    HEADS: tl.constexpr,  # query heads per tile: GROUP (packed) or 1 (one head per tile)
    BLOCK_Q: tl.constexpr,  # new tokens per tile: BLOCK_M // HEADS
    BLOCK_M: tl.constexpr,  # rows of the tile: BLOCK_Q tokens x HEADS heads, then padding
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    WIDE: tl.constexpr,  # int64 offsets into the caches (one spans 2**31 elements or more)
    SAME_KV: tl.constexpr,  # k_cache and v_cache have the same strides
    WINDOW: tl.constexpr,  # a sliding window is given
    SINKS: tl.constexpr,  # per-head sink logits are given
    STORE_LSE: tl.constexpr,
    GUARD: tl.constexpr,  # L4 section 3.8: contain bad device values (False only to time its cost)
):
    # Section 3.1 "One grid for every row": L4's grid (a program per query tile and group of HEADS heads,
    # the longest tiles first), with a second axis of splits: split s takes the s-th share of the band.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    tile = tl.num_programs(0) // head_groups - 1 - pid // head_groups
    head0 = (pid % head_groups).to(tl.int64) * HEADS  # the tile's first query head
    kvh = head0 // GROUP
    # Sequence b owns tiles cu[b] // BLOCK_Q + b onwards: the owner is the last b whose first tile is <= it.
    lo = tile * 0
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid
        else:
            hi = mid
    b = lo.to(tl.int64)
    q_start = tl.load(cu_seqlens_ptr + b)
    q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start
    tok0 = (tile - (q_start // BLOCK_Q + lo)) * BLOCK_Q  # this tile's first new token in its sequence
    if GUARD:
        # L4 section 3.8: an invalid query range is stored as zeros (lse -inf), the last one up to q's end.
        q_end = q_start + q_len
        last = b == num_seqs - 1
        cu_ok = (q_start >= 0) & (q_len >= 0) & (q_end <= total_q)
        cu_ok = cu_ok & ((b > 0) | (q_start == 0)) & ((last == 0) | (q_end == total_q))
        before = tl.load(cu_seqlens_ptr + b - 1, mask=b > 0, other=0)
        after = tl.load(cu_seqlens_ptr + b + 2, mask=b + 2 <= num_seqs, other=total_q)
        cu_ok = cu_ok & (before <= q_start) & (q_end <= after)
        record_error(err_ptr, (cu_ok == 0) & (head0 == 0) & (split == 0), 71, b, q_len)
        q_len = tl.where(last & (cu_ok == 0), total_q - q_start, q_len)
        first = (b == 0) & (cu_ok == 0)
        tok0 = tl.where(first, tile * BLOCK_Q, tok0)
        q_len = tl.where(first, tl.where(last, total_q, tl.minimum(tl.maximum(q_end, 0), total_q)), q_len)
        q_start = tl.where(first, 0, q_start)
    if tok0 >= q_len:
        return  # a spare tile (or a sequence with q_len = 0): nothing to compute, nothing to store
    ctx = tl.load(context_lens_ptr + b)
    if GUARD:
        ctx_ok = (ctx >= q_len) & (ctx <= max_pages * PAGE)
        record_error(err_ptr, cu_ok & (ctx_ok == 0) & (tok0 == 0) & (head0 == 0) & (split == 0), 72, b, ctx)
        seq_ok = cu_ok & ctx_ok
        ctx = tl.where(seq_ok, ctx, 0)
    prefix = ctx - q_len  # cached tokens before the first new one

    offs_r = tl.arange(0, BLOCK_M)
    tok = tok0 + offs_r // HEADS  # [BLOCK_M] new-token index in the sequence
    heads = head0 + offs_r % HEADS  # [BLOCK_M]
    row_ok = (tok < q_len) & (offs_r < BLOCK_Q * HEADS)
    q_rows = (q_start + tok).to(tl.int64)  # [BLOCK_M] rows of the packed q (and out, lse)
    if GUARD:
        row_ok = row_ok & (tok >= 0) & (q_rows >= 0) & (q_rows < total_q)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )  # [BLOCK_M, D]
    # Section 3.2 "The band": positions are absolute (cached prefix + index in the chunk), and so is the
    # window: a decode row at position 40 000 sees keys 39 873 to 40 000 with window 128.
    pos = prefix + tok  # [BLOCK_M]
    win_start = pos - window  # [BLOCK_M] keys at or before it are outside the window (unused without one)

    # Keys [band_lo, band_hi) are the band of the tile's rows: band_hi one past the last row's own key, band_lo the first
    # row's first key rounded down to a tile. Tiles before band_lo are never loaded. Inside it, keys
    # [full_lo, full_end) are seen by every row (no mask); the edges are masked.
    table_ptr = block_tables_ptr + b * stride_bt
    band_hi = tl.minimum(ctx, prefix + tok0 + BLOCK_Q)
    full_end = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N
    band_lo = band_hi * 0
    full_lo = band_hi * 0
    if WINDOW:
        band_lo = tl.maximum(prefix + tok0 - window + 1, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(band_hi - window, 0), BLOCK_N) * BLOCK_N
    if GUARD:
        # Only the pages some query of the sequence can see: with a window, from its first query's first key
        # on. Ids before that are never read, and every program of the sequence scans the same pages, so
        # the whole sequence is valid or none of it. At 32k with window 128 that is 9 pages, not 2,048.
        first_page = 0
        if WINDOW:
            first_page = tl.maximum(prefix - window + 1, 0) // PAGE
        n_bad, bad_id = scan_block_ids(table_ptr + first_page, tl.cdiv(ctx, PAGE) - first_page, num_blocks)
        record_error(err_ptr, (n_bad > 0) & (tok0 == 0) & (head0 == 0) & (split == 0), 73, b, bad_id)
        seq_ok = seq_ok & (n_bad == 0)
        band_hi = tl.where(seq_ok, band_hi, 0)
        band_lo = tl.where(seq_ok, band_lo, 0)
    # The three stretches: masked [band_lo, a), unmasked [a, c), masked [c, band_hi); band_lo <= a <= c <= band_hi.
    a = tl.minimum(tl.maximum(full_lo, band_lo), band_hi)
    c = tl.minimum(tl.maximum(full_end, a), band_hi)
    # Section 3.4 "Splitting the band": split s takes whole tiles [s0, s1) of the band.
    per = tl.cdiv(tl.cdiv(band_hi - band_lo, BLOCK_N), num_splits) * BLOCK_N
    s0 = band_lo + split * per
    s1 = tl.minimum(s0 + per, band_hi)

    # Section 3.3 "The sink": one more key of logit sinks[h] and value zero, held by split 0 only: the
    # running max starts at its logit and the sum at e^0 = 1, the accumulator at 0.
    m_sink = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # base-2 units; -inf: no sink here
    if SINKS:
        sink = tl.load(sinks_ptr + heads) * 1.4426950408889634  # [BLOCK_M]
        m_sink = tl.where(split == 0, sink, m_sink)
    m_i = m_sink
    l_i = tl.where(m_sink > float("-inf"), 1.0, 0.0)  # [BLOCK_M]
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)

    qk_scale = scale * 1.4426950408889634  # e^x = 2^(x log2 e)
    k_head_ptr = k_cache_ptr + kvh * stride_kh
    v_head_ptr = v_cache_ptr + kvh * stride_vh
    # The three stretches, each cut to this split's share [s0, s1): masked, unmasked, masked.
    # fmt: off
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, k_head_ptr, v_head_ptr, table_ptr, tl.maximum(band_lo, s0), tl.minimum(a, s1),
        offs_n, offs_d, pos, win_start, ctx, qk_scale, stride_kb, stride_kt, stride_vb, stride_vt,
        PAGE=PAGE, WIDE=WIDE, SAME_KV=SAME_KV, MASKED=True, WINDOW=WINDOW, BLOCK_N=BLOCK_N)
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, k_head_ptr, v_head_ptr, table_ptr, tl.maximum(a, s0), tl.minimum(c, s1),
        offs_n, offs_d, pos, win_start, ctx, qk_scale, stride_kb, stride_kt, stride_vb, stride_vt,
        PAGE=PAGE, WIDE=WIDE, SAME_KV=SAME_KV, MASKED=False, WINDOW=WINDOW, BLOCK_N=BLOCK_N)
    acc, l_i, m_i = _attend_range(
        acc, l_i, m_i, q, k_head_ptr, v_head_ptr, table_ptr, tl.maximum(c, s0), tl.minimum(band_hi, s1),
        offs_n, offs_d, pos, win_start, ctx, qk_scale, stride_kb, stride_kt, stride_vb, stride_vt,
        PAGE=PAGE, WIDE=WIDE, SAME_KV=SAME_KV, MASKED=True, WINDOW=WINDOW, BLOCK_N=BLOCK_N)
    # fmt: on

    # Section 3.5 "Storing the rows": a split that met no key and holds no sink stores o = 0, lse = -inf
    # (weight 0 in the merge), never 0 / 0. Unsplit, every real row saw its own key: l > 0.
    seen = l_i > 0
    l_div = tl.where(seen, l_i, 1.0)
    out = acc / l_div[:, None]  # [BLOCK_M, D]
    lse = tl.where(seen, (m_i + tl.math.log2(l_div)) * 0.6931471805599453, float("-inf"))
    if GUARD:
        out = tl.where(seq_ok, out, 0.0)  # an invalid sequence read nothing: zeros, lse -inf
        lse = tl.where(seq_ok, lse, float("-inf"))
    tl.store(
        out_ptr
        + q_rows[:, None] * stride_ot
        + heads[:, None] * stride_oh
        + split * stride_os
        + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if STORE_LSE:
        tl.store(lse_ptr + q_rows * stride_lt + heads * stride_lh + split * stride_ls, lse, mask=row_ok)


@triton.jit
def merge_splits_kernel(
    o_part_ptr,  # [total_q, Hq, S, D] fp32
    lse_part_ptr,  # [total_q, Hq, S] fp32
    out_ptr,  # [total_q, Hq, D], possibly a strided view
    lse_ptr,  # [total_q, Hq] fp32 (written when STORE_LSE)
    num_splits,
    num_heads,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lpt,
    stride_lph,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    # Section 3.4: F1's merge, one program per (query row, head); each split's lse weighs its output.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // num_heads
    h = pid % num_heads
    offs_d = tl.arange(0, D)
    offs_s = tl.arange(0, BLOCK_S)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_ok = s0 + offs_s < num_splits
        lse = tl.load(
            lse_part_ptr + row * stride_lpt + h * stride_lph + s0 + offs_s, mask=s_ok, other=float("-inf")
        )  # [BLOCK_S]
        o = tl.load(
            o_part_ptr
            + row * stride_pt
            + h * stride_ph
            + (s0 + offs_s)[:, None] * stride_ps
            + offs_d[None, :],
            mask=s_ok[:, None],
            other=0.0,
        )  # [BLOCK_S, D]
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # every split empty so far: no -inf - -inf
        alpha = tl.exp(m - m_ref)
        w = tl.exp(lse - m_ref)  # [BLOCK_S]; an empty split has lse -inf, weight 0
        w_sum = w_sum * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    seen = w_sum > 0  # [1]: False only for a row of an invalid sequence (zeros, lse -inf)
    w_div = tl.where(seen, w_sum, 1.0)
    tl.store(out_ptr + row * stride_ot + h * stride_oh + offs_d, (acc / w_div).to(out_ptr.dtype.element_ty))
    if STORE_LSE:
        lse_out = tl.where(seen, m + tl.log(w_div), float("-inf"))
        tl.store(lse_ptr + row * stride_lt + h * stride_lh + tl.arange(0, 1), lse_out)


def _config(D: int, tokens_per_seq: float = 1e9) -> tuple[int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, PACKED) for head dim D and the batch's mean new tokens per
    sequence (total_q / B, from the shapes: no sync), as L4's table. Under the interpreter, small tiles keep
    CPU tests fast, and both layouts run across the grader's cases."""
    import drills.runtime

    if drills.runtime.current().interpreter:
        return 32, 16, 4, 1, tokens_per_seq < 8
    if tokens_per_seq <= 1:  # decode rows only: one token's GROUP heads in a 16-row tile (F1's GROUP_PAD)
        return 16, 64, 4, 3, True
    if D == 128:
        if tokens_per_seq < 64:  # mostly decode rows: a 128-token tile would be mostly empty rows
            return 64, 64, 4, 3, True
        # Packed at every length: a K tile then serves the group's heads at once. An H200 measured 363 us
        # packed against 386 unpacked on a 4096-window chunk of 2k over 32k (the same run). A 64-key tile: a
        # 128-key window's band is then 3 tiles, not 2 of 128.
        return 128, 64, 8, 3, True
    if D <= 64:
        return 128, 64, 4, 3, True
    return 64, 32, 4, 2, True  # D = 256: a [128, 256] fp32 accumulator would not fit in registers


def _span(t) -> int:
    """Elements from t's first to its last, through its strides: the largest offset a kernel adds, plus 1."""
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def _launch(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    scale,
    out,
    lse=None,
    window=None,
    sinks=None,
    num_splits=1,
    config=None,
    guard=True,
):
    """Launch without checks: the benchmark times this, the public function adds the checks.
    out [total_q, Hq, D] and lse [total_q, Hq] fp32 (or None) may be strided views; sinks [Hq] fp32 or None;
    config, a _config tuple, overrides it. num_splits > 1 writes fp32 partials and merges them."""
    total_q, Hq, D = q.shape
    _, PAGE, Hkv, _ = k_cache.shape
    B = block_tables.shape[0]
    group = Hq // Hkv
    BLOCK_M, BLOCK_N, num_warps, num_stages, packed = config or _config(D, total_q / B)
    heads = group if packed else 1
    BLOCK_M = max(BLOCK_M, next_pow2(heads))
    BLOCK_Q = BLOCK_M // heads
    tiles, head_groups = total_q // BLOCK_Q + B, Hq // heads
    grid = (tiles * head_groups, num_splits)
    wide = max(_span(k_cache), _span(v_cache)) >= 2**31
    if num_splits == 1:
        o_dst, lse_dst = out, lse
        o_strides = (out.stride(0), out.stride(1), 0)
        lse_strides = (0, 0, 0) if lse is None else (lse.stride(0), lse.stride(1), 0)
    else:
        # The partials in one allocation: [total_q, Hq, S, D] outputs, then [total_q, Hq, S] lse.
        n_out = total_q * Hq * num_splits * D
        partials = torch.empty(n_out + total_q * Hq * num_splits, dtype=torch.float32, device=q.device)
        o_dst, lse_dst = partials, partials[n_out:]
        o_strides = (Hq * num_splits * D, num_splits * D, D)
        lse_strides = (Hq * num_splits, num_splits, 1)
    attend = prepare(
        unified_attention_kernel,
        grid,
        (
            q,
            k_cache,
            v_cache,
            o_dst,
            out if lse_dst is None else lse_dst,  # out stands in for lse when none is asked for
            q if sinks is None else sinks,  # q stands in for sinks when there are none
            block_tables,
            cu_seqlens_q,
            context_lens,
            scale,
            0 if window is None else int(window),  # a numpy integer too
            B,
            head_groups,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            v_cache.stride(0),
            v_cache.stride(1),
            v_cache.stride(2),
            *o_strides,
            *lse_strides,
            block_tables.stride(0),
            total_q,
            k_cache.shape[0],
            block_tables.shape[1],
            error_word(q.device),
        ),
        GROUP=group,
        HEADS=heads,
        BLOCK_Q=BLOCK_Q,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        D=D,
        PAGE=PAGE,
        WIDE=wide,
        SAME_KV=k_cache.stride() == v_cache.stride(),
        WINDOW=window is not None,
        SINKS=sinks is not None,
        STORE_LSE=lse_dst is not None,
        GUARD=guard,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits == 1:
        attend()
        return out if lse is None else (out, lse)
    merge = prepare(
        merge_splits_kernel,
        (total_q * Hq,),
        (
            o_dst,
            lse_dst,
            out,
            lse_dst if lse is None else lse,
            num_splits,
            Hq,
            *o_strides,
            *lse_strides[:2],
            out.stride(0),
            out.stride(1),
            0 if lse is None else lse.stride(0),
            0 if lse is None else lse.stride(1),
        ),
        D=D,
        BLOCK_S=min(64, max(16, next_pow2(num_splits))),
        STORE_LSE=lse is not None,
        num_warps=4,
    )
    attend()
    merge()
    return out if lse is None else (out, lse)


def _check_features(q, window, sinks, plan, check):
    """window, sinks and plan (section 1's contract); a bad one raises naming it."""
    check_window(window)
    if sinks is not None:
        validate.tensor("sinks", sinks, 1, (torch.float32,))
        validate.same_device(q=q, sinks=sinks)
        if sinks.shape[0] != q.shape[1]:
            raise ValueError(
                f"sinks must hold one logit per query head, Hq = {q.shape[1]}, got {sinks.shape[0]}"
            )
        if validate.device_values_checked(check, sinks):
            # Exponent bits all ones: inf or NaN. Read as integers, so no float is computed on the host.
            exponent = sinks.view(torch.int32) & 0x7F800000
            if bool((exponent == 0x7F800000).any()):
                raise ValueError("sinks must be finite logits: it holds NaN or inf")
    if plan is not None:
        if not isinstance(plan, UnifiedPlan):
            raise TypeError(f"plan must be a UnifiedPlan from plan(), got {type(plan).__name__}")
        splits = plan.num_splits
        if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= validate.MAX_GRID_YZ:
            raise ValueError(
                f"plan.num_splits must be an int from 1 to {validate.MAX_GRID_YZ}, got {splits!r}"
            )


def unified_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    window=None,
    sinks=None,
    scale=None,
    out=None,
    return_lse=False,
    check=None,
    plan=None,
):
    """Causal attention of a batch's new tokens over their paged KV cache, with a sliding window and sinks.

    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out, return_lse, check: as L4's
                  paged_prefill (q_len 0 padding rows, q_len 1 decode rows and prefill chunks over a cached
                  prefix in one batch)
    window        None, or an int >= 1: new token i of sequence b sits at absolute position
                  p = context_lens[b] - q_len_b + i and sees the keys j with p - window < j <= p (gpt-oss's
                  window of 128 is window=128); None: every key up to p
    sinks         None, or [Hq] float32 finite logits: head h's softmax denominator gains exp(sinks[h]), its
                  numerator nothing (a key whose value is zero). NaN or inf raises when check reads values
    plan          None (one program per query tile: no host sync), or a UnifiedPlan from plan(): how many
                  programs share each tile's band, merged afterwards (it pays for small decode batches)

    lse (return_lse=True) is the natural log of the whole denominator, the sink included. With window=None
    and sinks=None the result is L4's paged_prefill, up to rounding. Bad input raises ValueError or
    TypeError naming the argument, before anything is launched.

    Returns out [total_q, Hq, D] (and lse [total_q, Hq] fp32 with return_lse=True).
    """
    validate.paged_prefill_inputs(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out, return_lse, check
    )
    _check_features(q, window, sinks, plan, check)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [total_q, Hq, D]
    lse = (
        torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    )  # [total_q, Hq]
    if q.shape[0] == 0:
        return (out, lse) if return_lse else out  # every sequence is padding: nothing to launch
    num_splits = 1 if plan is None else plan.num_splits
    return _launch(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        float(scale),
        out,
        lse,
        window=window,
        sinks=None if sinks is None else sinks.contiguous(),
        num_splits=num_splits,
    )
