"""F1, your file: split-KV (flash-decoding) paged decode with a planner.

Three stages, in the order the grader checks them (`make test L=f1` says which one you are in); the
launchers are complete. Read drills/content/f1_split_kv_decode.md first: every TODO names its section.
  1. merge: merge_states_kernel (delete merge_states' `raise NotImplementedError` line)
  2. fixed splits: split_kv_kernel, merge_splits_kernel, and plan() for a num_splits given by the caller
     (delete the raise lines in plan() and split_kv_decode)
  3. planner: plan() choosing num_splits itself

    bytes = 2 (K and V) * sum(context_lens) * Hkv * D * 2 (fp16), plus B * Hq * num_splits * (D + 1) * 4
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word
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
    raise NotImplementedError(
        "f1 is not started: fill in plan() and the kernels in drills/mine/f1_split_kv_decode.py, then delete this line (read drills/content/f1_split_kv_decode.md)"
    )
    lens = validate.decode_plan_args(context_lens, num_kv_heads, page_size, num_sms, num_splits)  # noqa: F841 [B] ints >= 0
    # TODO(stage 3, section 4 "Planning"): when num_splits is None, split only when B * Hkv programs cannot
    # fill num_sms SMs (about 4 programs per SM), with chunks of at least MIN_CHUNK tokens.
    # TODO(stage 2, section 4 rules 3-5): clamp num_splits to the number of BLOCK_N tiles of the longest
    # sequence (at least 1, also for a batch of padding sequences); chunk = whole tiles; count the splits
    # again; return DecodePlan(num_splits, chunk, max_len).


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
    # num_blocks, max_pages, err_ptr and GUARD serve the reference's device guard (section 3.7, read it
    # once you pass): the launcher checks every value before launching, so your kernel may ignore them.
    # TODO(stage 2, section 3.1 "The grid"): b, kvh (int64) and split from the program ids; this split's token range
    # [start, end) = [split * chunk, min((split + 1) * chunk, ctx)), empty when start >= ctx.
    # TODO(section 3.1): load q as [GROUP_PAD, D] through its strides with padding rows masked to 0 (as in
    # L2); m_i (from -inf), l_i, acc.
    # TODO(section 3.2 "Gathering tokens"): loop over the range in tiles of BLOCK_N tokens; each token's
    # physical block is block_tables[b, tok // PAGE] (one load per tile when PAGE >= BLOCK_N), slot tok % PAGE.
    # TODO(section 3.3 "Online softmax per split"): scores in base 2 (qk_scale already holds log2(e)),
    # masked to -inf past `end`, then the exp2 update of m_i, l_i, acc.
    # TODO(section 3.4 "Empty splits"): o = acc / l_i and lse = (m_i + log2(l_i)) * ln(2) (natural log!),
    # but o = 0 and lse = -inf when l_i == 0. Store the GROUP real rows at split; lse only if WRITE_LSE.
    pass


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
    # GUARD serves the reference's device guard (section 3.7, read it once you pass): the launcher checks
    # every value before launching, so your kernel may ignore it.
    # TODO(stage 2, section 3.5 "Merging the splits"): for (b, h), walk the splits BLOCK_S at a time: running max
    # m of the lse values, weights exp(lse - m), rescale the running sum and output when m grows; store
    # acc / w_sum, and m + log(w_sum) when WRITE_LSE. A padding sequence (ctx = 0) has every split empty:
    # m stays -inf, so measure from 0 there and store 0 and lse -inf.
    pass


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
    # err_ptr and GUARD serve the reference's device guard (section 3.7, read it once you pass): the
    # launcher checks every lse before launching, so your kernel may ignore them.
    # TODO(stage 1, section 3.5): for BLOCK_R rows, m = max(lse_a, lse_b) (0 when both are -inf), w = exp(lse - m),
    # o = (w_a * o_a + w_b * o_b) / (w_a + w_b), lse = m + log(w_a + w_b); both empty -> o = 0, lse = -inf.
    pass


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
    raise NotImplementedError(
        "f1 is not started: fill in plan() and the kernels in drills/mine/f1_split_kv_decode.py, then delete this line (read drills/content/f1_split_kv_decode.md)"
    )
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
    raise NotImplementedError(
        "f1 is not started: fill in plan() and the kernels in drills/mine/f1_split_kv_decode.py, then delete this line (read drills/content/f1_split_kv_decode.md)"
    )
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
            raise ValueError(f"plan.num_splits = {splits} must be at most {validate.MAX_GRID_YZ} (grid axis 2)")
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
