"""F2, your file: cascade attention, a prefix that several sequences share read once per step.

Fill in the TODOs in three stages (make test L=f2 says which one you are in); the launchers and the checks
are complete. Read drills/content/f2_cascade_decode.md first: every TODO names its section.
  1. merge: merge_kernel (delete merge_states' `raise NotImplementedError` line)
  2. prefix and suffix with the cuts forced: _attend_tiles, prefix_kernel, suffix_kernel, and plan()'s
     tiles (the cuts after them are written; delete the raise lines in plan() and cascade_decode)
  3. planner: plan() deciding on its own whether cascading pays

When requests share a system prompt, their block tables start with the same physical pages. F1 reads
those pages once per request; here they are read once per tile of rows: the prefix stage puts the
queries of every member of a group (times the query heads of one KV head) in the rows of one tile and
attends the shared pages with tl.dot, the suffix stage attends each sequence's own pages after the
prefix (F1's split-KV), and the merge folds the two partial softmaxes by their log-sum-exp.

    bytes, F1:      2 (K and V) * sum(context_lens) * Hkv * D * 2 (fp16)
    bytes, cascade: 2 * (sum over groups of prefix_lens[g] * tiles(g) + sum of suffix lengths) * Hkv * D * 2,
                    plus B * Hq * (prefix_chunks + suffix_splits) * (D + 1) * 4 for the partials

`plan()` decides on the host, before the step, whether cascading pays and how the work is cut.
Read top to bottom: the planner, the prefix kernel, the suffix kernel, the merge, the launcher.
Explainer: drills/content/f2_cascade_decode.md.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import drills.runtime
from drills import validate
from drills.device_errors import error_word, record_error
from drills.launch import launch, next_pow2, prepare

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): exp2 is the hardware instruction
BLOCK_N = 16  # tokens per tile: the smallest tl.dot tile (a chunk is a multiple of it)
MIN_CHUNK = 64  # tokens: the smallest chunk the planner makes
MAX_ROWS = 128  # rows of a prefix tile: members x query heads of one KV head (128 beat 64 on an H200)
# Cascade when the tokens no longer read are at least this share of all tokens. The explainer's section 4
# table puts the kernels' own crossover lower (a forced cascade loses at a quarter saved and wins at 70%);
# the line is kept at three quarters for C1's engine, which plans with it and runs cascade steps eagerly.
CASCADE_SHARE = 0.75
H200_SMS = 132  # used for planning when no GPU is present (the interpreter)
PREFIX_N = 128  # keys a prefix tile scores at once, at most (_prefix_launch)
PREFIX_PER_SM = 1  # prefix-stage programs per SM: each carries a tile of up to MAX_ROWS rows
PREFIX_WARPS, PREFIX_STAGES = 8, 3  # the prefix stage's launch
# One warp per merge program: a program merges a handful of slots of one row, and at 4 warps the
# merge's waves of B x Hq programs took 16 to 40 us of an H100 step (section 3.7).
MERGE_WARPS = 1


@dataclass(frozen=True)
class CascadePlan:
    cascade: bool  # False: no prefix stage; every sequence is attended whole by the suffix stage (F1)
    members_per_tile: int  # sequences per prefix tile; a tile holds members_per_tile * GROUP rows
    tile_seqs: torch.Tensor | None  # [T, members_per_tile] int32: each tile's sequences, -1 pads
    tile_group: torch.Tensor | None  # [T] int32: the group each tile belongs to
    prefix_chunks: int  # chunks of the prefix per tile (programs along grid axis 2)
    prefix_chunk: int  # tokens per prefix chunk, a multiple of BLOCK_N
    suffix_splits: int  # splits of each sequence's own tokens, as F1's num_splits
    suffix_chunk: int  # tokens per suffix split, a multiple of BLOCK_N
    max_prefix: int  # the longest prefix the plan covers (0 without cascade)
    max_suffix: int  # the longest suffix the plan covers (the whole context without cascade)


def _split(max_len, programs, num_sms, forced, per_sm=4, align=BLOCK_N):
    """(count, chunk) cutting max_len tokens into chunks of whole tiles: F1's rule, about per_sm programs
    per SM, chunks of at least MIN_CHUNK tokens, never a split the longest run leaves empty. Unforced, a
    chunk of `align` tokens or more is rounded up to a multiple of `align`, so that its stage may score
    `align` keys at a time (the prefix stage's PREFIX_N)."""
    tiles = max(1, triton.cdiv(max_len, BLOCK_N))
    n = forced if forced is not None else max(1, (per_sm * num_sms) // max(1, programs))
    if forced is None:
        n = min(n, max(1, triton.cdiv(max_len, MIN_CHUNK)))
    n = min(n, tiles)
    chunk = triton.cdiv(tiles, n) * BLOCK_N
    if forced is None and chunk >= align:
        chunk = triton.cdiv(chunk, align) * align
    return max(1, triton.cdiv(max_len, chunk)), chunk


def _prefix_launch(chunk, rows, D):
    """The prefix stage's tile width and launch (section 3.7). A q tile of at most 128 x 128 elements
    (128 rows at D = 128, 64 at D = 256) scores the largest power of two up to PREFIX_N keys that divides
    the chunk, and at most 128 x 128 elements of K (64 keys at D = 256), at 8 warps and 3 stages, so that
    every tile starts at a multiple of its width and, with PAGE >= the width, lies in one page. Shared
    memory bounds it: 128 keys at D = 256 asked for 295 KB on an H100, past the 227 KB a block may have,
    where 64 keys fit. A larger q tile keeps 16 keys, 4 warps and 2 stages."""
    if rows * D <= 128 * 128:
        keys = min(PREFIX_N, chunk & -chunk, 128 * 128 // D)
        return dict(BLOCK_N=keys, num_warps=PREFIX_WARPS, num_stages=PREFIX_STAGES)
    return dict(BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)


def _as_list(name, values):
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype == torch.bool:
            raise TypeError(
                f"{name} must be a 1-D integer tensor, got {values.dtype} of shape {tuple(values.shape)}"
            )
        return values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints or a 1-D integer tensor, got {type(values).__name__}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}[{i}] must be an int, got {type(v).__name__} {v!r}")
    return list(values)


def check_groups(context_lens, prefix_group, prefix_lens, page_size):
    """Host check of the grouping: every prefix_group[b] in [-1, G), every prefix_lens[g] a multiple of
    page_size and at most every member's length. Lists or tensors; returns (lens, groups, plens) as lists."""
    lens = _as_list("context_lens", context_lens)
    groups = _as_list("prefix_group", prefix_group)
    plens = _as_list("prefix_lens", prefix_lens)
    if len(groups) != len(lens):
        raise ValueError(f"prefix_group must have B = {len(lens)} entries, got {len(groups)}")
    for g, n in enumerate(plens):
        if n < 0 or n % page_size:
            raise ValueError(f"prefix_lens[{g}] = {n} must be a multiple of PAGE = {page_size} and >= 0")
    for b, g in enumerate(groups):
        if not -1 <= g < len(plens):
            raise ValueError(
                f"prefix_group[{b}] = {g} is outside [-1, G = {len(plens)}) (G = len(prefix_lens))"
            )
        if g >= 0 and plens[g] > lens[b]:
            raise ValueError(
                f"prefix_lens[{g}] = {plens[g]} is longer than context_lens[{b}] = {lens[b]}, a member of group {g}"
            )
    return lens, groups, plens


def plan(
    context_lens,
    prefix_group,
    prefix_lens,
    num_q_heads,
    num_kv_heads,
    page_size,
    device=None,
    num_sms=None,
    cascade=None,
    members_per_tile=None,
    prefix_chunks=None,
    suffix_splits=None,
) -> CascadePlan:
    """Decide, on the host before the step, whether to cascade and how to cut the work.

    context_lens [B], prefix_group [B], prefix_lens [G]: lists of ints or 1-D integer tensors (read once)
    num_q_heads Hq, num_kv_heads Hkv (Hq a multiple of Hkv); page_size PAGE, a power of two from 1 to 128
    device       where the plan's tile tables live (default: context_lens' device if a tensor, else the runtime's)
    num_sms      SMs to fill, default the current GPU's (132, an H200's, without a GPU)
    cascade      force (True) or forbid (False) the prefix stage; None: cascade when the tokens a group's
                 members no longer read, (members - 1) * prefix_lens[g] summed, are at least three quarters
                 of all tokens (CASCADE_SHARE), and some group of two or more shares at least MIN_CHUNK tokens
    members_per_tile, prefix_chunks, suffix_splits: force the tile and the cuts (teaching and tests)
    """
    raise NotImplementedError(
        "f2 is not started: fill in plan() and the kernels in drills/mine/f2_cascade_decode.py, then delete this line (read drills/content/f2_cascade_decode.md)"
    )
    lens = validate.decode_plan_args(context_lens, num_kv_heads, page_size, num_sms, suffix_splits)
    lens, groups, plens = check_groups(lens, prefix_group, prefix_lens, page_size)
    validate.positive_int("num_q_heads", num_q_heads)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads = {num_q_heads} must be a multiple of num_kv_heads = {num_kv_heads}")
    for name, v in (("members_per_tile", members_per_tile), ("prefix_chunks", prefix_chunks)):
        if v is not None:
            validate.positive_int(name, v)
    if cascade is not None and not isinstance(cascade, bool):
        raise TypeError(f"cascade must be True, False or None, got {type(cascade).__name__}")
    if device is None:
        device = (
            context_lens.device if isinstance(context_lens, torch.Tensor) else drills.runtime.current().device
        )
    if num_sms is None:
        num_sms = (
            torch.cuda.get_device_properties().multi_processor_count
            if torch.cuda.is_available()
            else H200_SMS
        )
    group_size = num_q_heads // num_kv_heads  # noqa: F841 (rows per member in a tile)
    members = {}  # group -> its sequences, in batch order
    for b, g in enumerate(groups):
        if g >= 0:
            members.setdefault(g, []).append(b)
    saved = sum((len(m) - 1) * plens[g] for g, m in members.items())  # noqa: F841
    # TODO(stage 3, section 3.5 "The planner"): when cascade is None, cascade only when some group of two
    # or more shares at least MIN_CHUNK tokens and the tokens saved, `saved`, are at least CASCADE_SHARE of all.
    if not cascade or not members:
        splits, chunk = _split(max(lens), len(lens) * num_kv_heads, num_sms, suffix_splits)
        return CascadePlan(False, 1, None, None, 0, BLOCK_N, splits, chunk, 0, max(lens))
    # TODO(stage 2, section 3.5 "The planner"): mt = members_per_tile, default MAX_ROWS // group_size (at
    # least 1, at most the largest group); cut each group's members, in batch order, into tiles of mt
    # (pad with -1), tile_group[t] the tile's group: never two groups in one tile, every group one or more.
    mt, tiles, tile_group = 1, [], []
    starts = [plens[g] if g >= 0 else 0 for g in groups]
    max_prefix = max(plens[g] for g in members)
    max_suffix = max(n - s for n, s in zip(lens, starts))
    p_count, p_chunk = _split(
        max_prefix,
        len(tiles) * num_kv_heads,
        num_sms,
        prefix_chunks,
        per_sm=PREFIX_PER_SM,
        align=PREFIX_N,
    )
    s_count, s_chunk = _split(max_suffix, len(lens) * num_kv_heads, num_sms, suffix_splits)
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return CascadePlan(
        True,
        mt,
        as_tensor(tiles),
        as_tensor(tile_group),
        p_count,
        p_chunk,
        s_count,
        s_chunk,
        max_prefix,
        max_suffix,
    )


_make_plan = plan  # cascade_decode's `plan` argument shadows the function's name


@triton.jit
def _attend_tiles(
    q,  # [ROWS, D], the rows' queries
    k_cache_ptr,
    v_cache_ptr,
    bt_row,  # the block-table row the tokens' pages are read from
    kvh,
    start,
    end,  # tokens [start, end) of that row
    qk_scale,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    num_blocks,
    ROWS: tl.constexpr,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Online softmax of q's rows over tokens [start, end) of one table row: (o, lse, bad, bad_id), o
    normalised, lse natural log (-inf where no token was seen), bad whether a block id outside the pool
    was met, bad_id the first such id."""
    offs_n = tl.arange(0, BLOCK_N)
    n_bad = tl.zeros([BLOCK_N], dtype=tl.int32)  # per lane: block ids outside [0, num_blocks) met so far
    first_bad = tl.zeros([BLOCK_N], dtype=tl.int64)
    # TODO(stage 2, section 3.2 "Gathering tokens and the online softmax"): m_i (from -inf), l_i, acc
    # [ROWS, D]; loop over [start, end) in tiles of BLOCK_N tokens: each token's block id
    # bt_row[tok // PAGE] (one load per tile when PAGE >= BLOCK_N) widened to int64, slot tok % PAGE. Per
    # lane, count ids outside [0, num_blocks) in n_bad (the first in first_bad) and read block 0 instead.
    # K and V loads masked past `end` with other=0.0: a masked lane's memory may hold NaN or inf, and
    # 0 * NaN in p @ v is NaN even where p = 0. Scores with tl.dot in base 2 (qk_scale holds log2 e), -inf
    # past `end`, the exp2 update.
    # TODO(section 3.2): o = acc / l_i and lse = (m_i + log2 l_i) * ln 2, natural log; o = 0 and lse = -inf
    # where l_i == 0 (an empty range).
    o = tl.zeros([ROWS, D], dtype=tl.float32)
    lse = tl.zeros([ROWS], dtype=tl.float32)
    bad_lane = tl.min(tl.where(n_bad > 0, offs_n, BLOCK_N), axis=0)  # BLOCK_N: no bad block id
    bad_id = tl.sum(tl.where(offs_n == bad_lane, first_bad, 0), axis=0)
    return o, lse, bad_lane < BLOCK_N, bad_id


@triton.jit
def prefix_kernel(
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    v_cache_ptr,
    block_tables_ptr,  # [B, max_pages] int32
    prefix_lens_ptr,  # [G] int32
    tile_seqs_ptr,  # [T, MEMBERS] int32, -1 pads
    tile_group_ptr,  # [T] int32
    o_part_ptr,  # [B, Hq, NS, D] fp32: chunk c of the prefix goes to slot c
    lse_part_ptr,  # [B, Hq, NS] fp32
    qk_scale,
    chunk,  # tokens per prefix chunk
    B,
    G,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_pb,
    stride_ph,
    stride_lb,
    stride_lh,
    stride_bt,
    num_blocks,
    max_pages,
    err_ptr,  # [4] int64, the device error word (drills/device_errors.py)
    MEMBERS: tl.constexpr,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,  # MEMBERS * GROUP rounded up to a power of two, at least 16 (tl.dot)
    PAGE: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Section 3.1 "The prefix tile": one program per (tile of a group's members, KV head, prefix chunk).
    t = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2)
    g = tl.load(tile_group_ptr + t)
    plen = tl.load(prefix_lens_ptr + g, mask=(g >= 0) & (g < G), other=-1)  # a stale plan's group: not read
    # Section 3.6: a prefix the table row cannot hold, or that is no whole number of pages, or longer
    # than the plan's chunks cover, is not read: its rows get lse = +inf and the merge stores zeros.
    plen_ok = (plen >= 0) & (plen <= max_pages * PAGE) & (plen % PAGE == 0)
    plen_ok = plen_ok & (plen <= tl.num_programs(2).to(tl.int64) * chunk)
    record_error(err_ptr, (plen_ok == 0) & (kvh == 0) & (c == 0), 51, g, plen)
    plen = tl.where(plen_ok, plen, 0)

    # TODO(stage 2, section 3.1 "The prefix tile"): offs_r over ROWS rows; row r is member r // GROUP of
    # the tile (its sequence seq from tile_seqs, -1 for a pad) and query head head = kvh * GROUP + r % GROUP;
    # r_mask: r < MEMBERS * GROUP and 0 <= seq < B; b = seq where r_mask, else 0 (int64). Load q [ROWS, D]
    # through its strides, masked rows 0.
    offs_d = tl.arange(0, D)
    r_mask = tl.zeros([ROWS], dtype=tl.int1)
    b = tl.zeros([ROWS], dtype=tl.int64)
    head = tl.zeros([ROWS], dtype=tl.int64)
    q = tl.zeros([ROWS, D], dtype=q_ptr.dtype.element_ty)
    # The shared pages are the first entries of every member's row: read them from the tile's first.
    first = tl.load(tile_seqs_ptr + t * MEMBERS).to(tl.int64)
    first = tl.where((first >= 0) & (first < B), first, 0)
    # TODO(section 3.1): chunk c covers tokens [c * chunk, min((c + 1) * chunk, plen)).
    start = 0
    end = 0
    o, lse, bad_page, bad_id = _attend_tiles(
        q,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr + first * stride_bt,
        kvh,
        start,
        end,
        qk_scale,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_vb,
        stride_vt,
        stride_vh,
        num_blocks,
        ROWS,
        PAGE,
        D,
        BLOCK_N,
    )
    record_error(err_ptr, bad_page & (kvh == 0), 52, first, bad_id)
    lse = tl.where(bad_page | (plen_ok == 0), float("inf"), lse)  # the merge zeroes such rows
    o_rows = o_part_ptr + b[:, None] * stride_pb + head[:, None] * stride_ph + c * D + offs_d[None, :]
    tl.store(o_rows, o, mask=r_mask[:, None])
    tl.store(lse_part_ptr + b * stride_lb + head * stride_lh + c, lse, mask=r_mask)


@triton.jit
def suffix_kernel(
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,  # [B, max_pages] int32
    context_lens_ptr,  # [B] int32
    prefix_group_ptr,  # [B] int32 (read when CASCADE)
    prefix_lens_ptr,  # [G] int32 (read when CASCADE)
    o_ptr,  # final out [B, Hq, D] when unsplit without a prefix, else partials [B, Hq, NS, D] fp32
    lse_ptr,  # [B, Hq] or [B, Hq, NS] fp32, natural log
    qk_scale,
    chunk,  # tokens per split
    first_slot,  # the partial slot of split 0: the prefix chunks come before it
    G,
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
    num_blocks,
    max_pages,
    err_ptr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CASCADE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    # Section 3.3 "The suffix stage": F1's grid, one program per (sequence, KV head, split), over the
    # sequence's tokens after its group's prefix.
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    once = (kvh == 0) & (split == 0)
    row_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)
    record_error(err_ptr, (row_ok == 0) & once, 53, b, ctx)
    start = ctx * 0
    if CASCADE:
        g = tl.load(prefix_group_ptr + b)
        g_ok = (g >= -1) & (g < G)
        record_error(err_ptr, row_ok & (g_ok == 0) & once, 54, b, g)
        plen = tl.load(prefix_lens_ptr + g, mask=g_ok & (g >= 0), other=0)
        plen_ok = (plen >= 0) & (plen <= ctx) & (plen % PAGE == 0)
        record_error(err_ptr, row_ok & g_ok & (plen_ok == 0) & once, 55, b, plen)
        row_ok = row_ok & g_ok & plen_ok
        # TODO(stage 2, section 3.3 "The suffix stage"): the suffix starts after the group's prefix:
        # start = plen where row_ok (plen counts tokens), else 0.
    planned = ctx - start <= tl.num_programs(2).to(tl.int64) * chunk  # int64: splits * chunk may pass 2**31
    record_error(err_ptr, row_ok & (planned == 0) & once, 56, b, ctx)
    row_ok = row_ok & planned
    ctx = tl.where(row_ok, ctx, 0)
    start = tl.where(row_ok, start, 0)

    offs_g = tl.arange(0, GROUP_PAD)
    g_mask = offs_g < GROUP
    q_heads = kvh * GROUP + offs_g  # [GROUP_PAD]: contiguous grouping, as in L2
    offs_d = tl.arange(0, D)
    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )  # [GROUP_PAD, D]
    s0 = start + split * chunk
    o, lse, bad_page, bad_id = _attend_tiles(
        q,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr + b * stride_bt,
        kvh,
        s0,
        tl.minimum(s0 + chunk, ctx),
        qk_scale,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_vb,
        stride_vt,
        stride_vh,
        num_blocks,
        GROUP_PAD,
        PAGE,
        D,
        BLOCK_N,
    )
    record_error(err_ptr, bad_page & (kvh == 0), 57, b, bad_id)
    # A bad row stores zeros: unmerged, as o = 0 and lse = -inf; merged, as lse = +inf, which the merge
    # turns into zeros whatever the row's other slots hold.
    bad = bad_page | (row_ok == 0)
    o = tl.where(bad, 0.0, o)
    merged = CASCADE or (tl.num_programs(2) > 1)
    lse = tl.where(bad, tl.where(merged, float("inf"), float("-inf")), lse)
    o_rows = o_ptr + b * stride_ob + q_heads[:, None] * stride_oh + (first_slot + split) * stride_os
    tl.store(o_rows + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])
    if WRITE_LSE:
        tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + first_slot + split, lse, mask=g_mask)


@triton.jit
def merge_kernel(
    o_part_ptr,  # [B, Hq, NS, D] fp32
    lse_part_ptr,  # [B, Hq, NS] fp32
    out_ptr,  # [B, Hq, D]
    lse_ptr,  # [B, Hq] fp32 (written when WRITE_LSE)
    prefix_group_ptr,  # [B] int32: slots below num_prefix hold a prefix only for sequences in a group
    num_prefix,  # slots [0, num_prefix) are prefix chunks, [num_prefix, num_slots) suffix splits
    num_slots,
    stride_pb,
    stride_ph,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    stride_fb,
    stride_fh,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    # Section 3.4 "The merge": the states of disjoint key sets -> the state of their union, weighed by
    # e^(lse - max): an output is a normalised average, its lse says how much mass stands behind it.
    # TODO(stage 1, section 3.4 "The merge"): for (b, h) = the program ids (int64), walk the slots BLOCK_S
    # at a time; slots below num_prefix count only when prefix_group[b] >= 0. Running max m (shape [1]) of
    # their lse, weights exp(lse - m) (measured from 0 while m is -inf), the running sum w_sum and acc [D]
    # rescaled by exp(m_old - m). Partial o of slot s is at o_part_ptr + b * stride_pb + h * stride_ph + s * D.
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, D)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    # Section 3.6: m = +inf (or NaN) only when a stage poisoned the row: it stores zeros and lse -inf.
    ok = m < float("inf")
    acc = tl.where(ok, acc, 0.0)
    w_sum = tl.where(ok, w_sum, 0.0)
    seen = w_sum > 0  # [1]: False for a padding sequence, whose output is 0 and lse -inf
    w_safe = tl.where(seen, w_sum, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, (acc / w_safe).to(out_ptr.dtype.element_ty))
    if WRITE_LSE:
        lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))
        tl.store(lse_ptr + b * stride_fb + h * stride_fh + tl.arange(0, 1), lse_out)


def _merge(o_part, lse_part, out, lse, prefix_group, num_prefix):
    """merge_kernel over partials [B, Hq, NS, D] (contiguous) into out [B, Hq, D] (and lse [B, Hq])."""
    B, Hq, NS, D = o_part.shape
    lse_arg, lse_strides = (lse, lse.stride()) if lse is not None else (lse_part, (0, 0))
    return prepare(
        merge_kernel,
        (B, Hq),
        (o_part, lse_part, out, lse_arg, prefix_group, num_prefix, NS, *o_part.stride()[:2])
        + (*lse_part.stride()[:2], *out.stride()[:2], *lse_strides),
        D=D,
        BLOCK_S=min(64, max(16, next_pow2(NS))),
        WRITE_LSE=lse is not None,
        num_warps=MERGE_WARPS,
    )


def merge_states(o_a, lse_a, o_b, lse_b, check=None):
    """Merge two attention states over disjoint key sets into the state over their union.

    o_a, o_b      [R, D] normalised partial outputs (same shape and dtype; strided views are fine)
    lse_a, lse_b  [R] float32 log-sum-exp of each part's scaled scores, natural log; -inf = empty
    check         also check that no lse is NaN or +inf (None: on the CPU only); such a row stores zeros
    Returns (o [R, D] in o_a's dtype, lse [R] float32).
    """
    raise NotImplementedError(
        "f2 is not started: fill in plan() and the kernels in drills/mine/f2_cascade_decode.py, then delete this line (read drills/content/f2_cascade_decode.md)"
    )
    for name, t in (("o_a", o_a), ("o_b", o_b)):
        validate.tensor(name, t, 2, (torch.float16, torch.bfloat16, torch.float32))
    validate.tensor("o_b", o_b, 2, (o_a.dtype,))
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        validate.tensor(name, t, 1, (torch.float32,))
    validate.same_device(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    if o_b.shape != o_a.shape:
        raise ValueError(f"o_b shape {tuple(o_b.shape)} must equal o_a shape {tuple(o_a.shape)}")
    R, D = o_a.shape
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.shape != (R,):
            raise ValueError(f"{name} must have shape ({R},), got {tuple(t.shape)}")
    if not (validate.is_pow2(D) and D <= 256):
        raise ValueError(f"head dim D = {D} (o_a.shape[1]) must be a power of two up to 256")
    if validate.device_values_checked(check, lse_a):
        for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
            bad = (t < float("inf")).logical_not()
            if bad.any():
                i = int(bad.nonzero()[0])
                raise ValueError(
                    f"{name}[{i}] = {float(t[i])}: a log-sum-exp is finite, or -inf for an empty part"
                )
    # The two states side by side as partials of one row each: [R, 1, 2, D] and [R, 1, 2].
    o_part = torch.empty(R, 1, 2, D, dtype=torch.float32, device=o_a.device)
    lse_part = torch.empty(R, 1, 2, dtype=torch.float32, device=o_a.device)
    for i, (o_i, lse_i) in enumerate(((o_a, lse_a), (o_b, lse_b))):
        o_part[:, 0, i].copy_(o_i)
        lse_part[:, 0, i].copy_(lse_i)
    o = torch.empty(R, 1, D, dtype=o_a.dtype, device=o_a.device)
    lse = torch.empty(R, 1, dtype=torch.float32, device=o_a.device)
    no_group = torch.full((R,), -1, dtype=torch.int32, device=o_a.device)
    _merge(o_part, lse_part, o, lse, no_group, 0)()
    return o[:, 0], lse[:, 0]


_SIDE_STREAMS = {}  # GPU index -> the stream the prefix stage runs on (section 3.7)


def _side_stream(device):
    """One stream per GPU, made once, for the prefix stage. Its tiles keep the tensor cores busy while
    the suffix stage, on the caller's stream, waits on memory; one after the other, the step took the
    prefix stage's time plus the suffix stage's (section 3.7)."""
    stream = _SIDE_STREAMS.get(device.index)
    if stream is None:
        stream = _SIDE_STREAMS[device.index] = torch.cuda.Stream(device)
    return stream


def _launch(
    q, k_cache, v_cache, block_tables, context_lens, prefix_group, prefix_lens, scale, cplan, out, lse
):
    """Launch without checks (the benchmark times this). lse is None or [B, Hq] fp32."""
    B, Hq, D = q.shape
    _, PAGE, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    P, S = (cplan.prefix_chunks if cplan.cascade else 0), cplan.suffix_splits
    G = prefix_lens.shape[0]
    if G == 0:  # no group at all: hand the kernels a pointer they never read (G = 0), not an empty one
        prefix_lens = prefix_group
    common = dict(PAGE=PAGE, D=D, BLOCK_N=BLOCK_N)
    kv_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    guard = (k_cache.shape[0], block_tables.shape[1], error_word(q.device))
    head = (q, k_cache, v_cache, block_tables, context_lens, prefix_group, prefix_lens)
    suffix_meta = dict(GROUP=group, GROUP_PAD=max(16, next_pow2(group)), CASCADE=cplan.cascade, **common)
    qk_scale = scale * LOG2E
    suffix_args = (
        qk_scale,
        cplan.suffix_chunk,
        P,
        G,
        q.stride(0),
        q.stride(1),
        *kv_strides,
    )
    if P == 0 and S == 1:  # F1 unsplit: the suffix stage writes the final output itself
        lse_arg, lse_strides = (lse, lse.stride()) if lse is not None else (out, (0, 0))
        launch(
            suffix_kernel,
            (B, Hkv, 1),
            (
                *head,
                out,
                lse_arg,
                *suffix_args,
                *out.stride()[:2],
                0,
                *lse_strides,
                block_tables.stride(0),
                *guard,
            ),
            WRITE_LSE=lse is not None,
            num_warps=2,
            num_stages=5,
            **suffix_meta,
        )
        return out
    NS = P + S
    # The partials in one allocation: [B, Hq, NS, D] outputs, then [B, Hq, NS] lse.
    n_out = B * Hq * NS * D
    partials = torch.empty(n_out + B * Hq * NS, dtype=torch.float32, device=q.device)
    o_part = partials[:n_out].view(B, Hq, NS, D)
    lse_part = partials[n_out:].view(B, Hq, NS)
    # On a GPU the prefix stage runs on a side stream, beside the suffix stage: it starts once the
    # caller's stream has queued this step's inputs, and the merge waits for both (section 3.7).
    side = _side_stream(q.device) if P and q.is_cuda else None
    prefix_stage = None
    if P:
        mt = cplan.members_per_tile
        T = cplan.tile_seqs.shape[0]
        rows = max(16, next_pow2(mt * group))  # ROWS: members x GROUP, a power of two, at least 16
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            prefix_stage = prepare(
                prefix_kernel,
                (T, Hkv, P),
                (q, k_cache, v_cache, block_tables, prefix_lens, cplan.tile_seqs, cplan.tile_group)
                + (
                    o_part,
                    lse_part,
                    qk_scale,
                    cplan.prefix_chunk,
                    B,
                    G,
                    q.stride(0),
                    q.stride(1),
                    *kv_strides,
                )
                + (*o_part.stride()[:2], *lse_part.stride()[:2], block_tables.stride(0), *guard),
                MEMBERS=mt,
                GROUP=group,
                ROWS=rows,
                PAGE=PAGE,
                D=D,
                **_prefix_launch(cplan.prefix_chunk, rows, D),
            )
    suffix_stage = prepare(
        suffix_kernel,
        (B, Hkv, S),
        (*head, o_part, lse_part, *suffix_args, *o_part.stride()[:3], *lse_part.stride()[:2])
        + (block_tables.stride(0), *guard),
        WRITE_LSE=True,
        num_warps=2,
        num_stages=5,
        **suffix_meta,
    )
    merge_stage = _merge(o_part, lse_part, out, lse, prefix_group, P)
    # All prepared before the first starts, so the GPU never waits for the host.
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(q.device))
        with torch.cuda.stream(side):
            prefix_stage()
    elif prefix_stage is not None:
        prefix_stage()
    suffix_stage()
    if side is not None:
        torch.cuda.current_stream(q.device).wait_stream(side)
    merge_stage()
    return out


def _check_plan(cplan, B, Hkv, capacity, device):
    """Host checks of a plan (no device read): its type, its cuts, its tile tables."""
    if not isinstance(cplan, CascadePlan):
        raise TypeError(f"plan must be a CascadePlan from plan(), got {type(cplan).__name__}")
    for name in ("prefix_chunk", "suffix_chunk", "suffix_splits", "members_per_tile"):
        value = validate.positive_int(f"plan.{name}", getattr(cplan, name))
        if name.endswith("chunk") and value % BLOCK_N:
            raise ValueError(f"plan.{name} = {value} must be a multiple of BLOCK_N = {BLOCK_N}")
    for name in ("suffix_splits", "prefix_chunks"):  # grid axis 2 of the suffix and prefix stages
        if getattr(cplan, name) > validate.MAX_GRID_YZ:
            raise ValueError(f"plan.{name} = {getattr(cplan, name)} must be at most {validate.MAX_GRID_YZ}")
    if cplan.suffix_splits * cplan.suffix_chunk < cplan.max_suffix:
        raise ValueError(
            f"plan.suffix_splits * plan.suffix_chunk must cover plan.max_suffix = {cplan.max_suffix}"
        )
    if max(cplan.max_suffix, cplan.max_prefix) > capacity:
        raise ValueError(f"plan.max_suffix / plan.max_prefix is past the block table's capacity {capacity}")
    if cplan.cascade:
        validate.positive_int("plan.prefix_chunks", cplan.prefix_chunks)
        if cplan.prefix_chunks * cplan.prefix_chunk < cplan.max_prefix:
            raise ValueError(
                f"plan.prefix_chunks * plan.prefix_chunk must cover plan.max_prefix = {cplan.max_prefix}"
            )
        seqs, groups = cplan.tile_seqs, cplan.tile_group
        if not (isinstance(seqs, torch.Tensor) and isinstance(groups, torch.Tensor)):
            raise TypeError("plan.tile_seqs and plan.tile_group must be tensors (a plan from plan())")
        if seqs.dim() != 2 or seqs.shape[1] != cplan.members_per_tile or groups.shape != (seqs.shape[0],):
            raise ValueError("plan.tile_seqs must be [T, members_per_tile] and plan.tile_group [T]")
        if (
            seqs.device != device
            or groups.device != device
            or not (seqs.is_contiguous() and groups.is_contiguous())
        ):
            raise ValueError(f"plan.tile_seqs and plan.tile_group must be contiguous on q's device {device}")


def _check_shared(block_tables, context_lens, prefix_group, prefix_lens, cplan, PAGE, check_plan):
    """Device values, read on the host: the grouping (check_groups), the plan's tiles against it, and
    every member's first prefix_lens[g] / PAGE table entries equal to its group's first member's."""
    lens, groups, plens = check_groups(context_lens, prefix_group, prefix_lens, PAGE)
    members = {}
    for b, g in enumerate(groups):
        if g >= 0:
            members.setdefault(g, []).append(b)
    for g, m in members.items():
        pages = plens[g] // PAGE
        rows = block_tables[m, :pages]  # [members, pages]
        differ = (rows != rows[:1]).any(dim=1)
        if differ.any():
            b = m[int(differ.nonzero()[0])]
            raise ValueError(
                f"block_tables[{b}, :{pages}] differs from block_tables[{m[0]}, :{pages}]: sequences {m[0]} and "
                f"{b} are both in prefix_group {g}, whose prefix_lens[{g}] = {plens[g]} tokens they must share"
            )
    if not check_plan:
        return
    starts = [plens[g] if g >= 0 else 0 for g in groups]
    if cplan.cascade:
        seqs, tgroups = cplan.tile_seqs.tolist(), cplan.tile_group.tolist()
        planned = {}
        for row, g in zip(seqs, tgroups):
            for b in row:
                if b >= 0:
                    planned.setdefault(g, []).append(b)
        if {g: sorted(m) for g, m in planned.items()} != {g: sorted(m) for g, m in members.items()}:
            raise ValueError(
                "plan's tiles do not hold the sequences prefix_group groups: plan from these prefix_group"
            )
        if members and max(plens[g] for g in members) > cplan.max_prefix:
            raise ValueError(f"a prefix_lens of a group is past the plan's max_prefix = {cplan.max_prefix}")
    longest = max(n - (s if cplan.cascade else 0) for n, s in zip(lens, starts))
    if longest > cplan.suffix_splits * cplan.suffix_chunk:
        raise ValueError(
            f"context_lens: a sequence has {longest} tokens for the suffix stage, past the plan's "
            f"suffix_splits * suffix_chunk = {cplan.suffix_splits * cplan.suffix_chunk}"
        )


def cascade_decode(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    prefix_group,
    prefix_lens,
    scale=None,
    out=None,
    return_lse=False,
    check=None,
    plan=None,
):
    """Paged decode attention where groups of sequences share a prefix: paged_decode's result, the
    shared pages read once per tile of rows instead of once per sequence.

    q, k_cache, v_cache, block_tables, context_lens: as L2's paged_decode (each sequence's whole table and
                  length, its shared pages included); PAGE a power of two from 1 to 128
    prefix_group  [B] int32, contiguous: sequences with the same group g >= 0 share their first
                  prefix_lens[g] tokens, the same physical pages at the start of their tables; -1 = none
    prefix_lens   [G] int32, contiguous, each a multiple of PAGE and at most every member's context_lens
    scale         softmax scale, a finite number > 0, default 1 / sqrt(D)
    out           optional [B, Hq, D] of q's dtype (a strided view is fine), written in place
    return_lse    also return lse [B, Hq] float32, natural log
    check         also check the lengths, block ids, groups, that each group's members share those table
                  entries, and the plan against them: None (default) on the CPU only; True on a GPU too
    plan          a CascadePlan from plan() for these groups and lengths; made here when None, which reads
                  context_lens, prefix_group and prefix_lens from the device
    Returns out, or (out, lse).
    """
    raise NotImplementedError(
        "f2 is not started: fill in plan() and the kernels in drills/mine/f2_cascade_decode.py, then delete this line (read drills/content/f2_cascade_decode.md)"
    )
    B, Hq, Hkv, D, PAGE = validate.paged_decode_inputs(
        q, k_cache, v_cache, block_tables, context_lens, scale, out, min_page=1, max_page=128, check=check
    )
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    validate.tensor("prefix_group", prefix_group, 1, (torch.int32,))
    validate.tensor("prefix_lens", prefix_lens, 1, (torch.int32,))
    validate.same_device(q=q, prefix_group=prefix_group, prefix_lens=prefix_lens)
    if prefix_group.shape[0] != B:
        raise ValueError(f"prefix_group must have B = {B} entries, got {prefix_group.shape[0]}")
    validate.contiguous(prefix_group=prefix_group, prefix_lens=prefix_lens)
    checked = validate.device_values_checked(check, context_lens)
    if plan is None:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "plan is None while a CUDA graph is captured: call plan() before capturing, pass plan="
            )
        plan = _make_plan(context_lens, prefix_group, prefix_lens, Hq, Hkv, PAGE, device=q.device)
    _check_plan(plan, B, Hkv, block_tables.shape[1] * PAGE, q.device)
    if checked:
        _check_shared(block_tables, context_lens, prefix_group, prefix_lens, plan, PAGE, check_plan=True)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device) if return_lse else None
    _launch(
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        prefix_group,
        prefix_lens,
        float(scale),
        plan,
        out,
        lse,
    )
    return (out, lse) if return_lse else out
