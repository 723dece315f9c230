"""Grader for L4, paged prefill over a cached prefix. Each test is named for the mistake it catches.

Run: make test L=l4 (your drills/mine) or make test L=l4 IMPL=solutions. Every case poisons what must
not be read: NaN in every cache slot past a sequence's end and in every unused block, garbage ids in
every block-table entry past a sequence's last page (and in the whole row of a q_len = 0 sequence), and
`out` is a view into a canary-filled buffer. The oracle gathers each sequence's pages and runs a plain
fp32 softmax with the bottom-right causal mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from drills import validate
from drills.compare import assert_close, mismatch
from drills.grading.grader.diagnose import Mistake, returned_out_problem, returned_problem
from drills.grading.shared import bigmem
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel, record_loads
from drills.tests import bf16_everywhere, fill_past_fp16_range, raises_naming, seeded, sizes
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import (
    CANARY,
    CONTEXT_LENS_BAD_INPUTS,
    GARBAGE_BLOCK_IDS,
    HEAD_DIMS,
    KV_LAYOUTS,
    LIVE_BLOCK_ID_BAD_INPUTS,
    PAGED_BAD_INPUTS,
    SHARED_KV_BAD_INPUTS,
    TABLE_LAYOUTS,
    V_UNLIKE_K_NEEDS_TWO_STRIDES,
    PagedCase,
    blocks_past,
    check_launch,
    far_apart,
    gather_kv,
    grouping_cases,
    in_layer_pool,
    in_wider_table,
    int32_tensor,
    laid_out,
    launch_into_canary,
    make_paged_case,
    pool_past_int32,
    rows_far_apart,
    shift_scores,
    skip_without_memory_for_sparse_pages,
    spoiled_call,
)

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK_M": ("test_rows_past_a_sequence_end_not_written", "test_any_tile_shape"),
    "BLOCK_N": (
        "test_keys_past_the_context_are_not_read",
        "test_key_ranges_at_every_alignment",
        "test_any_tile_shape",
    ),
    "BLOCK_Q": ("test_rows_past_a_sequence_end_not_written", "test_padding_rows_of_a_packed_tile_not_stored"),
    "D": ("test_widest_head_dim_is_read_whole",),
    "GROUP": ("test_kv_head_grouping_is_contiguous", "test_padding_rows_of_a_packed_tile_not_stored"),
    "HEADS": (  # packed and one head per tile
        "test_key_ranges_at_every_alignment",
        "test_any_tile_shape",
        "test_group_wider_than_a_tile_of_rows",  # GROUP = 64 past a 16-row tile
    ),
    "MASKED": ("test_diagonal_tiles_are_masked", "test_keys_past_the_context_are_not_read"),
    "PAGE": (
        "test_prefix_ends_inside_a_page",
        "test_pages_smaller_than_a_key_tile",
        "test_pages_larger_than_a_key_tile",
        "test_one_page_holds_every_key",
    ),
    "SAME_KV": ("test_k_and_v_caches_with_different_strides", "test_q_and_cache_strides_are_used"),
    "STORE_LSE": ("test_lse_is_natural_log", "test_pure_prefill_without_a_prefix"),  # with and without
    "WIDE": (
        "test_page_index_widened_to_int64",
        "test_v_page_offsets_widened_to_int64",
        "test_pure_prefill_without_a_prefix",
    ),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}
BOUNDS_GAPS = {"GUARD": "no bound: the device guard's switch, on in every call but the benchmark's timing"}

DIMS = ("token", "head", "d")  # how a mismatch names its position: row of the packed q, query head, feature

# What paged_prefill admits, at its boundaries (drills/validate.py's limits, so the domain cannot drift
# from the launcher): test_pairwise_domain_cases_match_the_oracle crosses every pair of them.
_D_LO, _D_HI = validate.HEAD_DIM_RANGE
# (q_lens, context_lens) for a page size: each crosses a tile or page bound of its own kind.
BATCHES_BY_PAGE = {
    "pure_prefill": lambda P: ([17, 3], [17, 3]),  # no prefix; 17 new tokens: one past a 16-token tile
    "prefix_inside_a_page": lambda P: ([5, 9], [P + 8, 2 * P + 9]),  # prefixes of P + 3 and 2 P tokens
    "decode_rows_and_empty": lambda P: ([1, 0, 1, 9], [P + 2, 4, 1, P + 9]),  # packed heads: few tokens a row
}
DOMAIN = Domain(
    axes=dict(
        D=(_D_LO, _D_HI),  # the narrowest and the widest head dim; D = 256 takes its own tile config
        PAGE=(1, 16, 32),  # pages smaller than a key tile, one tile, two tiles (any power of two)
        heads=((2, 2), (9, 3), (17, 1)),  # (Hq, Hkv): MHA, GROUP 3, MQA with GROUP 17 (a packed tile's rows)
        batch=tuple(BATCHES_BY_PAGE),
        dtype=(torch.float16, torch.bfloat16),
        q=("contiguous", "strided"),  # far-apart rows: test_rows_and_heads_widened_to_int64
        kv=KV_LAYOUTS,
        table=TABLE_LAYOUTS,
        scale=(None, 0.3),
        lse=(False, True),
    ),
    rules=(V_UNLIKE_K_NEEDS_TWO_STRIDES,),
    limits=dict(head_dims=HEAD_DIMS),
)
LSE_DIMS = ("token", "head")
# lse is fp32 computed from exact fp16 products: only the summation order and exp2/log2 differ.
LSE_TOL = dict(atol=1e-3, rtol=1e-4, rel=1e-4)


@dataclass
class PrefillCase:
    q: torch.Tensor  # [total_q, Hq, D], the new tokens of every sequence, packed
    k_cache: torch.Tensor  # [num_blocks, PAGE, Hkv, D]
    v_cache: torch.Tensor  # [num_blocks, PAGE, Hkv, D]
    block_tables: torch.Tensor  # [B, max_pages] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32, cached prefix + new tokens

    @property
    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.cu_seqlens_q, self.context_lens

    @property
    def q_lens(self) -> list[int]:
        return torch.diff(self.cu_seqlens_q).tolist()


def make_prefill_case(
    context_lens, q_lens, Hq, Hkv, D, PAGE, stream, dtype=torch.float16, device="cpu", **paged
):
    """A poisoned, shuffled page pool holding context_lens[b] tokens per sequence (drills/tests/paged_kv.py),
    and q_lens[b] new tokens of each packed into q. A q_len = 0 sequence's whole table row is garbage: the
    kernel must not read it. `paged` goes to make_paged_case (shared_prefix_pages, sparse, num_blocks...)."""
    assert all(0 <= n <= c for n, c in zip(q_lens, context_lens))
    case = make_paged_case(context_lens, Hq, Hkv, D, PAGE, dtype=dtype, device=device, stream=stream, **paged)
    gen = torch.Generator().manual_seed(seeded(stream) + 1)
    tables = case.block_tables.clone()
    for b, n in enumerate(q_lens):
        if n == 0:
            tables[b] = GARBAGE_BLOCK_IDS[b % len(GARBAGE_BLOCK_IDS)]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], Hq, D, generator=gen).to(dtype).to(device)  # [total_q, Hq, D]
    return PrefillCase(
        q, case.k_cache, case.v_cache, tables, int32_tensor(device, *cu), case.context_lens.clone()
    )


def prefill_reference(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    scale=None,
    skip_prefix=False,
    own_key_hidden=False,
):
    """fp32 oracle: for each sequence, gather its pages, score its new tokens against every key, mask
    key j > prefix + i (bottom right), softmax. Returns (out [total_q, Hq, D], lse [total_q, Hq]).
    Two wrong answers the diagnosis names: skip_prefix=True masks the cached prefix's keys too (new token
    i sees keys prefix .. prefix + i), own_key_hidden=True each token's own key (j < prefix + i)."""
    total_q, Hq, D = q.shape
    group = Hq // k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(total_q, Hq, D, device=q.device)
    lse = torch.zeros(total_q, Hq, device=q.device)
    cu = cu_seqlens_q.tolist()
    for b, ctx in enumerate(context_lens.tolist()):
        first, last = cu[b], cu[b + 1]
        if first == last:
            continue
        k = gather_kv(k_cache, block_tables[b], ctx).float().repeat_interleave(group, dim=1)  # [ctx, Hq, D]
        v = gather_kv(v_cache, block_tables[b], ctx).float().repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[first:last].float(), k) * scale  # [Hq, q_len, ctx]
        i = torch.arange(last - first, device=q.device)[:, None] + ctx - (last - first)  # positions
        j = torch.arange(ctx, device=q.device)[None, :]  # key positions
        hidden = (j >= i) if own_key_hidden else (j > i)
        if skip_prefix:
            hidden = hidden | (j < ctx - (last - first))
        s = s.masked_fill(hidden, float("-inf"))
        out[first:last] = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v)
        lse[first:last] = torch.logsumexp(s, dim=-1).T
    return out, lse


def unwritten_rows_note(out, case) -> str:
    """A sentence on which rows of out were never written (they still hold the canary), when they are the
    first rows of sequences and fall in one of two patterns, else "". The same count in every sequence
    after the first: its first tile went to the sequence before it (the search's comparison). b times a
    count in sequence b: every tile of sequence b computed rows b tiles past its own (tok0 without + b)."""
    canary = torch.tensor(CANARY, dtype=out.dtype, device=out.device)  # as out's dtype rounds it
    never = (out == canary).flatten(1).all(dim=1).tolist()  # [total_q]
    cu = case.cu_seqlens_q.tolist()
    seqs = []  # (b, q_len, leading rows never written)
    for b in range(len(cu) - 1):
        rows = never[cu[b] : cu[b + 1]]
        k = next((i for i, gone in enumerate(rows) if not gone), len(rows))
        if any(rows[k:]):
            return ""  # rows lost after written ones: another mistake
        if rows:
            seqs.append((b, len(rows), k))
    if len(seqs) < 3 or seqs[0][2] != 0:
        return ""
    partial = [(b, n, k) for b, n, k in seqs[1:] if 0 < k < n]
    if not partial:
        return ""  # every later sequence wholly unwritten (or whole): the two patterns look alike
    b0, _, k0 = partial[0]
    if all(k == min(k0, n) for _, n, k in seqs[1:]):
        return (
            f"the first {k0} rows of every sequence after the first were never written: each one's first "
            "tile was given to the sequence before it"
        )
    if k0 % b0 == 0 and all(k == min(b * k0 // b0, n) for b, n, k in seqs[1:]):
        return (
            f"sequence b's first b x {k0 // b0} rows were never written: every tile of sequence b computed "
            "rows b tiles past its own"
        )
    return ""


def check(impl, case, scale=None, explain=None, **tol):
    """paged_prefill on `case` against the prefill oracle: out [total_q, Hq, D]. A mismatch says which
    rows were never written when they follow a pattern (unwritten_rows_note), and explain(out, ref), when
    given, adds a sentence of its own."""
    out = launch_into_canary(impl.paged_prefill, case, scale)
    ref, _ = prefill_reference(*case.args, scale=scale)
    problem = mismatch(out, ref, DIMS, **tol)
    if problem is not None:
        notes = [unwritten_rows_note(out, case), explain(out, ref) if explain else ""]
        raise AssertionError("\n".join([problem, *[n for n in notes if n]]))
    return out


def check_lse(impl, case):
    result = impl.paged_prefill(*case.args, return_lse=True)
    spec = (("out", case.q.shape, case.q.dtype), ("lse", case.q.shape[:2], torch.float32))
    wrong = returned_problem("paged_prefill", result, spec)
    assert wrong is None, wrong
    out, lse = result
    ref, ref_lse = prefill_reference(*case.args)
    assert lse.dtype == torch.float32 and lse.shape == case.q.shape[:2], (
        f"lse: {lse.dtype} {tuple(lse.shape)}"
    )
    assert_close(lse, ref_lse, LSE_DIMS, **LSE_TOL)
    assert_close(out, ref, DIMS)


# --- Section 2 "By hand": request 2 of L3's worked example, after its prefix hit ------------------------

TOKENS = "ABCDEFGH"
VALUE = {t: float(n + 1) for n, t in enumerate(TOKENS)}  # V[:, 0] of token A is 1, ..., H is 8


def worked_example(device):
    """L3's requests 1 and 2 after the prefix [A, B, C, D] was cached in blocks 0 and 1 (block size 2):
    request 1's new tokens [E, F] with table [0, 1, 2], request 2's [G, H] with table [0, 1, 3]; both
    have context 6. Every key is 0, so every visible key weighs the same; V[:, 0] is the token's value
    (A = 1 ... H = 8) for KV head 0, and 100 plus it for KV head 1 (Hq = 4, Hkv = 2). Blocks 4-7 are NaN,
    table entries past page 2 garbage. D = 2 padded to 16 with zero columns (tl.dot needs 16)."""
    Hq, Hkv, D, PAGE = 4, 2, 16, 2
    k_cache = torch.full((8, PAGE, Hkv, D), float("nan"), dtype=torch.float16, device=device)
    v_cache = k_cache.clone()
    blocks = {0: "AB", 1: "CD", 2: "EF", 3: "GH"}
    for blk, pair in blocks.items():
        k_cache[blk] = 0.0
        v_cache[blk] = 0.0
        for slot, t in enumerate(pair):
            v_cache[blk, slot, 0, 0] = VALUE[t]
            v_cache[blk, slot, 1, 0] = 100.0 + VALUE[t]
    tables = torch.tensor([[0, 1, 2, 2**31 - 1, -1], [0, 1, 3, -(2**31), 1 << 24]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seeded(4))
    q = torch.randn(4, Hq, D, generator=gen).to(torch.float16).to(device)  # [E, F, G, H] x 4 heads
    return PrefillCase(
        q, k_cache, v_cache, tables.to(device), int32_tensor(device, 0, 2, 4), int32_tensor(device, 6, 6)
    )


# New token -> the tokens it sees: the cached prefix A-D, then its own request's new tokens up to itself.
SEES = {"E": "ABCDE", "F": "ABCDEF", "G": "ABCDG", "H": "ABCDGH"}


def test_worked_example_request_2_after_its_prefix_hit(impl, runtime):
    """Section 2's table: E = mean(1..5) = 3, F = 3.5, G = mean(1, 2, 3, 4, 7) = 3.4, H = 25 / 6 = 4.167
    for query heads 0-1 (KV head 0), 100 more for heads 2-3 (KV head 1); the padded columns stay 0."""
    case = worked_example(runtime.device)
    out = check(impl, case)
    hand = torch.tensor([sum(VALUE[t] for t in SEES[n]) / len(SEES[n]) for n in "EFGH"])  # [4]
    expected = torch.stack([hand, hand, hand + 100, hand + 100], dim=1)  # [4 tokens, 4 heads]
    got = out[:, :, 0].float().cpu()
    assert torch.allclose(got, expected, atol=0.07), (
        f"output feature 0 per (new token E, F, G, H; head) = {got.tolist()}; section 2 gives "
        f"{expected.tolist()}"
    )
    assert (out[:, :, 1:] == 0).all(), "zero-padded V columns must give zero output columns"


def test_worked_example_lse_is_ln_of_the_keys_seen(impl, runtime):
    """Every score is 0, so lse = ln(number of keys seen): ln 5 = 1.609 for E and G, ln 6 = 1.792 for F and
    H (natural log: 2.322 and 2.585 would be base 2)."""
    case = worked_example(runtime.device)
    result = impl.paged_prefill(*case.args, return_lse=True)
    spec = (("out", case.q.shape, case.q.dtype), ("lse", case.q.shape[:2], torch.float32))
    wrong = returned_problem("paged_prefill", result, spec)
    assert wrong is None, wrong
    _, lse = result
    hand = torch.tensor([math.log(len(SEES[n])) for n in "EFGH"])[:, None].expand(4, 4)
    assert torch.allclose(lse.cpu(), hand, atol=1e-3), f"lse = {lse.tolist()}, section 2 gives ln 5 and ln 6"


# --- Section 3 "The kernel": causal ranges with a cached prefix, pages, the varlen grid ------------------


def test_pure_prefill_without_a_prefix(impl, runtime):
    """Prefix 0: context_lens == q_lens, so new token i sees keys 0..i (bottom right and top left agree)."""
    q_lens = sizes(runtime, [37, 20, 5], [2048, 777, 64])
    case = make_prefill_case(q_lens, q_lens, 8, 2, 64, 8, stream=101, device=runtime.device)
    check(impl, case)


def wrong_alignments(out, case) -> str:
    """Which wrong answer each failing sequence's rows are, as a sentence ("" when none): top-left
    alignment (new token i sees keys 0..i), the new tokens alone (the cached prefix skipped), or each
    row's own key hidden (a strict causal mask). They fail the same checks; only the rows themselves
    tell them apart."""
    ref, _ = prefill_reference(*case.args)
    q_lens = torch.diff(case.cu_seqlens_q).to(torch.int32)
    top_left, _ = prefill_reference(*case.args[:5], q_lens)  # keys 0..i: a context cut to q_len
    alone, _ = prefill_reference(*case.args, skip_prefix=True)
    strict, _ = prefill_reference(*case.args, own_key_hidden=True)  # finite: every row sees key 0 here
    wrongs = (
        (top_left, "aligned to the top left"),
        (alone, "the new tokens alone"),
        (strict, "its own key hidden"),
    )
    cu, said = case.cu_seqlens_q.tolist(), []
    for b in range(len(cu) - 1):
        rows = slice(cu[b], cu[b + 1])
        if cu[b] == cu[b + 1] or mismatch(out[rows], ref[rows]) is None:
            continue
        for wrong, what in wrongs:
            if mismatch(out[rows], wrong[rows]) is None:
                said.append(f"sequence {b}: {what}")
    if not said:
        return ""
    return "; ".join(said) + (
        " (top left: new token i saw keys 0..i; new tokens alone: the cached prefix's keys were skipped; "
        "its own key hidden: each row saw keys 0..position - 1)"
    )


def test_cached_prefix_is_visible_bottom_right(impl, runtime):
    """Prefixes of 24, 16 and 40 tokens: every new token sees the whole prefix, then the new tokens up to
    itself (j <= prefix + i). Aligned to the top left (j <= i), it would miss the end of the prefix and
    its own keys; a key loop that starts after the prefix misses the prefix itself. A failure says which
    of the two each sequence's rows are."""
    q_lens = sizes(runtime, [10, 20, 3], [512, 1000, 7])
    prefix = sizes(runtime, [24, 16, 40], [2048, 1024, 4000])
    ctx = [p + n for p, n in zip(prefix, q_lens)]
    case = make_prefill_case(ctx, q_lens, 8, 2, 64, 8, stream=103, device=runtime.device)
    out = launch_into_canary(impl.paged_prefill, case)
    ref, _ = prefill_reference(*case.args)
    problem = mismatch(out, ref, DIMS)
    if problem is not None:
        raise AssertionError(f"{problem}\n{wrong_alignments(out, case)}".rstrip())


def test_prefix_ends_inside_a_page(impl, runtime):
    """Prefixes of 13, 5 and 27 tokens with PAGE = 8: the last cached page is partly filled and the new
    tokens continue in its free slots (token 13 is slot 5 of page 1), not on a fresh page."""
    q_lens = sizes(runtime, [9, 14, 6], [300, 129, 1000])
    prefix = sizes(runtime, [13, 5, 27], [1013, 5, 2047])
    ctx = [p + n for p, n in zip(prefix, q_lens)]
    case = make_prefill_case(ctx, q_lens, 8, 2, 64, 8, stream=107, device=runtime.device)
    check(impl, case)


def test_prefix_a_whole_number_of_pages(impl, runtime):
    """Prefixes of 16, 8 and 32 tokens with PAGE = 8: the new tokens start on a fresh page."""
    q_lens = sizes(runtime, [9, 14, 6], [300, 129, 1000])
    prefix = sizes(runtime, [16, 8, 32], [1024, 8, 2048])
    ctx = [p + n for p, n in zip(prefix, q_lens)]
    case = make_prefill_case(ctx, q_lens, 8, 2, 64, 8, stream=109, device=runtime.device)
    check(impl, case)


def test_decode_rows_beside_long_chunks(impl, runtime):
    """One launch for a mixed batch: decode rows (q_len = 1, which see their whole context) between
    prefill chunks, one with no prefix (ctx 12) and a decode row with ctx = 1."""
    q_lens = sizes(runtime, [1, 30, 1, 1, 12], [1, 512, 1, 1, 2048])
    ctx = sizes(runtime, [40, 50, 1, 17, 12], [2048, 1536, 1, 777, 2048])
    case = make_prefill_case(ctx, q_lens, 8, 2, 64, 16, stream=113, device=runtime.device)
    check(impl, case)


def test_empty_sequences_produce_nothing(impl, runtime):
    """q_len = 0 rows (padding) first, between and last, some with a context and a table row of garbage
    ids: nothing is read through them and nothing is stored for them."""
    q_lens = sizes(runtime, [0, 12, 0, 5, 0], [0, 700, 0, 65, 0])
    ctx = sizes(runtime, [30, 20, 0, 9, 16], [3000, 900, 0, 65, 16])
    case = make_prefill_case(ctx, q_lens, 8, 2, 64, 8, stream=127, device=runtime.device)
    check(impl, case)
    # Every sequence padding: q holds no row (total_q = 0), nothing is launched, and the result is still
    # what the spec says, out [0, Hq, D] and, asked for, lse [0, Hq].
    empty = make_prefill_case([7, 0], [0, 0], 8, 2, 64, 8, stream=128, device=runtime.device)
    result = impl.paged_prefill(*empty.args, return_lse=True)
    spec = (("out", empty.q.shape, empty.q.dtype), ("lse", empty.q.shape[:2], torch.float32))
    wrong = returned_problem("paged_prefill", result, spec)
    assert wrong is None, f"a batch of padding sequences only (total_q = 0) with return_lse=True: {wrong}"


def test_rows_past_a_sequence_end_not_written(impl, runtime):
    """Sequences of 5, 3 and 11 new tokens: the last tile of each has rows past its end, which are the
    next sequence's rows (or past the end of out). out is a view into a canary-filled buffer, and under
    the interpreter programs run forward and in reverse, so a row stored by the wrong program shows. lse
    too: its store needs the same row mask as out's."""
    case = make_prefill_case([9, 3, 30], [5, 3, 11], 4, 2, 64, 8, stream=131, device=runtime.device)
    check(impl, case)
    check_lse(impl, case)


def test_cu_seqlens_mark_where_each_sequence_starts(impl, runtime):
    """Every q_len a whole number of tiles (BLOCK_M rows = BLOCK_M tokens here, Hq = Hkv), so no tile
    has rows past a sequence's end: sequence b's new tokens are rows cu_seqlens_q[b] to
    cu_seqlens_q[b + 1] - 1 of q, no more and no fewer."""
    tokens = impl._config(64)[0]
    # Three sequences: the first rows a misnumbered tile leaves unwritten grow with b in one mistake
    # (tok0 without + b) and stay one tile in another (the search's < for <=); two cannot tell them apart.
    q_lens = [tokens, 2 * tokens, 2 * tokens]
    ctx = [tokens + 7, 2 * tokens, 2 * tokens + 5]
    case = make_prefill_case(ctx, q_lens, 2, 2, 64, 8, stream=137, device=runtime.device)
    check(impl, case)
    # lse at each row's own place: no tile has rows past a sequence's end, so only lse's strides show.
    check_lse(impl, case)


@grouping_cases("group1-MHA", "group3", "group4", "group8", "group8-MQA")
def test_kv_head_grouping_is_contiguous(impl, runtime, Hq, Hkv):
    """Query head h reads KV head h // GROUP, not h % Hkv (interleaved). GROUP = 3 (SmolLM2: Hq = 9,
    Hkv = 3) is not a power of two: a tile's rows are not a whole number of groups. Interleaved and
    contiguous agree when GROUP = 1 (MHA) or Hkv = 1 (MQA): those cases pass either way."""
    q_lens = sizes(runtime, [11, 4], [600, 129])
    ctx = sizes(runtime, [20, 30], [1000, 2000])
    case = make_prefill_case(ctx, q_lens, Hq, Hkv, 64, 8, stream=139 + Hq * 7 + Hkv, device=runtime.device)
    check(impl, case)
    for packed in (True, False):  # both tile layouts of section 3.1, whichever _config picks above
        out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
        impl._launch(*case.args, 0.125, out, config=(16, 16, 4, 1, packed))
        ref, _ = prefill_reference(*case.args, scale=0.125)
        assert_close(out, ref, DIMS)


@pytest.mark.parametrize("D", [64, 128])
def test_head_dims(impl, runtime, D):
    q_lens = sizes(runtime, [7, 13], [1000, 333])
    ctx = sizes(runtime, [20, 13], [3000, 333])
    case = make_prefill_case(ctx, q_lens, 4, 2, D, 8, stream=149 + D, device=runtime.device)
    check(impl, case)


def test_widest_head_dim_is_read_whole(impl, runtime):
    """D = 256, the widest head dim the launcher admits (and its own tile config), on one KV head of two
    query heads, a few new tokens after a cached page: a feature tile capped at 128 scores with half of
    q and k and stores half of each output row, yet passes every case up to D = 128."""
    D = max(DOMAIN["head_dims"])
    case = make_prefill_case([21], [5], 2, 1, D, 16, stream=150, device=runtime.device)
    check(impl, case)


def test_pages_shuffled_and_shared(impl, runtime):
    """Three sequences share a cached prefix of two full pages (the same physical blocks, as L3 produces),
    and physical block 0 is in use."""
    q_lens = sizes(runtime, [6, 12, 1], [400, 1000, 1])
    ctx = sizes(runtime, [22, 40, 17], [1000, 1500, 700])
    case = make_prefill_case(
        ctx, q_lens, 8, 2, 64, 8, stream=151, device=runtime.device, shared_prefix_pages=2
    )
    assert (case.block_tables[:, :2] == case.block_tables[0, :2]).all()
    check(impl, case)
    case0 = make_prefill_case([19], [7], 4, 1, 64, 8, stream=157, device=runtime.device, num_blocks=3)
    assert 0 in case0.block_tables[0, :3].tolist(), "this case should use physical block 0"
    check(impl, case0)


def test_table_rows_are_read_through_their_stride(impl, runtime):
    """block_tables is a slice of a wider table (row stride max_pages + 5): a kernel that finds row b at
    b * max_pages (the table's width) instead of b * stride_bt reads another row's block ids, or the
    garbage between rows, for every sequence after the first."""
    q_lens = sizes(runtime, [6, 12, 1], [400, 1000, 1])
    ctx = sizes(runtime, [22, 40, 17], [1000, 1500, 700])
    case = make_prefill_case(ctx, q_lens, 8, 2, 64, 8, stream=152, device=runtime.device)
    case.block_tables = in_wider_table(case.block_tables)
    check(impl, case)


def test_pages_smaller_than_a_key_tile(impl, runtime):
    """PAGE = 4: one tile of keys spans several pages, each found through its own table entry."""
    case = make_prefill_case([45, 21], [13, 21], 4, 2, 64, 4, stream=163, device=runtime.device)
    check(impl, case)


def test_pages_larger_than_a_key_tile(impl, runtime):
    """PAGE = 32 on a CPU (larger than its 16-key tiles), 128 on a GPU: a key tile is a part of one page."""
    PAGE = sizes(runtime, 32, 128)
    q_lens = sizes(runtime, [13, 21], [300, 1000])
    ctx = sizes(runtime, [45, 21], [1000, 1000])
    case = make_prefill_case(ctx, q_lens, 4, 2, 64, PAGE, stream=167, device=runtime.device)
    check(impl, case)


def test_one_page_holds_every_key(impl, runtime):
    """PAGE = 64 on a CPU, 256 on a GPU, and every context fits in its first page, over several key
    tiles: every key of a sequence has the same block id, so block ids read for the wrong tile still find
    the right page. Passes where test_pages_smaller_than_a_key_tile fails only for such ids."""
    PAGE = sizes(runtime, 64, 256)
    q_lens = sizes(runtime, [30, 45, 1], [150, 250, 1])
    ctx = sizes(runtime, [50, 60, 40], [200, 256, 180])
    case = make_prefill_case(ctx, q_lens, 4, 2, 64, PAGE, stream=169, device=runtime.device)
    assert max(ctx) <= PAGE
    check(impl, case)


def test_keys_past_the_context_are_not_read(impl, runtime):
    """Contexts of 33 and 19 with PAGE = 8: the last key tile runs past the context, into the stale tail
    of the last page (NaN) and past it, where the table holds garbage ids (2**31 - 1, -1, ...)."""
    case = make_prefill_case([33, 19], [4, 19], 4, 2, 64, 8, stream=173, device=runtime.device, extra_pages=4)
    check(impl, case)


def test_table_rows_exactly_full(impl, runtime):
    """Contexts of 40 and 48 with PAGE = 8 in a table of exactly 6 columns: the second sequence's pages
    fill its row, the last of the table, so the entry for key 48 (one past the context) lies past the end
    of block_tables. A table load masked with cols <= ctx instead of cols < ctx reads it."""
    case = make_prefill_case([40, 48], [9, 48], 4, 2, 64, 8, stream=175, device=runtime.device)
    table = case.block_tables[:, :6].contiguous()  # [2, 6]: row 1 ends where the tensor ends
    check(impl, PrefillCase(*case.args[:3], table, *case.args[4:]))


@pytest.mark.parametrize("seen", ["outputs", "loads"])
def test_diagonal_tiles_are_masked(impl, runtime, seen):
    """Through _launch with 16-row tiles and 16-key tiles, GROUP = 1, and whole tiles only: the first
    rows of a tile must not see the keys its last rows see. Prefix 8: tile 0 holds positions 8-23 and
    keys 9-23 are future keys for its first row. "loads": and no tile loads a key tile wholly past its
    last token (key_tiles_past_the_last_token), which masking them would hide from every output."""
    if seen == "loads":
        if not runtime.interpreter:
            pytest.skip("the loads of each program are seen under the interpreter only")
        key_tiles_past_the_last_token(impl, runtime)
        return
    case = make_prefill_case([56, 32], [48, 32], 2, 2, 64, 8, stream=179, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
    impl._launch(*case.args, 0.125, out, config=(16, 16, 4, 1, False))
    ref, _ = prefill_reference(*case.args, scale=0.125)
    assert_close(out, ref, DIMS)


def key_tiles_past_the_last_token(impl, runtime):
    """A chunk's output is the same whether a query tile stops its key loop at its last token's position
    or walks every key of the context and masks the rest: only the loads tell. One sequence, a prefix of
    37 (mid-page) and 40 new tokens in 16-row, 16-key tiles, one head: no program may load a tile of K or
    V whose keys every row of it is masked from (the sequence's last tile legitimately loads them all)."""
    prefix, q_len, PAGE = 37, 40, 8
    ctx = prefix + q_len
    case = make_prefill_case([ctx], [q_len], 1, 1, 16, PAGE, stream=233, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))
    with record_loads(impl, case.q, case.k_cache, case.v_cache) as loads:
        impl._launch(*case.args, 0.125, out, config=(16, 16, 4, 1, False))
    if loads is None:
        return
    # The key position each element of the caches holds, by its offset in the storage (-1: no key of
    # this sequence, a block of the pool it does not use).
    table = case.block_tables[0].tolist()
    positions = {}
    for target, cache in ((1, case.k_cache), (2, case.v_cache)):
        where = torch.full((cache.untyped_storage().nbytes() // cache.element_size(),), -1, dtype=torch.int64)
        view = where.as_strided(cache.shape, cache.stride(), cache.storage_offset())
        for j in range(ctx):
            view[table[j // PAGE], j % PAGE] = j
        positions[target] = where.tolist()
    last_row = loads.last_rows(0, 0, q_len)  # (launch, program) -> its last new token
    for load in loads.loads:
        key = (load.launch, load.program)
        if load.target == 0 or key not in last_row:
            continue
        size = (case.k_cache if load.target == 1 else case.v_cache).element_size()
        seen = positions[load.target]
        keys = [seen[o // size] for o in load.offsets if 0 <= o // size < len(seen)]
        keys = [j for j in keys if j >= 0]
        last_key = prefix + last_row[key]  # the last key that program's last token may see
        assert not keys or min(keys) <= last_key, (
            f"prefix {prefix}, {q_len} new tokens, 16 x 16 tiles: the program {load.program} whose last new "
            f"token is {last_row[key]} (position {last_key}: it sees keys up to {last_key}) loaded "
            f"{'K' if load.target == 1 else 'V'} at positions {min(keys)} to {max(keys)}, a key tile wholly "
            "past its last token; masked to -inf, its scores change no output, and on a GPU loading and "
            "multiplying it costs that program as much as a tile it needs: end the key loop at the tile's "
            "last token (hi = min(ctx, prefix + tok0 + BLOCK_Q))"
        )


@pytest.mark.parametrize("packed", [True, False], ids=["packed-group", "one-head"])
def test_key_ranges_at_every_alignment(impl, runtime, packed):
    """Prefixes 0 to 16 against 1, 6 and 19 new tokens, in 16-key tiles and 16-row tiles (5 tokens x 3
    heads packed, 16 tokens one head per tile): each tile's first and last keys fall at every offset from
    a key-tile boundary, so a key range one key short or long (full_end, hi, a loop bound) shows on some
    row. Pages of one token make every prefix a whole number of pages: this is about the ranges only."""
    seqs = [(prefix, new) for prefix in range(17) for new in (1, 6, 19)]
    ctx, q_lens = [p + n for p, n in seqs], [n for _, n in seqs]
    case = make_prefill_case(ctx, q_lens, 3, 1, 32, 1, stream=187, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
    impl._launch(*case.args, 0.125, out, config=(16, 16, 4, 1, packed))
    ref, _ = prefill_reference(*case.args, scale=0.125)
    assert_close(out, ref, DIMS)


@pytest.mark.parametrize("packed", [True, False], ids=["packed-group", "one-head"])
@pytest.mark.parametrize("config", [(16, 16), (64, 16), (16, 32)], ids=lambda c: f"M{c[0]}xN{c[1]}")
def test_any_tile_shape(impl, runtime, config, packed):
    """BLOCK_M (rows: tokens x HEADS) and BLOCK_N are independent, and a tile holds either the GROUP query
    heads of one KV head (packed) or one query head: the tile -> sequence map, the causal ranges and the
    page lookups must hold for each. GROUP = 3, so a packed BLOCK_M is not a whole number of groups."""
    case = make_prefill_case([30, 8, 41], [17, 8, 1], 9, 3, 64, 8, stream=181, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
    impl._launch(*case.args, 0.125, out, config=(*config, 4, 1, packed))
    ref, _ = prefill_reference(*case.args, scale=0.125)
    assert_close(out, ref, DIMS)


@pytest.mark.parametrize("packed", [True, False], ids=["packed-group", "one-head"])
def test_group_wider_than_a_tile_of_rows(impl, runtime, packed):
    """GROUP = 64 (Hq = 64, Hkv = 1, D = 16) with 16-row tiles, decode rows beside a 3-token chunk: packed,
    one token's 64 heads do not fit 16 rows, so the launcher widens the tile to next_pow2(GROUP) = 64 rows,
    one token each (16 // 64 would give tiles of 0 tokens); one head per tile, 16 tokens of one head over
    64 head groups. Both through _launch; the packed case through paged_prefill's own config too."""
    case = make_prefill_case([20, 7, 33, 12], [1, 1, 1, 3], 64, 1, 16, 16, stream=229, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
    impl._launch(*case.args, 0.25, out, config=(16, 16, 4, 1, packed))
    ref, _ = prefill_reference(*case.args, scale=0.25)
    assert_close(out, ref, DIMS)
    if packed:
        check(impl, case)


def test_padding_rows_of_a_packed_tile_not_stored(impl, runtime):
    """GROUP = 3 in 16-row packed tiles: 5 tokens x 3 heads fill rows 0-14 and row 15 is padding. By the
    row formulas it is token tok0 + 5, the next tile's first token, whose own key sits past this tile's
    last key when prefix + tok0 + 5 is a multiple of BLOCK_N (prefix 11 with tok0 0, prefix 6 with tok0 5
    here). Stored, that row overwrites the next tile's right answer with a wrong one whenever this program
    runs last: the two programs share bytes, so the harness runs them in both orders."""
    case = make_prefill_case([31, 26], [20, 20], 9, 3, 64, 8, stream=183, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
    lse = torch.full(case.q.shape[:2], float("nan"), device=runtime.device)  # [total_q, Hq] fp32
    impl._launch(*case.args, 0.125, out, lse, config=(16, 16, 4, 1, True))
    ref, ref_lse = prefill_reference(*case.args, scale=0.125)
    assert_close(out, ref, DIMS)
    assert_close(lse, ref_lse, LSE_DIMS, **LSE_TOL)  # the padding row's lse is the next tile's row too


# --- Section 3.6 "The softmax": T5's update, base 2 inside, natural log out --------------------------------


def test_max_starts_at_minus_inf(impl, runtime):
    """Every score is about -128 (shift_scores: keys point away from the queries). A running max that
    starts at 0 instead of -inf stays 0, so p = exp2(s - 0) underflows to 0 for every key, l = 0, and the
    row stores 0 / 0. A chunk after a prefix, and a decode row."""
    case = make_prefill_case([30, 17], [12, 1], 4, 2, 64, 8, stream=189, device=runtime.device)
    check(impl, shift_scores(case, -128.0))


UNITS_NOTE = (
    "every key's weight under- or overflowed where the scores are large: the running max is not in the "
    "units exp2 sees (score times scale times log2 e)"
)


def every_weight_lost(out, ref) -> str:
    """UNITS_NOTE when rows that the oracle finds finite came out NaN, inf or all zero, else ""."""
    lost = ~out.float().isfinite() | (out.float() == 0).all(dim=-1, keepdim=True)
    return UNITS_NOTE if bool((lost & ref.isfinite() & (ref != 0)).any()) else ""


def test_running_max_in_the_units_of_the_exponent(impl, runtime):
    """Every score is about +40 (scale * q . k, shift_scores). The max that shifts the exponent must be in
    the exponent's own units: m = max(s * qk_scale). A max of the raw scores q . k, 8 times the score at
    D = 64, makes p = exp2(s * qk_scale - m) = 2^-262 for every key here: l = 0 and the row stores 0 / 0
    (and scores of -40 overflow). Scores near 0 hide it: the shift cancels unless it under- or overflows.
    A max that starts at 0 passes here (a max of 57.7 is above it)."""
    case = make_prefill_case([30, 17], [12, 1], 4, 2, 64, 8, stream=193, device=runtime.device)
    check(impl, shift_scores(case, 40.0), explain=every_weight_lost)


def _falling_scores_case(runtime):
    """A decode row (one token, so no tile is masked for some rows only) whose scores fall with the key
    position: about +60 in the first key tile, -60 after it. The running max must stay at the first
    tile's: m_new = max(m_i, the tile's max). Taken from each tile alone, it falls by 120 / ln 2 = 173 in
    base 2, and alpha = exp2(m_old - m_new) = 2^173 overflows to inf. Rising scores hide it (the tile's
    max is then the running one)."""
    n, D = 80, 64
    # One sequence, as the rising case: the sequence search's mistakes must pass both.
    case = make_prefill_case([n], [1], 4, 1, D, 8, stream=197, device=runtime.device)
    shift = torch.where(torch.arange(n) < 16, 60.0, -60.0)  # [n]: the score each key position adds
    for b, ctx in enumerate(case.context_lens.tolist()):
        t = torch.arange(ctx, device=runtime.device)
        blocks, slots = case.block_tables[b].long()[t // 8], t % 8
        case.k_cache[blocks, slots, 0, 0] = shift[:ctx].to(case.q.dtype).to(runtime.device)
    case.q[:, :, 0] = math.sqrt(D)  # scale * q . k gains the key's shift from feature 0
    return case


@pytest.mark.parametrize("scores", ["rising", "falling"])
def test_online_softmax_rescales_old_tiles(impl, runtime, scores):
    """Scores rise with the key position, so the running max grows tile after tile: dropping the rescale
    factor alpha = exp2(m_old - m_new) leaves the early tiles over-weighted. Falling: _falling_scores_case,
    where the running max must not fall."""
    if scores == "falling":
        check(impl, _falling_scores_case(runtime))
        return
    n, D = sizes(runtime, 80, 2000), 64
    case = make_prefill_case([n], [4], 4, 1, D, 8, stream=191, device=runtime.device)
    t = torch.arange(n, device=runtime.device)
    blocks, slots = case.block_tables[0].long()[t // 8], t % 8  # where token t lives
    q0 = case.q[0, 0].float()
    case.q.copy_((q0 + 0.1 * case.q.float()).to(case.q.dtype))  # every query close to q0
    ramp = torch.linspace(0.5, 12.0, n, device=runtime.device)[:, None]  # the score of key t
    k = 0.2 * case.k_cache[blocks, slots, 0].float() + ramp * math.sqrt(D) * q0 / q0.dot(q0)
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)  # [n, D]
    check(impl, case)


def test_scale_is_applied(impl, runtime):
    """The default scale is 1 / sqrt(D), folded with log2(e) into the scores; an explicit scale replaces
    it. One key tile per sequence, so that a missing rescale cannot fail here."""
    case = make_prefill_case([12, 7], [5, 7], 4, 1, 128, 8, stream=193, device=runtime.device)
    check(impl, case)
    check(impl, case, scale=0.3)


def test_output_is_normalised_by_the_softmax_sum(impl, runtime):
    """With every V row equal to 1 the output is exactly 1, whatever the scores."""
    case = make_prefill_case([40, 23], [9, 23], 4, 2, 64, 8, stream=197, device=runtime.device)
    real = ~torch.isnan(case.v_cache)
    case.v_cache[real] = 1.0
    out = check(impl, case)
    assert_close(out, torch.ones_like(out, dtype=torch.float32), DIMS)


def test_lse_is_natural_log(impl, runtime):
    """lse [total_q, Hq] fp32 is log(sum(exp(scaled masked scores))) in base e: the kernel works in base 2,
    so m + log2(l) must be multiplied by ln 2. Decode rows, chunks and a q_len = 0 row in one batch."""
    q_lens = sizes(runtime, [1, 17, 0, 6], [1, 700, 0, 64])
    ctx = sizes(runtime, [30, 40, 5, 6], [2000, 1400, 5, 64])
    check_lse(impl, make_prefill_case(ctx, q_lens, 8, 2, 64, 8, stream=199, device=runtime.device))


def test_chunked_prefill_equals_one_call(impl, runtime):
    """One prompt prefilled in one call, then again in chunks (each a call whose prefix is the chunks
    before it, the cache already holding the whole prompt): the outputs and lse must agree."""
    n, chunk = sizes(runtime, (70, 24), (5000, 2048))
    # GROUP 2 (two KV heads: interleaved heads still show) packs 8 tokens a tile: half the programs of 8 heads.
    Hq, Hkv = sizes(runtime, (4, 2), (8, 2))
    case = make_prefill_case([n], [n], Hq, Hkv, 64, 16, stream=211, device=runtime.device)
    whole, whole_lse = impl.paged_prefill(*case.args, return_lse=True)
    ref, ref_lse = prefill_reference(*case.args)
    assert_close(whole, ref, DIMS)
    for first in range(0, n, chunk):
        last = min(n, first + chunk)
        part = PrefillCase(
            case.q[first:last],
            case.k_cache,
            case.v_cache,
            case.block_tables,
            int32_tensor(runtime.device, 0, last - first),
            int32_tensor(runtime.device, last),
        )
        out, lse = impl.paged_prefill(*part.args, return_lse=True)
        assert_close(out, whole[first:last].float(), DIMS)
        assert_close(lse, whole_lse[first:last], LSE_DIMS, **LSE_TOL)
    assert_close(whole_lse, ref_lse, LSE_DIMS, **LSE_TOL)


# --- Layout: strides, dtypes, sizes ------------------------------------------------------------------------


def pooled_caches(case):
    """The case's k_cache and v_cache copied into layer 1 of a NaN-filled pool (paged_kv.in_layer_pool)."""
    pooled = in_layer_pool(
        PagedCase(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens)
    )
    return pooled.k_cache, pooled.v_cache


def test_q_and_cache_strides_are_used(impl, runtime):
    """q is every other head of a NaN-filled [total_q, 2 Hq, D] buffer, and k_cache, v_cache are layer 1
    of a NaN-filled pool [num_blocks, layers, PAGE, Hkv, 2, D]: only the last dimension is contiguous."""
    case = make_prefill_case([30, 9], [12, 9], 8, 2, 64, 8, stream=223, device=runtime.device)
    total_q, Hq, D = case.q.shape
    buffer = torch.full((total_q, 2 * Hq, D), float("nan"), dtype=case.q.dtype, device=runtime.device)
    q = buffer[:, 1::2]  # [total_q, Hq, D], strides (2 Hq D, 2 D, 1)
    q.copy_(case.q)
    k_cache, v_cache = pooled_caches(case)
    check(impl, PrefillCase(q, k_cache, v_cache, *case.args[3:]))


@pytest.mark.parametrize("layout", ["v-in-a-pool", "v-head-major", "v-block-stride-only"])
def test_k_and_v_caches_with_different_strides(impl, runtime, layout):
    """k_cache contiguous; v_cache one layer of a NaN-filled pool (every stride differs from K's), a
    head-major [num_blocks, Hkv, PAGE, D] buffer seen as [num_blocks, PAGE, Hkv, D] (the same block stride
    as K, the others swapped), or every other block of a NaN-filled buffer (the block stride alone
    differs). A kernel that finds V's rows with K's offsets, or decides that it may from some of the
    strides alone, reads the wrong elements of V."""
    case = make_prefill_case([30, 9], [12, 9], 8, 2, 64, 8, stream=225, device=runtime.device)
    if layout == "v-in-a-pool":
        _, v_cache = pooled_caches(case)
    elif layout == "v-block-stride-only":  # strides (2 PAGE Hkv D, Hkv D, D, 1)
        pairs = torch.full(
            (case.v_cache.shape[0], 2, *case.v_cache.shape[1:]),
            float("nan"),
            dtype=case.v_cache.dtype,
            device=case.v_cache.device,
        )  # [num_blocks, 2, PAGE, Hkv, D]
        pairs[:, 1] = case.v_cache
        v_cache = pairs[:, 1]
        assert v_cache.stride()[1:] == case.k_cache.stride()[1:]
    else:  # strides (PAGE Hkv D, D, PAGE D, 1)
        v_cache = case.v_cache.transpose(1, 2).contiguous().transpose(1, 2)
        assert v_cache.stride(0) == case.k_cache.stride(0)
    assert case.k_cache.stride() != v_cache.stride()
    check(impl, PrefillCase(case.q, case.k_cache, v_cache, *case.args[3:]))


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (D = 256 with
    packed decode rows at PAGE = 1, V's strides unlike K's with a prefix inside a page, lse with a wider
    table...): a kernel right on each bound alone can still be wrong where two meet. A failure names
    the case's values."""

    def run(c):
        Hq, Hkv = c["heads"]
        q_lens, lens = BATCHES_BY_PAGE[c["batch"]](c["PAGE"])
        case = make_prefill_case(
            lens, q_lens, Hq, Hkv, c["D"], c["PAGE"], stream=404, dtype=c["dtype"], device=runtime.device
        )
        caches = laid_out(case, runtime, "contiguous", c["kv"], c["table"])  # a PagedCase: K, V, table
        q = case.q
        if c["q"] == "strided":  # every other head of a NaN-filled [total_q, 2 Hq, D] buffer
            buffer = torch.full(
                (q.shape[0], 2 * Hq, q.shape[2]), float("nan"), dtype=q.dtype, device=q.device
            )
            q = buffer[:, 1::2]
            q.copy_(case.q)
        case = PrefillCase(
            q, caches.k_cache, caches.v_cache, caches.block_tables, case.cu_seqlens_q, case.context_lens
        )
        lse_box = []

        def launch(*args, **kw):
            result = impl.paged_prefill(*args, return_lse=c["lse"], **kw)
            if c["lse"]:
                lse_box.append(result[1])
            return result

        check_launch(launch, prefill_reference, case, DIMS, c["scale"])
        if c["lse"]:
            _, ref_lse = prefill_reference(*case.args, scale=c["scale"])
            assert_close(lse_box[0], ref_lse, LSE_DIMS, **LSE_TOL)

    DOMAIN.check_each(DOMAIN.cases(stream=404), run)


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    q_lens = sizes(runtime, [9, 1], [1500, 1])
    ctx = sizes(runtime, [20, 33], [3000, 2048])
    case = make_prefill_case(ctx, q_lens, 8, 2, 128, 16, stream=227, dtype=dtype, device=runtime.device)
    out = check(impl, case)
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_out_keeps_the_range_of_its_dtype(impl, runtime, dtype):
    """Every V element is 2^16 (bf16) or 2^13 (fp16) x (1 + |randn|) (fill_past_fp16_range), so every output element is too. bf16 outputs
    from 65536 up hold in bf16 and not in fp16 (largest 65504): a kernel that casts to tl.float16 where
    the tensors' own dtype belongs (p before P V, or out before the store) turns them into inf, or does
    not compile (tl.dot of fp16 p by bf16 v). The fp16 case is the same check inside fp16's range."""
    case = make_prefill_case([20, 33], [9, 1], 4, 2, 64, 8, stream=231, dtype=dtype, device=runtime.device)
    v = case.v_cache  # the stale slots' NaN stay NaN
    fill_past_fp16_range(v)
    check(impl, case)


def test_large_ragged_batch(impl, runtime):
    """Many sequences of random prefixes and chunk sizes, decode rows and empty rows among them."""
    gen = torch.Generator().manual_seed(seeded(229))
    B, top = sizes(runtime, (6, 24), (48, 1500))
    q_lens = torch.randint(0, top, (B,), generator=gen)
    q_lens[:2] = torch.tensor([1, 0])  # a decode row and a padding row among them
    ctx = q_lens + torch.randint(0, 2 * top, (B,), generator=gen)
    # GROUP 4 at D = 128 as a 32-head model has it, with two KV heads under the interpreter (its time goes
    # with programs, tiles x head groups): the raggedness is what this case is for.
    Hq, Hkv = sizes(runtime, (8, 2), (32, 8))
    case = make_prefill_case(
        ctx.tolist(), q_lens.tolist(), Hq, Hkv, 128, 16, stream=229, device=runtime.device
    )
    check(impl, case)


@pytest.mark.parametrize("B", [130, 1100], ids=["130-seqs", "1100-seqs"])
def test_sequence_search_covers_every_sequence(impl, runtime, B):
    """130 sequences of 1-3 new tokens over contexts of 1-12: the search for a tile's sequence over
    cu_seqlens_q must narrow [0, B) down to one sequence whatever B is. A fixed number of halvings, 6
    (right up to 64 sequences) or 7 (up to 128), stops with two candidates left and hands some tiles to
    the wrong sequence: past both bounds, 130 shows either. 1,100 sequences cross the next bounds a
    search is cut to (8 or 10 halvings, a vector of 256 or 1,024 first tiles): all but six are padding
    (q_len = 0, a spare tile each that returns at once), so the case stays cheap, and the six with new
    tokens sit at both sides of 256 and of 1,024 and at the end. Every other case has at most 51."""
    gen = torch.Generator().manual_seed(seeded(243))
    q_lens = torch.randint(1, 4, (B,), generator=gen)
    if B > 256:
        live = torch.zeros(B, dtype=torch.bool)
        live[[0, 255, 256, 1023, 1024, B - 1]] = True
        q_lens = torch.where(live, q_lens, 0)
    ctx = q_lens + torch.randint(0, 10, (B,), generator=gen)
    case = make_prefill_case(ctx.tolist(), q_lens.tolist(), 2, 1, 16, 4, stream=243, device=runtime.device)
    check(impl, case)


@pytest.mark.parametrize("far", ["q-rows", "out-rows", "table-rows", "kv-heads"])
def test_rows_and_heads_widened_to_int64(impl, runtime, far):
    """Offsets past 2**31 elements whose strides fit in int32, one tensor at a time. q's rows, or out's,
    3 * 2**26 elements apart (a view of a large activation buffer): rows 11 to 16 start past 2**31, so
    the packed row index times stride_qt (stride_ot) in int32 wraps to before q (out). block_tables' rows
    1.5 * 2**30 entries apart (rows_far_apart): b * stride_bt wraps from sequence 2 on. k_cache's and
    v_cache's KV heads 1.5 * 2**30 elements apart (a head-major pool seen as [num_blocks, PAGE, Hkv, D],
    Hkv = 3): head0 from tl.program_id(0) is int32, and kvh * stride_kh wraps for KV head 2. Each index
    must be int64 before it meets a stride; the interpreter reports a wrapped access, a GPU reads or
    stores other memory of the buffer. Sparse files on a CPU."""
    if far == "q-rows":
        case = make_prefill_case([9, 14], [5, 12], 4, 2, 64, 8, stream=235, device=runtime.device)
        check(impl, PrefillCase(_rows_past_int32(case.q, runtime), *case.args[1:]))
    elif far == "out-rows":
        case = make_prefill_case([9, 14], [5, 12], 4, 2, 64, 8, stream=236, device=runtime.device)
        out = _rows_past_int32(torch.full_like(case.q, float("nan")), runtime)  # unwritten rows stay NaN
        returned = impl.paged_prefill(*case.args, out=out)
        wrong = returned_out_problem("paged_prefill", returned, out)
        assert wrong is None, wrong
        assert_close(out, prefill_reference(*case.args)[0], DIMS)
    elif far == "table-rows":
        case = make_prefill_case([9, 14, 20], [5, 12, 3], 4, 2, 64, 8, stream=237, device=runtime.device)
        case.block_tables = rows_far_apart(case.block_tables, runtime)
        check(impl, case)
    else:  # decode rows beside a chunk of 20 new tokens
        case = make_prefill_case([20, 9, 30], [1, 1, 20], 6, 3, 64, 8, stream=238, device=runtime.device)
        k_cache, v_cache = (far_apart(c, runtime, dim=2) for c in (case.k_cache, case.v_cache))
        assert 2 * k_cache.stride(2) >= 2**31 > k_cache.stride(2)
        check(impl, PrefillCase(case.q, k_cache, v_cache, *case.args[3:]))


def _rows_past_int32(t, runtime):
    """A copy of t [total_q, Hq, D] whose rows lie 3 * 2**26 elements apart (the stride fits in int32) after
    2**31 elements of a sparse buffer: rows from 11 on start past 2**31 elements, so a row index times
    the stride in int32 wraps to before t. Skips, saying why, without the memory for the rows."""
    skip_without_memory_for_sparse_pages(runtime)
    total_q, Hq, D = t.shape
    stride, before = 3 * 2**26, 2**31  # the row stride, and the buffer's elements before t
    flat = bigmem.sparse_empty((before + (total_q - 1) * stride + Hq * D,), t.dtype, runtime.device)
    far = flat.as_strided((total_q, Hq, D), (stride, D, 1), before)  # row r at r * stride
    far.copy_(t)
    assert (total_q - 1) * stride >= 2**31 > stride
    return far


def test_page_index_widened_to_int64(impl, runtime):
    """A chunk after a prefix and a decode row, every page past 2**32 elements of the cache
    (pool_past_int32): the key tiles' block id * stride_kb must be computed in int64, in both key loops."""
    PAGE, Hkv, D = 16, 1, 128
    far_blocks = pool_past_int32(runtime, PAGE, Hkv, D, spare=96)
    q_lens = sizes(runtime, [9, 7], [300, 45])
    ctx = sizes(runtime, [40, 7], [700, 45])
    case = make_prefill_case(ctx, q_lens, 4, Hkv, D, PAGE, stream=233, device=runtime.device, **far_blocks)
    assert case.block_tables[:, 0].min().item() * PAGE * Hkv * D > 2**32
    check(impl, case)


def test_v_page_offsets_widened_to_int64(impl, runtime):
    """k_cache spans under 2**31 elements, v_cache is layer 3 of a 4-layer pool (stride_vb = 4 stride_kb)
    that spans 2**32 and more: every V row sits past 2**32, every K row below 2**31. int64 offsets are
    needed for V alone, through V's own strides: a kernel that widens K's offsets and not V's (or decides
    from k_cache's span alone) wraps V's rows onto the pool's first blocks, zeros here. Sparse files on a
    CPU: only the pages the sequences use take memory."""
    skip_without_memory_for_sparse_pages(runtime)
    PAGE, Hkv, D, layers = 16, 1, 128, 4
    stride = PAGE * Hkv * D  # elements per block of k_cache
    # K rows below 2**31; V rows, 4 times as far apart, past 2**32
    far_blocks = blocks_past(2**30, PAGE, Hkv, D, spare=96)
    q_lens = sizes(runtime, [9, 7], [300, 45])
    ctx = sizes(runtime, [40, 7], [700, 45])
    case = make_prefill_case(ctx, q_lens, 4, Hkv, D, PAGE, stream=247, device=runtime.device, **far_blocks)
    num_blocks = case.k_cache.shape[0]
    pool = bigmem.sparse_empty((num_blocks, layers, PAGE, Hkv, D), case.q.dtype, runtime.device)
    v_cache = pool[:, layers - 1]  # [num_blocks, PAGE, Hkv, D], stride_vb = layers * stride
    if not runtime.interpreter:
        pool[:128].zero_()  # torch.empty on a GPU: the blocks a wrapped V offset lands on (8-104) read 0
    in_use = torch.cat([case.block_tables[b, : math.ceil(n / PAGE)] for b, n in enumerate(ctx)]).long()
    v_cache[in_use] = case.v_cache[in_use]  # the poisoned, filled blocks, nothing else touched
    assert num_blocks * stride < 2**31 <= 2**32 < in_use.min().item() * v_cache.stride(0)
    check(impl, PrefillCase(case.q, case.k_cache, v_cache, *case.args[3:]))
    del pool, v_cache


# --- The launcher rejects bad input before launching -----------------------------------------------


def _spoil_cu(a, dev, *values):
    return dict(cu_seqlens_q=int32_tensor(dev, *values))


# A valid call: B = 2, q_lens [5, 3], context_lens [20, 3], PAGE = 16, max_pages 4.
# name -> (how to spoil the arguments of a valid call, the error, what the message must name)
BAD_INPUTS = {
    **PAGED_BAD_INPUTS,
    "page_not_pow2": (
        lambda a, dev: {n: a[n][:, :12].contiguous() for n in ("k_cache", "v_cache")},
        ValueError,
        "PAGE",
    ),
    "cu_seqlens_int64": (
        lambda a, dev: dict(cu_seqlens_q=a["cu_seqlens_q"].long()),
        TypeError,
        "cu_seqlens_q",
    ),
    "cu_seqlens_wrong_batch": (lambda a, dev: _spoil_cu(a, dev, 0, 8), ValueError, "cu_seqlens_q"),
    "cu_seqlens_not_from_0": (lambda a, dev: _spoil_cu(a, dev, 1, 5, 8), ValueError, r"cu_seqlens_q\[0\]"),
    "cu_seqlens_decreasing": (lambda a, dev: _spoil_cu(a, dev, 0, 6, 5), ValueError, "cu_seqlens_q"),
    "cu_seqlens_short_of_total_q": (
        lambda a, dev: _spoil_cu(a, dev, 0, 5, 7),
        ValueError,
        r"cu_seqlens_q\[2\]",
    ),
    "cu_seqlens_past_total_q": (lambda a, dev: _spoil_cu(a, dev, 0, 5, 9), ValueError, r"cu_seqlens_q\[2\]"),
    "cu_seqlens_strided": (
        lambda a, dev: dict(cu_seqlens_q=int32_tensor(dev, 0, 99, 5, 99, 8)[::2]),
        ValueError,
        "cu_seqlens_q",
    ),
    **CONTEXT_LENS_BAD_INPUTS,
    "q_len_past_context_len": (
        lambda a, dev: dict(context_lens=int32_tensor(dev, 20, 2)),
        ValueError,
        r"context_lens\[1\]",
    ),
    "context_len_past_table": (
        lambda a, dev: dict(context_lens=int32_tensor(dev, 65, 3)),
        ValueError,
        r"context_lens\[0\]",
    ),
    "mixed_devices": (
        lambda a, dev: dict(cu_seqlens_q=a["cu_seqlens_q"].to("meta")),
        ValueError,
        "cu_seqlens_q",
    ),
    **LIVE_BLOCK_ID_BAD_INPUTS,
    "scale_nan": (lambda a, dev: dict(scale=float("nan")), ValueError, "scale"),
    "scale_negative": (lambda a, dev: dict(scale=-0.125), ValueError, "scale"),
    "scale_bool": (lambda a, dev: dict(scale=True), TypeError, "scale"),
    "return_lse_not_bool": (lambda a, dev: dict(return_lse="yes"), TypeError, "return_lse"),
    "check_not_bool": (lambda a, dev: dict(check="yes"), TypeError, "check"),
    **SHARED_KV_BAD_INPUTS,
    "out_wrong_shape": (lambda a, dev: dict(out=torch.empty_like(a["q"])[:, :2]), ValueError, "out"),
    "out_fp32": (lambda a, dev: dict(out=torch.empty_like(a["q"], dtype=torch.float32)), TypeError, "out"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    case = make_prefill_case([20, 3], [5, 3], 4, 2, 64, 16, stream=239, device=runtime.device, max_pages=4)
    args = spoiled_call(case, spoil, runtime.device)
    with raises_naming(error, names):
        impl.paged_prefill(**args)


def test_padding_rows_may_have_any_table(impl, runtime):
    """Not a bad input: a q_len = 0 row's table is never read, so garbage ids there are accepted (and its
    context_len may be 0)."""
    case = make_prefill_case([0, 20, 7], [0, 5, 0], 4, 2, 64, 16, stream=241, device=runtime.device)
    assert (case.block_tables[0] < 0).any() or (case.block_tables[0] >= case.k_cache.shape[0]).any()
    check(impl, case)


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: paged_prefill must compute them with your Triton kernel, not
    with torch (gathering the pages for scaled_dot_product_attention, or a copy of the grader's oracle)."""
    case = make_prefill_case([37, 5], [12, 5], 8, 2, 64, 16, stream=251, device=runtime.device)
    assert_runs_a_triton_kernel(impl, lambda: impl.paged_prefill(*case.args), "paged_prefill")


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_top_left_and_base_2(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros output, the top-left causal
    answer and an lse in base 2, so passing the other tests means something."""
    case = make_prefill_case([40, 20], [9, 20], 8, 2, 64, 8, stream=257, device=runtime.device)
    ref, lse = prefill_reference(*case.args)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
    top_left = PrefillCase(*case.args[:5], torch.diff(case.cu_seqlens_q).to(torch.int32))  # prefix 0
    # Top left over the whole context = bottom right over a context cut to q_len.
    assert mismatch(prefill_reference(*top_left.args)[0].half(), ref) is not None
    assert mismatch(lse / math.log(2), lse, **LSE_TOL) is not None
    assert mismatch(ref.half(), ref) is None  # and the oracle rounded to fp16 passes


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, paged_prefill allocates [total_q, Hq, D] in q's dtype. Last in the file: a kernel
    that stores rows past the last sequence writes past this allocation, which the canary tests above
    report first."""
    case = make_prefill_case([25, 3], [10, 3], 8, 2, 64, 16, stream=263, device=runtime.device)
    out = impl.paged_prefill(*case.args)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype and out.device == case.q.device
    ref, _ = prefill_reference(*case.args)
    assert_close(out, ref, DIMS)


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """70,000 sequences of one new token each (decode rows in a prefill batch): more tiles than the
    65535 programs CUDA allows on grid axes 1 and 2 (axis 0 allows 2**31 - 1), so tiles and head groups
    share axis 0. A grid with sequences or tiles on axis 1 launches on the CPU and fails on a GPU with
    "invalid argument". Run dry (every launch recorded and checked, none run), one head of D = 16 and
    one page per sequence, without the value checks, which the other tests cover."""
    B, PAGE, D = 70_000, 16, 16
    q = torch.zeros(B, 1, D, dtype=torch.float16, device=runtime.device)  # [total_q, Hq, D]
    k_cache = torch.zeros(1, PAGE, 1, D, dtype=torch.float16, device=runtime.device)  # [blocks, PAGE, Hkv, D]
    v_cache = torch.zeros_like(k_cache)
    block_tables = torch.zeros(B, 1, dtype=torch.int32, device=runtime.device)  # [B, 1]
    cu_seqlens_q = torch.arange(B + 1, dtype=torch.int32, device=runtime.device)  # [B + 1]: one token each
    context_lens = torch.ones(B, dtype=torch.int32, device=runtime.device)  # [B]
    assert_grids_fit(
        impl,
        lambda: impl.paged_prefill(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, return_lse=True, check=False
        ),
        "paged_prefill of 70,000 sequences",
    )


# --- Diagnosis: which pitfall of the explainer's section 5 a pattern of results points at --------------
# The look-alikes and what tells them apart: pure prefill (prefix 0) passes top-left alignment; prefixes
# that are whole pages pass the fresh-page assumption; pages larger than a key tile pass the one-page-
# per-tile lookup; whole tiles (test_cu_seqlens_mark_where_each_sequence_starts) pass rows stored past a
# sequence's end; the worked example (keys all 0) and V all ones pass the softmax mistakes; one key tile
# per sequence (test_scale_is_applied) passes the missing rescale and the unmasked diagonal.

WORKED = "test_worked_example_request_2_after_its_prefix_hit"
WORKED_LSE = "test_worked_example_lse_is_ln_of_the_keys_seen"
OOB_OR_NAN = r"out of bounds load|NaN"
MISTAKES = [
    Mistake(
        31,
        # out written through q's strides: right wherever out is the launcher's own contiguous tensor
        # (return_lse, out=None), wrong through every canary-wrapped view of the checks.
        fails=(
            "test_worked_example_request_2_after_its_prefix_hit",
            "test_pure_prefill_without_a_prefix",
            "test_q_and_cache_strides_are_used",
        ),
        passes=(
            "test_worked_example_lse_is_ln_of_the_keys_seen",
            "test_lse_is_natural_log",
            "test_out_is_allocated_when_not_given",
            "test_chunked_prefill_equals_one_call",
        ),
        messages=(r"canary elements of the buffer around out",),
        question="Every check that passes `out=` fails, and every one that lets paged_prefill allocate out "
        "passes: which strides does your kernel step through out with?",
        section="3.5",
    ),
    Mistake(
        30,
        fails=("test_group_wider_than_a_tile_of_rows[packed-group]",),
        passes=("test_group_wider_than_a_tile_of_rows[one-head]", "test_any_tile_shape"),
        question="GROUP = 64 and a config of 16-row tiles, packed: how many tokens does a tile hold "
        "(BLOCK_M // GROUP), and what does your launcher do to BLOCK_M first?",
        section="3.1",
    ),
    Mistake(
        1,
        fails=("test_cached_prefix_is_visible_bottom_right", "test_decode_rows_beside_long_chunks", WORKED),
        passes=("test_pure_prefill_without_a_prefix",),
        messages=(r"aligned to the top left",),
        question="Prefill without a prefix passes and every case with a cached prefix fails: request 2's new "
        "token G sits at position 4; which keys may it see, and which does your mask let it see?",
        section="2",
    ),
    Mistake(
        2,
        fails=("test_rows_past_a_sequence_end_not_written",),
        passes=("test_cu_seqlens_mark_where_each_sequence_starts",),
        messages=(r"out of bounds (load of q|store of (out|lse))|write race|buffer around out",),
        question="A sequence of 5 new tokens in a tile of 8 token rows: whose rows are rows 5-7 of that "
        "tile, and does your kernel load and store them?",
        section="3.4",
    ),
    Mistake(
        2,
        # The lse store alone without the row mask: out is right, and lse's rows past a sequence's end land
        # on the next sequence's (a race) or past lse. Whole tiles pass; pitfall 12's bases fail them.
        fails=("test_rows_past_a_sequence_end_not_written", "test_lse_is_natural_log"),
        passes=("test_cu_seqlens_mark_where_each_sequence_starts", WORKED),
        messages=(r"out of bounds store of lse_ptr|write race",),
        question="A sequence of 5 new tokens in a tile of 8 token rows: your out store is masked to its "
        "rows, and your lse store?",
        section="3.4",
    ),
    Mistake(
        3,
        fails=(
            "test_cu_seqlens_mark_where_each_sequence_starts",
            "test_rows_past_a_sequence_end_not_written",
            WORKED,
        ),
        messages=(r"out of bounds load of q",),
        question="Sequence b's new tokens are q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]: how many rows is "
        "that, and how many does your kernel give it?",
        section="3.4",
    ),
    Mistake(
        4,
        fails=("test_prefix_ends_inside_a_page",),
        passes=(
            "test_key_ranges_at_every_alignment",
            "test_prefix_a_whole_number_of_pages",
            "test_pure_prefill_without_a_prefix",
            WORKED,
        ),
        question="A prefix of 13 tokens with PAGE = 8: in which page and slot does new token 0 live, and "
        "where does your kernel look for it?",
        section="3.3",
    ),
    Mistake(
        36,
        # Right while every key tile starts on a page (PAGE <= BLOCK_N), wrong once a page holds several.
        fails=("test_pages_larger_than_a_key_tile", "test_one_page_holds_every_key"),
        passes=("test_pages_smaller_than_a_key_tile", WORKED, "test_k_and_v_caches_with_different_strides"),
        question="PAGE = 32 and 16 keys per tile: which slot of its page does key 20 live in, and which "
        "does your kernel load for it?",
        section="3.3",
    ),
    Mistake(
        5,
        fails=("test_pages_smaller_than_a_key_tile",),
        passes=("test_pages_larger_than_a_key_tile", "test_output_is_normalised_by_the_softmax_sum"),
        question="PAGE = 4 and 16 keys per tile: how many table entries does one key tile need, and how "
        "many does your kernel read?",
        section="3.3",
    ),
    Mistake(
        6,
        fails=("test_kv_head_grouping_is_contiguous[group4]", WORKED),
        passes=(
            "test_kv_head_grouping_is_contiguous[group1-MHA]",
            "test_kv_head_grouping_is_contiguous[group8-MQA]",
        ),
        question="Only the cases with 1 < GROUP < Hq fail: with Hq = 8 and Hkv = 2, which KV head should "
        "query head 1 read, and which does your kernel give it?",
        section="3.1",
    ),
    Mistake(
        7,
        fails=("test_page_index_widened_to_int64",),
        passes=(
            WORKED,
            "test_large_ragged_batch",
            "test_pages_shuffled_and_shared",
            "test_any_tile_shape[M16xN16-one-head]",
        ),
        question="Only block ids past 2**31 / stride_kb fail: in which integer type is phys * stride_kb "
        "computed in your kernel?",
        section="3.3",
    ),
    Mistake(
        7,
        fails=("test_v_page_offsets_widened_to_int64",),
        passes=(WORKED, "test_k_and_v_caches_with_different_strides", "test_large_ragged_batch"),
        question="k_cache spans under 2**31 elements and v_cache more than 2**32: in which integer type is "
        "phys * stride_vb computed in your kernel, and does WIDE look at v_cache's span too?",
        section="3.3",
    ),
    Mistake(
        8,
        fails=(
            "test_diagonal_tiles_are_masked",
            "test_cached_prefix_is_visible_bottom_right",
            "test_pure_prefill_without_a_prefix",
        ),
        passes=("test_scale_is_applied",),
        messages=(OOB_OR_NAN,),
        question="A tile of 16 new tokens at positions 8-23: which is the last key its FIRST row may see, "
        "and does your unmasked loop stop before it?",
        section="3.2",
    ),
    Mistake(
        9,
        fails=("test_keys_past_the_context_are_not_read", "test_scale_is_applied"),
        # Contexts that end on a key tile's edge, or hold one tile, never load past the context: a kernel
        # that fails those has another mistake (a wrong tile -> sequence map looks alike otherwise).
        passes=(
            "test_online_softmax_rescales_old_tiles",
            "test_pure_prefill_without_a_prefix",
            "test_diagonal_tiles_are_masked",
            WORKED,
        ),
        messages=(OOB_OR_NAN,),
        question="Context 33, PAGE = 8, 16 keys per tile: which table entries does the tile of keys 32-47 "
        "need, and what do entries past the last page hold?",
        section="3.3",
    ),
    Mistake(
        9,
        fails=("test_table_rows_exactly_full",),
        # Not the worked example: its table has 5 columns, so an unmasked table load runs past them.
        passes=("test_keys_past_the_context_are_not_read", "test_pure_prefill_without_a_prefix"),
        messages=(r"out of bounds load of block_tables",),
        question="A context of 48 with PAGE = 8 fills pages 0-5: which is the last table entry your kernel "
        "may read, and which does the mask of your table load let it read?",
        section="3.3",
    ),
    Mistake(
        9,
        fails=("test_keys_past_the_context_are_not_read", "test_table_rows_exactly_full"),
        # Both loads unmasked: the table load reads past the end of block_tables, and the garbage ids it
        # reads past a sequence's last page send the K and V loads outside the caches.
        messages=(r"out of bounds load of block_tables", r"out of bounds load of [kv]_cache"),
        question="Context 33, PAGE = 8, 16 keys per tile: which table entries does the tile of keys 32-47 "
        "read, what do the entries past the last page hold, and which masks do your table load and your K "
        "and V loads have?",
        section="3.3",
    ),
    Mistake(
        10,
        fails=("test_online_softmax_rescales_old_tiles",),
        passes=("test_scale_is_applied", WORKED),
        question="When a later key tile raises a row's max, what happens in your kernel to the l and the "
        "acc summed under the old max, and is alpha an exponential in the base the max is kept in?",
        section="3.6",
    ),
    Mistake(
        10,
        # The max taken of each tile alone: right while scores rise, and a later tile that is all masked
        # for some rows (the diagonal's) or scores far lower overflows alpha. The diagonal's NaN alone
        # looks like pitfall 8; decode rows with falling scores, which pitfall 8 passes, tell them apart.
        fails=("test_online_softmax_rescales_old_tiles[falling]", "test_diagonal_tiles_are_masked"),
        passes=(
            WORKED,
            "test_online_softmax_rescales_old_tiles[rising]",
            "test_scale_is_applied",
            "test_max_starts_at_minus_inf",
        ),
        messages=(r"NaN/inf values",),
        question="A decode row's scores are +60 in its first key tile and -60 after it: what is your running "
        "max after the second tile, and what alpha rescales the first tile's sum?",
        section="3.6",
    ),
    Mistake(
        11,
        fails=("test_scale_is_applied",),
        passes=("test_output_is_normalised_by_the_softmax_sum", WORKED),
        question="exp2(x) is 2^x: which two factors must multiply a raw score q . k before it goes through "
        "exp2, so that the weight is e^(score * scale)?",
        section="3.6",
    ),
    Mistake(
        12,
        fails=("test_lse_is_natural_log", WORKED_LSE),
        passes=(WORKED, "test_pure_prefill_without_a_prefix"),
        question="E sees 5 keys that all score 0: its lse is ln 5 = 1.609. What does your kernel return, "
        "and in which base is m + log2(l)?",
        section="2",
    ),
    Mistake(
        12,
        # m kept in base 2 plus a natural log of l: right wherever every score is 0 (the worked example,
        # where m = 0), wrong elsewhere.
        fails=("test_lse_is_natural_log", "test_chunked_prefill_equals_one_call"),
        # The outputs are right: a mistake in the keys seen fails these too (and lse with them).
        passes=(
            WORKED,
            WORKED_LSE,
            "test_pure_prefill_without_a_prefix",
            "test_cached_prefix_is_visible_bottom_right",
            "test_decode_rows_beside_long_chunks",
        ),
        question="Your lse is right where every score is 0 and wrong elsewhere: in which base is m_i, and "
        "in which base is the log of l_i you add to it?",
        section="3.6",
    ),
    Mistake(
        14,
        fails=(
            "test_pages_smaller_than_a_key_tile",
            "test_pages_larger_than_a_key_tile",
            "test_online_softmax_rescales_old_tiles",
        ),
        passes=("test_one_page_holds_every_key", "test_scale_is_applied", WORKED),
        question="The loop over key tiles loads the block ids of one tile while it attends another: which "
        "tile's ids does your loop load in iteration start_n, and which tile uses them?",
        section="3.3",
    ),
    Mistake(
        15,
        fails=("test_any_tile_shape[M16xN16-one-head]", "test_any_tile_shape[M16xN32-one-head]"),
        passes=(
            "test_any_tile_shape[M16xN16-packed-group]",
            "test_any_tile_shape[M16xN32-packed-group]",
            WORKED,
        ),
        question="With HEADS = 1 there are Hq head groups of one query head each, not Hkv: which query head "
        "and which KV head does head group 5 compute when Hq = 8 and Hkv = 2?",
        section="3.1",
    ),
    Mistake(
        16,
        fails=("test_k_and_v_caches_with_different_strides",),
        passes=("test_q_and_cache_strides_are_used", WORKED),
        question="k_cache is contiguous and v_cache is a layer of a pool: which of your offsets may K and V "
        "share, and what tells your kernel that they may?",
        section="3.3",
    ),
    Mistake(
        17,
        fails=("test_padding_rows_of_a_packed_tile_not_stored",),
        # Not the lse check: its packed tiles have no padding rows (8 tokens x 4 heads), so a wrong lse
        # that fails the padding check's lse as well is pitfall 12.
        passes=("test_rows_past_a_sequence_end_not_written", WORKED, "test_lse_is_natural_log"),
        question="GROUP = 3 and 16 rows per packed tile: whose token and head does row 15 compute, which "
        "keys does this tile load for it, and does your kernel store it?",
        section="3.1",
    ),
    Mistake(
        18,
        fails=("test_key_ranges_at_every_alignment",),
        passes=(
            "test_diagonal_tiles_are_masked",
            WORKED,
            WORKED_LSE,
            "test_pages_smaller_than_a_key_tile",
            "test_padding_rows_of_a_packed_tile_not_stored",
        ),
        question="A tile of new tokens at positions 11-15 with 16-key tiles: which keys must its last row "
        "see, and do full_end, hi and your loop bounds give it exactly those?",
        section="3.2",
    ),
    Mistake(
        19,
        fails=("test_decode_rows_beside_long_chunks", "test_key_ranges_at_every_alignment"),
        passes=(
            "test_pure_prefill_without_a_prefix",
            "test_cached_prefix_is_visible_bottom_right",
            "test_diagonal_tiles_are_masked",
            WORKED,
        ),
        messages=(r"NaN/inf values where the reference is finite",),
        question="A decode row is a sequence with q_len = 1 in the same batch: which tile and which program "
        "compute its one row in your kernel, and are its rows ever stored?",
        section="3.4",
    ),
    Mistake(
        20,
        fails=("test_sequence_search_covers_every_sequence",),
        passes=(
            WORKED,
            "test_large_ragged_batch",
            "test_key_ranges_at_every_alignment",
            "test_empty_sequences_produce_nothing",
        ),
        question="Up to 51 sequences pass and 130 or 1,100 fail: how many halvings does your search over "
        "cu_seqlens_q need before hi - lo = 1 when B = 1,100, and how many does it do (or how many first "
        "tiles does it compare)?",
        section="3.4",
    ),
    Mistake(
        20,
        # The last sequence never found: every batch of two or more fails, except where the last
        # sequence has no new tokens (the empty-sequences and any-table cases end with one).
        fails=(WORKED, "test_sequence_search_covers_every_sequence[130-seqs]", "test_large_ragged_batch"),
        passes=(
            "test_empty_sequences_produce_nothing",
            "test_padding_rows_may_have_any_table",
            "test_online_softmax_rescales_old_tiles",
        ),
        question="Every batch fails except those whose last sequence has no new tokens: which range does "
        "your search over cu_seqlens_q start from, and can it ever return b = B - 1?",
        section="3.4",
    ),
    Mistake(
        20,
        # The search's comparison strict (first tile < tile): a tile that is exactly a sequence's first
        # goes to the sequence before, where tok0 >= q_len returns, so every later sequence loses one tile
        # of first rows. Sequence 0 is right; the rows lost do not grow with b as pitfall 24's do.
        fails=(WORKED, "test_cu_seqlens_mark_where_each_sequence_starts"),
        passes=("test_online_softmax_rescales_old_tiles", "test_chunked_prefill_equals_one_call"),
        messages=(r"first tile was given to the sequence before it",),
        question="Tile 4 is exactly sequence 3's first tile (cu_seqlens_q[3] // BLOCK_Q + 3 = 4): which "
        "sequence does your search give it, and does it compare the first tile with <= or with <?",
        section="3.4",
    ),
    Mistake(
        24,
        # First tiles rounded up, cdiv(cu_seqlens_q[b], BLOCK_Q) + b, in the search and in tok0 alike: the
        # numbering agrees with itself but not with the grid's total_q // BLOCK_Q + B tiles, so the last
        # sequence's last tile can lie past the grid and its rows are never written. Whole-tile batches
        # (no rounding) and padding rows pass, which the + b dropped (the entry below) fails.
        fails=(WORKED, "test_pure_prefill_without_a_prefix", "test_decode_rows_beside_long_chunks"),
        passes=(
            "test_cu_seqlens_mark_where_each_sequence_starts",
            "test_empty_sequences_produce_nothing",
            "test_padding_rows_may_have_any_table",
        ),
        question="Rows at the end of the batch are never written: which tile does your numbering give the "
        "last sequence's last tokens, and how many tiles does the launcher's grid have (total_q // "
        "BLOCK_Q + B)?",
        section="3.4",
    ),
    Mistake(
        24,
        # Sequence 0 is right (b = 0): one-sequence cases pass, every batch of two or more fails, even
        # where the later sequences are empty (their tiles then land on rows that are not theirs).
        fails=(
            WORKED,
            "test_empty_sequences_produce_nothing",
            "test_padding_rows_may_have_any_table",
            "test_sequence_search_covers_every_sequence[130-seqs]",
        ),
        passes=("test_online_softmax_rescales_old_tiles", "test_chunked_prefill_equals_one_call"),
        # The rows it loses grow with b (unwritten_rows_note); the search's < for <= loses one tile each.
        messages=(r"rows b tiles past its own",),
        question="One sequence passes and every batch fails: sequence b's first tile is cu_seqlens_q[b] // "
        "BLOCK_Q + b; which first tile does your tok0 subtract?",
        section="3.4",
    ),
    Mistake(
        21,
        fails=("test_cached_prefix_is_visible_bottom_right", "test_decode_rows_beside_long_chunks"),
        passes=("test_pure_prefill_without_a_prefix",),
        messages=(r"the new tokens alone",),
        question="A new token at position 20 after a prefix of 16: which keys must it see, and at which key "
        "does your first key loop start?",
        section="3.2",
    ),
    Mistake(
        22,
        fails=("test_cached_prefix_is_visible_bottom_right", "test_pure_prefill_without_a_prefix"),
        messages=(r"its own key hidden",),
        question="New token E of the worked example sits at position 4: is key 4 among the keys it sees, "
        "and does your mask compare with <= or with <?",
        section="3.2",
    ),
    Mistake(
        32,
        fails=("test_empty_sequences_produce_nothing",),
        passes=("test_lse_is_natural_log", "test_pure_prefill_without_a_prefix"),
        messages=(r"padding sequences only \(total_q = 0\)",),
        question="Every q_len is 0, so q has no row and nothing is launched: what does your paged_prefill "
        "return when return_lse=True, and is it the pair the spec promises?",
        section="3.4",
    ),
    Mistake(
        13,
        fails=("test_empty_sequences_produce_nothing",),
        passes=("test_keys_past_the_context_are_not_read", "test_pure_prefill_without_a_prefix"),
        # The garbage table row is read: out of bounds, or, in a kernel keeping the reference's guard,
        # its scan of the row's block ids fires.
        messages=(r"out of bounds load|device guard fired.*block_tables",),
        question="A sequence with q_len = 0 (or a tile past a sequence's last new token) still gets a "
        "program: which keys does that program read, through which table entries?",
        section="3.4",
    ),
    Mistake(
        23,
        fails=("test_out_keeps_the_range_of_its_dtype[bf16]",),
        passes=("test_out_keeps_the_range_of_its_dtype[fp16]", "test_dtypes[fp16]"),
        question="Your fp16 cases pass and your bf16 ones do not: which dtype does your kernel give p before "
        "P V and out before the store, and what does fp16 make of a bf16 output of 65536?",
        section="3.6",
    ),
    Mistake(
        25,
        fails=("test_table_rows_are_read_through_their_stride",),
        passes=(WORKED, "test_pages_shuffled_and_shared", "test_large_ragged_batch"),
        question="block_tables is a slice of a wider table here (rows max_pages + 5 apart): how does your "
        "kernel find row b, by stride_bt or by the table's width?",
        section="3.3",
    ),
    Mistake(
        26,
        fails=("test_max_starts_at_minus_inf",),
        passes=(WORKED, "test_online_softmax_rescales_old_tiles", "test_lse_is_natural_log"),
        question="Every score is about -128 here: what is your running max after the first key tile, if it "
        "starts at 0, and what is exp2 of the scores minus it?",
        section="3.6",
    ),
    Mistake(
        35,
        # lse stored through out's strides (or q's): its rows land D times too far apart, past lse's end, while
        # every output is right; pitfall 12's bases store inside lse.
        # Unlike an lse store without the row mask (2), it misplaces rows inside whole tiles too.
        fails=("test_lse_is_natural_log", WORKED_LSE, "test_cu_seqlens_mark_where_each_sequence_starts"),
        passes=(WORKED, "test_pure_prefill_without_a_prefix", "test_cached_prefix_is_visible_bottom_right"),
        messages=(r"out of bounds store of lse_ptr",),
        question="lse is [total_q, Hq] fp32 and out [total_q, Hq, D]: which strides does your lse store step "
        "by, and where does row 1, head 0 land?",
        section="3.5",
    ),
    Mistake(
        34,
        # NaN or zeros where the scores are large, and right where they are near 0 (the worked example).
        fails=("test_running_max_in_the_units_of_the_exponent", "test_max_starts_at_minus_inf"),
        passes=(WORKED,),
        messages=(r"the running max is not in the units exp2 sees",),
        question="Every score is about +40 here: in which units is your running max, and what is "
        "exp2(s * qk_scale - m) for the largest key when m is the max of the raw scores q . k?",
        section="3.6",
    ),
    Mistake(
        27,
        fails=("test_rows_and_heads_widened_to_int64[q-rows]",),
        passes=(WORKED, "test_q_and_cache_strides_are_used", "test_page_index_widened_to_int64"),
        question="Row 16 of q starts 16 * 3 * 2**26 elements in: in which integer type does your kernel "
        "compute the packed row index times stride_qt?",
        section="3.5",
    ),
    Mistake(
        27,
        fails=("test_rows_and_heads_widened_to_int64[out-rows]",),
        passes=(
            WORKED,
            "test_q_and_cache_strides_are_used",
            "test_rows_and_heads_widened_to_int64[kv-heads]",
        ),
        # The wrapped store leaves out's far rows NaN.
        messages=(r"NaN",),
        question="Row 16 of out starts 16 * 3 * 2**26 elements in: in which integer type does your kernel "
        "compute the packed row index times stride_ot, in the store?",
        section="3.5",
    ),
    Mistake(
        27,
        fails=("test_rows_and_heads_widened_to_int64[table-rows]",),
        passes=(WORKED, "test_table_rows_are_read_through_their_stride", "test_page_index_widened_to_int64"),
        # A wrapped table row reads poison ids or entries: NaN, or a load outside the table.
        messages=(r"NaN|out of bounds load of block_tables",),
        question="Row 2 of block_tables starts 3 * 2**30 entries in: in which integer type is the sequence "
        "index b when your kernel computes b * stride_bt?",
        section="3.4",
    ),
    Mistake(
        33,
        fails=("test_rows_and_heads_widened_to_int64[kv-heads]",),
        passes=(
            WORKED,
            "test_rows_and_heads_widened_to_int64[q-rows]",
            "test_rows_and_heads_widened_to_int64[out-rows]",
            "test_page_index_widened_to_int64",
        ),
        question="KV head 2 starts 3 * 2**30 elements into k_cache here: in which integer type does your "
        "kernel compute head0, and kvh * stride_kh with it?",
        section="3.1",
    ),
    Mistake(
        28,
        fails=("test_widest_head_dim_is_read_whole",),
        passes=(WORKED, "test_head_dims", "test_dtypes"),
        question="D = 256 here: how many features does your kernel's tl.arange over the head dim cover, and "
        "who writes features 128 to 255 of out?",
        section="3.1",
    ),
    Mistake(
        29,
        fails=("test_table_rows_exactly_full",),
        passes=(WORKED, "test_pure_prefill_without_a_prefix", "test_keys_past_the_context_are_not_read"),
        # The guard's own words: it fired on a context the spec admits, which no load past the table does.
        messages=(r"device guard fired on arguments the launcher accepted .*context_lens",),
        question="A context of 48 with PAGE = 8 fills a table row of 6 columns: does your guard's bound on "
        "context_lens admit it?",
        section="3.8",
    ),
    Mistake(
        37,
        # The key loop run to ctx: every output right (the keys past a tile's last token score -inf), and
        # a program loading key tiles wholly past its last token, which only the record of its loads shows.
        fails=("test_diagonal_tiles_are_masked[loads]",),
        passes=(WORKED, "test_diagonal_tiles_are_masked[outputs]", "test_key_ranges_at_every_alignment"),
        question="Prefix 37 and 40 new tokens in 16 x 16 tiles: which key tiles does your first query tile "
        "load, and which of them can any of its tokens see?",
        section="3.2",
    ),
    Mistake(
        16,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, PAGE, heads, batch, dtype, layouts and options; which of these does your kernel handle only "
        "one at a time (a stride taken from another tensor, a tile sized for another D or layout)?",
        section="3.3",
    ),
]
