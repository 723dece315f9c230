"""L5, your file: one attention kernel for every step, with sliding windows and attention sinks.

L4's kernel is here whole (the sequence search, the guards, the block ids, the key loop); fill in what a
window, a sink and a split band add to it: the mask in `_attend_kv_tile`, the band, the sink and the
epilogue in `unified_attention_kernel`, then `merge_splits_kernel` and `plan()`. Read
drills/content/l5_unified_attention.md first: every TODO names the section that teaches it. Grade with
`make test L=l5`. Start by deleting the `raise NotImplementedError` line in unified_attention; stage 3
(the split band) starts with the one in plan().

    keys read per query tile = its band: at most window + BLOCK_Q - 1 keys (rounded out to whole tiles)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word, record_error, scan_block_ids  # noqa: F401
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
    raise NotImplementedError(
        "l5 is not started: fill in drills/mine/l5_unified_attention.py stage by stage, deleting unified_attention's raise first and this one for stage 3, plan() and merge_splits_kernel (read drills/content/l5_unified_attention.md)"
    )
    # TODO(stage 3, section 3.4 "Splitting the band"): read the lengths (_int_list, validate.decode_plan_args),
    # check the window (check_window); a forced num_splits (at most validate.MAX_GRID_YZ) is the plan. Else
    # split only a decode-only batch (every q_len <= 1) whose B * Hkv programs cannot fill num_sms SMs (about
    # 4 per SM), in shares of at least MIN_CHUNK keys of the longest band min(context, window).
    return UnifiedPlan(num_splits=1)


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
    # TODO(stage 1, section 3.2 "The band"): on MASKED tiles, hide key j from row r (score -inf) unless
    # j <= pos[r] and, with a WINDOW, j > win_start[r].

    # T4's update in base 2. A window can hide a whole edge tile from some rows before they met any key
    # (and no sink set their max): measure from 0 then, so exp2(-inf - -inf) never makes a NaN.
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # [BLOCK_M]
    m_ref = m_new  # TODO(stage 1, section 3.2 "The band"): a row that met no key yet has m_new = -inf
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
    # TODO(stage 1, section 3.2 "The band"): pos [BLOCK_M], each row's absolute position, and win_start
    # [BLOCK_M], the last key before its window (computed even without a WINDOW: then unused).

    table_ptr = block_tables_ptr + b * stride_bt
    # TODO(stage 1, section 3.2 "The band"): band_hi (one past the tile's last row's own key, at most ctx),
    # band_lo (the first row's first key, rounded down to a whole BLOCK_N tile; 0 without a WINDOW), and
    # inside it full_lo and full_end, the whole tiles every row of the tile sees. With GUARD, first scan the
    # sequence's block ids as L4 does (scan_block_ids, record_error code 73; with a WINDOW, from the page of
    # the sequence's first query's first key: section 3.2), and an invalid sequence's band is empty. Then
    # the three stretches a <= c: masked [band_lo, a), unmasked [a, c), masked [c, band_hi).
    # TODO(stage 3, section 3.4 "Splitting the band"): this split's whole tiles [s0, s1) of the band
    # (num_splits programs share it); unsplit, s0 = band_lo and s1 = band_hi.

    # TODO(stage 2, section 3.3 "The sink"): m_sink [BLOCK_M], base 2: sinks[h] * log2(e) in split 0 when
    # SINKS, else -inf; m_i starts at m_sink, l_i at 1 where there is a sink (else 0); acc at 0.

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

    # TODO(stage 1, section 3.5 "Storing the rows"): out = acc / l and lse = (m + log2 l) * ln 2, both for
    # the real rows only (row_ok), at split `split` (stride_os, stride_ls); a row with l = 0 stores o = 0 and
    # lse = -inf; with GUARD an invalid sequence stores zeros and -inf. lse only when STORE_LSE.


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
    # TODO(stage 3, section 3.4 "Splitting the band"): one program per (query row, head) of the grid's one
    # axis (row = pid // num_heads, as int64): F1's merge of the row's num_splits partials, BLOCK_S at a
    # time, each weighted by exp(its lse - the running max); out in out's dtype, lse natural log (-inf when
    # every split was empty).
    pass


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
    raise NotImplementedError(
        "l5 is not started: fill in the kernels in drills/mine/l5_unified_attention.py, then delete this line (read drills/content/l5_unified_attention.md)"
    )
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
