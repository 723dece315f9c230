"""Paged-KV test cases, the fp32 PyTorch oracle for decode attention, and the checks the paged graders
share (L2, F1, L4; L1 takes the cases and the oracle).

A case fills only the cache slots that some sequence really uses; every other slot (the tail of each
last page, every unused block) holds NaN, and every block-table entry past a sequence's last page holds
a garbage id. A kernel that reads anything it should not gets NaN or faults.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from drills.compare import assert_close, assert_untouched
from drills.grading.grader.diagnose import returned_out_problem
from drills.grading.shared import bigmem
from drills.tests import seeded
from drills.tests.domain import Rule

GARBAGE_BLOCK_IDS = (2**31 - 1, -(2**31), -1, 1 << 24)


@dataclass
class PagedCase:
    q: torch.Tensor  # [B, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, PAGE, Hkv, D]
    v_cache: torch.Tensor  # [num_blocks, PAGE, Hkv, D]
    block_tables: torch.Tensor  # [B, max_pages] int32
    context_lens: torch.Tensor  # [B] int32

    @property
    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.context_lens


# The head dims every paged launcher admits (drills/validate.py: a power of two from 16 to 256): a
# kernel that tiles D at 128 passes every case up to 128, so each grader takes its widest from here.
HEAD_DIMS = tuple(2**i for i in range(4, 9))


def make_paged_case(
    context_lens,
    Hq,
    Hkv,
    D,
    PAGE,
    dtype=torch.float16,
    device="cpu",
    stream=0,
    extra_pages=2,
    shared_prefix_pages=0,
    num_blocks=None,
    first_block=0,
    poison=True,
    max_pages=None,
    sparse=False,
) -> PagedCase:
    """Random q/K/V in a shuffled page pool.

    shared_prefix_pages: the first n logical pages of every sequence map to the same physical blocks
    (prefix sharing); those pages are full in every sequence, so their contents are the same for all.
    num_blocks / first_block: a pool larger than needed, with the used blocks placed from first_block
    upwards (a large first_block makes block id * page stride exceed 2**31).
    sparse: caches from bigmem.sparse_empty (a pool of more than 2**31 elements on a CPU); only the
    used blocks are written (poisoned, then filled), every other block reads as zeros.
    """
    gen = torch.Generator().manual_seed(seeded(stream))
    lens = [int(n) for n in context_lens]
    B = len(lens)
    pages = [math.ceil(n / PAGE) for n in lens]
    if shared_prefix_pages:
        assert all(n >= shared_prefix_pages * PAGE for n in lens), (
            "shared pages must be full in every sequence"
        )
    max_pages = max_pages or max(pages) + extra_pages
    own = [p - shared_prefix_pages for p in pages]
    needed = shared_prefix_pages + sum(own)
    num_blocks = num_blocks or needed + 3
    assert first_block + needed <= num_blocks
    # Shuffled physical ids; page 0 of the pool is in use whenever first_block == 0.
    ids = (first_block + torch.randperm(num_blocks - first_block, generator=gen)[:needed]).tolist()
    shared, ids = ids[:shared_prefix_pages], ids[shared_prefix_pages:]

    garbage = torch.tensor(GARBAGE_BLOCK_IDS, dtype=torch.int64)
    tables = garbage[torch.randint(len(GARBAGE_BLOCK_IDS), (B, max_pages), generator=gen)]
    valid = torch.zeros(num_blocks, PAGE, dtype=torch.bool)  # slots some sequence reads
    for b, n in enumerate(lens):
        row = shared + ids[: own[b]]
        ids = ids[own[b] :]
        tables[b, : len(row)] = torch.tensor(row, dtype=torch.int64)
        for p, blk in enumerate(row):
            valid[blk, : min(PAGE, n - p * PAGE)] = True

    shape = (num_blocks, PAGE, Hkv, D)
    fill = float("nan") if poison else 0.0
    if sparse:
        k_cache, v_cache = (bigmem.sparse_empty(shape, dtype, device) for _ in range(2))
        in_use = valid.any(dim=1).nonzero()[:, 0].to(device)  # the used blocks: the only pages touched
        k_cache[in_use], v_cache[in_use] = fill, fill
    else:
        k_cache = torch.full(shape, fill, dtype=dtype, device=device)
        v_cache = torch.full(shape, fill, dtype=dtype, device=device)
    used = valid.nonzero()  # [n_valid, 2] (block, slot) pairs, written in one indexed copy each
    blk, slot = used[:, 0].to(device), used[:, 1].to(device)
    k_cache[blk, slot] = torch.randn(len(used), Hkv, D, generator=gen).to(dtype).to(device)
    v_cache[blk, slot] = torch.randn(len(used), Hkv, D, generator=gen).to(dtype).to(device)
    q = torch.randn(B, Hq, D, generator=gen).to(dtype).to(device)
    return PagedCase(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables.to(torch.int32).to(device),
        context_lens=torch.tensor(lens, dtype=torch.int32, device=device),
    )


# --- An e4m3 cache (F3) ----------------------------------------------------------------------------

E4M3 = torch.float8_e4m3fn


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """F3's store rule in torch: the e4m3 nearest (ties to even) to clamp(x / scale, -448, 448), x
    [..., Hkv, D], scale [1] or [Hkv] float32 (one per KV head). NaN stays NaN (the code 0x7F)."""
    s = scale.float().to(x.device).reshape(-1, 1)  # [Hkv or 1, 1]
    return (x.float() / s).clamp(-448.0, 448.0).to(E4M3)


@dataclass
class Fp8Case(PagedCase):
    k_scale: torch.Tensor | None = None  # [1] or [Hkv] float32: K = code * k_scale[head]
    v_scale: torch.Tensor | None = None

    @property
    def args(self):
        return (*super().args, self.k_scale, self.v_scale)


def blocks_read(case, PAGE: int) -> torch.Tensor:
    """The distinct block ids the sequences of `case` read (their table rows up to their lengths), int64
    on the tables' device: a GPU's tables stay on it."""
    pages = [-(-int(n) // PAGE) for n in case.context_lens.tolist()]
    tables = case.block_tables
    rows = [tables[b, :p].long() for b, p in enumerate(pages)]
    return torch.cat(rows + [torch.zeros(0, dtype=torch.long, device=tables.device)]).unique()


def fp8_case(case: PagedCase, k_scale, v_scale) -> Fp8Case:
    """The case with its caches stored as e4m3 by quantize_e4m3, in the same layout (shape, strides and
    storage offset): every element outside the views, and every poisoned slot, is the NaN code. A sparse
    pool (more than 2**28 elements) stays sparse: only the blocks a sequence reads are written."""
    dev = case.q.device
    k_scale = torch.as_tensor(k_scale, dtype=torch.float32).reshape(-1).to(dev)
    v_scale = torch.as_tensor(v_scale, dtype=torch.float32).reshape(-1).to(dev)
    PAGE = case.k_cache.shape[1]
    used = blocks_read(case, PAGE).to(dev)

    def convert(cache, scale):
        n = cache.untyped_storage().nbytes() // cache.element_size()
        if n > 2**28:
            flat = bigmem.sparse_empty((n,), E4M3, dev)
            out = flat.as_strided(cache.shape, cache.stride(), cache.storage_offset())
            out[used] = quantize_e4m3(cache[used], scale)
        else:
            flat = torch.full((n,), float("nan"), device=dev).to(E4M3)
            out = flat.as_strided(cache.shape, cache.stride(), cache.storage_offset())
            out.copy_(quantize_e4m3(cache, scale))
        return out

    return Fp8Case(
        case.q,
        convert(case.k_cache, k_scale),
        convert(case.v_cache, v_scale),
        case.block_tables,
        case.context_lens,
        k_scale,
        v_scale,
    )


def blocks_past(elements: int, PAGE: int, Hkv: int, D: int, spare: int) -> dict:
    """make_paged_case's pool arguments (num_blocks, first_block, sparse) for a case whose used blocks all
    start past `elements` elements of the cache, so that block id * PAGE * Hkv * D needs int64: the first
    block 8 past the limit, `spare` blocks above it to shuffle the pages among. With elements = 2**32 an
    int32 offset wraps past 0 onto the pool's first blocks, zeros in a sparse cache."""
    first = elements // (PAGE * Hkv * D) + 8
    return dict(num_blocks=first + spare, first_block=first, sparse=True)


def skip_without_memory_for_sparse_pages(runtime):
    """Skip, saying why, a test over sparse caches (bigmem.sparse_empty) when the interpreter's machine
    cannot hold the pages the test touches (about 1 GB); on a GPU they are allocated for real."""
    import pytest

    if runtime.interpreter and bigmem.free_bytes() < 2**30:
        pytest.skip(
            f"needs about 1 GB of free memory for the pages it touches, {bigmem.free_bytes() / 2**30:.1f} GB free"
        )


def pool_past_int32(runtime, PAGE: int, Hkv: int, D: int, spare: int) -> dict:
    """make_paged_case's pool arguments for the int64 page-index cases (L2, F1, L4): every used block id
    past 2**32 / page stride, so that block id * stride_kb wraps around in int32 onto the pool's first
    blocks, zeros in a sparse cache. The caches span about 8.6 GB: sparse files on a CPU, where the test
    is skipped, saying why, without the memory for the pages it touches."""
    skip_without_memory_for_sparse_pages(runtime)
    return blocks_past(2**32, PAGE, Hkv, D, spare=spare)


def q_rows_far_apart(q: torch.Tensor, runtime) -> torch.Tensor:
    """rows_far_apart(q): q's rows 1.5 * 2**30 elements apart, for the int64 sequence-index cases of L2
    and F1."""
    return rows_far_apart(q, runtime)


def rows_far_apart(t: torch.Tensor, runtime) -> torch.Tensor:
    """A copy of t [B, ...] (q, out, block_tables) whose rows lie 1.5 * 2**30 elements apart in a sparse
    buffer (a view of a large activation buffer or block table; the stride fits in int32): row 2 starts
    3 * 2**30 elements in, so b * stride(0) in int32 wraps to -2**30, a row before t. The buffer holds
    2**31 elements before t, so on a GPU the wrapped row lands in it (zeroed there); the interpreter
    reports an access outside t. Skips, saying why, without the memory for the rows."""
    return far_apart(t, runtime, dim=0)


def far_apart(t: torch.Tensor, runtime, dim: int = 0) -> torch.Tensor:
    """A copy of t whose entries along `dim` lie 1.5 * 2**30 elements apart in a sparse buffer, the other
    dims laid out contiguously inside each: rows_far_apart for dim 0; dim 2 of a cache [num_blocks, PAGE,
    Hkv, D] is a head-major pool (each KV head's pages in a region of its own) seen in the cache's shape.
    Index 2 starts 3 * 2**30 elements in, so an int32 index times that stride wraps to -2**30, inside the
    2**31 elements the buffer holds before t (zeroed there on a GPU; the interpreter reports an access
    outside t). Needs t.shape[dim] >= 3. Skips, saying why, without the memory for the pages touched."""
    skip_without_memory_for_sparse_pages(runtime)
    n = t.shape[dim]
    rest = t.shape[:dim] + t.shape[dim + 1 :]
    inner = math.prod(rest)
    stride, before = 3 * 2**29, 2**31  # the far dim's stride, and the buffer's elements before t
    flat = bigmem.sparse_empty((before + (n - 1) * stride + inner,), t.dtype, runtime.device)
    if not runtime.interpreter:
        flat[before - 2**30 : before - 2**30 + inner].zero_()  # torch.empty on a GPU: index 2 wrapped
    rest_strides = list(torch.empty(rest, device="meta").stride())  # each region laid out contiguously
    strides = (*rest_strides[:dim], stride, *rest_strides[dim:])
    far = flat.as_strided(tuple(t.shape), strides, before)  # index i of dim at i * stride
    far.copy_(t)
    assert (n - 1) * stride >= 2**31 > stride
    return far


def in_wider_table(block_tables: torch.Tensor, extra: int = 5) -> torch.Tensor:
    """The same [B, max_pages] entries as columns 0..max_pages - 1 of a [B, max_pages + extra] table of
    -1: a row stride of max_pages + extra, so a kernel that steps rows by max_pages instead of
    block_tables.stride(0) reads another sequence's pages or a -1."""
    B, max_pages = block_tables.shape
    wide = torch.full((B, max_pages + extra), -1, dtype=torch.int32, device=block_tables.device)
    wide[:, :max_pages] = block_tables
    return wide[:, :max_pages]


def live_slots(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(block ids, slots) of every token some sequence holds, each [total tokens]."""
    PAGE = case.k_cache.shape[1]
    blocks, slots = [], []
    for b, n in enumerate(case.context_lens.tolist()):
        t = torch.arange(n, device=case.q.device)
        blocks.append(case.block_tables[b].long()[t // PAGE])
        slots.append(t % PAGE)
    return torch.cat(blocks), torch.cat(slots)


def tail_slots(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(block ids, slots) of the stale tail of every partly filled last page, each [stale slots]."""
    PAGE = case.k_cache.shape[1]
    blocks, slots = [], []
    for b, n in enumerate(case.context_lens.tolist()):
        if n % PAGE:
            slot = torch.arange(n % PAGE, PAGE, device=case.q.device)
            blocks.append(torch.full_like(slot, int(case.block_tables[b, n // PAGE])))
            slots.append(slot)
    return torch.cat(blocks), torch.cat(slots)


def shift_scores(case: PagedCase, shift, scale=None) -> PagedCase:
    """Add about `shift` (a number, or one per query head: [Hq]) to every score of every head, in place.

    Feature 0 of every live key becomes 16 and feature 0 of query head h becomes shift[h] / (16 * scale),
    so scale * q.k gains shift[h] whatever the key (the other features keep their random part). A
    softmax does not change under a shift; a kernel whose running max assumes scores near 0 does.
    """
    _, Hq, D = case.q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    shift = torch.as_tensor(shift, dtype=torch.float32).expand(Hq)  # [Hq]
    blocks, slots = live_slots(case)
    case.k_cache[blocks, slots, :, 0] = 16.0
    case.q[:, :, 0] = (shift / (16.0 * scale)).to(case.q.dtype).to(case.q.device)  # [Hq], broadcast over B
    return case


def strided_q(case: PagedCase) -> PagedCase:
    """The same case with q a view of every other head of a NaN-filled [B, 2 * Hq, D] buffer:
    stride(1) = 2 * D and stride(0) = 2 * Hq * D, so a kernel that assumes q contiguous reads NaN."""
    B, Hq, D = case.q.shape
    buffer = torch.full((B, 2 * Hq, D), float("nan"), dtype=case.q.dtype, device=case.q.device)
    q = buffer[:, 1::2]  # [B, Hq, D], strides (2 * Hq * D, 2 * D, 1)
    q.copy_(case.q)
    return PagedCase(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens)


def in_layer_pool(case: PagedCase, layers: int = 2, layer: int = 1) -> PagedCase:
    """The same case with K and V one layer of a NaN-filled pool [num_blocks, layers, PAGE, Hkv, 2, D]
    (K and V of a head side by side): every stride but the last differs from a contiguous cache's, and
    the K and V views interleave without sharing an element."""
    num_blocks, PAGE, Hkv, D = case.k_cache.shape
    pool = torch.full(
        (num_blocks, layers, PAGE, Hkv, 2, D),
        float("nan"),
        dtype=case.k_cache.dtype,
        device=case.k_cache.device,
    )
    k_cache, v_cache = pool[:, layer, :, :, 0], pool[:, layer, :, :, 1]  # [num_blocks, PAGE, Hkv, D] each
    k_cache.copy_(case.k_cache)
    v_cache.copy_(case.v_cache)
    return PagedCase(case.q, k_cache, v_cache, case.block_tables, case.context_lens)


def v_strides_unlike_k(case: PagedCase) -> PagedCase:
    """The case with v_cache a head-major [num_blocks, Hkv, PAGE, D] buffer seen as [num_blocks, PAGE,
    Hkv, D]: K's block stride, its token and head strides swapped, so V read through K's strides (one
    address line copied from the other) reads the wrong tokens and heads. Needs Hkv > 1 or PAGE > 1."""
    v_cache = case.v_cache.transpose(1, 2).contiguous().transpose(1, 2)  # strides (PAGE Hkv D, D, PAGE D, 1)
    assert v_cache.stride() != case.k_cache.stride() and v_cache.stride(0) == case.k_cache.stride(0)
    return PagedCase(case.q, case.k_cache, v_cache, case.block_tables, case.context_lens)


# Context-length patterns a domain's "lens" axis names (drills/tests/domain.py), in tokens for a page
# size: each crosses a page bound of its own kind.
CONTEXT_PATTERNS = {
    "last_page_partial": lambda PAGE: [PAGE + 3, 5, PAGE],  # 3 rows: q_rows_far_apart needs them
    "full_pages": lambda PAGE: [PAGE, 2 * PAGE],
    "padding_and_one_token": lambda PAGE: [0, 1, PAGE + 1],  # a padding row, one key, one past a page
}
# The stride patterns a domain's layout axes name: q, the KV caches and the block table, each alone.
Q_LAYOUTS = ("contiguous", "strided", "far_apart")
KV_LAYOUTS = ("contiguous", "layer_pool", "v_unlike_k")
TABLE_LAYOUTS = ("tight", "padded")
# V's token and head strides swapped differ from K's only where both dims have more than one entry.
V_UNLIKE_K_NEEDS_TWO_STRIDES = Rule(
    ("kv", "heads", "PAGE"),
    lambda kv, heads, PAGE: kv != "v_unlike_k" or (heads[1] > 1 and PAGE > 1),
    "V's strides unlike K's need Hkv > 1 and PAGE > 1",
)
FAR_APART_NEEDS_THREE_ROWS = Rule(
    ("q", "lens"),
    lambda q, lens: q != "far_apart" or len(CONTEXT_PATTERNS[lens](16)) >= 3,
    "q_rows_far_apart wraps an int32 row offset from row 2 on",
)


def fits_this_machine(domain, runtime):
    """The domain without far-apart q rows where the interpreter's machine cannot hold their pages."""
    if runtime.interpreter and bigmem.free_bytes() < 2**30 and "far_apart" in domain.axes.get("q", ()):
        return domain.without(q=("far_apart",))
    return domain


def laid_out(case: PagedCase, runtime, q="contiguous", kv="contiguous", table="tight") -> PagedCase:
    """The case with the named layouts: q strided (strided_q) or its rows far apart (q_rows_far_apart,
    three sequences or more),
    K and V one layer of a pool (in_layer_pool) or V's strides unlike K's (v_strides_unlike_k), the
    table's rows in a wider table (in_wider_table). Every view holds the same values as `case`."""
    if kv == "layer_pool":
        case = in_layer_pool(case)
    elif kv == "v_unlike_k":
        case = v_strides_unlike_k(case)
    if q == "strided":
        case = strided_q(case)
    elif q == "far_apart":
        case = dataclasses.replace(case, q=q_rows_far_apart(case.q, runtime))
    if table == "padded":
        case = dataclasses.replace(case, block_tables=in_wider_table(case.block_tables))
    return case


def gather_kv(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """The first n tokens of one sequence, in order: [n, Hkv, D]."""
    PAGE = cache.shape[1]
    pages = table_row[: math.ceil(n / PAGE)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def paged_attention_reference(
    q, k_cache, v_cache, block_tables, context_lens, scale=None, k_scale=None, v_scale=None
):
    """fp32 oracle: gather each sequence's pages, then plain softmax attention.

    k_scale, v_scale: an e4m3 cache's scales (F3), [1] or [Hkv] float32: the gathered codes are
    dequantized (code * its KV head's scale) before the attention, page by page, so that a sparse pool
    is never dequantized whole.
    Returns (out [B, Hq, D] fp32, lse [B, Hq] fp32, natural log). Query head h uses KV head h // GROUP.
    """
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k_mul = (
        1.0 if k_scale is None else k_scale.float().cpu().reshape(1, -1, 1).to(q.device)
    )  # [1, Hkv or 1, 1]
    v_mul = 1.0 if v_scale is None else v_scale.float().cpu().reshape(1, -1, 1).to(q.device)
    outs, lses = [], []
    for b in range(B):
        n = int(context_lens[b])
        k = gather_kv(k_cache, block_tables[b], n).float() * k_mul  # [n, Hkv, D]
        v = gather_kv(v_cache, block_tables[b], n).float() * v_mul
        k = k.repeat_interleave(group, dim=1)  # [n, Hq, D]: contiguous grouping
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale  # [Hq, n]
        outs.append(torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v))
        lses.append(torch.logsumexp(s, dim=-1))
    return torch.stack(outs), torch.stack(lses)


CANARY = 1234.5  # exactly representable in fp16 and bf16
MARGIN = 16  # spare heads on each side of every sequence's rows: room for up to 16 padding rows


def call_with_canary_out(fn, q):
    """Call fn(out) with `out` [B, Hq, D] a strided view into a canary-filled buffer (spare heads around
    every sequence's rows, a spare sequence before and after), so a stray store lands in the canary
    instead of past an allocation; check that fn returned `out` and that nothing outside it changed."""
    B, Hq, D = q.shape
    buffer = torch.full((B + 2, Hq + 2 * MARGIN, D), CANARY, dtype=q.dtype, device=q.device)
    out = buffer[1 : B + 1, MARGIN : MARGIN + Hq]  # stride(0) = (Hq + 2 * MARGIN) * D
    returned = fn(out)
    if isinstance(returned, tuple):
        returned = returned[0]
    wrong = returned_out_problem("your launcher", returned, out)
    assert wrong is None, wrong
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
    keep[1 : B + 1, MARGIN : MARGIN + Hq] = True
    assert_untouched(
        buffer,
        CANARY,
        keep,
        "the buffer around out (padding rows or wrong heads stored?)",
        ("b+1", "head+16", "d"),
    )
    return out


def launch_into_canary(launch, case, scale=None):
    """launch(*case.args, scale=scale, out=out), the lesson's launcher, with `out` a view into a canary
    buffer (call_with_canary_out): every check also catches rows stored where they do not belong.
    Returns out, shaped like case.q."""
    return call_with_canary_out(lambda out: launch(*case.args, scale=scale, out=out), case.q)


def check_launch(launch, reference, case, dims, scale=None, **tol):
    """launch_into_canary against the fp32 oracle reference(*case.args, scale=scale) -> (out, lse),
    a mismatch named along `dims`; tol overrides the dtype's tolerance. Returns the launcher's out."""
    out = launch_into_canary(launch, case, scale)
    ref, _ = reference(*case.args, scale=scale)
    assert_close(out, ref, dims, **tol)
    return out


# (Hq, Hkv) by the name a grouping test's case carries, so that one name is one shape in every lesson.
# GROUP = 1 (MHA) and Hkv = 1 (MQA) pass even with interleaved heads: the controls for the others.
GROUPINGS = {
    "group1-MHA": (4, 4),
    "group2": (4, 2),
    "group3": (9, 3),
    "group4": (8, 2),
    "group4-worked-example": (32, 8),
    "group8": (16, 2),
    "group8-MQA": (8, 1),
    "group32-MQA": (32, 1),
    "group32x2": (64, 2),
}


def grouping_cases(*names):
    """@pytest.mark.parametrize("Hq,Hkv", ...) over the named GROUPINGS, each case's id its name."""
    import pytest

    return pytest.mark.parametrize("Hq,Hkv", [GROUPINGS[n] for n in names], ids=list(names))


# --- Spoiling a valid call, for the launchers' bad-input checks (L2, F1, L4) -------------------------


def spoiled_call(case, spoil, *context) -> dict:
    """The keyword arguments of a valid launch on `case` (its fields by name, in order), with check=True:
    on a GPU the lengths and block ids are checked only when asked, and these cases spoil them too.
    Then spoiled: updated with spoil(arguments, *context), an entry of a bad-input table."""
    args = {field.name: getattr(case, field.name) for field in dataclasses.fields(case)}
    args["check"] = True
    args.update(spoil(args, *context))
    return args


def int32_tensor(device, *values):
    return torch.tensor(values, dtype=torch.int32, device=device)


def with_entry(table, b, p, value):
    """A copy of a block table with entry [b, p] replaced."""
    table = table.clone()
    table[b, p] = value
    return table


def overlapping_caches(k_cache):
    """k_cache and a v_cache that share all but one block of memory with it."""
    pool = torch.cat([k_cache, k_cache[:1]])  # [num_blocks + 1, PAGE, Hkv, D]
    return dict(k_cache=pool[:-1], v_cache=pool[1:])  # v's block i is k's block i + 1


# Bad arguments every launcher over a paged cache rejects (L2, L4): name -> (how to spoil the arguments
# of a valid call, the error, what the message must name). Each grader adds its own entries.
PAGED_BAD_INPUTS = {
    "q_rank": (lambda a, dev: dict(q=a["q"][0]), ValueError, "q"),
    "q_not_a_tensor": (lambda a, dev: dict(q=a["q"].tolist()), TypeError, "q"),
    "q_dtype_fp32": (lambda a, dev: dict(q=a["q"].float()), TypeError, "q"),
    "k_cache_dtype": (lambda a, dev: dict(k_cache=a["k_cache"].bfloat16()), TypeError, "k_cache"),
    "k_cache_rank": (lambda a, dev: dict(k_cache=a["k_cache"][0]), ValueError, "k_cache"),
    "v_cache_shape": (lambda a, dev: dict(v_cache=a["v_cache"][:, :, :1]), ValueError, "v_cache"),
    "hq_not_multiple_of_hkv": (lambda a, dev: dict(q=a["q"][:, :3].contiguous()), ValueError, "Hq"),
    "head_dim_mismatch": (lambda a, dev: dict(q=a["q"][..., :32].contiguous()), ValueError, "head dim"),
    "q_last_dim_strided": (
        lambda a, dev: dict(q=a["q"].transpose(1, 2).contiguous().transpose(1, 2)),
        ValueError,
        "q",
    ),
    "block_tables_int64": (
        lambda a, dev: dict(block_tables=a["block_tables"].long()),
        TypeError,
        "block_tables",
    ),
}

# Entries that L2 and L4 both add after their own, each group at the place both tables give it.
CONTEXT_LENS_BAD_INPUTS = {
    "context_lens_int64": (
        lambda a, dev: dict(context_lens=a["context_lens"].long()),
        TypeError,
        "context_lens",
    ),
    "context_lens_wrong_batch": (
        lambda a, dev: dict(context_lens=a["context_lens"][:1]),
        ValueError,
        "context_lens",
    ),
}
# Block ids the kernel would follow out of the pool: the launcher checks every entry a sequence's pages use.
LIVE_BLOCK_ID_BAD_INPUTS = {
    "live_block_id_past_pool": (
        lambda a, dev: dict(block_tables=with_entry(a["block_tables"], 0, 1, a["k_cache"].shape[0])),
        ValueError,
        r"block_tables\[0, 1\]",
    ),
    "live_block_id_negative": (
        lambda a, dev: dict(block_tables=with_entry(a["block_tables"], 1, 0, -1)),
        ValueError,
        r"block_tables\[1, 0\]",
    ),
}
# k_cache and v_cache must share no element: V in K's memory is a caller's mix-up, not a layout.
SHARED_KV_BAD_INPUTS = {
    "v_cache_is_k_cache": (lambda a, dev: dict(v_cache=a["k_cache"]), ValueError, "v_cache"),
    "v_cache_overlaps_k_cache": (lambda a, dev: overlapping_caches(a["k_cache"]), ValueError, "v_cache"),
}
