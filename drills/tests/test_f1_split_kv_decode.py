"""Grader for F1, split-KV paged decode with a planner. Each test is named for the mistake it catches.

Run: make test L=f1 (your drills/mine) or make test L=f1 IMPL=solutions. Caches are poisoned as in L2:
NaN past every sequence's end and in unused blocks, garbage block ids past every last page.
"""

from __future__ import annotations

import math

import pytest
import torch

from drills import validate
from drills.compare import assert_close, mismatch
from drills.grading.grader.diagnose import Mistake
from drills.grading.grader.report import Stage
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel
from drills.tests import (
    bf16_everywhere,
    fill_past_fp16_range,
    guards_f1_split_kv_decode,
    keys_past_fp16_range,
    probe,
    seeded,
    sizes,
)
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import (
    CONTEXT_PATTERNS,
    FAR_APART_NEEDS_THREE_ROWS,
    HEAD_DIMS,
    KV_LAYOUTS,
    Q_LAYOUTS,
    TABLE_LAYOUTS,
    V_UNLIKE_K_NEEDS_TWO_STRIDES,
    PagedCase,
    call_with_canary_out,
    fits_this_machine,
    grouping_cases,
    in_layer_pool,
    in_wider_table,
    int32_tensor,
    laid_out,
    make_paged_case,
    overlapping_caches,
    paged_attention_reference,
    pool_past_int32,
    q_rows_far_apart,
    rows_far_apart,
    shift_scores,
    spoiled_call,
    strided_q,
    v_strides_unlike_k,
    with_entry,
)

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK_N": ("test_last_page_is_masked", "test_every_split_count_matches_unsplit"),
    "BLOCK_R": (
        "test_merge_states_equals_one_shot_softmax",
    ),  # R = 37 rows: three tiles of 16, the last partial
    "BLOCK_S": ("test_merge_reads_every_tile_of_splits", "test_many_splits_merge_with_rescale"),
    "D": ("test_widest_head_dim_is_read_whole", "test_merge_states_of_batched_heads_at_the_widest_head_dim"),
    "GROUP": ("test_kv_head_grouping_is_contiguous",),
    "GROUP_PAD": ("test_kv_head_grouping_is_contiguous",),  # GROUP = 32 pads past 16
    "PAGE": ("test_last_page_is_masked", "test_page_sizes_gathered_token_by_token"),
    "WRITE_LSE": (
        "test_padding_sequences_give_zero_and_lse_minus_inf",
        "test_split_ranges_cover_each_key_once",
        "test_lse_not_stored_unless_asked",  # False, unsplit: out stands in for the lse pointer
    ),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}
BOUNDS_GAPS = {"GUARD": "no bound: the device guard's switch, on in every call but the benchmark's timing"}

DIMS = ("b", "head", "d")
LOG2E, LN2 = 1 / math.log(2), math.log(2)  # a base-2 lse is the natural one times LOG2E

# What split_kv_decode admits, at its boundaries (drills/validate.py's limits, so the domain cannot
# drift from the launcher): test_pairwise_domain_cases_match_the_oracle crosses every pair of them.
_D_LO, _D_HI = validate.HEAD_DIM_RANGE
DOMAIN = Domain(
    axes=dict(
        D=(_D_LO, _D_HI),  # the narrowest and the widest head dim: one D tile of 256
        PAGE=(1, 16, validate.GATHER_MAX_PAGE),  # gathered token by token below 16, a page per tile from 16
        heads=((2, 2), (9, 3), (17, 1)),  # (Hq, Hkv): MHA, GROUP 3, MQA with GROUP 17 > GROUP_PAD 16
        lens=tuple(CONTEXT_PATTERNS),  # a partial last page, full pages, a padding row beside one key
        dtype=(torch.float16, torch.bfloat16),
        q=Q_LAYOUTS,  # contiguous, strided, rows 1.5 * 2**30 elements apart
        kv=KV_LAYOUTS,
        table=TABLE_LAYOUTS,
        scale=(None, 0.3),
        plan=("planner", "unsplit", "chunk16"),  # chunk16 at PAGE 128: 17 splits, past a merge tile of 16
    ),
    rules=(V_UNLIKE_K_NEEDS_TWO_STRIDES, FAR_APART_NEEDS_THREE_ROWS),
    limits=dict(
        head_dims=HEAD_DIMS,
        pages=tuple(2**i for i in range(8)),  # PAGE from 1 to 128; below 16 a tile gathers token by token
    ),
)


def check(impl, case, plan=None, scale=None):
    """Run through a canary-wrapped `out` with return_lse, compare out and lse with the oracle."""
    lse_box = []

    def call(out):
        o, lse = impl.split_kv_decode(*case.args, scale=scale, plan=plan, out=out, return_lse=True)
        lse_box.append(lse)
        return o

    out = call_with_canary_out(call, case.q)
    ref, ref_lse = paged_attention_reference(*case.args, scale=scale)
    assert_close(out, ref, DIMS)
    lse = lse_box[0]
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape, "lse must be [B, Hq] float32"
    empty = ref_lse == float("-inf")  # [B, Hq]: padding sequences saw no key
    assert (lse[empty] == float("-inf")).all(), "a padding sequence's lse (context_lens = 0) must be -inf"
    problem = mismatch(
        lse.masked_fill(empty, 0.0),
        ref_lse.masked_fill(empty, 0.0),
        ("b", "head"),
        atol=2e-3,
        rtol=1e-3,
        rel=1e-3,
    )
    if problem is not None:  # said apart: out right and lse wrong points at the lse formula alone
        raise AssertionError(f"out matches, but the returned lse does not:\n{problem}")
    return out, lse


def fixed_plan(impl, chunk, max_len):
    """A plan with an exact chunk size, bypassing the planner: how the tests force empty splits."""
    return impl.DecodePlan(num_splits=math.ceil(max_len / chunk), chunk=chunk, max_len=max_len)


# --- Splitting ---------------------------------------------------------------------------------


def test_every_split_count_matches_unsplit(impl, runtime):
    """Split counts 1 .. pages + 3 through plan(num_splits=...): the result must not depend on how the
    keys are cut. Gaps or overlaps between split ranges change it."""
    n = sizes(runtime, 40, 1000)  # 2.5 pages: counts 1 .. 6, the last three past the pages
    case = make_paged_case([n], 8, 2, 64, 16, device=runtime.device, stream=1)
    pages = math.ceil(n / 16)
    unsplit, _ = check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=1))  # split count 1
    counts = range(2, pages + 4) if runtime.interpreter else [2, 3, 5, 8, 16, 31, 63, pages, pages + 3]
    for splits in counts:
        out, _ = check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))
        assert_close(out, unsplit.float(), DIMS)


def test_empty_splits_do_not_divide_zero_by_zero(impl, runtime):
    """A ragged batch with a 16-token chunk: the short sequences get many splits with no tokens. An
    empty split must contribute weight 0 (lse = -inf), not 0/0 = NaN."""
    lens = sizes(runtime, [70, 1, 17, 33], [1000, 1, 17, 250, 999])
    # Table rows 4 pages longer than the longest sequence: a plan may cover up to their capacity.
    case = make_paged_case(lens, 8, 2, 64, 16, device=runtime.device, stream=2, extra_pages=4)
    check(impl, case, plan=fixed_plan(impl, 16, max(lens)))
    # More splits than the longest sequence has tiles: trailing splits are empty for everyone.
    check(impl, case, plan=fixed_plan(impl, 16, max(lens) + 48))


@pytest.mark.parametrize("splits", [1, 4], ids=["one-split", "merged"])
def test_padding_sequences_give_zero_and_lse_minus_inf(impl, runtime, splits):
    """context_lens[b] = 0 is a padding sequence (a batch padded to the size of a captured CUDA graph): its
    output is 0 and its lse -inf, and the rows around it are unaffected. With one split the kernel's
    empty-split rule covers it; merged, every split of the sequence is empty, so the merge's running max
    stays -inf and exp(-inf - (-inf)) is NaN unless the merge measures from 0 (section 3.5)."""
    case = make_paged_case([37, 0, 50, 0], 8, 2, 64, 16, device=runtime.device, stream=22)
    plan = impl.plan(case.context_lens, 2, 16, num_splits=splits)
    out, lse = check(impl, case, plan=plan)
    assert not torch.isnan(out[[1, 3]]).any(), "NaN in a padding sequence's output: 0 / 0 somewhere"
    assert (out[[1, 3]] == 0).all(), "a padding sequence (context_lens = 0) must output 0"
    assert (lse[[1, 3]] == float("-inf")).all(), "a padding sequence's lse must be -inf (it saw no key)"
    only = make_paged_case([0, 0], 8, 2, 64, 16, device=runtime.device, stream=23)
    only_plan = impl.plan(only.context_lens, 2, 16, num_splits=splits)
    assert (impl.split_kv_decode(*only.args, plan=only_plan) == 0).all(), "padding sequences only: not 0"


def test_many_splits_merge_with_rescale(impl, runtime):
    """Scores rise along the sequence and there are more splits (80) than the merge reads at once (64),
    so the merge's running max changes between groups of splits: its running sum must be rescaled. The
    second sequence's 100 tokens fill splits 0 to 6 only, so its second group of splits is empty: a max
    taken from each group alone falls to -inf there."""
    n, D = 16 * 80, 64
    case = make_paged_case([n, 100], 4, 1, D, 16, device=runtime.device, stream=16, poison=False)
    t = torch.arange(n, device=runtime.device)
    blocks, slots = case.block_tables[0].long()[t // 16], t % 16
    q0 = case.q[0, 0].float()  # [D]
    ramp = torch.linspace(0.0, 15.0, n, device=runtime.device)[:, None]  # head 0's score for token t
    k = 0.3 * case.k_cache[blocks, slots, 0].float() + ramp * math.sqrt(D) * q0 / q0.dot(q0)
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)  # [n, D]
    check(impl, case, plan=fixed_plan(impl, 16, n))  # 80 splits of one tile each


def _with_scores(case, scores):
    """Sequence 0's keys set so that query head 0 scores exactly `scores` [n] on them (the other heads
    score multiples of it): k_t = scores[t] * sqrt(D) * q0 / |q0|^2."""
    n, D = len(scores), case.q.shape[-1]
    t = torch.arange(n, device=case.q.device)
    blocks, slots = case.block_tables[0].long()[t // case.k_cache.shape[1]], t % case.k_cache.shape[1]
    q0 = case.q[0, 0].float()  # [D]
    k = scores.to(q0.device)[:, None] * math.sqrt(D) * q0 / q0.dot(q0)  # [n, D]
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)
    return case


# The reference's merge reads BLOCK_S = min(64, next_pow2(num_splits)) splits at a time (at least 16):
# 17 splits are one past a 16-split tile, 65 one past its widest tile, 129 one past a 128-split tile.
MERGE_TILE_EDGES = (17, 65, 129)


@pytest.mark.parametrize("splits", MERGE_TILE_EDGES, ids=[f"splits{s}" for s in MERGE_TILE_EDGES])
def test_merge_reads_every_tile_of_splits(impl, runtime, splits):
    """One split more than a merge tile of 16, 64 or 128 holds, one tile (16 tokens) per split. The
    first split and the last hold the same high score (+8, every other score is 0), so the two weigh
    the most and exactly the same: the merge's running max is set by its first tile and never changes,
    and a merge that forgets to rescale is still right here. A merge that reads one fixed-size tile of
    splits, with no loop over the rest, drops the last split and half the weight."""
    n = 16 * splits
    case = make_paged_case([n], 1, 1, 64, 16, device=runtime.device, stream=27)
    scores = torch.zeros(n)
    scores[0] = scores[n - 16] = 8.0  # token 0 of the first split and of the last
    check(impl, _with_scores(case, scores), plan=fixed_plan(impl, 16, n))


def test_splits_filling_whole_merge_tiles(impl, runtime):
    """16 splits of one tile each: the merge reads them as one whole tile of BLOCK_S = 16, with no lane
    past the last split. Counts between merge tiles (every other case's) leave masked lanes whose lse
    must weigh nothing; this count passes whatever those lanes read, and tells a mistake there apart
    from split ranges that overlap or leave a gap, which fail at every count."""
    case = make_paged_case([256], 8, 2, 64, 16, device=runtime.device, stream=28)
    check(impl, case, plan=fixed_plan(impl, 16, 256))


def test_split_ranges_cover_each_key_once(impl, runtime):
    """Every score is 0 and every split holds the same number of keys (ctx = 4 chunks of 16, and 3
    chunks of 32 in a second case): all splits weigh the same, so how the merge weighs them cannot
    matter, and the output is the plain mean of V. Only split ranges that overlap (a key counted twice)
    or leave a gap (a key never read) change it. Outputs only: a merge that ignores lse passes here."""
    for chunk, n in ((16, 64), (32, 96)):
        case = make_paged_case([n], 4, 1, 64, 16, device=runtime.device, stream=28)
        _with_scores(case, torch.zeros(n))
        plan = fixed_plan(impl, chunk, n)
        out = call_with_canary_out(
            lambda out, case=case, plan=plan: impl.split_kv_decode(*case.args, plan=plan, out=out),
            case.q,
        )
        ref, _ = paged_attention_reference(*case.args)
        assert_close(out, ref, DIMS)


def test_split_merge_shifts_by_the_max(impl, runtime):
    """Every score is about +128 (keys aligned with the queries), so every split's lse is above 128: e^lse
    overflows fp32 (past 88.7) and a merge that weighs splits by e^lse instead of e^(lse - max) gives
    inf / inf = NaN."""
    case = shift_scores(make_paged_case([70, 33], 8, 2, 64, 16, device=runtime.device, stream=19), 128.0)
    _, lse = check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=3))
    assert lse.min().item() > 88.7, "every head's lse should be past fp32's exp range here"


def test_max_starts_at_minus_inf(impl, runtime):
    """Every score is about -128: a split's running max that starts at 0 stays 0 and every exp2 underflows
    (l = 0, the split looks empty); with 3 splits, each split's lse is below -104, where e^lse underflows
    too, so the split merge must shift by the max as well."""
    case = shift_scores(make_paged_case([70, 33], 8, 2, 64, 16, device=runtime.device, stream=20), -128.0)
    for splits in (1, 3):
        _, lse = check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))
    assert lse.max().item() < -104, "every head's lse should be below fp32's exp range here"


@pytest.mark.parametrize("splits", [1, 2], ids=["one-split", "two-splits"])
def test_running_max_never_falls(impl, runtime, splits):
    """Scores fall with the key position: +60 in the first 16-token tile, -60 in the four after it. The
    running max must stay at the first tile's, m_new = max(m_i, the tile's max). Taken from each tile
    alone, it falls by 120 / ln 2 = 173 in base 2, and alpha = exp2(m_old - m_new) = 2^173 overflows
    to inf. Rising scores hide it (the tile's max is then the running one), and so do splits of one tile
    each: two splits of 48 tokens keep split 0's fall inside it."""
    n = 80
    case = make_paged_case([n], 1, 1, 64, 16, device=runtime.device, stream=30)
    scores = torch.where(torch.arange(n) < 16, 60.0, -60.0)
    check(impl, _with_scores(case, scores), plan=impl.plan(case.context_lens, 1, 16, num_splits=splits))


def test_q_strides_are_used(impl, runtime):
    """q is every other head of a [B, 2 * Hq, D] buffer (stride(1) = 2 * D), the other heads NaN: a
    kernel that steps through q by D per head reads them. Unsplit and split."""
    case = strided_q(make_paged_case([40, 9], 8, 2, 64, 16, device=runtime.device, stream=21))
    for splits in (1, 3):
        check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))


def test_table_rows_are_read_through_their_stride(impl, runtime):
    """block_tables is a view of a wider table of -1 (in_wider_table): row b starts at b * stride(0), not
    at b * max_pages. A kernel given block_tables.shape[1] for the row stride reads another sequence's
    pages, or a -1. Unsplit and split."""
    case = make_paged_case([35, 48, 70], 8, 2, 64, 16, device=runtime.device, stream=23)
    case.block_tables = in_wider_table(case.block_tables)
    for splits in (1, 3):
        check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))


@pytest.mark.parametrize("PAGE", [4, 16])
def test_cache_strides_are_used(impl, runtime, PAGE):
    """k_cache and v_cache are layer 1 of a NaN-filled pool [num_blocks, layers, PAGE, Hkv, 2, D]: block,
    token and head strides all differ from a contiguous cache's. PAGE = 4 gathers token by token."""
    case = in_layer_pool(make_paged_case([40, 9], 8, 2, 64, PAGE, device=runtime.device, stream=22 + PAGE))
    check(impl, case, plan=impl.plan(case.context_lens, 2, PAGE, num_splits=2))


def test_v_is_read_through_its_own_strides(impl, runtime):
    """v_cache head-major (its token and head strides swapped against k_cache's, the block stride the
    same): a launch that hands the kernel K's strides for V reads V's wrong tokens and heads. Unsplit
    and split on the one-page tile (PAGE = 16), split on the token-by-token gather (PAGE = 4)."""
    for PAGE, splits in ((16, (1, 2)), (4, (2,))):
        case = make_paged_case([40, 9], 8, 2, 64, PAGE, device=runtime.device, stream=24 + PAGE)
        case = v_strides_unlike_k(case)
        for n in splits:
            check(impl, case, plan=impl.plan(case.context_lens, 2, PAGE, num_splits=n))


def test_widest_head_dim_is_read_whole(impl, runtime):
    """D = 256, the widest head dim the launcher admits, on one KV head and two pages, unsplit and split:
    a feature tile capped at 128 scores with half of q and k and leaves half of each output row (and of
    each partial the merge reads) unwritten, yet passes every case up to D = 128."""
    D = max(DOMAIN["head_dims"])
    case = make_paged_case([19], 2, 1, D, 16, device=runtime.device, stream=26)
    for n in (1, 2):
        check(impl, case, plan=impl.plan(case.context_lens, 1, 16, num_splits=n))


def test_lse_is_natural_log(impl, runtime):
    """lse must equal torch.logsumexp of the scaled scores (base e). Base 2, or forgetting to convert
    back after exp2 tricks, is off by a factor ln 2. Unsplit (the split kernel writes the final lse
    itself), so that out is right and only lse can be wrong; the split path's lse is checked by every
    other test."""
    case = make_paged_case([45, 3], 8, 2, 64, 16, device=runtime.device, stream=3)
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=1))
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=1), scale=0.37)


@pytest.mark.parametrize("splits", [1, 2], ids=["unsplit", "split"])
def test_lse_not_stored_unless_asked(impl, runtime, splits):
    """Without return_lse there is no lse tensor: the launcher hands the unsplit kernel out in its place,
    a pointer never written (WRITE_LSE = False). An lse stored all the same lands on out's first
    elements, fp32 bits over fp16 ones, after sequence 0's output. Every other value check asks for lse.
    Split in two, the merge is the kernel given WRITE_LSE = False: its lse store lands on out the same way."""
    case = make_paged_case([37, 21, 50], 8, 2, 64, 16, device=runtime.device, stream=24)
    plan = impl.plan(case.context_lens, 2, 16, num_splits=splits)
    out = call_with_canary_out(lambda o: impl.split_kv_decode(*case.args, plan=plan, out=o), case.q)
    try:
        assert_close(out, paged_attention_reference(*case.args)[0], DIMS)
    except AssertionError as e:
        raise AssertionError(f"{splits} split(s), return_lse=False (WRITE_LSE = False): {e}") from None


# --- L2's edge cases, through the split path -------------------------------------------------


@pytest.mark.parametrize("splits", [1, 4])
def test_last_page_is_masked(impl, runtime, splits):
    lens = [1, 15, 16, 17, 31] + sizes(runtime, [], [777, 1000])
    case = make_paged_case(lens, 8, 2, 64, 16, device=runtime.device, stream=4)
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))


@pytest.mark.parametrize("splits", [1, 2], ids=["one-split", "merged"])
def test_table_rows_exactly_full(impl, runtime, splits):
    """Contexts of 20 and 32 with PAGE = 16 in a table of exactly 2 columns: the second sequence's pages
    fill its row, the last of the table, so context_lens[1] = max_pages * PAGE, the largest valid length.
    A bound that takes it for one past the row (ctx < max_pages * PAGE) zeroes that sequence, and a read
    of the entry after its last page reads past the end of block_tables. The pool has exactly the 4 blocks
    the pages need, so block id num_blocks - 1, the largest valid one, is in use too; unsplit and in two splits."""
    case = make_paged_case(
        [20, 32], 4, 2, 64, 16, device=runtime.device, stream=47, max_pages=2, num_blocks=4
    )
    assert case.block_tables.shape[1] * 16 == 32  # no spare column
    assert 3 in case.block_tables.flatten().tolist()  # block num_blocks - 1, the largest valid id, in use
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))


@grouping_cases("group1-MHA", "group2", "group3", "group4", "group8", "group32-MQA")
def test_kv_head_grouping_is_contiguous(impl, runtime, Hq, Hkv):
    """Query head h reads KV head h // GROUP, not h % Hkv (interleaved). GROUP = 3 (Hq = 9, Hkv = 3) is
    not a power of two: a GROUP rounded up to 4 reads the wrong KV heads."""
    case = make_paged_case(
        sizes(runtime, [40, 9], [300, 129]), Hq, Hkv, 64, 16, device=runtime.device, stream=Hq + Hkv
    )
    check(impl, case, plan=impl.plan(case.context_lens, Hkv, 16, num_splits=2))


@pytest.mark.parametrize("PAGE", [1, 2, 8, 16, 64])
def test_page_sizes_gathered_token_by_token(impl, runtime, PAGE):
    """Pages smaller than a 16-token tile are gathered token by token through the block table."""
    lens = sizes(runtime, [37, 5, 20], [1000, 5, 333])
    case = make_paged_case(lens, 8, 2, 64, PAGE, device=runtime.device, stream=PAGE)
    for splits in (1, 3):
        check(impl, case, plan=impl.plan(case.context_lens, 2, PAGE, num_splits=splits))


def test_shared_and_shuffled_pages_single_sequence(impl, runtime):
    """plan=None: the planner's own choice, for a batch whose sequences share pages, and for B = 1. Then
    twice on one context_lens buffer: a serving loop writes each step's lengths into the same buffer, and
    plan=None plans from this call's lengths; a plan kept for the buffer (by its address or its shape)
    from an earlier call covers the old lengths, and a sequence grown past them loses its tail."""
    case = make_paged_case(
        sizes(runtime, [64, 40], [2048, 700]),
        8,
        2,
        128,
        16,
        device=runtime.device,
        stream=6,
        shared_prefix_pages=2,
    )
    check(impl, case)  # the planner's own choice
    one = make_paged_case([sizes(runtime, 150, 32768)], 32, 8, 128, 16, device=runtime.device, stream=7)
    check(impl, one)  # B = 1: the case split-KV exists for
    step = make_paged_case([100, 70], 8, 2, 64, 16, device=runtime.device, stream=31)
    grown = step.context_lens.clone()
    step.context_lens.copy_(torch.tensor([16, 5], dtype=torch.int32))
    check(impl, step)  # the earlier step's lengths
    step.context_lens.copy_(grown)  # the same buffer, the next step's lengths
    try:
        check(impl, step)
    except AssertionError as e:
        raise AssertionError(
            f"a second call, same context_lens buffer now holding [100, 70] (was [16, 5]), plan=None: {e}"
        ) from None


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    case = make_paged_case(
        sizes(runtime, [33, 4], [1500, 17]), 8, 2, 128, 16, dtype=dtype, device=runtime.device, stream=8
    )
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=3))


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_out_keeps_the_range_of_its_dtype(impl, runtime, dtype):
    """Every V element is 2^16 (bf16) or 2^13 (fp16) x (1 + |randn|) (fill_past_fp16_range), so every output element is too: bf16 outputs
    from 65536 up hold in bf16 and not in fp16 (largest 65504). A store cast to tl.float16 where out's own
    element type belongs turns them into inf (and a merge of inf partial outputs into NaN). Unsplit and
    split; the fp16 case is the same check inside fp16's range. Last, K from 2^16 up (bf16) with q scaled
    down to keep the scores: a score dot of q and K cast to tl.float16 turns them into inf."""
    case = make_paged_case([40, 17], 8, 2, 64, 16, dtype=dtype, device=runtime.device, stream=21)
    v = case.v_cache
    fill_past_fp16_range(v)  # the stale slots' NaN stay NaN
    for splits in (1, 3):
        check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))
    case = make_paged_case([40, 17], 8, 2, 64, 16, dtype=dtype, device=runtime.device, stream=22)
    keys_past_fp16_range(case.k_cache, case.q)  # q . k as before, K past fp16's range in bf16
    try:
        check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=1))
    except AssertionError as e:
        raise AssertionError(f"K from 2^16 up in bf16 (q scaled down to keep the scores): {e}") from None


def test_sequence_index_widened_to_int64(impl, runtime):
    """q's rows 1.5 * 2**30 elements apart (q_rows_far_apart), unsplit and split: both kernels index q,
    and the split kernel its partial outputs, by the sequence, whose offsets must be int64; then out's
    rows as far apart, which the merge kernel stores by its own sequence index."""
    case = make_paged_case([20, 9, 33], 4, 2, 64, 16, device=runtime.device, stream=22)
    wide = PagedCase(q_rows_far_apart(case.q, runtime), *case.args[1:])
    for splits in (1, 3):
        check(impl, wide, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))
    # out's rows as far apart (out may be a view of a large buffer): split, the merge kernel stores each
    # sequence's row at b * stride_ob, so its own b must be int64 too.
    ref, _ = paged_attention_reference(*case.args)
    for splits in (1, 3):
        out = rows_far_apart(torch.zeros_like(case.q), runtime)  # [B, Hq, D], rows far apart
        plan = impl.plan(case.context_lens, 2, 16, num_splits=splits)
        # return_lse: a stray lse store (pitfall 23) is not this check's to catch.
        returned, _ = impl.split_kv_decode(*case.args, plan=plan, out=out, return_lse=True)
        assert returned.data_ptr() == out.data_ptr(), "split_kv_decode must return out"
        assert_close(out, ref, DIMS)


def test_page_index_widened_to_int64(impl, runtime):
    """Block ids above 2**32 / page stride: int32 offsets wrap around to block 0 onwards and read zeros,
    on the one-page-per-tile path (PAGE = 16) and the token-by-token one (PAGE = 8). The caches are
    sparse files on a CPU (pool_past_int32)."""
    Hkv, D = 1, 128
    for PAGE, lens, splits in (
        (16, sizes(runtime, [40, 7], [300, 45]), (1, 3)),
        (8, [sizes(runtime, 40, 100)], (2,)),
    ):
        far_blocks = pool_past_int32(runtime, PAGE, Hkv, D, spare=64)
        case = make_paged_case(lens, 4, Hkv, D, PAGE, device=runtime.device, stream=9 + PAGE, **far_blocks)
        for n in splits:
            check(impl, case, plan=impl.plan(case.context_lens, Hkv, PAGE, num_splits=n))


# --- merge_states -----------------------------------------------------------------------------


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (D = 256 at
    PAGE = 1, V's strides unlike K's with GQA, far-apart q rows under 17 splits...): a kernel right on
    each bound alone can still be wrong where two meet. A failure names the case's values."""
    domain = fits_this_machine(DOMAIN, runtime)

    def run(c):
        Hq, Hkv = c["heads"]
        lens = CONTEXT_PATTERNS[c["lens"]](c["PAGE"])
        case = make_paged_case(
            lens, Hq, Hkv, c["D"], c["PAGE"], dtype=c["dtype"], device=runtime.device, stream=402
        )
        case = laid_out(case, runtime, c["q"], c["kv"], c["table"])
        plan = {
            "planner": None,
            "unsplit": impl.plan(lens, Hkv, c["PAGE"], num_splits=1),
            "chunk16": fixed_plan(impl, 16, max(lens)),
        }[c["plan"]]
        check(impl, case, plan=plan, scale=c["scale"])

    domain.check_each(domain.cases(stream=402), run)


def _state(scores, values):
    """(o, lse) of softmax(scores) @ values over the last key axis: scores [R, n], values [R, n, D]."""
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("rn,rnd->rd", p, values), torch.logsumexp(scores, dim=-1)


def test_merge_states_equals_one_shot_softmax(impl, runtime):
    """Merging two parts must equal softmax over the union of their keys, including very different
    maxima (a merge without the max shift overflows or loses the smaller part)."""
    gen = torch.Generator().manual_seed(seeded(11))
    R, D = 37, 64
    s = torch.randn(R, 30, generator=gen) * 3
    s[:, 10:] += torch.linspace(-40, 40, R)[:, None]  # part b far above or below part a
    v = torch.randn(R, 30, D, generator=gen)
    o_a, lse_a = _state(s[:, :10], v[:, :10])
    o_b, lse_b = _state(s[:, 10:], v[:, 10:])
    want_o, want_lse = _state(s, v)
    dev = runtime.device
    o, lse = impl.merge_states(o_a.to(dev), lse_a.to(dev), o_b.to(dev), lse_b.to(dev))
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def test_merge_states_of_batched_heads_at_the_widest_head_dim(impl, runtime):
    """merge_states takes o [..., D] and lse [...]: here [3, 7, 256] and [3, 7], a decode step's batch and
    heads at the widest head dim the lesson admits. 21 rows, past one tile of 16: a merge that counts rows
    as o_a.shape[0] (3) merges the first 3 and leaves the rest as torch.empty gave them, and one made
    for D up to 128 refuses the call or merges half of each row."""
    gen = torch.Generator().manual_seed(seeded(27))
    B, H, D, dev = 3, 7, validate.HEAD_DIM_RANGE[1], runtime.device
    s = torch.randn(B * H, 12, generator=gen) * 3
    v = torch.randn(B * H, 12, D, generator=gen)
    (o_a, lse_a), (o_b, lse_b) = _state(s[:, :5], v[:, :5]), _state(s[:, 5:], v[:, 5:])
    want_o, want_lse = _state(s, v)
    o, lse = impl.merge_states(
        *(t.reshape(B, H, *t.shape[1:]).to(dev) for t in (o_a, lse_a, o_b, lse_b))
    )  # [B, H, D], [B, H]
    assert o.shape == (B, H, D) and lse.shape == (B, H), (
        f"merge_states of o [{B}, {H}, {D}] returned o {tuple(o.shape)} and lse {tuple(lse.shape)}: "
        "the result has the inputs' shape"
    )
    assert_close(o.reshape(B * H, D), want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse.reshape(B * H), want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def test_merge_states_is_associative_and_handles_empty_parts(impl, runtime):
    gen = torch.Generator().manual_seed(seeded(12))
    R, D, dev = 20, 32, runtime.device
    s = torch.randn(R, 24, generator=gen) * 4
    v = torch.randn(R, 24, D, generator=gen)
    parts = [_state(s[:, i : i + 8], v[:, i : i + 8]) for i in (0, 8, 16)]
    (a_o, a_l), (b_o, b_l), (c_o, c_l) = [(o.to(dev), l.to(dev)) for o, l in parts]
    left = impl.merge_states(*impl.merge_states(a_o, a_l, b_o, b_l), c_o, c_l)
    right = impl.merge_states(a_o, a_l, *impl.merge_states(b_o, b_l, c_o, c_l))
    assert_close(left[0], right[0].float(), ("row", "d"), atol=1e-5, rtol=1e-5, rel=1e-5)
    assert_close(left[1], right[1], ("row",), atol=1e-5, rtol=1e-5, rel=1e-5)
    empty_o, empty_l = torch.zeros_like(a_o), torch.full_like(a_l, float("-inf"))
    o, lse = impl.merge_states(a_o, a_l, empty_o, empty_l)  # an empty part changes nothing
    assert_close(o, a_o, ("row", "d"), atol=1e-6, rtol=1e-6, rel=1e-6)
    o, lse = impl.merge_states(empty_o, empty_l, empty_o, empty_l)  # both empty: 0 and -inf, no NaN
    assert not torch.isnan(o).any() and (o == 0).all() and (lse == float("-inf")).all(), (
        "both parts empty (lse = -inf): merge_states must give o = 0 and lse = -inf, got "
        f"{int(torch.isnan(o).any(-1).sum())} rows of o with NaN, lse {lse[:3].tolist()}...: "
        "exp(-inf - (-inf)) is NaN"
    )


def test_merge_states_lse_beyond_fp32_exp_range(impl, runtime):
    """lse values near +200 and -200 are legal (large scores, a large scale): e^lse overflows fp32 past
    88.7 and underflows below -103, so a merge that weighs the parts by e^lse directly, instead of
    e^(lse - max), gives inf / inf or 0 / 0. Rows 0-7 both parts high, 8-15 both low, 16-23 one high
    and one low (the low part then weighs e^-300 = 0). Rows 24-31 have both lse near -100: e^lse is an
    fp32 subnormal there (below e^-87.3) with only a few bits left, so e^lse weights are off by about
    1% with no NaN anywhere: the absolute lse matters, not the gap between the parts."""
    gen = torch.Generator().manual_seed(seeded(24))
    R, D, dev = 32, 32, runtime.device
    s = torch.randn(R, 16, generator=gen) * 2
    v = torch.randn(R, 16, D, generator=gen)
    shift_a = torch.tensor([200.0] * 8 + [-200.0] * 8 + [150.0] * 8 + [-102.0] * 8)[:, None]  # [R, 1]
    shift_b = torch.tensor([205.0] * 8 + [-190.0] * 8 + [-150.0] * 8 + [-102.5] * 8)[:, None]
    s_a, s_b = s[:, :6] + shift_a, s[:, 6:] + shift_b
    (o_a, lse_a), (o_b, lse_b) = _state(s_a, v[:, :6]), _state(s_b, v[:, 6:])
    want_o, want_lse = _state(torch.cat([s_a, s_b], dim=1), v)
    o, lse = impl.merge_states(o_a.to(dev), lse_a.to(dev), o_b.to(dev), lse_b.to(dev))
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def _base2_lse(scores):
    """lse in base 2, as a library that works with exp2 returns it (FlashInfer's kernels, by default):
    the running max and sum taken in base-2 units, log2 sum 2^(s log2 e) = m + log2 l. scores [R, n]."""
    s2 = scores.float() * LOG2E
    m = s2.max(dim=-1).values
    return m + torch.log2(torch.exp2(s2 - m[:, None]).sum(dim=-1))


def test_library_base2_lse_merged_after_times_ln2(impl, runtime):
    """Two states whose lse comes in base 2, as FlashInfer's kernels return it, converted the way section
    3.5 teaches (times ln 2) and merged by your merge_states: the result must be the softmax over the
    union. Part b sits 1 to 4 above or below part a, where the base decides the weights; the grader first
    checks that a merge fed the unconverted base-2 lse would be off here, so the case can tell."""
    gen = torch.Generator().manual_seed(seeded(26))
    R, D, dev = 16, 32, runtime.device
    s = torch.randn(R, 20, generator=gen)
    s[:, 12:] += torch.linspace(-4.0, 4.0, R)[:, None]  # [R, 20]: part b is keys 12..19
    v = torch.randn(R, 20, D, generator=gen)
    (o_a, _), (o_b, _) = _state(s[:, :12], v[:, :12]), _state(s[:, 12:], v[:, 12:])
    lse2_a, lse2_b = _base2_lse(s[:, :12]), _base2_lse(s[:, 12:])  # [R] each, base 2
    want_o, want_lse = _state(s, v)
    # The mistake the conversion prevents: base-2 lse weighed as natural log, e^(lse2_a - lse2_b).
    w_a = torch.sigmoid(lse2_a - lse2_b)[:, None]  # e^a / (e^a + e^b)
    wrong = w_a * o_a + (1 - w_a) * o_b
    assert mismatch(wrong, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4) is not None
    o, lse = impl.merge_states(o_a.to(dev), (lse2_a * LN2).to(dev), o_b.to(dev), (lse2_b * LN2).to(dev))
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def test_merge_states_reads_strided_views(impl, runtime):
    """o_a is one half of a [R, 2, D] buffer, o_b every other row of a [2 * R, D] one, each lse a column
    of a [R, 3] buffer, everything around them NaN. merge_states_kernel indexes rows as row * D, so
    the launcher must hand it contiguous copies."""
    gen = torch.Generator().manual_seed(seeded(25))
    R, D, dev = 12, 32, runtime.device
    s, v = torch.randn(R, 16, generator=gen) * 3, torch.randn(R, 16, D, generator=gen)
    (o_a, lse_a), (o_b, lse_b) = _state(s[:, :7], v[:, :7]), _state(s[:, 7:], v[:, 7:])
    nan = float("nan")
    o_a_view = torch.full((R, 2, D), nan, device=dev)[:, 1]  # [R, D], stride (2 * D, 1)
    o_b_view = torch.full((2 * R, D), nan, device=dev)[::2]  # [R, D], stride (2 * D, 1)
    lse_a_view = torch.full((R, 3), nan, device=dev)[:, 0]  # [R], stride 3
    lse_b_view = torch.full((R, 3), nan, device=dev)[:, 2]
    for view, value in ((o_a_view, o_a), (o_b_view, o_b), (lse_a_view, lse_a), (lse_b_view, lse_b)):
        view.copy_(value)
    o, lse = impl.merge_states(o_a_view, lse_a_view, o_b_view, lse_b_view)
    want_o, want_lse = _state(s, v)
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def test_merge_states_fp16_outputs(impl, runtime):
    gen = torch.Generator().manual_seed(seeded(13))
    s, v = torch.randn(8, 16, generator=gen), torch.randn(8, 16, 64, generator=gen)
    (o_a, l_a), (o_b, l_b) = _state(s[:, :5], v[:, :5]), _state(s[:, 5:], v[:, 5:])
    dev = runtime.device
    o, lse = impl.merge_states(o_a.half().to(dev), l_a.to(dev), o_b.half().to(dev), l_b.to(dev))
    assert o.dtype == torch.float16 and lse.dtype == torch.float32, (
        f"merge_states of fp16 outputs returned o {o.dtype} and lse {lse.dtype}: o keeps o_a's dtype, and lse "
        "stays float32 whatever o's dtype (an fp16 lse loses the digits that weigh the parts)"
    )
    assert_close(o, _state(s, v)[0], ("row", "d"))


# --- plan() -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lens,Hkv",
    [
        ([1], 8),
        ([32768], 8),
        ([4096] * 8, 8),
        ([1024] * 64, 8),
        ([512] * 256, 8),
        ([5, 3000, 17], 2),
        ([16], 1),
    ],
)
def test_plan_never_returns_empty_or_zero_splits(impl, lens, Hkv):
    """Whatever it chooses, every split of the longest sequence has tokens and chunks are tile-sized."""
    for forced in (None, 1, 7, 10_000):
        p = impl.plan(lens, Hkv, 16, num_sms=132, num_splits=forced)
        assert p.num_splits >= 1 and p.chunk >= 1 and p.max_len == max(lens)
        assert (p.num_splits - 1) * p.chunk < max(lens) <= p.num_splits * p.chunk, (
            f"{p}: the last split of the longest sequence is empty, or the splits do not cover it"
        )
        assert p.chunk % 16 == 0, (
            f"{p}: a chunk of {p.chunk} tokens is not a whole number of 16-token tiles (BLOCK_N), so "
            "a tile would straddle two splits and, with PAGE >= 16, two pages"
        )
        if forced is not None:
            assert p.num_splits <= forced, (
                f"{p}: {p.num_splits} splits where at most {forced} were asked: a chunk rounded down to "
                "whole tiles leaves more splits than asked"
            )


def test_plan_of_padding_sequences_has_one_split(impl):
    """A batch of padding sequences (every length 0: a graph bucket with no request yet) still gets a
    plan with one split of whole tiles, never 0 splits or a chunk of 0 (a division by zero later)."""
    p = impl.plan([0, 0, 0], 2, 16, num_sms=132)
    assert p.num_splits == 1, (
        f"{p}: a batch of padding sequences planned {p.num_splits} splits: cdiv(0, chunk) = 0 counts no "
        "split, and a grid of 0 programs writes nothing; the count is at least 1"
    )
    assert p.chunk >= 16 and p.chunk % 16 == 0 and p.max_len == 0, f"{p}"
    mixed = impl.plan([0, 37, 0], 2, 16, num_sms=132)
    assert mixed.max_len == 37 and mixed.num_splits * mixed.chunk >= 37, f"{mixed}: must cover 37 tokens"


def test_plan_splits_only_when_the_grid_is_starved(impl):
    big = impl.plan([2048] * 128, 8, 16, num_sms=132)  # 1024 programs already
    assert big.num_splits == 1, (
        f"128 sequences x 8 KV heads are 1024 programs, past 4 x 132 SMs: plan() gave {big.num_splits} "
        "splits, not 1"
    )
    one = impl.plan([32768], 8, 16, num_sms=132)  # 8 programs on 132 SMs
    assert one.num_splits >= 132 // 8, (
        f"1 sequence x 8 KV heads are 8 programs on 132 SMs: plan() gave {one.num_splits} splits, not "
        f"at least {132 // 8}"
    )


def test_plan_skips_none_of_its_rules(impl):
    """Section 4's rules, each where skipping it changes the plan (every result stays right: only the
    step's speed is lost). Rule 1 aims at 4 x num_sms programs, with the SMs it is handed: one sequence of
    32768 tokens, 8 KV heads gets 64 splits on 132 SMs and 8 on 16. Rule 2, unforced: 1000 tokens on 132
    SMs take 16 chunks of MIN_CHUNK = 64 tokens, not 63 of 16. A forced count is cut only by the tiles
    (rules 3-5): num_splits=7 over 100 tokens (7 tiles) gives 7 splits, which the tests that force
    counts rely on. A ragged batch is cut by its longest sequence."""
    for num_sms, want in ((132, 64), (16, 8)):
        p = impl.plan([32768], 8, 16, num_sms=num_sms)
        assert p.num_splits == want, (
            f"plan([32768], 8 KV heads, num_sms={num_sms}) gave {p}: section 4 aims at 4 x {num_sms} "
            f"programs, {4 * num_sms} // 8 = {4 * num_sms // 8} splits, which whole tiles make {want}"
        )
    p = impl.plan([1000], 8, 16, num_sms=132)
    assert p.num_splits == 16 and p.chunk == 64, (
        f"plan([1000], 8 KV heads, num_sms=132) gave {p}: chunks of at least MIN_CHUNK = 64 tokens "
        "allow at most cdiv(1000, 64) = 16 splits of 64 tokens (a merge of 63 tiny splits costs more "
        "than it saves)"
    )
    p = impl.plan([5, 3000, 0, 17], 2, 16, num_sms=132)
    assert p.num_splits == 47 and p.chunk == 64, (
        f"plan([5, 3000, 0, 17], 2 KV heads, num_sms=132) gave {p}: 8 programs aim at 528 // 8 = 66 "
        "splits, MIN_CHUNK allows cdiv(3000, 64) = 47 of 64 tokens; the longest of a ragged batch sets "
        "the cut, and a short or padding sequence just leaves its later splits empty"
    )
    p = impl.plan([100], 2, 16, num_sms=132, num_splits=7)
    assert p.num_splits == 7 and p.chunk == 16, (
        f"plan([100], 2, 16, num_splits=7) gave {p}: a forced count is cut only to the 7 tiles of the "
        "longest sequence, not to chunks of MIN_CHUNK tokens"
    )


# --- Your kernel does the work ------------------------------------------------------------------


@pytest.mark.parametrize("splits", [1, 3])
def test_runs_a_triton_kernel(impl, runtime, splits):
    """The right numbers are not enough: split_kv_decode and merge_states must compute them with your
    Triton kernels, not with torch (or a copy of the grader's oracle), split or not."""
    case = make_paged_case([45, 3], 8, 2, 64, 16, device=runtime.device, stream=17)
    plan = impl.plan(case.context_lens, 2, 16, num_splits=splits)
    assert_runs_a_triton_kernel(impl, lambda: impl.split_kv_decode(*case.args, plan=plan), "split_kv_decode")
    gen = torch.Generator().manual_seed(seeded(18))
    (o_a, l_a), (o_b, l_b) = [
        (
            torch.randn(6, 32, generator=gen).to(runtime.device),
            torch.randn(6, generator=gen).to(runtime.device),
        )
        for _ in range(2)
    ]
    assert_runs_a_triton_kernel(impl, lambda: impl.merge_states(o_a, l_a, o_b, l_b), "merge_states")


# --- The launcher rejects bad input ----------------------------------------------------------


# name -> (how to spoil the arguments of a valid split_kv_decode call, the error, what the message names)
BAD_INPUTS = {
    "q_dtype_fp32": (lambda a, impl, dev: dict(q=a["q"].float()), TypeError, "q"),
    "block_tables_int64": (
        lambda a, impl, dev: dict(block_tables=a["block_tables"].long()),
        TypeError,
        "block_tables",
    ),
    "context_len_negative": (
        lambda a, impl, dev: dict(context_lens=int32_tensor(dev, 20, -1)),
        ValueError,
        r"context_lens\[1\]",
    ),
    "check_not_a_bool": (lambda a, impl, dev: dict(check=1), TypeError, "check"),
    "page_not_pow2": (
        lambda a, impl, dev: {
            n: a["k_cache"].repeat(1, 3, 1, 1)[:, :48].contiguous() for n in ("k_cache", "v_cache")
        },
        ValueError,
        "PAGE",
    ),
    "context_lens_strided": (
        lambda a, impl, dev: dict(context_lens=int32_tensor(dev, 20, 99, 5, 99)[::2]),
        ValueError,
        "context_lens",
    ),
    "block_tables_columns_strided": (
        lambda a, impl, dev: dict(block_tables=a["block_tables"].repeat_interleave(2, 1)[:, ::2]),
        ValueError,
        "block_tables",
    ),
    "live_block_id_past_pool": (
        lambda a, impl, dev: dict(block_tables=with_entry(a["block_tables"], 0, 1, a["k_cache"].shape[0])),
        ValueError,
        r"block_tables\[0, 1\]",
    ),
    "live_block_id_negative": (
        lambda a, impl, dev: dict(block_tables=with_entry(a["block_tables"], 1, 0, -5)),
        ValueError,
        r"block_tables\[1, 0\]",
    ),
    "scale_nan": (lambda a, impl, dev: dict(scale=float("nan")), ValueError, "scale"),
    "scale_inf": (lambda a, impl, dev: dict(scale=float("inf")), ValueError, "scale"),
    "scale_negative": (lambda a, impl, dev: dict(scale=-0.125), ValueError, "scale"),
    "scale_zero": (lambda a, impl, dev: dict(scale=0.0), ValueError, "scale"),
    "v_cache_is_k_cache": (lambda a, impl, dev: dict(v_cache=a["k_cache"]), ValueError, "v_cache"),
    "v_cache_overlaps_k_cache": (
        lambda a, impl, dev: overlapping_caches(a["k_cache"]),
        ValueError,
        "v_cache",
    ),
    "plan_not_a_plan": (lambda a, impl, dev: dict(plan=4), TypeError, "plan"),
    "plan_past_the_table": (
        lambda a, impl, dev: dict(plan=impl.plan([10**6, 5], 2, 16)),
        ValueError,
        "plan.max_len",
    ),
    "plan_too_short": (lambda a, impl, dev: dict(plan=impl.plan([8], 2, 16)), ValueError, "plan"),
    "plan_zero_splits": (
        lambda a, impl, dev: dict(plan=impl.DecodePlan(num_splits=0, chunk=32, max_len=20)),
        ValueError,
        "plan.num_splits",
    ),
    "plan_chunk_not_tiles": (
        lambda a, impl, dev: dict(plan=impl.DecodePlan(num_splits=2, chunk=10, max_len=20)),
        ValueError,
        "plan.chunk",
    ),
    "plan_chunks_too_few": (
        lambda a, impl, dev: dict(plan=impl.DecodePlan(num_splits=1, chunk=16, max_len=20)),
        ValueError,
        "plan",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    case = make_paged_case([20, 5], 4, 2, 64, 16, device=runtime.device, stream=14)
    args = spoiled_call(case, spoil, impl, runtime.device)
    with pytest.raises(error, match=names):
        impl.split_kv_decode(**args)


# name -> (plan()'s arguments, the error, what the message names); plan(context_lens, num_kv_heads, page_size)
BAD_PLANS = {
    "page_size_not_pow2": (([10], 2, 12), {}, ValueError, "page_size"),
    "page_size_bool": (([10], 2, True), {}, TypeError, "page_size"),
    "num_splits_zero": (([10], 2, 16), dict(num_splits=0), ValueError, "num_splits"),
    "num_splits_bool": (([10], 2, 16), dict(num_splits=True), TypeError, "num_splits"),
    "num_splits_float": (([10], 2, 16), dict(num_splits=2.0), TypeError, "num_splits"),
    "num_sms_negative": (([10], 2, 16), dict(num_sms=-5), ValueError, "num_sms"),
    "num_sms_bool": (([10], 2, 16), dict(num_sms=True), TypeError, "num_sms"),
    "num_kv_heads_bool": (([10], True, 16), {}, TypeError, "num_kv_heads"),
    "num_kv_heads_zero": (([10], 0, 16), {}, ValueError, "num_kv_heads"),
    "lengths_float": (([10.5, 3], 2, 16), {}, TypeError, r"context_lens\[0\]"),
    "lengths_float_tensor": ((torch.tensor([10.0, 3.0]), 2, 16), {}, TypeError, "context_lens"),
    "lengths_empty": (([], 2, 16), {}, ValueError, "context_lens"),
    "length_negative": (([10, -1], 2, 16), {}, ValueError, r"context_lens\[1\]"),
}


@pytest.mark.parametrize("name", list(BAD_PLANS))
def test_plan_rejects_bad_arguments(impl, name):
    args, kwargs, error, names = BAD_PLANS[name]
    with pytest.raises(error, match=names):
        impl.plan(*args, **kwargs)


def test_merge_states_rejects_bad_input(impl, runtime):
    o = torch.zeros(4, 64, device=runtime.device)
    lse = torch.zeros(4, device=runtime.device)
    with pytest.raises(ValueError, match="lse_b"):
        impl.merge_states(o, lse, o, torch.zeros(3, device=runtime.device))
    with pytest.raises(TypeError, match="o_b"):
        impl.merge_states(o, lse, o.half(), lse)
    with pytest.raises(TypeError, match="lse_a"):
        impl.merge_states(o, lse.half(), o, lse)
    with pytest.raises(ValueError, match="D"):
        impl.merge_states(o[:, :48], lse, o[:, :48], lse)


def test_tolerance_rejects_zeros(runtime):
    """Not a test of your kernel: the comparison fails an all-zeros output."""
    case = make_paged_case([37, 20], 8, 2, 64, 16, device=runtime.device, stream=15)
    ref, _ = paged_attention_reference(*case.args)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None


# --- A guard kept from the reference contains what it records ------------------------------------

# Section 3.7's bad values (drills/tests/guards_f1_split_kv_decode.py) on both paths: a length past the
# row, a block id of -1 on each gathering path, a length past the plan, and merge_states given NaN or +inf.
KEPT_GUARD_CASES = (
    "context_len_one_past_the_row_1_split",
    "block_id_-1_1_split",
    "context_len_one_past_the_row_2_splits",
    "block_id_-1_2_splits",
    "context_len_past_the_plan_2_splits",
    "block_id_-1_pages_of_4_2_splits",
    "merge_states_lse_a_nan",
    "merge_states_lse_b_plus_inf",
)


def _outputs(plain):
    return tuple(torch.tensor(values, dtype=getattr(torch, dtype)) for dtype, values in plain)


def test_a_kept_guard_contains_what_it_records(impl, runtime):
    """Section 3.7's bad device values, with check=False as an engine calls on a GPU, through your file.
    Your kernels need no guard, and a value they do not record says nothing here. A guard kept from the
    reference that records a value must contain it as the reference does: the row it reaches stores
    zeros with lse -inf, every other row is what the valid call gave, and nothing is read outside the
    tensors. Merged, a split that met a bad block id hands the merge lse = +inf: m = +inf, the row's sum is
    zeroed, and a merged lse not masked where the sum is 0 stores inf + log(0) = NaN (a padding row, whose
    m is -inf, still gets -inf without the mask, so no valid case sees it)."""
    cases = {c.name: c for c in guards_f1_split_kv_decode.cases("cpu")}
    results = probe(impl, guards_f1_split_kv_decode.contained, runtime.device, KEPT_GUARD_CASES)
    for name, recorded, raised, valid, bad in results:
        if recorded is None:
            continue  # no guard fired for this value: the lesson asks for none
        case = cases[name]
        assert raised is None, (
            f"{name}: your guard recorded the bad value ({recorded}), and the call still raised: {raised}"
        )
        assert case.argument in recorded, (
            f"{name}: your guard recorded {recorded!r}, which does not name {case.argument}, the bad argument"
        )
        try:
            case.compare(_outputs(valid), _outputs(bad))
        except AssertionError as failed:
            raise AssertionError(
                f"{name}: your guard recorded the bad value ({recorded}) but did not contain it, as "
                f"section 3.7 does: {failed}"
            ) from None


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


@pytest.mark.parametrize("splits", [1, 2])
def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime, splits):
    """70,000 sequences in one decode step: more than the 65535 programs CUDA allows on grid axes 1 and
    2 (axis 0 allows 2**31 - 1), so sequences belong on axis 0, in the split kernel and in the merge
    (splits = 2). A grid with sequences on axis 1 or 2 launches on the CPU and fails on a GPU with
    "invalid argument". Run dry (every launch recorded and checked, none run), without the value
    checks, which the other tests cover."""
    q, k_cache, v_cache, block_tables, context_lens = _many_short_sequences(runtime.device)
    decode_plan = impl.plan(context_lens, 1, k_cache.shape[1], num_splits=splits)
    assert_grids_fit(
        impl,
        lambda: impl.split_kv_decode(
            q, k_cache, v_cache, block_tables, context_lens, plan=decode_plan, return_lse=True, check=False
        ),
        f"split_kv_decode of 70,000 sequences in {splits} split(s)",
    )


# --- Stages: merge, then fixed splits, then the planner (make test and make progress say which) ------
# Stage 2's checks force their split count through plan(num_splits=k) (or a DecodePlan made here), so
# plan()'s own choice (num_splits=None) is stage 3's alone; a case no pattern names is stage 3's.

STAGES = [
    Stage(
        "merge",
        (
            "test_merge_states_*",
            "test_library_base2_lse_merged_after_times_ln2",
            "test_tolerance_rejects_zeros",
        ),
        "merge_states: two states merged into the softmax over their union, shifted by the max (lse near "
        "+-200), empty parts (lse = -inf), strided views, fp16 outputs",
    ),
    Stage(
        "fixed splits",
        (
            "test_every_split_count_matches_unsplit",
            "test_empty_splits_do_not_divide_zero_by_zero",
            "test_many_splits_merge_with_rescale",
            "test_split_merge_shifts_by_the_max",
            "test_max_starts_at_minus_inf",
            "test_running_max_never_falls",
            "test_q_strides_are_used",
            "test_table_rows_are_read_through_their_stride",
            "test_cache_strides_are_used",
            "test_v_is_read_through_its_own_strides",
            "test_widest_head_dim_is_read_whole",
            "test_lse_is_natural_log",
            "test_lse_not_stored_unless_asked[unsplit]",
            "test_splits_filling_whole_merge_tiles",
            "test_last_page_is_masked",
            "test_kv_head_grouping_is_contiguous",
            "test_page_sizes_gathered_token_by_token",
            "test_dtypes",
            "test_page_index_widened_to_int64",
            "test_runs_a_triton_kernel",
            "test_launcher_rejects_bad_input",
            "test_padding_sequences_give_zero_and_lse_minus_inf",
            "test_a_kept_guard_contains_what_it_records",
        ),
        "split_kv_kernel and merge_splits_kernel with the split count forced through plan(num_splits=k): "
        "every count equals unsplit, empty splits, the merge's shift and rescale, L2's masks and pages",
    ),
    Stage(
        "planner",
        (
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_splits_only_when_the_grid_is_starved",
            "test_plan_rejects_bad_arguments",
            "test_plan_of_padding_sequences_has_one_split",
            "test_plan_skips_none_of_its_rules",
            "test_shared_and_shuffled_pages_single_sequence",
            "test_launcher_rejects_bad_input[plan_too_short]",
            "test_launcher_rejects_bad_input[plan_past_the_table]",
        ),
        "plan() choosing on its own (num_splits=None): split only when B * Hkv programs cannot fill the "
        "GPU, in chunks of at least MIN_CHUNK tokens, never an empty split",
    ),
]


# --- Diagnosis: which pitfall of section 6 a pattern of results points at ------------------------
# Narrow mistakes fail their own check and pass test_every_split_count_matches_unsplit; the broad ones
# are told apart by what they still get right (unsplit runs, merge_states, one page size or another).

EVERY_SPLIT = "test_every_split_count_matches_unsplit"
MISTAKES = [
    Mistake(
        35,
        # The last count of plan() without its floor of 1: cdiv(0, chunk) = 0 splits for a batch of
        # padding sequences, which the launcher then refuses (or a grid of 0 programs leaves out unwritten).
        fails=("test_plan_of_padding_sequences_has_one_split",),
        messages=(r"padding sequences planned 0 splits",),
        question="Every context_lens is 0: what is cdiv(max_len, chunk), and how many programs does a grid "
        "with that many splits launch?",
        section="4",
    ),
    Mistake(
        30,
        # A guard kept from the reference whose merge stores m + ln(w_sum) unmasked: inf + ln 0 = NaN for a
        # row a split poisoned, where -inf belongs; every valid case passes (a padding row gets -inf).
        fails=("test_a_kept_guard_contains_what_it_records",),
        passes=(EVERY_SPLIT, "test_padding_sequences_give_zero_and_lse_minus_inf"),
        messages=(r"did not contain it[^\n]*lse of invalid rows",),
        question="A split met a bad block id and stored lse = +inf: after the merge's guard zeroes the row's "
        "sums, what does your merged lse store for that row, and where is it masked?",
        section="3.7",
    ),
    Mistake(
        26,
        # Rows GROUP .. GROUP_PAD - 1 of q loaded without the group mask: never stored, so every value is
        # right, but past the last KV head they read beyond q, which the harness reports.
        fails=(EVERY_SPLIT, "test_last_page_is_masked", "test_kv_head_grouping_is_contiguous"),
        passes=(
            "test_merge_states_equals_one_shot_softmax",
            "test_merge_states_is_associative_and_handles_empty_parts",
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_of_padding_sequences_has_one_split",
        ),
        messages=(r"out of bounds load of q_ptr",),
        question="GROUP = 4 pads to GROUP_PAD = 16 rows: which query heads do rows 4 to 15 name for the "
        "last KV head, and does your q load mask them?",
        section="3.1",
    ),
    Mistake(
        24,
        fails=("test_plan_splits_only_when_the_grid_is_starved",),
        passes=(
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_of_padding_sequences_has_one_split",
        ),
        question="128 sequences and 8 KV heads on 132 SMs: how many programs does the grid have before any "
        "split, and what does your plan() divide 4 x 132 by?",
        section="4",
    ),
    Mistake(
        25,
        fails=("test_plan_skips_none_of_its_rules",),
        messages=(r"section 4 aims at 4 x",),
        passes=(
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_splits_only_when_the_grid_is_starved",
        ),
        question="One sequence, 8 KV heads, num_sms=16: how many programs does section 4 aim at, and "
        "where does your plan() read the number of SMs from?",
        section="4",
    ),
    Mistake(
        25,
        fails=("test_plan_skips_none_of_its_rules",),
        messages=(r"chunks of at least MIN_CHUNK = 64 tokens allow",),
        passes=(
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_splits_only_when_the_grid_is_starved",
        ),
        question="1000 tokens, 8 KV heads, 132 SMs: how many splits does rule 1 give, and which rule caps "
        "them at cdiv(1000, 64)?",
        section="4",
    ),
    Mistake(
        25,
        fails=("test_plan_skips_none_of_its_rules",),
        messages=(r"the longest of a ragged batch sets",),
        passes=(
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_splits_only_when_the_grid_is_starved",
        ),
        question="Lengths 5, 3000, 0 and 17 with 2 KV heads: which sequence's length decides how many "
        "splits the batch needs, and which one does your plan() read?",
        section="4",
    ),
    Mistake(
        25,
        fails=("test_plan_skips_none_of_its_rules",),
        messages=(r"a forced count is cut only",),
        passes=(
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_splits_only_when_the_grid_is_starved",
        ),
        question="num_splits=7 over 100 tokens: which of section 4's rules apply to a forced count, and "
        "does MIN_CHUNK?",
        section="4",
    ),
    Mistake(
        13,
        fails=("test_merge_states_is_associative_and_handles_empty_parts",),
        passes=("test_merge_states_equals_one_shot_softmax",),
        messages=(r"both parts empty",),
        question="Both parts of a row are empty, lse_a = lse_b = -inf: what is your max m, and what is "
        "exp(lse_a - m)?",
        section="3.5",
    ),
    Mistake(
        8,
        # The split ends at the end of ctx's page, not at ctx: the page's stale tail (NaN in the grader's
        # pool) leaves l = NaN, which the empty-split rule stores as 0. Pages of one token have no tail.
        fails=("test_last_page_is_masked", EVERY_SPLIT),
        passes=("test_page_sizes_gathered_token_by_token[1]", "test_merge_states_equals_one_shot_softmax"),
        question="Pages of one token pass and every larger page fails: where does your split's last tile "
        "stop, at ctx or at the end of ctx's page?",
        section="3.1",
    ),
    Mistake(
        14,
        # Masked lanes of a merge tile read with other=0: every count between tiles is off, split ranges
        # look wrong, but a count that fills its tiles passes (pitfall 3's overlaps fail it too).
        fails=(EVERY_SPLIT, "test_split_ranges_cover_each_key_once"),
        passes=(
            "test_lse_is_natural_log",
            "test_last_page_is_masked[1]",
            "test_splits_filling_whole_merge_tiles",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="5 splits and a merge tile of 16: what lse does your merge load for lanes 5 to 15, and "
        "what weight does each of them get?",
        section="3.5",
    ),
    Mistake(
        23,
        # Unsplit, the split kernel's store; split, the merge's: either lands on out (a wrong value, or a
        # write race between the programs that store out and the ones that store lse over it).
        fails=("test_lse_not_stored_unless_asked",),
        passes=("test_lse_is_natural_log", "test_every_split_count_matches_unsplit"),
        question="return_lse=False, one split or two: which tensor does the launcher pass as lse_ptr, and "
        "what do your split and merge kernels store through it?",
        section="3.4",
    ),
    Mistake(
        22,
        fails=("test_table_rows_exactly_full",),
        passes=("test_last_page_is_masked", "test_every_split_count_matches_unsplit"),
        messages=(r"device guard fired|out of bounds load of block_tables",),
        question="A context of 32 with PAGE = 16 in a table of 2 columns: is it a valid length, and which "
        "lengths do your guard and your table loads admit?",
        section="3.7",
    ),
    Mistake(
        1,
        fails=("test_empty_splits_do_not_divide_zero_by_zero",),
        passes=(EVERY_SPLIT,),
        messages=("NaN",),
        question="A split whose token range is empty never enters the loop: what are its l and acc, "
        "and what does acc / l give?",
        section="3.4",
    ),
    Mistake(
        1,
        fails=(
            "test_empty_splits_do_not_divide_zero_by_zero",
            "test_padding_sequences_give_zero_and_lse_minus_inf[one-split]",
        ),
        passes=(EVERY_SPLIT, "test_lse_is_natural_log"),
        question="A split that saw no token: what lse does your kernel store for it, and what weight "
        "does the merge then give its output of 0?",
        section="3.4",
    ),
    Mistake(
        2,
        fails=("test_lse_is_natural_log",),
        messages=(r"out matches, but the returned lse",),
        question="Your kernel works in base 2 (exp2, scores times log2 e): in which base is m_i + "
        "log2(l_i), and in which base must lse be returned?",
        section="3.3",
    ),
    Mistake(
        2,
        # The merge's weights are right (out matches) and its returned lse is not: the log of the weights'
        # sum taken in base 2. Unsplit rows, which the merge does not touch, pass.
        fails=(
            EVERY_SPLIT,
            "test_many_splits_merge_with_rescale",
            "test_empty_splits_do_not_divide_zero_by_zero",
        ),
        passes=(
            "test_lse_is_natural_log",
            "test_split_ranges_cover_each_key_once",
            "test_plan_never_returns_empty_or_zero_splits",
        ),
        messages=(r"out matches, but the returned lse",),
        question="Merged rows have the right output and the wrong lse, unsplit ones are right: in which base "
        "does your merge take the log of its weights' sum?",
        section="3.5",
    ),
    Mistake(
        2,
        fails=("test_library_base2_lse_merged_after_times_ln2", "test_merge_states_equals_one_shot_softmax"),
        passes=("test_lse_is_natural_log", EVERY_SPLIT),
        question="merge_states gets its lse in natural log, as torch.logsumexp gives it: in which base do "
        "your weights and your returned lse work, if you use exp2 and log2 there?",
        section="3.5",
    ),
    Mistake(
        27,
        # Every split of a head stores its lse in slot 0: unsplit runs are right, and every merge weighs
        # its splits by slots nobody wrote (NaN in fresh memory). Pitfall 3's ranges give no NaN.
        fails=(EVERY_SPLIT, "test_split_ranges_cover_each_key_once"),
        passes=(
            "test_lse_is_natural_log",
            "test_lse_not_stored_unless_asked[unsplit]",
            "test_last_page_is_masked[1]",
        ),
        messages=(r"NaN",),
        question="4 splits: at which element of the partial lse does split 2 of head 1 store its lse, and "
        "which elements does the merge read for that head?",
        section="3.5",
    ),
    Mistake(
        3,
        fails=(EVERY_SPLIT, "test_split_ranges_cover_each_key_once"),
        passes=("test_lse_is_natural_log", "test_last_page_is_masked[1]"),
        question="Unsplit is right and some split counts are not: with chunk = 48 and ctx = 100, which "
        "tokens does each of your splits read, and is any read twice or never?",
        section="2",
    ),
    Mistake(
        4,
        fails=("test_merge_states_lse_beyond_fp32_exp_range",),
        passes=("test_merge_states_equals_one_shot_softmax",),
        messages=(r"NaN|nan",),  # e^lse overflows: this lesson's own exponential without its max shift
        question="Both parts have lse near +200 (or -200): what is e^200 in fp32, and what do you "
        "subtract from each lse before the exp so that nothing overflows?",
        section="2",
    ),
    Mistake(
        4,
        fails=("test_merge_states_lse_beyond_fp32_exp_range",),
        passes=("test_merge_states_equals_one_shot_softmax",),
        question="Both parts have lse near +200 (or -200): what is e^200 in fp32, and what do you "
        "subtract from each lse before the exp so that nothing overflows?",
        section="2",
    ),
    Mistake(
        4,
        fails=("test_split_merge_shifts_by_the_max",),
        passes=(EVERY_SPLIT, "test_empty_splits_do_not_divide_zero_by_zero"),
        messages=(r"NaN|nan",),  # e^lse overflows: this lesson's own exponential without its max shift
        question="Every split's lse is above 128 here: what is e^lse in fp32, and what does the split "
        "merge subtract from each lse before the exp?",
        section="3.5",
    ),
    Mistake(
        4,
        fails=("test_split_merge_shifts_by_the_max",),
        passes=(EVERY_SPLIT, "test_empty_splits_do_not_divide_zero_by_zero"),
        question="Every split's lse is above 128 here: what is e^lse in fp32, and what does the split "
        "merge subtract from each lse before the exp?",
        section="3.5",
    ),
    Mistake(
        5,
        fails=("test_page_sizes_gathered_token_by_token[1]",),
        passes=("test_page_sizes_gathered_token_by_token[16]", "test_page_sizes_gathered_token_by_token[64]"),
        question="With PAGE = 4, how many pages does one 16-token tile span, and how many block-table "
        "entries does your kernel read for it?",
        section="3.2",
    ),
    Mistake(
        5,
        # A page size under the tile other than 1 (PAGE = 8 on the one-page-per-tile path): pages of 16
        # and 64 pass, and so does every case at PAGE = 16. The int64 check's pages are small too.
        fails=("test_page_sizes_gathered_token_by_token",),
        passes=(
            "test_page_sizes_gathered_token_by_token[16]",
            "test_page_sizes_gathered_token_by_token[64]",
            EVERY_SPLIT,
        ),
        question="With PAGE = 8, how many pages does one 16-token tile span, and which path of your kernel "
        "reads its block-table entries?",
        section="3.2",
    ),
    Mistake(
        6,
        fails=("test_many_splits_merge_with_rescale",),
        passes=(
            EVERY_SPLIT,
            "test_empty_splits_do_not_divide_zero_by_zero",
            "test_merge_reads_every_tile_of_splits",
        ),
        question="More than 64 splits are merged in groups: when a later group has a larger lse, what "
        "happens to the running sum of the earlier groups' weights?",
        section="3.5",
    ),
    Mistake(
        33,
        # Rows GROUP .. GROUP_PAD - 1 stored without the group mask: they land on the next KV head's heads
        # (a write race with that head's program) and past out's last head.
        fails=(
            EVERY_SPLIT,
            "test_last_page_is_masked",
            "test_kv_head_grouping_is_contiguous",
            "test_page_sizes_gathered_token_by_token",
        ),
        passes=(
            "test_merge_states_equals_one_shot_softmax",
            "test_merge_states_is_associative_and_handles_empty_parts",
            "test_plan_never_returns_empty_or_zero_splits",
            "test_plan_of_padding_sequences_has_one_split",
        ),
        messages=(r"write race|out of bounds store",),
        question="GROUP = 4 pads to GROUP_PAD = 16 rows: which query heads do rows 4 to 15 name, and does "
        "your store of o mask them?",
        section="3.1",
    ),
    Mistake(
        34,
        # A plan kept from an earlier call for the same context_lens buffer: its lengths are the old ones.
        fails=("test_shared_and_shuffled_pages_single_sequence",),
        passes=(EVERY_SPLIT, "test_plan_splits_only_when_the_grid_is_starved"),
        messages=(r"a second call, same context_lens buffer",),
        question="The same context_lens tensor holds [16, 5] at one call and [100, 70] at the next, "
        "plan=None both times: from which lengths is your second call's plan made?",
        section="3.6",
    ),
    Mistake(
        32,
        # The split's running max taken of each key tile alone: right while scores rise (the tile's max is
        # then the running one) and with splits of one tile; falling scores overflow alpha to inf.
        fails=("test_running_max_never_falls",),
        passes=(
            EVERY_SPLIT,
            "test_many_splits_merge_with_rescale",
            "test_max_starts_at_minus_inf",
            "test_split_merge_shifts_by_the_max",
        ),
        messages=(r"NaN/inf values",),
        question="Scores are +60 in the first key tile and -60 after it: what is your running max after the "
        "second tile, and what alpha then rescales the first tile's sum?",
        section="3.3",
    ),
    Mistake(
        31,
        # The merge's max taken from each tile alone: out stays right (the rescale is consistent), and the
        # lse is measured from the last tile's max, -inf after a tile of empty splits.
        fails=("test_many_splits_merge_with_rescale",),
        passes=(
            EVERY_SPLIT,
            "test_empty_splits_do_not_divide_zero_by_zero",
            "test_merge_reads_every_tile_of_splits",
        ),
        messages=(r"out matches, but the returned lse does not:\s+\d+ NaN/inf values",),
        question="80 splits in tiles of 64, and only splits 0 to 6 hold tokens: what is your merge's max "
        "after the second tile, and what lse does it then store?",
        section="3.5",
    ),
    Mistake(
        7,
        fails=("test_kv_head_grouping_is_contiguous[group4]",),
        passes=(
            "test_kv_head_grouping_is_contiguous[group1-MHA]",
            "test_kv_head_grouping_is_contiguous[group32-MQA]",
        ),
        question="Only the cases with 1 < GROUP < Hq fail: with Hq = 32 and Hkv = 8, which KV head "
        "should query head 13 read, and which one does your kernel give it?",
        section="3.1",
    ),
    Mistake(
        7,
        fails=("test_kv_head_grouping_is_contiguous[group3]",),
        passes=(
            "test_kv_head_grouping_is_contiguous[group2]",
            "test_kv_head_grouping_is_contiguous[group4]",
            EVERY_SPLIT,
        ),
        question="Every power-of-two group passes and GROUP = 3 does not: with Hq = 9 and Hkv = 3, which "
        "query heads does KV head 1 own, and what GROUP does your kernel receive?",
        section="3.1",
    ),
    Mistake(
        8,
        fails=("test_last_page_is_masked", EVERY_SPLIT),
        # The tokens past the split's end read table entries past the context: stale pages (NaN), past
        # the table (out of bounds), or ids outside the pool, which the reference's guard stops.
        messages=(r"NaN|out of bounds|device guard fired.*block_tables",),
        question="A split ends at min((s + 1) * chunk, ctx): does your mask stop the last tile at the "
        "split's end, or load the tokens after it?",
        section="3.1",
    ),
    Mistake(
        9,
        fails=("test_page_index_widened_to_int64",),
        passes=(EVERY_SPLIT, "test_page_sizes_gathered_token_by_token"),
        question="Only block ids past 2**31 / stride_kb fail: in which integer type is the block id "
        "multiplied by the page stride in your kernel?",
        section="3.2",
    ),
    Mistake(
        10,
        fails=("test_q_strides_are_used",),
        passes=(EVERY_SPLIT, "test_lse_is_natural_log", "test_empty_splits_do_not_divide_zero_by_zero"),
        question="q is a view here (every other head of a bigger buffer): how far apart are two query "
        "heads in memory, and what does your kernel step by?",
        section="3.1",
    ),
    Mistake(
        11,
        fails=("test_max_starts_at_minus_inf",),
        passes=(EVERY_SPLIT, "test_split_merge_shifts_by_the_max"),
        question="Every score is about -128 here: what is your running max after the first tile, if it "
        "starts at 0, and what is exp2 of the scores minus it?",
        section="3.3",
    ),
    Mistake(
        29,
        # merge_states' grid of R // 16 programs: 37 rows leave 5 as allocated (NaN); 16 and 8 rows pass.
        fails=("test_merge_states_equals_one_shot_softmax",),
        passes=(
            EVERY_SPLIT,
            "test_library_base2_lse_merged_after_times_ln2",
            "test_merge_states_fp16_outputs",
        ),
        messages=(r"NaN",),
        question="37 rows in tiles of 16: how many programs does your merge_states launch, and which rows "
        "does no program merge?",
        section="3.5",
    ),
    Mistake(
        7,
        # GROUP_PAD fixed at 16: a group of 32 (MQA) computes and stores its first 16 heads only.
        fails=("test_kv_head_grouping_is_contiguous[group32-MQA]",),
        passes=(
            "test_kv_head_grouping_is_contiguous[group4]",
            "test_kv_head_grouping_is_contiguous[group3]",
            EVERY_SPLIT,
        ),
        question="Hq = 32 and Hkv = 1: how many rows does your tile hold for the group of 32 heads, and "
        "which heads are never stored?",
        section="3.1",
    ),
    Mistake(
        28,
        fails=("test_merge_states_of_batched_heads_at_the_widest_head_dim",),
        passes=("test_merge_states_equals_one_shot_softmax", "test_merge_states_reads_strided_views"),
        question="o_a is [3, 7, 256] and lse_a [3, 7]: how many rows does your merge_states merge, and how "
        "many features of each row?",
        section="3.5",
    ),
    Mistake(
        12,
        fails=("test_merge_states_reads_strided_views",),
        passes=("test_merge_states_equals_one_shot_softmax",),
        question="merge_states_kernel finds row r at r * D: where does row r of a strided view really "
        "start, and what must the launcher give the kernel?",
        section="3.5",
    ),
    Mistake(
        13,
        fails=("test_padding_sequences_give_zero_and_lse_minus_inf[merged]",),
        passes=("test_padding_sequences_give_zero_and_lse_minus_inf[one-split]", EVERY_SPLIT),
        question="Every split of a padding sequence is empty, so every lse the merge reads is -inf: what "
        "is the merge's running max then, and what is exp(lse - m)?",
        section="3.5",
    ),
    Mistake(
        14,
        fails=("test_merge_reads_every_tile_of_splits",),
        passes=(EVERY_SPLIT,),
        question="With 65 splits and a merge tile of 64, which splits does your merge read, and which "
        "does it never load?",
        section="3.5",
    ),
    Mistake(
        15,
        fails=(EVERY_SPLIT,),
        passes=(
            "test_split_ranges_cover_each_key_once",
            "test_lse_is_natural_log",
            "test_last_page_is_masked[1]",
            "test_plan_never_returns_empty_or_zero_splits",
        ),
        question="Two splits, one whose keys score far higher than the other's: should their partial "
        "outputs count equally in the merge, and what tells the merge how much each weighs?",
        section="2",
    ),
    Mistake(
        16,
        fails=("test_plan_never_returns_empty_or_zero_splits",),
        messages=(r"not a whole number of 16-token tiles",),
        question="max_len = 100 and 3 splits: what chunk does your plan() give, and where does the "
        "second split's first 16-token tile start?",
        section="4",
    ),
    Mistake(
        16,
        fails=("test_plan_never_returns_empty_or_zero_splits",),
        messages=(r"splits where at most \d+ were asked",),
        question="max_len = 100 and at most 3 splits: how many tiles does a chunk of floor(7 / 3) = 2 tiles "
        "leave uncovered, and how many splits does your plan() then need?",
        section="4",
    ),
    Mistake(
        17,
        fails=("test_sequence_index_widened_to_int64",),
        passes=(EVERY_SPLIT, "test_q_strides_are_used", "test_page_index_widened_to_int64"),
        question="Row 2 of q starts 3 * 2**30 elements in: in which integer type does your kernel compute "
        "b * stride_qb?",
        section="3.1",
    ),
    Mistake(
        18,
        fails=("test_out_keeps_the_range_of_its_dtype[bf16]",),
        passes=("test_out_keeps_the_range_of_its_dtype[fp16]", "test_dtypes[fp16]"),
        question="Your fp16 cases pass and your bf16 ones do not: which dtype does your kernel store its "
        "output in, and what does fp16 make of a bf16 output of 65536?",
        section="3.3",
    ),
    Mistake(
        19,
        fails=("test_table_rows_are_read_through_their_stride",),
        passes=(EVERY_SPLIT, "test_q_strides_are_used", "test_last_page_is_masked"),
        question="block_tables is a view of a wider table here: how far apart are its rows, and what does "
        "your launch pass the kernel for that distance?",
        section="3.2",
    ),
    # One sequence (EVERY_SPLIT) passes whatever out's row stride: only sequence 1 on lands elsewhere.
    Mistake(
        19,
        fails=("test_last_page_is_masked",),
        passes=(EVERY_SPLIT,),
        messages=(r"canary elements of the buffer around out",),
        question="One sequence passes and two overwrite the canary around out: out is a view into a wider "
        "buffer, so how far apart are its rows, and which distance does your launch pass for them?",
        section="3.1",
    ),
    Mistake(
        20,
        fails=("test_v_is_read_through_its_own_strides",),
        # K's token stride steps past V's real slots into the NaN that poisons every stale one.
        messages=(r"\bNaN\b",),
        passes=(EVERY_SPLIT, "test_cache_strides_are_used", "test_q_strides_are_used"),
        question="v_cache's token and head strides differ from k_cache's here: which strides does your "
        "launch pass the kernel for V?",
        section="3.2",
    ),
    Mistake(
        21,
        fails=("test_widest_head_dim_is_read_whole",),
        passes=(EVERY_SPLIT, "test_page_index_widened_to_int64", "test_dtypes"),
        question="D = 256 here: how many features does your kernel's tl.arange over the head dim cover, and "
        "who writes features 128 to 255 of out?",
        section="3.2",
    ),
    Mistake(
        20,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, PAGE, heads, lengths, dtype, layouts and plan; which of these does your kernel handle only one "
        "at a time (a stride taken from another tensor, a tile sized for another D or PAGE)?",
        section="3.2",
    ),
]
