"""L2 reference: paged decode attention with GQA.

One decode step: each sequence has one new query token per query head and attends over its whole
KV cache, which lives in fixed-size pages scattered through a shared pool. The kernel reads every KV
byte exactly once, so its time is bytes / bandwidth:

    bytes = 2 (K and V) * sum(context_lens) * Hkv * D * 2 (fp16)   # B=64, ctx=1024: 268 MB

Read top to bottom: the kernel (grid (B, Hkv), one program per sequence and KV head), then the
launcher that validates, allocates and launches. Explainer: drills/content/l2_paged_decode.md.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word, record_error, scan_block_ids
from drills.launch import launch, next_pow2


@triton.jit
def paged_decode_kernel(
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    v_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    out_ptr,  # [B, Hq, D], possibly a strided view
    block_tables_ptr,  # [B, max_pages] int32
    context_lens_ptr,  # [B] int32
    scale,
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
    stride_bt,
    num_blocks,  # k_cache.shape[0]: the device guard's bound for block ids
    max_pages,  # block_tables.shape[1]: the device guard's bound for ctx, in pages
    err_ptr,  # [4] int64, the device error word (drills/device_errors.py)
    GROUP: tl.constexpr,  # query heads per KV head, Hq // Hkv
    GROUP_PAD: tl.constexpr,  # max(16, next_pow2(GROUP)): tensor cores multiply 16 rows anyway (T3 3.5)
    PAGE: tl.constexpr,
    D: tl.constexpr,
    GUARD: tl.constexpr,  # section 3.7: contain bad device values (False only to time the guard's cost)
):
    # Section 3.1 "One program": which sequence and which KV head this program owns.
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    ctx = tl.load(context_lens_ptr + b)
    if GUARD:
        # Section 3.7 "A kernel that trusts nothing": a length the table row cannot hold would walk past
        # the row into another sequence's block ids. Such a row reads nothing and stores zeros.
        ctx_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)
        record_error(err_ptr, (ctx_ok == 0) & (kvh == 0), 21, b, ctx)
        ctx = tl.where(ctx_ok, ctx, 0)

    # Section 3.2 "Packing the group": the GROUP query heads that share KV head kvh are contiguous
    # (head h reads KV head h // GROUP), padded with zero rows up to GROUP_PAD.
    offs_g = tl.arange(0, GROUP_PAD)
    g_mask = offs_g < GROUP
    q_heads = kvh * GROUP + offs_g  # [GROUP_PAD]
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, PAGE)
    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )  # [GROUP_PAD, D]

    # Online-softmax state, one row per query head (as in T5, where a row was a query position).
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, D], dtype=tl.float32)

    # Section 3.3 "The page loop": only cdiv(ctx, PAGE) table entries are read; the rest may be garbage.
    num_pages = tl.cdiv(ctx, PAGE)
    if GUARD:
        # Section 3.7: the row's block ids are scanned before the loop; one outside the pool makes the
        # row read nothing (zeros), so no address is ever formed from it.
        n_bad, bad_id = scan_block_ids(block_tables_ptr + b * stride_bt, num_pages, num_blocks)
        record_error(err_ptr, (n_bad > 0) & (kvh == 0), 22, b, bad_id)
        num_pages = tl.where(n_bad == 0, num_pages, 0)
    for p in range(0, num_pages):
        # Widen before multiplying: block id * page stride passes 2**31 on large caches.
        phys = tl.load(block_tables_ptr + b * stride_bt + p).to(tl.int64)
        tok = p * PAGE + offs_t  # [PAGE] token positions in the sequence
        t_mask = tok < ctx  # the last page is usually partly filled: its tail is stale
        k = tl.load(
            k_cache_ptr + phys * stride_kb + offs_t[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
            mask=t_mask[:, None],
            other=0.0,
        )  # [PAGE, D]
        v = tl.load(
            v_cache_ptr + phys * stride_vb + offs_t[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
            mask=t_mask[:, None],
            other=0.0,
        )  # [PAGE, D]
        s = tl.dot(q, tl.trans(k)) * scale  # [GROUP_PAD, PAGE] fp32
        s = tl.where(t_mask[None, :], s, float("-inf"))  # a zeroed key would still score exp(0 - m)

        # Section 3.4 "Online softmax": page 0 always holds token 0, so m_new is finite from the first
        # iteration on and alpha never computes -inf - (-inf).
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [GROUP_PAD]
        alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old max
        p_ = tl.exp(s - m_new[:, None])  # [GROUP_PAD, PAGE]
        l_i = l_i * alpha + tl.sum(p_, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p_.to(v.dtype), v)  # [GROUP_PAD, D]
        m_i = m_new

    # Section 3.5 "Storing only real rows": normalise once, at the end. A padding sequence (ctx = 0)
    # read nothing: l_i = 0 and acc = 0, and 0 / 0 would store NaN, so it divides by 1 and stores zeros.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # [GROUP_PAD, D]
    # Only the GROUP real rows are stored: padding rows belong to other heads' memory.
    tl.store(
        out_ptr + b * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=g_mask[:, None],
    )


def _launch(q, k_cache, v_cache, block_tables, context_lens, scale, out, guard=True):
    """Launch without checks: the benchmark times this, the public function adds the checks. guard=False
    drops the device guard (section 3.7), only so that the benchmark can time what it costs."""
    B, Hq, D = q.shape
    _, PAGE, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    # Measured on an H200 over warps {2, 4, 8} x stages {1..5}: a [16, D] page tile is small, so 2 warps
    # with 5 loads in flight read fastest (0.70 -> 1.02 of the read ceiling at B=64, ctx=1024). Each stage
    # holds a K and a V page in shared memory: five of the largest (PAGE 128, D 256) would need 1.3 MB,
    # past any GPU's (228 KB on an H100), so larger pages get fewer stages and more warps.
    stages = max(1, min(5, 64 * 1024 // (2 * PAGE * D * q.element_size())))
    warps = 2 if PAGE * D <= 4096 else 4 if PAGE * D <= 8192 else 8
    # launch() calls the compiled binary directly once it has seen this specialisation (section 3.6).
    launch(
        paged_decode_kernel,
        (B, Hkv),
        (
            q,
            k_cache,
            v_cache,
            out,
            block_tables,
            context_lens,
            scale,
            q.stride(0),
            q.stride(1),
            *k_cache.stride()[:3],
            *v_cache.stride()[:3],
            out.stride(0),
            out.stride(1),
            block_tables.stride(0),
            k_cache.shape[0],
            block_tables.shape[1],
            error_word(q.device),
        ),
        GROUP=group,
        GROUP_PAD=max(16, next_pow2(group)),
        PAGE=PAGE,
        D=D,
        GUARD=guard,
        num_warps=warps,
        num_stages=stages,
    )
    return out


def paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale=None, out=None, check=None):
    """Decode attention over a paged KV cache, query heads grouped onto KV heads (GQA).

    q             [B, Hq, D], float16 or bfloat16: one new token per sequence (a strided view is fine)
    k_cache       [num_blocks, PAGE, Hkv, D], q's dtype, PAGE a power of two from 16 to 128 (a page is one
                  register tile); v_cache likewise. Strided views are fine (one layer of a bigger pool),
                  but k_cache and v_cache must share no element
    block_tables  [B, max_pages] int32, each row contiguous (a slice of a wider table is fine): logical
                  page p of sequence b is physical block block_tables[b, p], in [0, num_blocks) for every
                  page the sequence uses; entries past a sequence's last page are never read
    context_lens  [B] int32, contiguous, 0 <= context_lens[b] <= max_pages * PAGE; 0 marks a padding
                  sequence (a batch padded to a captured graph's size): nothing is read, its output is 0
    scale         softmax scale, a finite number > 0, default 1 / sqrt(D)
    out           optional [B, Hq, D] of q's dtype (a strided view is fine), written in place
    check         also check the lengths and live block ids: None (default) on the CPU only, where it
                  costs no device sync; True on a GPU too (not while capturing a CUDA graph); False never

    Every (strided) view is read through its strides; only the last dimension must be contiguous. Bad
    input raises ValueError or TypeError naming the argument, before anything is launched. No check
    reads device memory unless asked, so the call can be captured in a CUDA graph and replayed.

    Query head h attends with KV head h // (Hq // Hkv). Returns out [B, Hq, D].
    """
    validate.paged_decode_inputs(
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale,
        out,
        max_page=validate.DECODE_MAX_PAGE,
        check=check,
    )
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = torch.empty_like(q)
    return _launch(q, k_cache, v_cache, block_tables, context_lens, float(scale), out)
