"""L2, your file: paged decode attention with GQA.

Fill in `paged_decode_kernel` below; the launcher under it is complete. Read
drills/content/l2_paged_decode.md first: every TODO names the section that teaches it.
Grade with `make test L=l2`. Start by deleting the `raise NotImplementedError` line in paged_decode.

    bytes = 2 (K and V) * sum(context_lens) * Hkv * D * 2 (fp16)   # B=64, ctx=1024: 268 MB
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word
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
    # num_blocks, max_pages, err_ptr and GUARD serve the reference's device guard (section 3.7, read it
    # once you pass): the launcher checks every value before launching, so your kernel may ignore them.
    # TODO(section 3.1 "One program"): which sequence b and which KV head kvh this program owns (widen
    # both to int64), and the sequence's length ctx from context_lens.

    # TODO(section 3.2 "Packing the group"): the GROUP query heads of KV head kvh, padded to GROUP_PAD
    # rows with a mask; load q as [GROUP_PAD, D] through stride_qb and stride_qh (q may be a view), the
    # padding rows masked (never read) and set to 0.

    # TODO(section 3.4 "Online softmax"): the running max m_i (from -inf), sum l_i and accumulator acc,
    # one row per query head, all fp32.

    # TODO(section 3.3 "The page loop"): for each of the cdiv(ctx, PAGE) pages, look up the physical
    # block in block_tables, load K and V [PAGE, D] through the cache strides with the last page masked
    # (other=0.0), score with tl.dot.

    # TODO(section 3.4 "Online softmax"): update m_i, l_i and acc with the rescale factor alpha (p in V's
    # dtype for tl.dot).

    # TODO(section 3.5 "Storing only real rows"): normalise by l_i (a padding sequence, ctx = 0, read nothing:
    # l_i = 0 there, so divide by 1 and store zeros) and store the GROUP real rows.
    pass


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
    raise NotImplementedError(
        "l2 is not started: fill in paged_decode_kernel in drills/mine/l2_paged_decode.py, then delete this line (read drills/content/l2_paged_decode.md)"
    )
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
