"""Grader for L2, paged decode attention with GQA. Each test is named for the mistake it catches.

Run: make test L=l2 (your drills/mine) or make test L=l2 IMPL=solutions. Every case poisons what must
not be read: NaN in every cache slot past a sequence's end and in every unused block, garbage ids in
every block-table entry past a sequence's last page.
"""

from __future__ import annotations

import math

import pytest
import torch

from drills import validate
from drills.compare import assert_close, mismatch
from drills.grading.grader.diagnose import Mistake, returned_out_problem
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel
from drills.tests import bf16_everywhere, fill_past_fp16_range, seeded, sizes
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import (
    CANARY,
    CONTEXT_LENS_BAD_INPUTS,
    CONTEXT_PATTERNS,
    HEAD_DIMS,
    KV_LAYOUTS,
    LIVE_BLOCK_ID_BAD_INPUTS,
    PAGED_BAD_INPUTS,
    SHARED_KV_BAD_INPUTS,
    TABLE_LAYOUTS,
    V_UNLIKE_K_NEEDS_TWO_STRIDES,
    PagedCase,
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
    paged_attention_reference,
    pool_past_int32,
    rows_far_apart,
    shift_scores,
    spoiled_call,
    strided_q,
    tail_slots,
    v_strides_unlike_k,
)

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "GROUP": ("test_kv_head_grouping_is_contiguous",),
    "GROUP_PAD": (
        "test_kv_head_grouping_is_contiguous",
        "test_padding_rows_not_written",
        "test_groups_wider_than_sixteen_heads",
    ),
    "PAGE": (
        "test_worked_example_ctx37_reads_three_pages",
        "test_last_page_is_masked",
        "test_head_dims_and_page_sizes",
        "test_widest_page_is_read_whole",  # PAGE = 128, the widest the launcher admits
        "test_pairwise_domain_cases_match_the_oracle",
    ),
    "D": ("test_widest_head_dim_is_read_whole",),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}
BOUNDS_GAPS = {"GUARD": "no bound: the device guard's switch, on in every call but the benchmark's timing"}

DIMS = ("b", "head", "d")  # how a mismatch names its position: sequence, query head, feature

# What paged_decode admits, at its boundaries (drills/validate.py's limits, so the domain cannot drift
# from the launcher): test_pairwise_domain_cases_match_the_oracle crosses every pair of these values.
_D_LO, _D_HI = validate.HEAD_DIM_RANGE
DOMAIN = Domain(
    axes=dict(
        D=(_D_LO, _D_HI),  # the narrowest and the widest head dim: one D tile of 256
        PAGE=(validate.DECODE_MIN_PAGE, validate.DECODE_MAX_PAGE),  # any power of two from 16 to 128
        heads=((2, 2), (9, 3), (17, 1)),  # (Hq, Hkv): MHA, GROUP 3, MQA with GROUP 17 > GROUP_PAD 16
        lens=tuple(CONTEXT_PATTERNS),  # a partial last page, full pages, a padding row beside one key
        dtype=(torch.float16, torch.bfloat16),
        q=("contiguous", "strided"),  # far-apart rows: test_sequence_index_widened_to_int64
        kv=KV_LAYOUTS,
        table=TABLE_LAYOUTS,
        scale=(None, 0.3),
    ),
    rules=(V_UNLIKE_K_NEEDS_TWO_STRIDES,),
    limits=dict(head_dims=HEAD_DIMS, min_page=validate.DECODE_MIN_PAGE),
)


def run_into_canary(impl, case, scale=None):
    return launch_into_canary(impl.paged_decode, case, scale)


def check(impl, case, scale=None, **tol):
    """paged_decode on `case` against the decode oracle: out [B, Hq, D]."""
    return check_launch(impl.paged_decode, paged_attention_reference, case, DIMS, scale, **tol)


# --- Section 2 "By hand": the worked example through your kernel -------------------------------------


def test_worked_example_ctx37_reads_three_pages(impl, runtime):
    """ctx = 37, PAGE = 16, block table [9, 3, 7, garbage...]: three pages, 5 valid tokens in the last.
    Everything but blocks 9, 3, 7 (and slots 0..4 of block 7) is NaN. The worked example's heads: Hq = 32,
    Hkv = 8, D = 128, so token 36 of KV head 3 starts at element 119168 of k_cache (section 2)."""
    Hq, Hkv, D, PAGE = 32, 8, 128, 16
    case = make_paged_case([37], Hq, Hkv, D, PAGE, num_blocks=12, device=runtime.device, stream=37)
    # Re-place the three pages at the blocks the worked example uses.
    k, v = case.k_cache.clone(), case.v_cache.clone()
    case.k_cache.fill_(float("nan"))
    case.v_cache.fill_(float("nan"))
    old = case.block_tables[0, :3].long()
    new = torch.tensor([9, 3, 7], device=runtime.device)
    case.k_cache[new], case.v_cache[new] = k[old], v[old]
    case.block_tables[0, :3] = new.to(torch.int32)
    garbage = case.block_tables[0, 3:]
    assert torch.isnan(case.k_cache[7, 5:]).all() and ((garbage < 0) | (garbage >= 12)).all()
    assert case.k_cache[7, 36 - 32, 3].data_ptr() - case.k_cache.data_ptr() == 119168 * 2  # fp16: 2 bytes
    check(impl, case)


# --- Section 5 "Pitfalls" -----------------------------------------------------------------------------


@pytest.mark.parametrize("PAGE", [16, 32])
def test_last_page_is_masked(impl, runtime, PAGE):
    """Lengths 1, PAGE - 1, PAGE, PAGE + 1 and others: the stale tail of every last page is NaN. Real
    scores are high (about +40), so a tail key would get no weight even scored 0: this check is about
    the loads; test_tail_keys_get_no_weight is about the scores."""
    lens = [1, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE - 3] + sizes(runtime, [], [3 * PAGE, 777, 1000])
    case = shift_scores(make_paged_case(lens, 8, 2, 64, PAGE, device=runtime.device, stream=PAGE), 40.0)
    out = run_into_canary(impl, case)
    ref, _ = paged_attention_reference(*case.args)
    problem = mismatch(out, ref, DIMS)
    if problem is not None:
        raise AssertionError(f"{problem}\n{last_page_skipped(out, ref, case)}".rstrip())


def last_page_skipped(out, ref, case) -> str:
    """A sentence naming the sequences (over one page, the last partly filled) whose rows are attention
    over their whole pages alone, as when the pages are counted ctx // PAGE; "" when there are none."""
    PAGE = case.k_cache.shape[1]
    lens = case.context_lens.tolist()
    whole = torch.tensor([n // PAGE * PAGE for n in lens], dtype=torch.int32, device=case.q.device)
    cut, _ = paged_attention_reference(*case.args[:4], whole)
    seqs = [
        b
        for b, n in enumerate(lens)
        if n > PAGE and n % PAGE and mismatch(out[b], ref[b]) is not None and mismatch(out[b], cut[b]) is None
    ]
    if not seqs:
        return ""
    return (
        f"sequences {seqs} (context_lens {[lens[b] for b in seqs]}) attended over their whole pages alone: "
        "the last, partly filled page was never read"
    )


def test_masked_v_lanes_are_zero(impl, runtime):
    """The stale tail of each last page holds finite values here, and keys that score about -8000, so
    reading it does no harm; what the V load's masked lanes hold still matters: p = 0 times an undefined
    lane (NaN, when the load has a mask but no `other=`) is NaN in p @ v."""
    case = make_paged_case([20, 7, 16], 8, 2, 64, 16, device=runtime.device, stream=71)
    shift_scores(case, 128.0)  # real scores about +128: even a zero key (score 0) weighs exp(-128) = 0
    blocks, slots = tail_slots(case)
    case.k_cache[blocks, slots] = 0.0
    case.k_cache[blocks, slots, :, 0] = -1024.0  # q.k * scale = 64 * -1024 / 8 = -8192 (q[..., 0] = 64 here)
    case.v_cache[blocks, slots] = 1000.0
    check(impl, case)


def test_tail_keys_get_no_weight(impl, runtime):
    """Masked keys must score -inf. Loading them as zeros is not enough: a zero key scores 0, which
    outweighs real keys whose scores are all negative here."""
    case = make_paged_case([17, 33, 5], 4, 1, 64, 16, device=runtime.device, stream=5)
    # Make every real score strongly negative: keys point against the query direction.
    case.q.copy_(case.q.abs())
    real = ~torch.isnan(case.k_cache)
    case.k_cache[real] = -case.k_cache[real].abs()
    check(impl, case)


@grouping_cases(
    "group1-MHA",
    "group2",
    "group3",
    "group4",
    "group4-worked-example",
    "group8",
    "group32-MQA",
    "group32x2",
)
def test_kv_head_grouping_is_contiguous(impl, runtime, Hq, Hkv):
    """Query head h reads KV head h // GROUP, not h % Hkv (interleaved). GROUP > 16 needs GROUP_PAD > 16.
    GROUP = 3 (Hq = 9, Hkv = 3) is not a power of two: a GROUP rounded up to 4 reads the wrong KV heads.
    Interleaved and contiguous agree when GROUP = 1 (MHA) or Hkv = 1 (MQA): those cases pass either way."""
    lens = sizes(runtime, [20, 9], [300, 129, 64])
    case = make_paged_case(lens, Hq, Hkv, 64, 16, device=runtime.device, stream=Hq * 7 + Hkv)
    check(impl, case)


def test_padding_rows_not_written(impl, runtime):
    """GROUP = 4 is padded to GROUP_PAD = 16 rows; only the 4 real rows may be stored. A padding row has
    q = 0, so every key scores 0 and gets the same weight: it holds the mean of V, finite and plausible,
    and stored it overwrites the next KV head's query heads (or lands past the end of out). Every test
    checks the canary around `out`; this one makes padding the whole story: 12 of 16 rows are padding."""
    case = make_paged_case([40, 16, 3], 8, 2, 64, 16, device=runtime.device, stream=3)
    out = run_into_canary(impl, case)
    assert not torch.isnan(out).any(), "NaN in out: a real head's row is 0/0 or read something poisoned"
    ref, _ = paged_attention_reference(*case.args)
    assert_close(out, ref, DIMS)


def test_padding_sequence_outputs_zeros(impl, runtime):
    """context_lens[b] = 0 is a padding sequence (a batch padded to the size of a captured CUDA graph): it
    reads nothing, and its output is 0. Its loop never runs, so l = 0 and acc = 0, and acc / l stores
    NaN: divide by 1 where l = 0. Its block-table row is all garbage ids, and the real rows around it
    must come out as if it were not there."""
    case = make_paged_case([37, 0, 20, 0], 8, 2, 64, 16, device=runtime.device, stream=29)
    out = run_into_canary(impl, case)
    pad = out[[1, 3]]
    assert not torch.isnan(pad).any(), (
        f"padding sequences (context_lens = 0) hold {int(torch.isnan(pad).sum())} NaN of {pad.numel()}: "
        "0 / 0 when a row read no key (section 3.5)"
    )
    assert (pad == 0).all(), "padding sequences (context_lens = 0) must be 0: they attend over nothing"
    ref, _ = paged_attention_reference(*case.args)
    assert_close(out, ref, DIMS)
    only_padding = make_paged_case([0, 0], 8, 2, 64, 16, device=runtime.device, stream=31)
    assert (run_into_canary(impl, only_padding) == 0).all(), "a batch of padding sequences only must give 0"


def test_online_softmax_rescales_old_pages(impl, runtime):
    """Scores grow page after page, so the running max changes on every page: dropping the rescale
    factor alpha = exp(m_old - m_new) leaves the early pages over-weighted."""
    n, D = sizes(runtime, 80, 2000), 64
    case = make_paged_case([n], 4, 1, D, 16, device=runtime.device, stream=11, poison=False)
    t = torch.arange(n, device=runtime.device)
    blocks, slots = case.block_tables[0].long()[t // 16], t % 16  # where token t lives
    q0 = case.q[0, 0].float()  # [D]
    ramp = torch.linspace(0.5, 12.0, n, device=runtime.device)[:, None]  # head 0's score for token t
    # score = q0 . k / sqrt(D), so k = ramp * sqrt(D) * q0 / |q0|^2 scores ramp (plus a little noise).
    k = 0.3 * case.k_cache[blocks, slots, 0].float() + ramp * math.sqrt(D) * q0 / q0.dot(q0)
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)  # [n, D]
    check(impl, case)


def test_max_starts_at_minus_inf(impl, runtime):
    """Every score is about -128 (keys point away from the queries), far below 0. A running max that
    starts at 0 instead of -inf stays 0, so p = exp(s - 0) underflows to 0 for every key and l = 0."""
    case = make_paged_case([32, 16], 16, 1, 64, 16, device=runtime.device, stream=73)  # full pages only
    check(impl, shift_scores(case, -128.0))


def test_each_head_keeps_its_own_max(impl, runtime):
    """The heads of one group score in different ranges: even heads about +128, odd heads about 0. One
    max shared by the group (about 128) makes every odd head's exp(s - 128) underflow to 0."""
    case = make_paged_case([32, 48], 8, 1, 64, 16, device=runtime.device, stream=79)  # full pages only
    check(impl, shift_scores(case, torch.tensor([128.0, 0.0]).repeat(4)))


def test_q_strides_are_used(impl, runtime):
    """q is every other head of a [B, 2 * Hq, D] buffer (stride(1) = 2 * D), the other heads NaN: a
    kernel that steps through q by D per head, or Hq * D per sequence, reads them."""
    case = make_paged_case([32, 9], 8, 1, 64, 16, device=runtime.device, stream=83)
    check(impl, strided_q(case))


def test_cache_strides_are_used(impl, runtime):
    """k_cache and v_cache are layer 1 of a NaN-filled pool [num_blocks, layers, PAGE, Hkv, 2, D]: block,
    token and head strides all differ from a contiguous cache's, as in an engine's per-layer KV pool."""
    case = make_paged_case([40, 9], 8, 2, 64, 16, device=runtime.device, stream=89)
    check(impl, in_layer_pool(case))


@pytest.mark.parametrize("layout", ["v-head-major", "v-block-stride-only"])
def test_k_and_v_caches_with_different_strides(impl, runtime, layout):
    """k_cache contiguous, v_cache a head-major [num_blocks, Hkv, PAGE, D] buffer seen as [num_blocks, PAGE,
    Hkv, D] (the same block stride as K, its token and head strides swapped), or every other block of a
    NaN-filled buffer (V's block stride alone differs from K's). A kernel that loads V through K's
    strides, all of them or only the block stride (one copy-pasted term), reads the wrong elements of V."""
    case = make_paged_case([40, 9], 8, 2, 64, 16, device=runtime.device, stream=91)
    if layout == "v-head-major":
        check(impl, v_strides_unlike_k(case))
        return
    v = case.v_cache
    pairs = torch.full((v.shape[0], 2, *v.shape[1:]), float("nan"), dtype=v.dtype, device=v.device)
    pairs[:, 1] = v  # [num_blocks, 2, PAGE, Hkv, D]: strides (2 PAGE Hkv D, Hkv D, D, 1) for V
    assert pairs[:, 1].stride()[1:] == case.k_cache.stride()[1:] != pairs[:, 1].stride()
    check(impl, PagedCase(case.q, case.k_cache, pairs[:, 1], case.block_tables, case.context_lens))


def test_out_strides_are_used(impl, runtime):
    """out is every other head of a canary-filled [B, 2 * Hq, D] buffer (stride(1) = 2 * D, as q is in
    test_q_strides_are_used), q contiguous: a store that steps through out by D per head writes over the
    canary heads between them and leaves half of out's heads unwritten."""
    case = make_paged_case([32, 9], 8, 2, 64, 16, device=runtime.device, stream=85)
    B, Hq, D = case.q.shape
    buffer = torch.full((B, 2 * Hq, D), CANARY, dtype=case.q.dtype, device=case.q.device)
    out = buffer[:, 1::2]  # [B, Hq, D], strides (2 * Hq * D, 2 * D, 1)
    returned = impl.paged_decode(*case.args, out=out)
    wrong = returned_out_problem("paged_decode", returned, out)
    assert wrong is None, wrong
    between = buffer[:, 0::2]  # [B, Hq, D]: the heads between out's, never out's own
    assert (between == CANARY).all(), (
        "a store landed between out's heads (out's head stride is 2 * D here): the store must step by "
        "out.stride(1), not by D"
    )
    assert_close(out, paged_attention_reference(*case.args)[0], DIMS)


def test_scale_is_applied(impl, runtime):
    """The default scale is 1 / sqrt(D); an explicit scale replaces it. One page per sequence and one KV
    head, so that among the mistakes of section 5 mostly a missing scale fails here (no rescale, no
    grouping involved)."""
    case = make_paged_case([16, 7], 4, 1, 128, 16, device=runtime.device, stream=13)
    check(impl, case)  # default 1 / sqrt(128)
    check(impl, case, scale=0.3)


def test_output_is_normalised_by_the_softmax_sum(impl, runtime):
    """With every V row equal to 1 the output is exactly 1, whatever the scores: the weights sum to 1.
    Forgetting acc / l leaves l (>= 1) in the output."""
    case = make_paged_case([40, 23], 4, 2, 64, 16, device=runtime.device, stream=17)
    real = ~torch.isnan(case.v_cache)
    case.v_cache[real] = 1.0
    out = check(impl, case)
    assert_close(out, torch.ones_like(out, dtype=torch.float32), DIMS)


def test_single_token_context_returns_its_value_row(impl, runtime):
    """ctx = 1: one key, weight exactly 1, so each head's output is its KV head's single V row."""
    case = make_paged_case([1, 1], 4, 2, 64, 16, device=runtime.device, stream=17)
    out = check(impl, case)
    v0 = case.v_cache[case.block_tables[:, 0].long(), 0]  # [B, Hkv, D]
    assert_close(out, v0.float().repeat_interleave(2, dim=1), DIMS)


# --- Layout: pages through the block table, batch and shapes ---------------------------------------


def test_pages_are_looked_up_through_the_block_table(impl, runtime):
    """Shuffled physical pages, page 0 of the pool in use, and a prefix of full pages shared by every
    sequence (as prefix caching produces)."""
    lens = sizes(runtime, [35, 48, 70], [1000, 513, 2048, 640])
    case = make_paged_case(lens, 8, 2, 64, 16, device=runtime.device, stream=19, shared_prefix_pages=2)
    assert (case.block_tables[:, :2] == case.block_tables[0, :2]).all()
    check(impl, case)
    case0 = make_paged_case([40], 4, 1, 64, 16, num_blocks=3, device=runtime.device, stream=23)
    assert 0 in case0.block_tables[0, :3].tolist(), "this case should use physical block 0"
    check(impl, case0)


def test_table_rows_are_read_through_their_stride(impl, runtime):
    """The rows of a wider table: row stride max_pages + 5, so a kernel that steps by the table's width
    instead of stride_bt reads another row's block ids (or the garbage between rows)."""
    lens = sizes(runtime, [35, 48, 70], [1000, 513, 2048, 640])
    case = make_paged_case(lens, 8, 2, 64, 16, device=runtime.device, stream=19, shared_prefix_pages=2)
    case.block_tables = in_wider_table(case.block_tables)
    check(impl, case)


def test_table_rows_exactly_full(impl, runtime):
    """Contexts of 20 and 32 with PAGE = 16 in a table of exactly 2 columns: the second sequence's pages
    fill its row, the last of the table, so context_lens[1] = max_pages * PAGE, the largest valid length.
    A bound that takes it for one past the row (ctx < max_pages * PAGE) zeroes that sequence, and a read
    of the entry after its last page reads past the end of block_tables. The pool has exactly the 4 blocks
    the pages need, so block id num_blocks - 1, the largest valid one, is in use too."""
    case = make_paged_case(
        [20, 32], 4, 2, 64, 16, device=runtime.device, stream=41, max_pages=2, num_blocks=4
    )
    assert case.block_tables.shape[1] * 16 == 32  # no spare column
    assert 3 in case.block_tables.flatten().tolist()  # block num_blocks - 1, the largest valid id, in use
    check(impl, case)


def test_groups_wider_than_sixteen_heads(impl, runtime):
    """GROUP = 24 (Hq = 24, Hkv = 1): a tile of GROUP_PAD = 16 rows holds only heads 0-15 of the group,
    so heads 16-23 are never computed. GROUP_PAD is the next power of two of GROUP, 16 at least. Then
    GROUP = 71 (Falcon-7B: 71 query heads on one KV head), past a tile fixed at 32 or 64 rows too."""
    case = make_paged_case([20, 9], 24, 1, 32, 16, device=runtime.device, stream=43)
    check(impl, case)
    case = make_paged_case([20, 9], 71, 1, 16, 16, device=runtime.device, stream=44)
    check(impl, case)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("PAGE", [16, 32])
def test_head_dims_and_page_sizes(impl, runtime, D, PAGE):
    lens = sizes(runtime, [2 * PAGE + 3, 5], [4000, 1, 333, 2 * PAGE])
    case = make_paged_case(lens, 8, 2, D, PAGE, device=runtime.device, stream=D + PAGE)
    check(impl, case)


def test_widest_head_dim_is_read_whole(impl, runtime):
    """D = 256, the widest head dim the launcher admits, on one KV head of two query heads and two pages:
    a kernel whose feature tile stops at 128 (tl.arange(0, 128), or D capped there) scores with half of
    q and k and leaves half of out unwritten, yet passes every case up to D = 128."""
    D, PAGE = max(DOMAIN["head_dims"]), DOMAIN["min_page"]
    case = make_paged_case([PAGE + 3], 2, 1, D, PAGE, device=runtime.device, stream=43)
    check(impl, case)


def test_widest_page_is_read_whole(impl, runtime):
    """PAGE = 128, the widest page the launcher admits, on one KV head of two query heads of D = 16: one
    full page and 3 tokens of a second. A kernel whose tile over a page's tokens stops short of PAGE
    (tl.arange(0, 64) masked by offs < PAGE, a register budget borrowed from another kernel) never scores
    the tokens past its tile, yet passes every page up to that width."""
    PAGE = validate.DECODE_MAX_PAGE
    case = make_paged_case([PAGE + 3, PAGE], 2, 1, 16, PAGE, device=runtime.device, stream=47)
    check(impl, case)


def test_single_sequence_long_context(impl, runtime):
    """B = 1: the whole grid is Hkv programs, each walking every page."""
    n = sizes(runtime, 150, 32768)
    case = make_paged_case([n], 32, 8, 128, 16, device=runtime.device, stream=29)
    check(impl, case)


def test_large_ragged_batch(impl, runtime):
    """Many sequences of very different lengths in one launch."""
    gen = torch.Generator().manual_seed(seeded(31))
    B, top = (6, 60) if runtime.interpreter else (64, 3000)
    lens = torch.randint(1, top, (B,), generator=gen).tolist()
    case = make_paged_case(lens, 32, 8, 128, 16, device=runtime.device, stream=31)
    check(impl, case)


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    case = make_paged_case(
        sizes(runtime, [33, 4], [1500, 17, 256]),
        8,
        2,
        128,
        16,
        dtype=dtype,
        device=runtime.device,
        stream=37,
    )
    check(impl, case)


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_out_keeps_the_range_of_its_dtype(impl, runtime, dtype):
    """Every V element is 2^16 (bf16) or 2^13 (fp16) x (1 + |randn|) (fill_past_fp16_range), so every
    output element is too: bf16 outputs from 65536 up hold in bf16 and not in fp16 (largest 65504). A
    store cast to tl.float16 where out's own element type belongs turns them into inf. The fp16 case is
    the same check inside fp16's range."""
    case = make_paged_case([40, 17], 8, 2, 64, 16, dtype=dtype, device=runtime.device, stream=39)
    fill_past_fp16_range(case.v_cache)  # the stale slots' NaN stay NaN
    check(impl, case)


def test_page_index_widened_to_int64(impl, runtime):
    """Two decode rows whose pages all lie past 2**32 elements of the cache (pool_past_int32): the page
    loop's phys * stride_kb must be computed in int64."""
    PAGE, Hkv, D = 16, 1, 128
    far_blocks = pool_past_int32(runtime, PAGE, Hkv, D, spare=64)
    lens = sizes(runtime, [40, 7], [300, 45])
    case = make_paged_case(lens, 4, Hkv, D, PAGE, device=runtime.device, stream=41, **far_blocks)
    assert case.block_tables[:, 0].min().item() * PAGE * Hkv * D > 2**32
    check(impl, case)


@pytest.mark.parametrize("far", ["q", "out", "block_tables"])
def test_sequence_index_widened_to_int64(impl, runtime, far):
    """The rows of q, of out or of block_tables 1.5 * 2**30 elements apart (rows_far_apart), one tensor at
    a time: b * stride_qb, b * stride_ob and b * stride_bt must each be computed in int64. A kernel that
    widens only the q row's offset still reads block ids or stores out rows through a wrapped one."""
    case = make_paged_case([20, 9, 33], 4, 2, 64, 16, device=runtime.device, stream=97)
    if far == "out":
        # Unwritten rows stay NaN: on a GPU a wrapped store lands outside out, leaving its row as it was.
        out = rows_far_apart(torch.full_like(case.q, float("nan")), runtime)  # [B, Hq, D]
        returned = impl.paged_decode(*case.args, out=out)
        wrong = returned_out_problem("paged_decode", returned, out)
        assert wrong is None, wrong
        assert_close(out, paged_attention_reference(*case.args)[0], DIMS)
        return
    q, k_cache, v_cache, block_tables, context_lens = case.args
    if far == "q":
        q = rows_far_apart(q, runtime)
    else:
        block_tables = rows_far_apart(block_tables, runtime)
    check(impl, PagedCase(q, k_cache, v_cache, block_tables, context_lens))


def test_kv_head_index_widened_to_int64(impl, runtime):
    """k_cache and v_cache keep each KV head's pages in a region of its own, 1.5 * 2**30 elements apart (a
    head-major pool seen as [num_blocks, PAGE, Hkv, D]; the stride fits in int32): KV head 2 starts
    3 * 2**30 elements in, so kvh * stride_kh in int32 wraps to -2**30, before the cache. tl.program_id(1)
    is int32 as the sequence index is: widened before it meets a stride. Sparse files on a CPU."""
    case = make_paged_case([20, 9], 6, 3, 64, 16, device=runtime.device, stream=98)
    k_cache, v_cache = (far_apart(c, runtime, dim=2) for c in (case.k_cache, case.v_cache))
    assert 2 * k_cache.stride(2) >= 2**31 > k_cache.stride(2)
    check(impl, PagedCase(case.q, k_cache, v_cache, case.block_tables, case.context_lens))


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (D = 256 with
    a GROUP of 17, V's strides unlike K's with a padding row, bf16 with a wider table...): a kernel
    right on each bound alone can still be wrong where two meet. A failure names the case's values."""

    def run(c):
        Hq, Hkv = c["heads"]
        lens = CONTEXT_PATTERNS[c["lens"]](c["PAGE"])
        case = make_paged_case(
            lens, Hq, Hkv, c["D"], c["PAGE"], dtype=c["dtype"], device=runtime.device, stream=401
        )
        check(impl, laid_out(case, runtime, c["q"], c["kv"], c["table"]), scale=c["scale"])

    DOMAIN.check_each(DOMAIN.cases(stream=401), run)


# --- The launcher rejects bad input before launching -----------------------------------------------


# name -> (how to spoil the arguments of a valid call, the error, what the message must name)
BAD_INPUTS = {
    **PAGED_BAD_INPUTS,
    "head_dim_not_pow2": (
        lambda a, dev: {n: a[n][..., :48].contiguous() for n in ("q", "k_cache", "v_cache")},
        ValueError,
        "D",
    ),
    "page_not_pow2_16": (
        lambda a, dev: {n: a[n][:, :8].contiguous() for n in ("k_cache", "v_cache")},
        ValueError,
        "PAGE",
    ),
    "page_past_128": (
        lambda a, dev: {
            n: a[n].new_zeros(a[n].shape[0], 2 * validate.DECODE_MAX_PAGE, *a[n].shape[2:])
            for n in ("k_cache", "v_cache")
        },
        ValueError,
        "PAGE",
    ),
    "block_tables_wrong_batch": (
        lambda a, dev: dict(block_tables=a["block_tables"][:1]),
        ValueError,
        "block_tables",
    ),
    **CONTEXT_LENS_BAD_INPUTS,
    "context_len_negative": (
        lambda a, dev: dict(context_lens=int32_tensor(dev, 20, -1)),
        ValueError,
        r"context_lens\[1\]",
    ),
    "context_len_past_table": (
        lambda a, dev: dict(context_lens=int32_tensor(dev, 10**6, 5)),
        ValueError,
        r"context_lens\[0\]",
    ),
    "check_not_a_bool": (lambda a, dev: dict(check="yes"), TypeError, "check"),
    "mixed_devices": (
        lambda a, dev: dict(block_tables=a["block_tables"].to("meta")),
        ValueError,
        "block_tables",
    ),
    # What the kernel indexes: flat context_lens, rows of block_tables, live block ids inside the pool.
    "context_lens_strided": (
        lambda a, dev: dict(context_lens=int32_tensor(dev, 20, 99, 5, 99)[::2]),
        ValueError,
        "context_lens",
    ),
    "block_tables_columns_strided": (
        lambda a, dev: dict(block_tables=a["block_tables"].repeat_interleave(2, 1)[:, ::2]),
        ValueError,
        "block_tables",
    ),
    **LIVE_BLOCK_ID_BAD_INPUTS,
    "scale_nan": (lambda a, dev: dict(scale=float("nan")), ValueError, "scale"),
    "scale_inf": (lambda a, dev: dict(scale=float("inf")), ValueError, "scale"),
    "scale_negative": (lambda a, dev: dict(scale=-0.125), ValueError, "scale"),
    "scale_zero": (lambda a, dev: dict(scale=0.0), ValueError, "scale"),
    "scale_bool": (lambda a, dev: dict(scale=True), TypeError, "scale"),
    **SHARED_KV_BAD_INPUTS,
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    case = make_paged_case([20, 5], 4, 2, 64, 16, device=runtime.device, stream=43)
    args = spoiled_call(case, spoil, runtime.device)
    with pytest.raises(error, match=names):
        impl.paged_decode(**args)


def test_launcher_rejects_bad_out(impl, runtime):
    case = make_paged_case([20, 5], 4, 2, 64, 16, device=runtime.device, stream=47)
    with pytest.raises(ValueError, match="out"):
        impl.paged_decode(*case.args, out=torch.empty(2, 4, 32, dtype=case.q.dtype, device=runtime.device))
    with pytest.raises(TypeError, match="out"):
        impl.paged_decode(*case.args, out=torch.empty(2, 4, 64, dtype=torch.float32, device=runtime.device))
    with pytest.raises(TypeError, match="scale"):
        impl.paged_decode(*case.args, scale="0.1")


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: paged_decode must compute them with your Triton kernel, not
    with torch (gathering the pages for scaled_dot_product_attention, or a copy of the grader's oracle)."""
    case = make_paged_case([37, 5], 8, 2, 64, 16, device=runtime.device, stream=61)
    assert_runs_a_triton_kernel(impl, lambda: impl.paged_decode(*case.args), "paged_decode")


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_mean_of_v(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros output and the plain mean of
    V (a kernel that forgot the scores), so passing the other tests means something."""
    case = make_paged_case([37, 20, 64], 8, 2, 64, 16, device=runtime.device, stream=53)
    ref, _ = paged_attention_reference(*case.args)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
    means = []
    for b, n in enumerate(case.context_lens.tolist()):
        means.append(
            gather_kv(case.v_cache, case.block_tables[b], n).float().mean(0).repeat_interleave(4, dim=0)
        )
    assert mismatch(torch.stack(means).half(), ref) is not None
    assert mismatch(ref.half(), ref) is None  # and the oracle rounded to fp16 passes


def test_same_buffers_with_new_values(impl, runtime):
    """An engine calls paged_decode every step on the same buffers (those a CUDA graph captured, section
    3.6), writing each step's q, cache pages, tables and lengths into them in place: every call must read
    the values the buffers hold now. A launcher that remembers its answers by where its inputs live
    returns the first step's output for the second."""
    case = make_paged_case([20, 9], 8, 2, 64, 16, device=runtime.device, stream=99)
    out = torch.empty_like(case.q)
    impl.paged_decode(*case.args, out=out)
    step = make_paged_case([20, 9], 8, 2, 64, 16, device=runtime.device, stream=100)
    for buffer, values in zip(case.args, step.args):
        buffer.copy_(values)  # the same tensors, the next step's values
    returned = impl.paged_decode(*case.args, out=out)
    wrong = returned_out_problem("paged_decode", returned, out)
    assert wrong is None, wrong
    assert_close(out, paged_attention_reference(*case.args)[0], DIMS)


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, paged_decode allocates [B, Hq, D] in q's dtype. Last in the file: a kernel that
    stores padding rows writes past this allocation, which the canary tests above report first."""
    case = make_paged_case([25, 3], 8, 2, 64, 16, device=runtime.device, stream=59)
    out = impl.paged_decode(*case.args)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype and out.device == case.q.device
    ref, _ = paged_attention_reference(*case.args)
    assert_close(out, ref, DIMS)


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


def _many_short_sequences(device, B=70_000, pages=2):
    """B sequences (more than the 65535 programs CUDA allows on grid axes 1 and 2) of one head of
    D = 16, every table row pointing at blocks 0 and 1 of a two-block cache: nothing else grows with B."""
    PAGE, D = 16, 16
    q = torch.zeros(B, 1, D, dtype=torch.float16, device=device)  # [B, Hq, D]
    k_cache = torch.zeros(pages, PAGE, 1, D, dtype=torch.float16, device=device)  # [blocks, PAGE, Hkv, D]
    block_tables = torch.arange(pages, dtype=torch.int32, device=device).repeat(B, 1)  # [B, pages]
    context_lens = torch.full((B,), pages * PAGE, dtype=torch.int32, device=device)  # [B]
    return q, k_cache, torch.zeros_like(k_cache), block_tables, context_lens


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """70,000 sequences in one decode step: more than the 65535 programs CUDA allows on grid axes 1 and
    2 (axis 0 allows 2**31 - 1), so sequences belong on axis 0 and KV heads on axis 1. A grid of
    (Hkv, B) launches on the CPU and fails on a GPU with "invalid argument". Run dry (every launch
    recorded and checked, none run), without the value checks, which the other tests cover."""
    q, k_cache, v_cache, block_tables, context_lens = _many_short_sequences(runtime.device)
    assert_grids_fit(
        impl,
        lambda: impl.paged_decode(q, k_cache, v_cache, block_tables, context_lens, check=False),
        "paged_decode of 70,000 sequences",
    )


# --- Diagnosis: which pitfall of section 5 a pattern of results points at ------------------------
# The narrow mistakes (4, 9-11) fail only their own check and pass the worked example; the broad ones
# are told apart by the checks they still pass (ctx = 1, V all ones, one page, GROUP = 1 or Hkv = 1).

WORKED = "test_worked_example_ctx37_reads_three_pages"
MISTAKES = [
    Mistake(
        1,
        fails=(
            "test_kv_head_grouping_is_contiguous[group4-worked-example]",
            "test_kv_head_grouping_is_contiguous[group1-MHA]",
            WORKED,
        ),
        # One KV head (kvh = 0) hides the mistake: MQA and the other one-KV-head cases pass.
        passes=(
            "test_kv_head_grouping_is_contiguous[group32-MQA]",
            "test_each_head_keeps_its_own_max",
            "test_scale_is_applied",
        ),
        # Heads kvh * GROUP_PAD + r pass Hq for the last KV heads whenever GROUP < GROUP_PAD: q is read
        # past its end (padding rows stored over the next group, also right only for one KV head, are not).
        messages=(r"out of bounds load of q_ptr",),
        question="Only the cases with one KV head (kvh = 0) pass: with GROUP = 4 padded to GROUP_PAD = 16, which "
        "query heads does KV head 1 own, kvh * GROUP onwards or kvh * GROUP_PAD onwards?",
        section="3.2",
    ),
    Mistake(
        1,
        fails=("test_kv_head_grouping_is_contiguous[group4-worked-example]", WORKED),
        passes=(
            "test_kv_head_grouping_is_contiguous[group1-MHA]",
            "test_kv_head_grouping_is_contiguous[group32-MQA]",
        ),
        question="Only the cases with 1 < GROUP < Hq fail: with Hq = 32 and Hkv = 8, which KV head should "
        "query head 13 read, and which one does your kernel give it?",
        section="3.2",
    ),
    Mistake(
        1,
        fails=("test_kv_head_grouping_is_contiguous[group3]",),
        passes=(
            "test_kv_head_grouping_is_contiguous[group4-worked-example]",
            "test_kv_head_grouping_is_contiguous[group2]",
            "test_kv_head_grouping_is_contiguous[group8]",
        ),
        question="Every power-of-two group passes and GROUP = 3 does not: with Hq = 9 and Hkv = 3, which "
        "query heads does KV head 1 own, and what GROUP does your kernel receive?",
        section="3.2",
    ),
    Mistake(
        18,
        fails=("test_out_keeps_the_range_of_its_dtype[bf16]",),
        passes=("test_out_keeps_the_range_of_its_dtype[fp16]", "test_dtypes[fp16]"),
        question="Your fp16 cases pass and a bf16 one past 65504 does not: which dtype does your kernel "
        "cast out to before the store, and what does fp16 make of a bf16 output of 10^5?",
        section="3.5",
    ),
    Mistake(
        17,
        fails=("test_sequence_index_widened_to_int64",),
        # A table row stride taken as max_pages fails the far-apart table too: its own check names it.
        passes=(
            WORKED,
            "test_q_strides_are_used",
            "test_page_index_widened_to_int64",
            "test_table_rows_are_read_through_their_stride",
        ),
        question="Row 2 of q (of out, of block_tables) starts 3 * 2**30 elements in: in which integer type "
        "does your kernel compute b * stride_qb, b * stride_ob and b * stride_bt?",
        section="3.1",
    ),
    Mistake(
        16,
        fails=("test_last_page_is_masked",),
        passes=("test_max_starts_at_minus_inf", "test_each_head_keeps_its_own_max"),
        messages=(r"the last, partly filled page was never read",),
        question="ctx = 37 and PAGE = 16: how many pages hold this sequence's tokens, and how many times "
        "does your page loop run?",
        section="3.3",
    ),
    Mistake(
        16,
        # ctx // PAGE + 1: one page too many whenever the last page is full, so the loop reads the table
        # entry past the sequence's pages (garbage, or past the row): the guard's words, or the harness's.
        fails=("test_last_page_is_masked", "test_table_rows_exactly_full"),
        passes=(WORKED,),
        messages=(
            r"device guard fired on arguments the launcher accepted|out of bounds load of block_tables",
        ),
        question="ctx = 32 and PAGE = 16: how many pages hold this sequence's tokens, how many times does "
        "your page loop run, and which table entry does its last iteration read?",
        section="3.3",
    ),
    Mistake(
        2,
        fails=("test_last_page_is_masked",),
        # A max taken over the group per key (tl.max(s, axis=0)) makes NaN on the last page too, but fails
        # the full pages of test_each_head_keeps_its_own_max, which an unmasked last page passes.
        passes=("test_masked_v_lanes_are_zero", "test_each_head_keeps_its_own_max"),
        messages=("NaN",),
        question="For ctx = 37 and PAGE = 16, which slots of the last page hold tokens of this sequence, "
        "and does your kernel load the others too?",
        section="2",
    ),
    Mistake(
        3,
        fails=("test_tail_keys_get_no_weight",),
        passes=("test_last_page_is_masked", "test_masked_v_lanes_are_zero"),
        question="A masked key is loaded as zeros: what score does it get, and what weight does the "
        "softmax give that score when every real score is negative?",
        section="3.3",
    ),
    Mistake(
        4,
        fails=("test_page_index_widened_to_int64",),
        passes=(WORKED, "test_single_sequence_long_context"),
        question="Only block ids past 2**31 / stride_kb fail: in which integer type is phys * stride_kb "
        "computed in your kernel?",
        section="2",
    ),
    Mistake(
        5,
        fails=("test_padding_rows_not_written",),
        messages=(r"buffer around out|out of bounds store of out|write race",),
        question="Your kernel computes GROUP_PAD rows but a KV head owns only GROUP query heads: whose "
        "rows of out do the other GROUP_PAD - GROUP rows land on?",
        section="3.5",
    ),
    Mistake(
        6,
        fails=("test_online_softmax_rescales_old_pages",),
        passes=("test_scale_is_applied", "test_output_is_normalised_by_the_softmax_sum"),
        question="One-page contexts pass and multi-page ones fail: when the running max grows on a new "
        "page, what happens to the l and acc summed under the old max, and is alpha an exponential in the "
        "same base as p's?",
        section="2",
    ),
    Mistake(
        6,
        # alpha applied to l and not to acc (or the other way round): V all ones no longer gives 1, as
        # without the normalisation, but every context of one page is still right.
        fails=("test_online_softmax_rescales_old_pages", "test_output_is_normalised_by_the_softmax_sum"),
        passes=("test_scale_is_applied", "test_single_token_context_returns_its_value_row"),
        question="One-page contexts pass and V all ones does not give 1: after a page that raises the "
        "running max, are l_i and acc both sums under the new max?",
        section="3.4",
    ),
    Mistake(
        7,
        # A missing acc / l is wrong from the first page on: one page of 16 keys fails too.
        fails=("test_output_is_normalised_by_the_softmax_sum", "test_scale_is_applied"),
        passes=("test_single_token_context_returns_its_value_row",),
        question="With every V row equal to 1 your output is not 1: what must acc be divided by once "
        "the last page is done?",
        section="3.5",
    ),
    Mistake(
        8,
        fails=("test_scale_is_applied",),
        passes=(
            "test_output_is_normalised_by_the_softmax_sum",
            "test_single_token_context_returns_its_value_row",
        ),
        question="Only the outputs that depend on how sharp the softmax is are off: is every score "
        "multiplied by scale before the max and the exp, and is that exp e^x (tl.exp), not 2^x?",
        section="3.3",
    ),
    Mistake(
        9,
        fails=("test_q_strides_are_used",),
        passes=(WORKED,),
        question="q is a view here (every other head of a bigger buffer): how far apart are two query "
        "heads in memory, and what does your kernel step by?",
        section="2",
    ),
    Mistake(
        9,
        fails=("test_cache_strides_are_used",),
        passes=(WORKED,),
        question="The cache is one layer of a bigger pool here: which strides does your kernel use to "
        "find block phys, token t and KV head kvh?",
        section="2",
    ),
    Mistake(
        9,
        fails=("test_out_strides_are_used",),
        passes=(WORKED, "test_q_strides_are_used"),
        question="out is every other head of a bigger buffer here: how far apart are two heads of out in "
        "memory, and what does your store step by?",
        section="2",
    ),
    Mistake(
        9,
        fails=("test_table_rows_are_read_through_their_stride",),
        passes=("test_pages_are_looked_up_through_the_block_table", WORKED),
        question="block_tables is a slice of a wider table here (each row max_pages + 5 apart): how does "
        "your kernel find row b, by stride_bt or by the table's width?",
        section="2",
    ),
    Mistake(
        9,
        fails=(
            "test_kv_head_grouping_is_contiguous[group1-MHA]",
            "test_q_strides_are_used",
            "test_padding_rows_not_written",
        ),
        passes=(WORKED, "test_single_sequence_long_context"),
        question="out is a view with strides of its own here (a slice of a larger buffer), and q another: "
        "which strides does your store into out step by?",
        section="2",
    ),
    Mistake(
        10,
        fails=("test_max_starts_at_minus_inf",),
        passes=(WORKED, "test_each_head_keeps_its_own_max"),
        question="Every score is about -128 here: what is your running max after the first page, if it "
        "starts at 0, and what is exp(-128 - m) in fp32?",
        section="3.4",
    ),
    Mistake(
        11,
        fails=("test_each_head_keeps_its_own_max",),
        passes=(WORKED, "test_max_starts_at_minus_inf"),
        question="Two heads of one group score about +128 and about 0: is your running max one number "
        "per query head, or one for the whole group?",
        section="3.4",
    ),
    Mistake(
        12,
        fails=("test_padding_rows_not_written",),
        messages=(r"out of bounds load of q",),
        question="Which query heads do the padding rows of the last KV head address, and does your q "
        "load read them?",
        section="3.2",
    ),
    Mistake(
        13,
        fails=("test_masked_v_lanes_are_zero",),
        messages=("NaN",),
        question="What value does a masked-off lane of tl.load hold when the load has no other=, and what "
        "is 0 times that value?",
        section="3.3",
    ),
    Mistake(
        14,
        messages=(r"operands must be (the )?same dtype",),
        question="tl.dot(p, v) refuses its operands: what dtype is p after tl.exp, and what dtype is v?",
        section="3.4",
    ),
    Mistake(
        15,
        fails=("test_padding_sequence_outputs_zeros",),
        passes=(WORKED, "test_output_is_normalised_by_the_softmax_sum"),
        question="A padding sequence has context_lens = 0: how many times does your page loop run for it, "
        "what are l_i and acc afterwards, and what does acc / l_i store?",
        section="3.5",
    ),
    Mistake(
        9,
        fails=("test_k_and_v_caches_with_different_strides",),
        passes=(WORKED, "test_cache_strides_are_used", "test_q_strides_are_used"),
        question="v_cache's token and head strides differ from k_cache's here: through which strides does "
        "your kernel load V?",
        section="2",
    ),
    Mistake(
        19,
        fails=("test_widest_head_dim_is_read_whole",),
        passes=(WORKED, "test_head_dims_and_page_sizes", "test_large_ragged_batch"),
        question="D = 256 here: how many features does your kernel's tl.arange over the head dim cover, and "
        "who computes q·k over features 128 to 255 and writes them to out?",
        section="3.2",
    ),
    Mistake(
        20,
        fails=("test_groups_wider_than_sixteen_heads",),
        passes=(WORKED, "test_kv_head_grouping_is_contiguous[group8]", "test_padding_rows_not_written"),
        question="GROUP = 24, then 71, here: how many rows does your tile of q have, and which query heads "
        "of the group does it hold?",
        section="3.2",
    ),
    Mistake(
        21,
        fails=("test_table_rows_exactly_full",),
        passes=(WORKED, "test_last_page_is_masked"),
        messages=(r"device guard fired|out of bounds load of block_tables",),
        question="A context of 32 with PAGE = 16 in a table of 2 columns: is it a valid length, and which "
        "lengths do your guard and your table loads admit?",
        section="3.7",
    ),
    Mistake(
        22,
        fails=("test_kv_head_index_widened_to_int64",),
        passes=(WORKED, "test_sequence_index_widened_to_int64", "test_cache_strides_are_used"),
        question="KV head 2 starts 3 * 2**30 elements into k_cache here: in which integer type does your "
        "kernel compute kvh * stride_kh, and what type does tl.program_id return?",
        section="3.1",
    ),
    Mistake(
        23,
        fails=("test_widest_page_is_read_whole",),
        passes=(WORKED, "test_head_dims_and_page_sizes", "test_widest_head_dim_is_read_whole"),
        question="PAGE = 128 here: how many of a page's slots does your kernel's tl.arange over the tokens "
        "cover, and who scores the others?",
        section="3.3",
    ),
    Mistake(
        24,
        # The running max of the raw scores q . k, the exponent of the scaled ones: the shift cancels in
        # acc / l until exp under- or overflows, so small scores (one key, D = 16) pass and the large ones
        # of nearly every other check do not; a missing acc / l (7) fails the small ones too, and a rescale
        # of l alone (6) passes the one-page scale check.
        fails=(
            "test_scale_is_applied",
            "test_output_is_normalised_by_the_softmax_sum",
            "test_max_starts_at_minus_inf",
            "test_each_head_keeps_its_own_max",
        ),
        passes=("test_single_token_context_returns_its_value_row", "test_widest_page_is_read_whole"),
        question="Scores are about +128 or -128 here: in which units is your running max, scale * q . k as "
        "in the exponent or the raw q . k, and what is exp(s - m) for the largest key when they differ?",
        section="3.4",
    ),
    Mistake(
        9,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, PAGE, heads, lengths, dtype and layouts; which of these does your kernel handle only one at a "
        "time (a stride taken from another tensor, a tile sized for another D or GROUP)?",
        section="2",
    ),
]
