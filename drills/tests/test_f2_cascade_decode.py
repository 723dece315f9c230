"""Grader for F2, cascade attention over a paged KV cache. Each test is named for the mistake it catches.

Run: make test L=f2 (your drills/mine) or make test L=f2 IMPL=solutions. Caches are poisoned as in L2
(NaN past every sequence's end and in unused blocks, garbage block ids past every last page), and the
pages a group's later members gave up for the shared ones are NaN too: a suffix that starts too early,
or a prefix read from a member's own first pages, reads them.
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
    guards_f2_cascade_decode,
    keys_past_fp16_range,
    seeded,
    sizes,
)
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import (
    HEAD_DIMS,
    KV_LAYOUTS,
    PAGED_BAD_INPUTS,
    Q_LAYOUTS,
    SHARED_KV_BAD_INPUTS,
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
    paged_attention_reference,
    pool_past_int32,
    q_rows_far_apart,
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
    "BLOCK_N": (
        "test_every_prefix_chunk_count_matches",
        "test_every_suffix_split_count_matches",
        "test_page_sizes",
    ),
    "BLOCK_S": (
        "test_merge_reads_every_tile_of_slots",
        "test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",
    ),
    "CASCADE": ("test_worked_example_three_requests", "test_fallback_equals_split_kv"),
    "D": ("test_widest_head_dim_is_read_whole", "test_merge_states_equals_one_shot_softmax"),
    "GROUP": ("test_prefix_tile_rows_map_to_heads",),
    "GROUP_PAD": ("test_prefix_tile_rows_map_to_heads", "test_gqa_group_wider_than_a_tile"),
    "MEMBERS": ("test_members_one_past_the_tile", "test_group_of_64_members"),
    "PAGE": (
        "test_suffix_starts_after_the_prefix",
        "test_page_sizes",
    ),
    "ROWS": (
        "test_prefix_tile_rows_map_to_heads",
        "test_group_of_64_members",
        "test_gqa_group_wider_than_a_tile",
    ),
    "WRITE_LSE": (  # with and without: out stands in for the lse pointer when lse is not asked for
        "test_lse_is_natural_log",
        "test_equals_paged_decode",
    ),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}

DIMS = ("b", "head", "d")
LOG2E, LN2 = 1 / math.log(2), math.log(2)

# What cascade_decode admits, at its boundaries (drills/validate.py's limits and the planner's, so the
# domain cannot drift from the launcher): test_pairwise_domain_cases_match_the_oracle crosses every pair.
_D_LO, _D_HI = validate.HEAD_DIM_RANGE


def _prefix(PAGE):  # a shared prefix of at least one 16-token tile, a multiple of PAGE
    return max(PAGE, 16)


# Group patterns, each (lens, prefix_group, prefix_lens) for a page size: every length the docstring
# admits, 0 included (a zero-length prefix, a padding sequence outside every group).
GROUPINGS_BY_PAGE = {
    # a group beside a sequence in no group and a padding sequence (in no group either)
    "shared_ungrouped_padding": lambda P: (
        [_prefix(P) + 3, _prefix(P) + 9, 9, 0],
        [0, 0, -1, -1],
        [_prefix(P)],
    ),
    "zero_length_prefix": lambda P: ([P + 3, 5, 7], [0, 0, 0], [0]),
    "two_groups": lambda P: (
        [_prefix(P) + 1, _prefix(P) + 5, _prefix(P), _prefix(P) + 7],
        [0, 0, 1, 1],
        [_prefix(P)] * 2,
    ),
}
DOMAIN = Domain(
    axes=dict(
        D=(_D_LO, _D_HI),  # the narrowest and the widest head dim: one D tile of 256
        PAGE=(1, 16, 32),  # token by token below a tile's width, one page per tile from it on
        heads=((2, 2), (9, 3), (17, 1)),  # (Hq, Hkv): MHA, GROUP 3, MQA with GROUP 17 > a tile of 16 rows
        groups=tuple(GROUPINGS_BY_PAGE),
        dtype=(torch.float16, torch.bfloat16),
        q=Q_LAYOUTS,  # contiguous, strided, rows 1.5 * 2**30 elements apart
        kv=KV_LAYOUTS,
        table=TABLE_LAYOUTS,
        plan=("planner", "no_cascade", "cascade_cut"),  # cascade_cut: 2 prefix chunks, 2 suffix splits
    ),
    rules=(V_UNLIKE_K_NEEDS_TWO_STRIDES,),
    limits=dict(
        head_dims=HEAD_DIMS,
        pages=tuple(2**i for i in range(8)),  # PAGE from 1 to 128; below 16 a tile gathers token by token
        tile_tokens=16,  # BLOCK_N: the keys a stage scores at once; smaller pages are gathered per token
        merge_tile=64,  # the reference merge reads at most 64 slots (prefix chunks + suffix splits) at a time
    ),
)


def cascade_case(
    lens, groups, plens, Hq=8, Hkv=2, D=64, PAGE=16, dtype=torch.float16, device="cpu", stream=0, **pool
):
    """A paged case whose sequences in group g share the first plens[g] tokens: the later members' table
    entries point at the first member's pages, and the pages they had there are poisoned (NaN).
    pool: make_paged_case's pool arguments (num_blocks, first_block, sparse).
    Returns (case, prefix_group [B] int32, prefix_lens [G] int32)."""
    case = make_paged_case(lens, Hq, Hkv, D, PAGE, dtype=dtype, device=device, stream=stream, **pool)
    tables = case.block_tables.clone()
    for g, n in enumerate(plens):
        members = [b for b, x in enumerate(groups) if x == g]
        pages = n // PAGE
        for b in members[1:]:
            given_up = tables[b, :pages].long()
            case.k_cache[given_up] = float("nan")
            case.v_cache[given_up] = float("nan")
            tables[b, :pages] = tables[members[0], :pages]
    case.block_tables = tables
    return case, int32_tensor(device, *groups), torch.tensor(plens, dtype=torch.int32, device=device)


def check(impl, case, groups, plens, plan=None, scale=None):
    """Run through a canary-wrapped `out` with return_lse, compare out and lse with the fp32 oracle."""
    lse_box = []

    def call(out):
        o, lse = impl.cascade_decode(
            *case.args, groups, plens, scale=scale, out=out, return_lse=True, plan=plan
        )
        lse_box.append(lse)
        return o

    out = call_with_canary_out(call, case.q)
    ref, ref_lse = paged_attention_reference(*case.args, scale=scale)
    assert_close(out, ref, DIMS)
    lse = lse_box[0]
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape, "lse must be [B, Hq] float32"
    empty = ref_lse == float("-inf")
    assert (lse[empty] == float("-inf")).all(), "a padding sequence's lse (context_lens = 0) must be -inf"
    problem = mismatch(
        lse.masked_fill(empty, 0.0),
        ref_lse.masked_fill(empty, 0.0),
        ("b", "head"),
        atol=2e-3,
        rtol=1e-3,
        rel=1e-3,
    )
    if problem is not None:
        raise AssertionError(f"out matches, but the returned lse does not:\n{problem}")
    return out, lse


def forced(impl, case, groups, plens, **cuts):
    """A cascading plan with the cuts given (members_per_tile, prefix_chunks, suffix_splits)."""
    _, Hq, _ = case.q.shape
    _, PAGE, Hkv, _ = case.k_cache.shape
    return impl.plan(case.context_lens, groups, plens, Hq, Hkv, PAGE, cascade=True, **cuts)


PLAN_FIELDS = (
    "cascade",
    "members_per_tile",
    "tile_seqs",
    "tile_group",
    "prefix_chunks",
    "prefix_chunk",
    "suffix_splits",
    "suffix_chunk",
    "max_prefix",
    "max_suffix",
)


def with_cuts(impl, plan, **fields):
    """A copy of a plan with some fields replaced, bypassing the planner: how the tests force exact cuts."""
    return impl.CascadePlan(**{name: fields.get(name, getattr(plan, name)) for name in PLAN_FIELDS})


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (a zero-length
    prefix with GQA, far-apart q rows at PAGE = 1, V's strides unlike K's under a forced cascade...): a
    kernel right on each bound alone can still be wrong where two meet. A failure names the case."""
    domain = fits_this_machine(DOMAIN, runtime)

    def run(c):
        Hq, Hkv = c["heads"]
        lens, groups, plens = GROUPINGS_BY_PAGE[c["groups"]](c["PAGE"])
        case, pg, pl = cascade_case(
            lens, groups, plens, Hq, Hkv, c["D"], c["PAGE"], c["dtype"], device=runtime.device, stream=403
        )
        case = laid_out(case, runtime, c["q"], c["kv"], c["table"])
        plan = {
            "planner": None,
            "no_cascade": impl.plan(lens, groups, plens, Hq, Hkv, c["PAGE"], cascade=False),
            "cascade_cut": forced(impl, case, pg, pl, prefix_chunks=2, suffix_splits=2),
        }[c["plan"]]
        check(impl, case, pg, pl, plan=plan)

    domain.check_each(domain.cases(stream=403), run)


# --- merge_states -----------------------------------------------------------------------------


def _state(scores, values):
    """(o, lse) of softmax(scores) @ values over the last key axis: scores [R, n], values [R, n, D]."""
    return torch.einsum("rn,rnd->rd", torch.softmax(scores, dim=-1), values), torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("D", [64, validate.HEAD_DIM_RANGE[1]])
def test_merge_states_equals_one_shot_softmax(impl, runtime, D):
    """Two parts far apart (part b 40 above or below part a) merged must equal the softmax over the union.
    A merge that averages the outputs without their lse weights, or in base 2, is off. D = 256 too, the
    widest head dim the lesson admits: a merge made for D up to 128 refuses it or merges half a row."""
    gen = torch.Generator().manual_seed(seeded(11))
    R, dev = 37, runtime.device
    s = torch.randn(R, 30, generator=gen) * 3
    s[:, 10:] += torch.linspace(-40, 40, R)[:, None]
    v = torch.randn(R, 30, D, generator=gen)
    (o_a, lse_a), (o_b, lse_b) = _state(s[:, :10], v[:, :10]), _state(s[:, 10:], v[:, 10:])
    want_o, want_lse = _state(s, v)
    o, lse = impl.merge_states(o_a.to(dev), lse_a.to(dev), o_b.to(dev), lse_b.to(dev))
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def test_merge_states_lse_beyond_fp32_exp_range(impl, runtime):
    """lse near +200 and -200: e^lse overflows or underflows fp32, so the weights must be e^(lse - max)."""
    gen = torch.Generator().manual_seed(seeded(24))
    R, D, dev = 16, 32, runtime.device
    s, v = torch.randn(R, 16, generator=gen) * 2, torch.randn(R, 16, D, generator=gen)
    s_a = s[:, :6] + torch.tensor([200.0] * 8 + [-200.0] * 8)[:, None]
    s_b = s[:, 6:] + torch.tensor([205.0] * 8 + [-190.0] * 8)[:, None]
    (o_a, lse_a), (o_b, lse_b) = _state(s_a, v[:, :6]), _state(s_b, v[:, 6:])
    want_o, want_lse = _state(torch.cat([s_a, s_b], dim=1), v)
    o, lse = impl.merge_states(o_a.to(dev), lse_a.to(dev), o_b.to(dev), lse_b.to(dev))
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


def test_merge_states_handles_empty_parts(impl, runtime):
    """An empty part (lse = -inf, o = 0) changes nothing; two empty parts give 0 and -inf, never NaN."""
    gen = torch.Generator().manual_seed(seeded(12))
    dev = runtime.device
    o_a, lse_a = _state(torch.randn(8, 5, generator=gen), torch.randn(8, 5, 32, generator=gen))
    o_a, lse_a = o_a.to(dev), lse_a.to(dev)
    empty_o, empty_l = torch.zeros_like(o_a), torch.full_like(lse_a, float("-inf"))
    o, lse = impl.merge_states(o_a, lse_a, empty_o, empty_l)
    assert_close(o, o_a, ("row", "d"), atol=1e-6, rtol=1e-6, rel=1e-6)
    assert_close(lse, lse_a, ("row",), atol=1e-6, rtol=1e-6, rel=1e-6)
    o, lse = impl.merge_states(empty_o, empty_l, empty_o, empty_l)
    assert not torch.isnan(o).any() and (o == 0).all() and (lse == float("-inf")).all(), "both parts empty"


def test_merge_states_reads_strided_views(impl, runtime):
    """o_a one half of a [R, 2, D] buffer, lse_b a column of a [R, 3] one, NaN around them."""
    gen = torch.Generator().manual_seed(seeded(25))
    R, D, dev = 12, 32, runtime.device
    s, v = torch.randn(R, 16, generator=gen) * 3, torch.randn(R, 16, D, generator=gen)
    (o_a, lse_a), (o_b, lse_b) = _state(s[:, :7], v[:, :7]), _state(s[:, 7:], v[:, 7:])
    o_a_view = torch.full((R, 2, D), float("nan"), device=dev)[:, 1]
    lse_b_view = torch.full((R, 3), float("nan"), device=dev)[:, 2]
    o_a_view.copy_(o_a)
    lse_b_view.copy_(lse_b)
    o, lse = impl.merge_states(o_a_view, lse_a.to(dev), o_b.to(dev), lse_b_view)
    want_o, want_lse = _state(s, v)
    assert_close(o, want_o, ("row", "d"), atol=1e-4, rtol=1e-4, rel=1e-4)
    assert_close(lse, want_lse, ("row",), atol=1e-4, rtol=1e-5, rel=1e-5)


MERGE_BAD_INPUTS = {
    "lse_a_nan": (
        lambda o, l: dict(
            lse_a=l.clone().index_fill_(0, torch.tensor([3], device=l.device), float("nan")), check=True
        ),
        ValueError,
        r"lse_a\[3\]",
    ),
    "lse_b_plus_inf": (
        lambda o, l: dict(
            lse_b=l.clone().index_fill_(0, torch.tensor([5], device=l.device), float("inf")), check=True
        ),
        ValueError,
        r"lse_b\[5\]",
    ),
    "lse_a_float16": (lambda o, l: dict(lse_a=l.half()), TypeError, "lse_a"),
    "o_b_other_dtype": (lambda o, l: dict(o_b=o.double()), TypeError, "o_b"),
    "o_b_other_shape": (lambda o, l: dict(o_b=o[:-1]), ValueError, "o_b"),
    "lse_b_other_length": (lambda o, l: dict(lse_b=l[:-1]), ValueError, "lse_b"),
}


@pytest.mark.parametrize("name", list(MERGE_BAD_INPUTS))
def test_merge_states_rejects_bad_input(impl, runtime, name):
    """A NaN or +inf lse is no state of any key set (check=True, as on the CPU by default, names it before
    the launch), nor is an lse of the wrong dtype or length, or two outputs that differ in shape or dtype."""
    o, lse = torch.randn(8, 32, device=runtime.device), torch.randn(8, device=runtime.device)
    args = dict(o_a=o, lse_a=lse, o_b=o.clone(), lse_b=lse.clone())
    spoil, error, names = MERGE_BAD_INPUTS[name]
    args.update(spoil(o, lse))
    with pytest.raises(error, match=names):
        impl.merge_states(**args)


# --- The prefix and suffix stages, cut as the test says ------------------------------------------


def test_worked_example_three_requests(impl, runtime):
    """Section 2's case: three requests share 8 tokens (PAGE = 4, two pages) and hold 2, 3 and 5 of
    their own. One tile of rows attends the two shared pages; each suffix starts at token 8."""
    case, groups, plens = cascade_case(
        [10, 11, 13], [0, 0, 0], [8], 4, 1, 64, 4, device=runtime.device, stream=1
    )
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, prefix_chunks=1, suffix_splits=1))


def test_prefix_counted_once(impl, runtime):
    """Every member's suffix must start after the shared prefix: a suffix stage that starts at token 0
    attends the prefix a second time (its pages are in every member's table), and the merge then
    weighs it twice. A prefix of 1 page with one suffix split, one of 4 pages with two."""
    for pages, stream, splits in ((1, 2, 1), (sizes(runtime, 4, 64), 3, 2)):
        n = 16 * pages
        case, groups, plens = cascade_case(
            [n + 5, n + 20, n + 1], [0, 0, 0], [n], device=runtime.device, stream=stream
        )
        check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=splits))


def test_suffix_starts_after_the_prefix(impl, runtime):
    """prefix_lens counts tokens, not pages: with PAGE = 8 and a 24-token prefix the suffix starts at
    token 24 (page 3), not at page 24 or token 3. The pages a member gave up are NaN, so starting early
    reads NaN; starting late drops tokens."""
    case, groups, plens = cascade_case([30, 40, 25], [0, 0, 0], [24], PAGE=8, device=runtime.device, stream=4)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


def test_groups_of_one_member(impl, runtime):
    """A group of one still gets its prefix attended by the prefix stage (its suffix starts after it), in a
    batch where another group has two members."""
    case, groups, plens = cascade_case(
        [20, 37, 35, 50], [0, 1, 1, 2], [16, 32, 48], device=runtime.device, stream=5
    )
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


def test_tiles_hold_one_group(impl, runtime):
    """Two groups of three and of three and two sequences with none (one a padding sequence, context 0),
    two members per tile:
    a tile built from the batch in order would put group 0's last member and group 1's first in one tile
    and attend both to one prefix. Each tile's rows must all be members of its group."""
    lens = [37, 0, 40, 33, 20, 50, 19, 48]
    groups = [0, -1, 1, 0, -1, 1, 0, 1]
    case, pg, pl = cascade_case(lens, groups, [16, 32], device=runtime.device, stream=6)
    check(impl, case, pg, pl, plan=forced(impl, case, pg, pl, members_per_tile=2, suffix_splits=2))


def test_group_with_an_empty_prefix(impl, runtime):
    """prefix_lens = [16, 0]: group 1 shares nothing, which the launcher admits. Its tile still runs
    (an empty range: o = 0, lse = -inf, weighed 0 by the merge); a planner that gives it no tile leaves
    its members' prefix slots unwritten, and the merge reads them. Sequence 2 is in no group."""
    case, groups, plens = cascade_case(
        [40, 33, 25, 30, 21], [0, 0, -1, 1, 1], [16, 0], device=runtime.device, stream=34
    )
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


def test_shared_pages_read_from_the_tiles_first_member(impl, runtime):
    """One group, 1, whose members are sequences 2 and 3: the prefix tile finds the shared pages in its
    first member's table row (row 2), not in row g = 1, which holds sequence 1's own pages. In every
    other one-group case the first member is sequence 0, so the two rows coincide. Group 0
    (prefix_lens[0] = 1024, past every context and past the table's 5 columns) has no member, as when
    an engine keeps a prefix whose requests have all finished: no tile, and its length is never read,
    nor planned for (a plan whose max_prefix counts it is past the table's capacity). Every other case
    has a group 0 with members, which hides a merge that takes group 0 for no group (-1 is none)."""
    case, groups, plens = cascade_case(
        [45, 20, 40, 33], [-1, -1, 1, 1], [1024, 32], device=runtime.device, stream=35
    )
    assert 1024 > case.block_tables.shape[1] * 16  # group 0's prefix: past what a table row holds
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


def test_sequences_in_no_group_start_at_token_0(impl, runtime):
    """Sequence 2 is in no group (prefix_group = -1) and longer than group 0's 32-token prefix: its
    suffix is its whole context. Read as an index, -1 names the last group (Python's prefix_lens[-1]),
    whose prefix length would drop its first 32 tokens."""
    case, groups, plens = cascade_case([50, 40, 45], [0, 0, -1], [32], device=runtime.device, stream=36)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


@pytest.mark.parametrize("cascade", [True, False], ids=["cascade", "fallback"])
def test_table_rows_exactly_full(impl, runtime, cascade):
    """PAGE = 16 in a table of exactly 2 columns: sequences 0 and 1 share a 32-token prefix that fills
    their rows, and sequence 1's context is that prefix alone; sequence 2, in no group, fills the last row
    of the table. context_lens[b] = prefix_lens[g] = max_pages * PAGE is the largest valid length: a guard
    that takes it for one past the row (ctx < max_pages * PAGE) zeroes the sequence, and a read of the
    entry after its last page reads past the end of block_tables."""
    case, groups, plens = cascade_case(
        [32, 32, 32], [0, 0, -1], [32], device=runtime.device, stream=49, max_pages=2
    )
    assert case.block_tables.shape[1] * 16 == 32  # no spare column
    plan = forced(impl, case, groups, plens, suffix_splits=1) if cascade else None
    if not cascade:
        plan = impl.plan(case.context_lens, groups, plens, 8, 2, 16, cascade=False)
    check(impl, case, groups, plens, plan=plan)


@pytest.mark.parametrize("members", [1, 2, 3])
def test_members_one_past_the_tile(impl, runtime, members):
    """A group one member past members_per_tile: its last tile holds one member and padded rows, which
    must be masked (no load through a -1, no store past the tile's members)."""
    n = members + 1
    lens = [20 + 3 * i for i in range(n)]
    case, groups, plens = cascade_case(lens, [0] * n, [16], 6, 2, device=runtime.device, stream=7 + members)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, members_per_tile=members))


def test_group_of_64_members(impl, runtime):
    """64 members of one group, four query heads of one KV head: 256 rows, two tiles of 128 (the planner's
    default), with short suffixes so that the case stays small."""
    lens = [16 + (i % 5) for i in range(64)]
    case, groups, plens = cascade_case(lens, [0] * 64, [16], 4, 1, 16, 16, device=runtime.device, stream=10)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


def test_every_prefix_chunk_count_matches(impl, runtime):
    """A 5-tile prefix (80 tokens) cut into 1 .. 6 chunks (6: one past the tiles, an empty chunk):
    every cut equals the whole; a chunk that reads to the prefix's end, or stops a tile short, does not.
    Then the prefix stage's wider tiles (section 3.7: as many keys as the chunk is a multiple of, up to
    PREFIX_N = 128): a 272-token prefix in chunks of 256, 64 and 32 tokens, the last chunk 16 tokens into
    its tile, and PAGE = 128 with chunks of 256, where each 128-key tile is one page read with one
    block-id load. A tile that assumes 16 keys, stops at a page's end or reads past the prefix's end
    does not match."""
    case, groups, plens = cascade_case([90, 85], [0, 0], [80], 4, 1, device=runtime.device, stream=11)
    for chunks in (1, 2, 3, 5, 6):
        plan = forced(impl, case, groups, plens, prefix_chunks=chunks, suffix_splits=1)
        plan = with_cuts(impl, plan, prefix_chunks=chunks, prefix_chunk=16 * math.ceil(5 / chunks))
        check(impl, case, groups, plens, plan=plan)
    case, groups, plens = cascade_case([300, 290], [0, 0], [272], 4, 1, device=runtime.device, stream=60)
    for chunk in (256, 64, 32):
        plan = forced(impl, case, groups, plens, prefix_chunks=1, suffix_splits=1)
        check(
            impl,
            case,
            groups,
            plens,
            plan=with_cuts(impl, plan, prefix_chunks=-(-272 // chunk), prefix_chunk=chunk),
        )
    case, groups, plens = cascade_case(
        [600, 520], [0, 0], [512], 4, 1, 16, 128, device=runtime.device, stream=61
    )
    plan = forced(impl, case, groups, plens, prefix_chunks=1, suffix_splits=1)
    check(impl, case, groups, plens, plan=with_cuts(impl, plan, prefix_chunks=2, prefix_chunk=256))


def test_every_suffix_split_count_matches(impl, runtime):
    """Suffixes of 0 .. 4 tiles after a 1-page prefix (sequence 1 ends where its prefix ends), cut into
    1 .. 5 splits: an empty suffix or split stores o = 0 and lse = -inf and weighs 0 in the merge."""
    case, groups, plens = cascade_case([80, 16, 40], [0, 0, -1], [16], 4, 1, device=runtime.device, stream=12)
    for splits in (1, 2, 5):
        check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=splits))


def test_merge_reads_every_tile_of_slots(impl, runtime):
    """33 prefix chunks and 32 suffix splits of one tile each: 65 partial states per row, one past the
    merge's widest tile of 64 slots, so the merge must loop over its slots, not read one tile of them.
    The third member's suffix is one tile (544 = 528 + 16 tokens), so its slots 34 to 64 are empty and
    the merge's second tile holds only empty slots: a max taken from each tile alone falls to -inf
    there, and the lse it stores, m + ln(w_sum), is -inf while out still matches."""
    case, groups, plens = cascade_case(
        [1040, 1040, 544], [0, 0, 0], [528], 2, 1, 16, device=runtime.device, stream=26
    )
    plan = forced(impl, case, groups, plens, prefix_chunks=33, suffix_splits=32)
    assert plan.prefix_chunks + plan.suffix_splits == 65, f"{plan}"
    check(impl, case, groups, plens, plan=plan)


def test_merge_rescales_when_a_later_tile_of_slots_raises_the_max(impl, runtime):
    """The 65 slots of test_merge_reads_every_tile_of_slots (one past the merge's widest tile), with
    member 0's scores rising along its context: its last suffix split, alone in the merge's second tile,
    holds the largest lse, so the running max rises there and the sum so far is rescaled by e^(m_old -
    m_new). A merge that takes that one exponential in base 2 (exp2 where the lse is natural) passes
    every case whose max is settled in the first tile."""
    tile = DOMAIN["merge_tile"]
    prefix, suffix = 16 * (tile // 2 + 1), 16 * (tile // 2)  # 33 prefix chunks + 32 splits of one tile
    n = prefix + suffix
    case, groups, plens = cascade_case([n, n], [0, 0], [prefix], 2, 1, 16, device=runtime.device, stream=30)
    t = torch.arange(n, device=runtime.device)
    blocks, slots = case.block_tables[0].long()[t // 16], t % 16  # member 0's tokens, the prefix's too
    q0 = case.q[0, 0].float()  # [D]
    ramp = torch.linspace(0.0, 12.0, n, device=runtime.device)[:, None]  # head 0's score for token t
    k = 0.3 * case.k_cache[blocks, slots, 0].float() + ramp * math.sqrt(16) * q0 / q0.dot(q0)  # [n, D]
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)
    plan = forced(impl, case, groups, plens, prefix_chunks=tile // 2 + 1, suffix_splits=tile // 2)
    assert plan.prefix_chunks + plan.suffix_splits == tile + 1, f"{plan}"
    check(impl, case, groups, plens, plan=plan)


def test_v_is_read_through_its_own_strides(impl, runtime):
    """v_cache head-major (its token and head strides swapped against k_cache's, the block stride the
    same), out a view unlike q (the canary buffer around it): a launch that hands the kernels K's
    strides for V reads V's wrong tokens and heads, in the prefix stage and the suffix stage."""
    case, groups, plens = cascade_case([40, 33, 9], [0, 0, -1], [32], device=runtime.device, stream=31)
    case = v_strides_unlike_k(case)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


def test_widest_head_dim_is_read_whole(impl, runtime):
    """D = 256, the widest head dim the launcher admits, on one KV head of two query heads: a feature tile
    capped at 128 scores with half of q and k and leaves half of every partial output unwritten, yet
    passes every case up to D = 128. Two members share one page; the suffixes are split in two."""
    D = max(DOMAIN["head_dims"])
    case, groups, plens = cascade_case([19, 25], [0, 0], [16], 2, 1, D, device=runtime.device, stream=32)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


# A tile reads one table entry when a page holds it (PAGE >= BLOCK_N) and one per token below: each path
# forms its own block offsets, so the int64 case runs one page size from each side of the suffix stage's
# 16-key tile (the prefix stage's tiles, 32 keys wide here, gather token by token at both).
SPAN_PAGES = (DOMAIN["tile_tokens"], 4)


@pytest.mark.parametrize("PAGE", SPAN_PAGES, ids=[f"page{p}" for p in SPAN_PAGES])
def test_page_index_widened_to_int64(impl, runtime, PAGE):
    """Block ids above 2**32 / page stride, in the shared prefix and the suffixes: int32 offsets wrap to
    the pool's first blocks (zeros in a sparse cache). At PAGE = 16 the suffix stage reads one table entry
    per tile, and PAGE = 4 gathers block ids token by token. The caches are sparse files on a CPU."""
    far_blocks = pool_past_int32(runtime, PAGE, 1, 128, spare=32)
    case, groups, plens = cascade_case(
        [40, 37], [0, 0], [32], 4, 1, 128, PAGE, device=runtime.device, stream=27, **far_blocks
    )
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


def test_sequence_index_widened_to_int64(impl, runtime):
    """q's rows 1.5 * 2**30 elements apart (q_rows_far_apart): member 2's row starts 3 * 2**30 elements
    in, so b * stride_qb must be int64 in the prefix tile (which loads its members' rows) and in the
    suffix stage."""
    case, groups, plens = cascade_case([40, 33, 25], [0, 0, 0], [16], 4, 2, device=runtime.device, stream=33)
    case = PagedCase(q_rows_far_apart(case.q, runtime), *case.args[1:])
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=1))


@grouping_cases("group1-MHA", "group3", "group8-MQA")
def test_prefix_tile_rows_map_to_heads(impl, runtime, Hq, Hkv):
    """Row r of a prefix tile is member r // GROUP and query head kvh * GROUP + r % GROUP. GROUP = 3
    leaves padded rows in a tile of 16 (5 members = 15 rows); mixed up rows put a member's output
    under another member's head."""
    lens = [30, 21, 40, 17, 25, 33]
    case, groups, plens = cascade_case(lens, [0] * 6, [16], Hq, Hkv, device=runtime.device, stream=13 + Hq)
    check(
        impl, case, groups, plens, plan=forced(impl, case, groups, plens, members_per_tile=5, suffix_splits=1)
    )


@pytest.mark.parametrize("D", [64, 128])
def test_head_dims(impl, runtime, D):
    case, groups, plens = cascade_case([40, 35, 20], [0, 0, -1], [32], D=D, device=runtime.device, stream=15)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


@pytest.mark.parametrize("PAGE", [1, 4, 8, 32])
def test_page_sizes(impl, runtime, PAGE):
    """Pages smaller than a tile are gathered token by token, in the prefix and the suffix.
    PAGE = 8, half a tile, shares 16 tokens (a whole tile, so a suffix started on a tile edge is right
    there and only the gather can be wrong): one block id per tile, right from PAGE = 16 on, taken from
    PAGE = 8 reads the second page of every tile from the first page's block."""
    n = 16 if PAGE == 8 else max(PAGE, 8)
    case, groups, plens = cascade_case(
        [n + 9, n + 30, 12], [0, 0, -1], [n], PAGE=PAGE, device=runtime.device, stream=16
    )
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    """Each dtype, then its range: every V element 2^16 (bf16) or 2^13 (fp16) x (1 + |randn|)
    (fill_past_fp16_range), so every partial and output is too. bf16 from 65536 up holds in bf16 and not
    in fp16 (largest 65504): a P V product cast to tl.float16 (p and v narrowed where v's own dtype
    belongs) turns it into inf, in the prefix tile and the suffix stage alike; the fp16 case stays
    inside fp16's range. Last, K from 2^16 up (bf16) with q scaled down to keep the scores: q and K cast
    to tl.float16 for the score dot turn them into inf."""
    case, groups, plens = cascade_case([40, 33], [0, 0], [32], dtype=dtype, device=runtime.device, stream=17)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))
    case, groups, plens = cascade_case(
        [40, 33, 19], [0, 0, -1], [16], dtype=dtype, device=runtime.device, stream=40
    )
    fill_past_fp16_range(case.v_cache)  # the given-up pages' NaN stay NaN
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))
    case, groups, plens = cascade_case(
        [40, 33, 19], [0, 0, -1], [16], dtype=dtype, device=runtime.device, stream=41
    )
    keys_past_fp16_range(case.k_cache, case.q)  # q . k as before, K past fp16's range in bf16
    try:
        check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))
    except AssertionError as e:
        raise AssertionError(f"K from 2^16 up in bf16 (q scaled down to keep the scores): {e}") from None


def test_q_and_cache_strides_are_used(impl, runtime):
    """q is every other head of a NaN buffer; K and V are one layer of a NaN-filled pool."""
    case, groups, plens = cascade_case([40, 33, 9], [0, 0, -1], [32], device=runtime.device, stream=18)
    case = in_layer_pool(strided_q(case))
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


def test_table_rows_are_read_through_their_stride(impl, runtime):
    """block_tables is a view of a wider table of -1 (in_wider_table), and group 0's first member is
    sequence 1: the prefix stage reads the shared pages from row 1, at 1 * stride(0), not 1 * max_pages
    (which lands in row 0's -1 padding). Suffixes read their own rows the same way."""
    case, groups, plens = cascade_case(
        [30, 45, 40, 33], [-1, 0, 0, 0], [32], device=runtime.device, stream=28
    )
    case.block_tables = in_wider_table(case.block_tables)
    check(impl, case, groups, plens, plan=forced(impl, case, groups, plens, suffix_splits=2))


def test_gqa_group_wider_than_a_tile(impl, runtime):
    """256 query heads on one KV head: one member's rows alone fill two of the planner's 128-row tiles, so
    a tile holds one member (members_per_tile = MAX_ROWS // GROUP rounds down to 0: at least 1) and the
    kernel's rows are 256, not 128."""
    case, groups, plens = cascade_case([40, 33], [0, 0], [32], 256, 1, 16, device=runtime.device, stream=29)
    plan = impl.plan(case.context_lens, groups, plens, 256, 1, 16, cascade=True)
    assert plan.members_per_tile >= 1, f"{plan}: a tile must hold at least one member"
    check(impl, case, groups, plens, plan=plan)


GROUP_GUARDS = [c.name for c in guards_f2_cascade_decode.cases("cpu") if c.name.startswith("prefix_")]


@pytest.mark.parametrize("name", GROUP_GUARDS)
def test_bad_group_values_on_the_device_are_contained(impl, runtime, name):
    """check=False, as an engine calls on a GPU (nothing read on the host), with a group id outside
    [-1, G) or a prefix length that is no whole number of pages, past a member's context or past the table
    (section 3.6). The kernels must not follow it: they record it in the device error word, which names
    the argument, and never read outside the tensors they were given."""
    case = next(c for c in guards_f2_cascade_decode.cases(runtime.device, impl) if c.name == name)
    with pytest.raises(Exception, match=case.argument) as raised:
        case.call(False)
    assert "device guard" in str(raised.value), (
        f"raised, but not by the device guard of section 3.6: {raised.value}"
    )


def _falling_scores_case(runtime):
    """Scores that fall with the key position in both stages: +60 in the prefix's first 16-token tile and
    in each suffix's first, -60 in every tile after them. The running max must stay at the first tile's,
    m_new = max(m_i, the tile's max). Taken from each tile alone, it falls by 120 / ln 2 = 173 in base 2,
    and alpha = exp2(m_old - m_new) = 2^173 overflows to inf. Rising scores hide it (the tile's max is
    then the running one), and so does a range of one tile."""
    plen, D = 32, 64
    case, groups, plens = cascade_case(
        [plen + 40, plen + 37], [0, 0], [plen], 4, 1, D, device=runtime.device, stream=37
    )
    PAGE = case.k_cache.shape[1]
    for b, ctx in enumerate(case.context_lens.tolist()):
        t = torch.arange(ctx)
        high = (t < 16) | ((t >= plen) & (t < plen + 16))  # each stage's first tile
        blocks, slots = case.block_tables[b].cpu().long()[t // PAGE], t % PAGE
        shift = torch.where(high, 60.0, -60.0).to(case.q.dtype).to(runtime.device)
        case.k_cache[blocks.to(runtime.device), slots.to(runtime.device), :, 0] = shift[:, None]
    case.q[:, :, 0] = math.sqrt(D)  # scale * q . k gains the key's shift from feature 0
    return case, groups, plens


def test_lse_is_natural_log(impl, runtime):
    """lse must equal torch.logsumexp of the scaled scores (base e), with the default scale and another;
    then with every score about -128 (L2's pitfall 10), through both stages (a group sharing 32 tokens,
    a sequence in no group; one chunk and one split, so no part is empty): a running max that starts at 0
    stays 0, every exp2 underflows (2^-184 is below fp32's smallest) and l = 0, so the part looks empty
    and the row stores 0. Last, scores that fall (_falling_scores_case): a running max taken of each key
    tile alone overflows its rescale. Every other case scores near 0."""
    case, groups, plens = cascade_case([40, 33], [0, 0], [16], device=runtime.device, stream=19)
    plan = forced(impl, case, groups, plens, suffix_splits=1)
    check(impl, case, groups, plens, plan=plan)
    check(impl, case, groups, plens, plan=plan, scale=0.37)
    low, groups, plens = cascade_case([50, 40, 45], [0, 0, -1], [32], device=runtime.device, stream=38)
    shift_scores(low, -128.0)
    try:
        _, lse = check(
            impl, low, groups, plens, plan=forced(impl, low, groups, plens, prefix_chunks=1, suffix_splits=1)
        )
    except AssertionError as e:
        raise AssertionError(f"every score about -128: {e}") from None
    assert lse.max().item() < -100, "every head's lse should be far below 0 here"
    falling, groups, plens = _falling_scores_case(runtime)
    try:
        check(
            impl,
            falling,
            groups,
            plens,
            plan=forced(impl, falling, groups, plens, prefix_chunks=1, suffix_splits=1),
        )
    except AssertionError as e:
        raise AssertionError(f"scores +60 in the first key tile of each stage, -60 after: {e}") from None


@pytest.mark.parametrize("path", ["planned", "cascade"])
def test_equals_paged_decode(impl, runtime, path):
    """The same inputs through L2's reference paged_decode (which knows nothing of groups): equal up to
    rounding (the lse is checked against the oracle by every other test). Neither call asks for lse:
    "planned", the planner's choice, then F1's fallback unsplit, where the launcher hands the suffix kernel
    out in place of lse, a pointer never written (WRITE_LSE = False); an lse stored all the same lands on
    out. "cascade", a cascade forced: the merge is the kernel given WRITE_LSE = False, and an lse it stores
    all the same lands on out too."""
    from drills.solutions.l2_paged_decode import paged_decode

    case, groups, plens = cascade_case(
        [50, 64, 17, 33], [0, 0, -1, 0], [32], device=runtime.device, stream=20
    )
    ref = paged_decode(*case.args).float()
    if path == "planned":
        assert_close(impl.cascade_decode(*case.args, groups, plens), ref, DIMS)
        plan = impl.plan(case.context_lens, groups, plens, 8, 2, 16, cascade=False, suffix_splits=1)
        said = "unsplit fallback without return_lse (WRITE_LSE = False)"
    else:
        plan = forced(impl, case, groups, plens, prefix_chunks=1, suffix_splits=1)
        said = "cascade without return_lse (the merge's WRITE_LSE = False)"
    out = call_with_canary_out(
        lambda o: impl.cascade_decode(*case.args, groups, plens, out=o, plan=plan), case.q
    )
    try:
        assert_close(out, ref, DIMS)
    except AssertionError as e:
        raise AssertionError(f"{said}: {e}") from None


@pytest.mark.parametrize("cascade", [True, False], ids=["cascade", "fallback"])
def test_runs_a_triton_kernel(impl, runtime, cascade):
    case, groups, plens = cascade_case([40, 33], [0, 0], [16], device=runtime.device, stream=21)
    plan = impl.plan(case.context_lens, groups, plens, 8, 2, 16, cascade=cascade)
    assert_runs_a_triton_kernel(
        impl, lambda: impl.cascade_decode(*case.args, groups, plens, plan=plan), "cascade_decode"
    )
    o, lse = torch.randn(6, 32, device=runtime.device), torch.randn(6, device=runtime.device)
    assert_runs_a_triton_kernel(impl, lambda: impl.merge_states(o, lse, o, lse), "merge_states")


# --- The launcher rejects bad input ------------------------------------------------------------

F2_BAD_INPUTS = {
    "prefix_len_not_a_page_multiple": (
        lambda a, dev: dict(prefix_lens=int32_tensor(dev, 24)),
        ValueError,
        r"prefix_lens\[0\]",
    ),
    "prefix_len_past_a_member": (
        lambda a, dev: dict(prefix_lens=int32_tensor(dev, 48)),
        ValueError,
        "prefix_lens",
    ),
    "prefix_len_negative": (
        lambda a, dev: dict(prefix_lens=int32_tensor(dev, -16)),
        ValueError,
        "prefix_lens",
    ),
    "prefix_group_past_G": (
        lambda a, dev: dict(prefix_group=int32_tensor(dev, 0, 1)),
        ValueError,
        "prefix_group",
    ),
    "prefix_group_below_minus_one": (
        lambda a, dev: dict(prefix_group=int32_tensor(dev, 0, -2)),
        ValueError,
        "prefix_group",
    ),
    "prefix_group_int64": (
        lambda a, dev: dict(prefix_group=a["prefix_group"].long()),
        TypeError,
        "prefix_group",
    ),
    "prefix_lens_float": (
        lambda a, dev: dict(prefix_lens=a["prefix_lens"].float()),
        TypeError,
        "prefix_lens",
    ),
    "prefix_group_wrong_batch": (
        lambda a, dev: dict(prefix_group=int32_tensor(dev, 0)),
        ValueError,
        "prefix_group",
    ),
    "members_do_not_share_pages": (
        lambda a, dev: dict(block_tables=with_entry(a["block_tables"], 1, 0, int(a["block_tables"][1, 2]))),
        ValueError,
        "block_tables",
    ),
    "plan_not_a_plan": (lambda a, dev: dict(plan=3), TypeError, "plan"),
    "scale_nan": (lambda a, dev: dict(scale=float("nan")), ValueError, "scale"),
    "return_lse_not_a_bool": (lambda a, dev: dict(return_lse=1), TypeError, "return_lse"),
}
BAD_INPUTS = {**PAGED_BAD_INPUTS, **SHARED_KV_BAD_INPUTS, **F2_BAD_INPUTS}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    case, groups, plens = cascade_case([40, 37], [0, 0], [32], 4, 2, device=runtime.device, stream=22)
    args = spoiled_call(case, lambda a, dev: {}, runtime.device)
    args.update(prefix_group=groups, prefix_lens=plens)
    args.update(spoil(args, runtime.device))
    with pytest.raises(error, match=names):
        impl.cascade_decode(**args)


def test_check_true_catches_tables_that_do_not_share(impl, runtime):
    """Sequence 2 claims group 0's 32-token prefix but its table's second page is its own: check=True
    names block_tables (and the group) before any kernel runs."""
    case, groups, plens = cascade_case([40, 37, 45], [0, 0, 0], [32], device=runtime.device, stream=23)
    case.block_tables = with_entry(case.block_tables, 2, 1, int(case.block_tables[2, 2]))
    with pytest.raises(ValueError, match=r"block_tables\[2"):
        impl.cascade_decode(*case.args, groups, plens, check=True)


# --- plan() -------------------------------------------------------------------------------------


def _plan_invariants(p, lens, groups, plens, Hkv):
    members = {}
    for b, g in enumerate(groups):
        if g >= 0:
            members.setdefault(g, []).append(b)
    starts = [plens[g] if (p.cascade and g >= 0) else 0 for g in groups]
    suffix = max(n - s for n, s in zip(lens, starts))
    longest = max(range(len(lens)), key=lambda b: lens[b] - starts[b])
    assert p.suffix_chunk % 16 == 0 and p.suffix_splits * p.suffix_chunk >= suffix, (
        f"{p}: suffix not covered: the longest suffix is sequence {longest}'s, context {lens[longest]} from "
        f"token {starts[longest]} on, {suffix} tokens, and the plan's splits cover "
        f"{p.suffix_splits * p.suffix_chunk} (a suffix is each sequence's own, a sequence in no group's its "
        "whole context)"
    )
    assert (p.suffix_splits - 1) * p.suffix_chunk < max(suffix, 1), f"{p}: an empty last suffix split"
    if not p.cascade:
        return
    assert p.prefix_chunk % 16 == 0 and p.prefix_chunks * p.prefix_chunk >= max(plens[g] for g in members)
    tiles = p.tile_seqs.tolist()
    seen = {}
    for row, g in zip(tiles, p.tile_group.tolist()):
        real = [b for b in row if b >= 0]
        assert real, f"{p}: a tile with no member"
        twice = sorted({b for b in real if real.count(b) > 1})
        assert not twice, (
            f"{p}: the tile {row} of group {g} holds sequence {twice[0]} twice: a tile's empty slots are -1 "
            "(no sequence), not a sequence id, which the kernel would attend and store a second time"
        )
        assert all(groups[b] == g for b in real), f"tile of group {g} holds {real}: rows of another group"
        seen.setdefault(g, []).extend(real)
    assert {g: sorted(m) for g, m in seen.items()} == members, "every member in exactly one tile of its group"
    # Each tile reads its group's prefix once: a group needs ceil(members / members_per_tile) tiles, and
    # every tile past that (cut at each break in a run of the batch) reads the shared pages once more.
    for g, m in members.items():
        have, want = p.tile_group.tolist().count(g), -(-len(m) // p.members_per_tile)
        assert have == want, (
            f"{p}: {have} tiles of group {g} where ceil({len(m)} members / members_per_tile "
            f"{p.members_per_tile}) = {want} hold them: a tile is cut from the group's members in batch "
            "order, not from a run of consecutive sequences, and each extra tile reads the prefix again"
        )


def test_plan_cascades_only_when_it_pays_and_cuts_by_its_rules(impl):
    """256 requests sharing 288 tokens with 12 of their own: cascade. Groups of one, a 16-token prefix
    among long suffixes, or no groups: F1's split-KV, which reads the same bytes with fewer kernels.
    Then section 3.5's rules, each where skipping it changes the plan (every result stays right: only the
    step's speed is lost). Rule 1 has two halves: 64 requests of 20 tokens sharing 16 save 79% of the
    reads, but a prefix below MIN_CHUNK = 64 tokens is one tile, whose stage and merge cost more than
    they save: no cascade; nor when the only such prefix has one member. Rule 2: members_per_tile = 128 // GROUP is capped at the largest group, a
    forced one too: 8 members with GROUP = 1 get tiles of 8, not 128 (120 rows of padding), and two groups
    of 4 tiles of 4. Rule 3: each
    stage cut for its own grid. 8 members of 33792 tokens sharing 32768, Hkv = 8, 132 SMs: the prefix
    stage has 1 tile x 8 = 8 programs a chunk at two per SM, 264 // 8 = 33 chunks of 1008 tokens; the
    suffix stage B x Hkv = 64 programs a split at four per SM, 528 // 64 = 8 splits of 128 tokens.
    """
    lens, groups, plens = [300] * 256, [0] * 256, [288]
    p = impl.plan(lens, groups, plens, 9, 3, 16, device="cpu", num_sms=132)
    assert p.cascade, f"{p}: 255 of 256 requests re-read 288 shared tokens; cascading pays here"
    _plan_invariants(p, lens, groups, plens, 3)
    for lens, groups, plens in (
        ([300] * 4, [0, 1, 2, 3], [288] * 4),
        ([4000] * 8, [0] * 8, [16]),
        ([300] * 8, [-1] * 8, []),
        ([0] * 4, [-1] * 4, []),  # padding sequences only (a graph bucket with no request): no token at all
    ):
        p = impl.plan(lens, groups, plens, 32, 8, 16, device="cpu", num_sms=132)
        assert not p.cascade, f"{p}: nothing (or almost nothing) is read twice; cascading does not pay"
        _plan_invariants(p, lens, groups, plens, 8)

    p = impl.plan([20] * 64, [0] * 64, [16], 8, 2, 16, device="cpu", num_sms=132)
    assert not p.cascade, (
        f"{p}: 64 members share 16 tokens, below MIN_CHUNK = 64: the saving half of rule 1 holds (79%), "
        "the prefix-length half does not, so the planner falls back"
    )
    # The wide prefix must be shared: a lone member's 64 tokens beside 8 members sharing 48 save exactly
    # three quarters of the reads (7 x 48 of 64 + 8 x 48), but the only prefix of MIN_CHUNK tokens is
    # read by one request, whose tile saves nothing.
    p = impl.plan([64] + [48] * 8, [0] + [1] * 8, [64, 48], 8, 2, 16, device="cpu", num_sms=132)
    assert not p.cascade, (
        f"{p}: the only prefix of MIN_CHUNK = 64 tokens or more belongs to a group of one member, which "
        "saves nothing; rule 1 asks for a group of two or more sharing at least MIN_CHUNK tokens"
    )
    for forced in (None, 20):
        p = impl.plan(
            [1088] * 8, [0] * 8, [1024], 8, 8, 16, device="cpu", num_sms=132, members_per_tile=forced
        )
        assert p.cascade and p.members_per_tile == 8, (
            f"{p}: members_per_tile = {p.members_per_tile} where the largest group has 8 members"
            + (
                f" (forced {forced}, capped at the largest group too)"
                if forced
                else " (128 // GROUP = 128, capped at 8)"
            )
        )
    # Two groups of 4: the cap is the largest group, not every grouped sequence (a tile never holds two groups).
    p = impl.plan(
        [1088] * 8, [0] * 4 + [1] * 4, [1024] * 2, 8, 8, 16, device="cpu", num_sms=132, cascade=True
    )
    assert p.members_per_tile == 4, (
        f"{p}: members_per_tile = {p.members_per_tile} where the largest group has 4 members (two groups of 4)"
    )
    p = impl.plan([33792] * 8, [0] * 8, [32768], 8, 8, 16, device="cpu", num_sms=132)
    got = (p.prefix_chunks, p.prefix_chunk, p.suffix_splits, p.suffix_chunk)
    assert p.cascade and got == (16, 2048, 8, 128), (
        f"{p}: (prefix_chunks, prefix_chunk, suffix_splits, suffix_chunk) = {got}, not (16, 2048, 8, 128): "
        "one program per SM over tiles x Hkv for the prefix stage, four over B x Hkv for the suffix stage"
    )
    # 96 members of 4 query heads each: 3 tiles of 32 x 8 KV heads = 24 programs per chunk, so 132 // 24 =
    # 5 chunks of the 63-tile prefix, 13 tiles (208 tokens) each, rounded up to a multiple of PREFIX_N =
    # 128 keys so that the prefix tile can be that wide: 256 tokens, 4 chunks.
    p = impl.plan([1100] * 96, [0] * 96, [1008], 32, 8, 16, device="cpu", num_sms=132)
    got = (p.prefix_chunks, p.prefix_chunk)
    assert p.cascade and got == (4, 256), (
        f"(prefix_chunks, prefix_chunk) = {got}, not (4, 256): 24 prefix programs per chunk, one per SM, "
        "give 5 chunks of 208 tokens, and an unforced chunk of 128 tokens or more is rounded up to a "
        "multiple of PREFIX_N = 128"
    )


@pytest.mark.parametrize(
    "members,prefix,own",
    [
        (2, 1024, 64),
        (8, 256, 64),
        (8, 512, 64),
        (4, 4096, 1024),
        (64, 304, 128),
        (64, 512, 128),
        (8, 96, 16),  # 672 of 896 tokens saved: exactly three quarters, which "at least" admits
        (64, 64, 16),  # a prefix of exactly MIN_CHUNK tokens, which "at least" admits
    ],
)
def test_plan_saves_every_read_but_one_per_group(impl, members, prefix, own):
    """Cascading still reads each prefix once: the tokens saved are (members - 1) * prefix_lens[g], and the
    planner cascades when they reach three quarters of all tokens (section 3.5). Counting all the members
    (2 * 1024 of 2 * 1088 tokens saved, 94%) cascades two requests that save only 47%. These cases sit
    on both sides of the line, and two on it: a saving of exactly 75% and a prefix of exactly MIN_CHUNK,
    both of which rule 1's "at least" admits (a `>` where `>=` belongs falls back there)."""
    lens, groups = [prefix + own] * members, [0] * members
    p = impl.plan(lens, groups, [prefix], 32, 8, 16, device="cpu", num_sms=132)
    saved, total = (members - 1) * prefix, members * (prefix + own)
    pays = saved >= 0.75 * total
    on_the_line = (
        " (exactly three quarters: rule 1 says at least)"
        if 4 * saved == 3 * total
        else " (a prefix of exactly MIN_CHUNK = 64 tokens: rule 1 says at least)"
        if prefix == 64
        else ""
    )
    assert p.cascade == pays, (
        f"{members} members sharing {prefix} tokens with {own} of their own each: cascading saves "
        f"{saved} of {total} tokens ({saved / total:.0%}), so the planner should {'' if pays else 'not '}cascade"
        + on_the_line
    )


@pytest.mark.parametrize(
    "lens,groups,plens",
    [
        ([300] * 64, [0] * 64, [288]),
        ([4608] * 32, [0] * 16 + [1] * 16, [4096, 2048]),
        ([33000, 32900], [0, 0], [32768]),
        ([40, 0, 17, 300], [0, -1, -1, 0], [32]),
    ],
)
def test_plan_covers_every_token_once(impl, lens, groups, plens):
    """Whatever it chooses: chunks of whole tiles cover every prefix and suffix, no empty last split,
    each member in exactly one tile of its own group."""
    for cuts in ({}, dict(cascade=True), dict(cascade=True, members_per_tile=3, prefix_chunks=7)):
        p = impl.plan(lens, groups, plens, 32, 8, 16, device="cpu", num_sms=132, **cuts)
        _plan_invariants(p, lens, groups, plens, 8)


BAD_PLANS = {
    "prefix_len_not_a_page_multiple": (
        ([40, 40], [0, 0], [24], 8, 2, 16),
        {},
        ValueError,
        r"prefix_lens\[0\]",
    ),
    "prefix_len_past_a_member": (([40, 20], [0, 0], [32], 8, 2, 16), {}, ValueError, "prefix_lens"),
    "prefix_group_past_G": (([40, 40], [0, 1], [16], 8, 2, 16), {}, ValueError, r"prefix_group\[1\]"),
    "prefix_group_wrong_length": (([40, 40], [0], [16], 8, 2, 16), {}, ValueError, "prefix_group"),
    "prefix_group_float": (([40, 40], [0.0, 0], [16], 8, 2, 16), {}, TypeError, "prefix_group"),
    "heads_not_a_multiple": (([40], [0], [16], 9, 2, 16), {}, ValueError, "num_q_heads"),
    "page_size_not_pow2": (([40], [0], [12], 8, 2, 12), {}, ValueError, "page_size"),
    "members_per_tile_zero": (
        ([40], [0], [16], 8, 2, 16),
        dict(members_per_tile=0),
        ValueError,
        "members_per_tile",
    ),
    "cascade_not_a_bool": (([40], [0], [16], 8, 2, 16), dict(cascade=1), TypeError, "cascade"),
}


@pytest.mark.parametrize("name", list(BAD_PLANS))
def test_plan_rejects_bad_arguments(impl, name):
    args, kwargs, error, names = BAD_PLANS[name]
    with pytest.raises(error, match=names):
        impl.plan(*args, device="cpu", **kwargs)


def test_default_plan_two_groups_and_shuffled_pages(impl, runtime):
    """plan=None: cascade_decode plans for itself. Two groups of four sharing 64 and 48 tokens, pages
    shuffled through the pool, and one sequence with none."""
    lens = [70, 66, 80, 65, 50, 60, 72, 55, 30]
    groups = [0, 0, 1, 0, 1, 1, 0, 1, -1]
    case, pg, pl = cascade_case(lens, groups, [64, 48], device=runtime.device, stream=24)
    check(impl, case, pg, pl)


def test_fallback_equals_split_kv(impl, runtime):
    """The planner's fallback (cascade=False): every sequence attended whole by the suffix stage, unsplit
    and split, groups ignored; and a batch with no group at all (prefix_lens empty, G = 0)."""
    case, groups, plens = cascade_case([40, 0, 37], [0, -1, 0], [32], device=runtime.device, stream=25)
    for splits in (1, 3):
        plan = impl.plan(case.context_lens, groups, plens, 8, 2, 16, cascade=False, suffix_splits=splits)
        assert not plan.cascade
        check(impl, case, groups, plens, plan=plan)
    no_groups = int32_tensor(runtime.device, -1, -1, -1)
    check(impl, case, no_groups, torch.zeros(0, dtype=torch.int32, device=runtime.device))  # G = 0


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


@pytest.mark.parametrize("grouped", ["no_groups", "one_group"])
def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime, grouped):
    """70,000 sequences in one decode step (and, in one group sharing their first page, 70,000 prefix
    tiles of one member each): more than the 65535 programs CUDA allows on grid axes 1 and 2 (axis 0
    allows 2**31 - 1), so sequences and tiles belong on axis 0. A grid with them on axis 1 or 2
    launches on the CPU and fails on a GPU with "invalid argument". Run dry (every launch recorded and
    checked, none run), without the value checks, which the other tests cover."""
    q, k_cache, v_cache, block_tables, context_lens = _many_short_sequences(runtime.device)
    B, PAGE = q.shape[0], k_cache.shape[1]
    if grouped == "no_groups":
        prefix_group = torch.full((B,), -1, dtype=torch.int32, device=runtime.device)  # [B]
        prefix_lens = torch.zeros(0, dtype=torch.int32, device=runtime.device)  # [G = 0]
        cut = {}
    else:
        prefix_group = torch.zeros(B, dtype=torch.int32, device=runtime.device)  # [B], all in group 0
        prefix_lens = torch.tensor([PAGE], dtype=torch.int32, device=runtime.device)  # [G = 1]
        cut = dict(cascade=True, members_per_tile=1, suffix_splits=2)
    cascade_plan = impl.plan(context_lens, prefix_group, prefix_lens, 1, 1, PAGE, **cut)
    assert_grids_fit(
        impl,
        lambda: impl.cascade_decode(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            prefix_group,
            prefix_lens,
            plan=cascade_plan,
            return_lse=True,
            check=False,
        ),
        f"cascade_decode of 70,000 sequences ({grouped})",
    )


# --- Stages: merge, then the stages with the cuts forced, then the planner ------------------------

STAGES = [
    Stage(
        "merge",
        ("test_merge_states_*",),
        "merge_states: two states merged into the softmax over their union, shifted by the max, empty parts, "
        "strided views",
    ),
    Stage(
        "prefix and suffix, cuts forced",
        (
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_suffix_starts_after_the_prefix",
            "test_groups_of_one_member",
            "test_tiles_hold_one_group",
            "test_members_one_past_the_tile",
            "test_group_with_an_empty_prefix",
            "test_shared_pages_read_from_the_tiles_first_member",
            "test_sequences_in_no_group_start_at_token_0",
            "test_group_of_64_members",
            "test_every_prefix_chunk_count_matches",
            "test_every_suffix_split_count_matches",
            "test_merge_reads_every_tile_of_slots",
            "test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",
            "test_v_is_read_through_its_own_strides",
            "test_widest_head_dim_is_read_whole",
            "test_page_index_widened_to_int64",
            "test_sequence_index_widened_to_int64",
            "test_prefix_tile_rows_map_to_heads",
            "test_head_dims",
            "test_page_sizes",
            "test_dtypes",
            "test_q_and_cache_strides_are_used",
            "test_table_rows_are_read_through_their_stride",
            "test_gqa_group_wider_than_a_tile",
            "test_bad_group_values_on_the_device_are_contained",
            "test_lse_is_natural_log",
            "test_runs_a_triton_kernel",
            "test_launcher_rejects_bad_input",
            "test_check_true_catches_tables_that_do_not_share",
        ),
        "prefix_kernel, suffix_kernel and merge_kernel with plan(cascade=True, ...) cutting the work as each "
        "test says: the prefix once, suffixes after it, tiles of one group, masked rows, any chunk count",
    ),
    Stage(
        "planner",
        (
            "test_plan_*",
            "test_default_plan_two_groups_and_shuffled_pages",
            "test_fallback_equals_split_kv",
            "test_equals_paged_decode[planned]",
        ),
        "plan() choosing on its own: cascade only when it pays, else F1's split-KV; every token covered once",
    ),
]

# --- Diagnosis: which pitfall of section 5 a pattern of results points at -------------------------
# Most mistakes of the stages fail almost every cascade check; they are told apart by what they still
# get right: PAGE = 1 (a page count equals a token count), GROUP = 1 (every row mapping agrees), the
# fallback (no prefix stage), merge_states alone, one tile, one chunk.

MHA = "test_prefix_tile_rows_map_to_heads[group1-MHA]"
MISTAKES = [
    Mistake(
        38,
        # A stage's key tile as L2 must not: tail keys scored 0, or l not rescaled. Right wherever every
        # range is one whole tile, which the 65-slot checks (one tile per chunk and per split) are.
        fails=(
            "test_prefix_counted_once",
            "test_every_suffix_split_count_matches",
            "test_lse_is_natural_log",
        ),
        passes=(
            "test_merge_reads_every_tile_of_slots",
            "test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="A suffix of 20 tokens in tiles of 16: which keys of your second tile are real, what score "
        "do the others get, and is your l rescaled when a later tile raises the max?",
        section="3.2",
    ),
    Mistake(
        37,
        # Tiles cut from runs of consecutive grouped sequences: every result right, the prefix read once
        # per run instead of once per members_per_tile members.
        fails=("test_plan_covers_every_token_once",),
        messages=(r"tiles of group \d+ where ceil",),
        question="Groups [0, -1, -1, 0] in tiles of 2: how many tiles does group 0 need, and how many does "
        "your plan() cut when a sequence of no group stands between its members?",
        section="3.5",
    ),
    Mistake(
        36,
        # The merge's max taken from each tile of slots alone: out stays right (the rescale is consistent),
        # and the lse is measured from the last tile's max, -inf after a tile of empty slots.
        fails=("test_merge_reads_every_tile_of_slots",),
        passes=(
            "test_worked_example_three_requests",
            "test_every_suffix_split_count_matches",
            "test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",
        ),
        messages=(r"out matches, but the returned lse does not",),
        question="65 slots in tiles of 64, and a member whose slots 34 to 64 are empty: what is your merge's "
        "max after its second tile, and what lse does it then store?",
        section="3.4",
    ),
    Mistake(
        36,
        # The merge reads its first tile of 64 slots and no more: right wherever a row has at most 64 slots,
        # which only the two 65-slot checks pass.
        fails=(
            "test_merge_reads_every_tile_of_slots",
            "test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",
        ),
        passes=(
            "test_worked_example_three_requests",
            "test_every_suffix_split_count_matches",
            "test_every_prefix_chunk_count_matches",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="65 slots and a merge that reads 64 at a time: which of them does your merge read, and "
        "which loop brings it to slot 64?",
        section="3.4",
    ),
    Mistake(
        35,
        # Rule 1 as a ratio, saved / sum(context_lens): a batch of padding sequences only divides by 0.
        fails=("test_plan_cascades_only_when_it_pays_and_cuts_by_its_rules",),
        messages=(r"ZeroDivisionError",),
        passes=("test_plan_covers_every_token_once", "test_plan_saves_every_read_but_one_per_group"),
        question="Four padding sequences, every context 0: what is the total your plan() compares the saved "
        "tokens with, and what does dividing by it give?",
        section="3.5",
    ),
    Mistake(
        30,
        # The running max taken of each key tile alone: right while scores rise and over one tile; scores
        # that fall by 120 overflow alpha to inf.
        fails=("test_lse_is_natural_log",),
        passes=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",
        ),
        messages=(r"scores \+60 in the first key tile",),
        question="Scores are +60 in the first key tile and -60 after it: what is your running max after the "
        "second tile, and what alpha then rescales the first tile's sum?",
        section="3.2",
    ),
    Mistake(
        31,
        # prefix_lens[t] for tile t: right while every group has one tile and group g's is tile g.
        fails=("test_members_one_past_the_tile", "test_shared_pages_read_from_the_tiles_first_member"),
        passes=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_groups_of_one_member",
            "test_every_prefix_chunk_count_matches",
        ),
        question="A group of 3 members in tiles of 2, then a group of 2: which tiles are group 1's, and which "
        "entry of prefix_lens does your prefix kernel read for each tile?",
        section="3.1",
    ),
    Mistake(
        32,
        # Suffix split s cut at [s * chunk, (s + 1) * chunk) from token 0, clipped to start after the prefix:
        # a context within one chunk passes (the worked example), and the fallback (every start 0).
        fails=(
            "test_prefix_counted_once",
            "test_every_suffix_split_count_matches",
            "test_page_sizes[1]",
            MHA,
        ),
        passes=(
            "test_worked_example_three_requests",
            "test_fallback_equals_split_kv",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="A 64-token prefix, a context of 84 and one suffix split of 32 tokens: which tokens does your "
        "suffix split read, and from which token does it count its chunk?",
        section="3.3",
    ),
    Mistake(
        33,
        # max_prefix over every group, memberless ones included: the plan passes the table's capacity.
        fails=("test_shared_pages_read_from_the_tiles_first_member",),
        messages=(r"past the block table's capacity",),
        passes=(
            "test_worked_example_three_requests",
            "test_tiles_hold_one_group",
            "test_prefix_counted_once",
        ),
        question="prefix_lens = [1024, 32] and only group 1 has members: which prefix does the plan's "
        "max_prefix have to cover, and which does your plan() take?",
        section="3.5",
    ),
    Mistake(
        34,
        # CASCADE on in a plan that does not cascade: every member starts after a prefix nothing reads.
        fails=("test_fallback_equals_split_kv", "test_table_rows_exactly_full[fallback]"),
        passes=(
            "test_table_rows_exactly_full[cascade]",
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
        ),
        question="A plan with cascade = False runs no prefix stage: from which token does your suffix stage "
        "start a member of group 0, and who reads its prefix?",
        section="3.3",
    ),
    Mistake(
        29,
        # prefix_group[b] > 0 taken for "in a group": group 0's members lose their prefix in the merge.
        # Only a batch whose groups are numbered from 1 passes.
        fails=("test_prefix_counted_once", "test_worked_example_three_requests", MHA),
        passes=(
            "test_shared_pages_read_from_the_tiles_first_member",
            "test_fallback_equals_split_kv",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="Groups [0, 0, -1]: for which sequences does your merge read the prefix slots, and which "
        "value of prefix_group means no group?",
        section="3.4",
    ),
    Mistake(
        28,
        fails=("test_dtypes[bf16]",),
        passes=("test_dtypes[fp16]", "test_head_dims", "test_prefix_counted_once"),
        question="Your fp16 cases pass and your bf16 one does not: in which dtype does your loop multiply p "
        "by V, and what does fp16 make of a bf16 value of 65536?",
        section="3.2",
    ),
    Mistake(
        27,
        # One block id per tile taken for a page smaller than the tile: from PAGE = 8 (a 16-key tile spans
        # two pages), or from PAGE = 16 where the prefix stage's tile is 32 to 128 keys wide (section 3.7).
        # Every prefix stage whose tile is wider than its pages reads the later pages of each tile from
        # the first page's block, while the suffix stage's 16-key tiles over 16-token pages stay right.
        fails=("test_every_prefix_chunk_count_matches", "test_prefix_counted_once"),
        passes=(
            "test_every_suffix_split_count_matches",
            "test_worked_example_three_requests",
            "test_members_one_past_the_tile",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="PAGE = 16 and a prefix tile of 128 keys (or PAGE = 8 and a tile of 16): how many pages, "
        "and how many block ids, does one tile of your loop span, and from which page size on does one "
        "load of the table per tile suffice?",
        section="3.2",
    ),
    Mistake(
        23,
        fails=("test_lse_is_natural_log",),
        # Every score near 0 passes: the look-alikes that also break the low-score case fail these.
        passes=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_tiles_hold_one_group",
            "test_sequences_in_no_group_start_at_token_0",
            "test_every_prefix_chunk_count_matches",
            "test_every_suffix_split_count_matches",
        ),
        messages=(r"every score about -128",),
        question="Every score is about -128: what is your running max after the first tile if it starts "
        "at 0, and what is exp2 of a base-2 score of -184?",
        section="3.2",
    ),
    Mistake(
        2,
        # The suffix started on the tile edge at or before the prefix's end: right for prefixes that are
        # whole tiles of 16 (every case but the 8- and 24-token prefixes), and re-reading up to 15 tokens.
        fails=("test_suffix_starts_after_the_prefix", "test_worked_example_three_requests"),
        passes=(
            "test_page_sizes[32]",
            "test_prefix_counted_once",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="A 24-token prefix and tiles of 16 tokens: which tokens does your prefix stage read, at "
        "which token does your suffix start, and does either stop or start on a tile edge?",
        section="3.3",
    ),
    Mistake(
        22,
        fails=("test_equals_paged_decode",),
        passes=(
            "test_lse_is_natural_log",
            "test_worked_example_three_requests",
            "test_fallback_equals_split_kv",
        ),
        messages=(r"write race|WRITE_LSE = False",),
        question="return_lse=False, no cascade and one split: which tensor does the launcher pass as "
        "lse_ptr, and what does your suffix kernel store through it?",
        section="3.3",
    ),
    Mistake(
        21,
        fails=("test_table_rows_exactly_full",),
        passes=("test_suffix_starts_after_the_prefix", "test_worked_example_three_requests"),
        messages=(r"device guard fired|out of bounds load of block_tables",),
        question="Contexts and a shared prefix of 32 with PAGE = 16 in a table of 2 columns: are they valid "
        "lengths, and which lengths do your guards and your table loads admit?",
        section="3.6",
    ),
    Mistake(
        26,
        # Suffix split s stored at slot s, not first_slot + s: the prefix's slots are overwritten and the
        # suffix's keep the NaN of fresh memory. The fallback (no prefix slots) is right.
        fails=("test_worked_example_three_requests", "test_prefix_counted_once", MHA),
        passes=("test_fallback_equals_split_kv", "test_equals_paged_decode[planned]"),
        messages=(r"\bNaN\b",),
        question="2 prefix chunks and 3 suffix splits: at which slot of the partials does your suffix stage "
        "store split 1, its output and its lse?",
        section="3.3",
    ),
    Mistake(
        1,
        fails=("test_prefix_counted_once", "test_page_sizes[1]", MHA),
        passes=("test_merge_states_equals_one_shot_softmax", "test_fallback_equals_split_kv"),
        question="A member has context 11 and a prefix of 8: which tokens does your suffix stage read, and "
        "which does the prefix stage read?",
        section="2",
    ),
    Mistake(
        2,
        fails=("test_suffix_starts_after_the_prefix",),
        passes=("test_page_sizes[1]", "test_merge_states_equals_one_shot_softmax"),
        question="Only PAGE = 1 passes: is prefix_lens a count of tokens or of pages, and at which token "
        "does your suffix start?",
        section="3.3",
    ),
    Mistake(
        3,
        fails=("test_plan_rejects_bad_arguments[prefix_len_not_a_page_multiple]",),
        question="prefix_lens = 24 with PAGE = 16: which page holds tokens 16 to 23, and do the members "
        "share it?",
        section="3.5",
    ),
    Mistake(
        4,
        fails=("test_groups_of_one_member",),
        passes=("test_tiles_hold_one_group", "test_worked_example_three_requests"),
        question="A group with one member: does your planner give it a tile, and if not, who attends its "
        "prefix?",
        section="3.5",
    ),
    Mistake(
        5,
        fails=("test_merge_states_equals_one_shot_softmax",),
        question="Your merge weighs each part by e^(lse - m): is that the exponential your code takes, and "
        "in which base is the lse it is given?",
        section="3.4",
    ),
    Mistake(
        5,
        fails=("test_lse_is_natural_log", "test_fallback_equals_split_kv"),
        passes=("test_merge_states_equals_one_shot_softmax",),
        question="Your stages run in base 2 (exp2, the scale times log2 e): what do you multiply m + log2 l "
        "by before you store it as lse?",
        section="3.2",
    ),
    Mistake(
        6,
        fails=("test_tiles_hold_one_group",),
        passes=(
            "test_worked_example_three_requests",
            "test_members_one_past_the_tile",
            "test_every_suffix_split_count_matches",
        ),
        question="Groups [0, 1, 0, 1] and two members per tile: which sequences does your planner put in "
        "the first tile, and which prefix does that tile attend?",
        section="3.1",
    ),
    Mistake(
        7,
        fails=("test_prefix_tile_rows_map_to_heads[group3]",),
        passes=(MHA,),
        question="GROUP = 3 and 5 members per tile: which member and which query head is row 7 of your "
        "prefix tile?",
        section="3.1",
    ),
    Mistake(
        8,
        fails=("test_members_one_past_the_tile",),
        passes=("test_worked_example_three_requests",),
        # A -1 member read as sequence 0 stores into sequence 0's rows: a canary, or a write race when the
        # programs run in another order.
        messages=(r"out of bounds|outside|canary|write race",),
        question="The last tile of a group holds fewer members than the tile has room for: what sequence "
        "does a -1 entry of tile_seqs name, and does your mask stop its row?",
        section="3.1",
    ),
    Mistake(
        8,
        # tile_seqs loaded for every one of the ROWS rows, unmasked: rows past MEMBERS * GROUP (the tile
        # rounded up to a power of two) name entries of the next tile, and past the last tile's end.
        fails=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_page_sizes[1]",
            MHA,
        ),
        passes=("test_merge_states_equals_one_shot_softmax", "test_fallback_equals_split_kv"),
        messages=(r"out of bounds load of tile_seqs",),
        question="ROWS is MEMBERS * GROUP rounded up to a power of two: which entries of tile_seqs do the "
        "rows past MEMBERS * GROUP name, and does your load of tile_seqs stop them?",
        section="3.1",
    ),
    Mistake(
        9,
        fails=("test_every_prefix_chunk_count_matches",),
        passes=("test_prefix_counted_once", "test_worked_example_three_requests"),
        question="An 80-token prefix in 3 chunks of 32: where does each of your chunks stop?",
        section="3.1",
    ),
    Mistake(
        9,
        # A chunk's end not cut at the prefix's length: chunks that fill the prefix pass (16- and 64-token
        # prefixes in one chunk), a prefix of 8 in a chunk of 16, an empty prefix and a last chunk past
        # the prefix read the first member's own tokens for every member.
        fails=(
            "test_every_prefix_chunk_count_matches",
            "test_worked_example_three_requests",
            "test_group_with_an_empty_prefix",
        ),
        passes=("test_prefix_counted_once", MHA, "test_merge_states_equals_one_shot_softmax"),
        question="An 8-token prefix in one chunk of 16 tokens: where does your prefix chunk stop, and whose "
        "tokens does it read past the prefix?",
        section="3.1",
    ),
    Mistake(
        9,
        # The same end, with the chunks that start at or past the prefix's end skipped: the empty prefix
        # passes, and the last chunk that starts inside a prefix still reads past it (the 8-token one),
        # which the suffix check sees too (a suffix read twice looks like one started at the wrong page).
        fails=("test_every_prefix_chunk_count_matches", "test_worked_example_three_requests"),
        passes=(
            "test_prefix_counted_once",
            MHA,
            "test_merge_states_equals_one_shot_softmax",
            "test_group_with_an_empty_prefix",
        ),
        question="An 8-token prefix in one chunk of 16 tokens: where does your prefix chunk stop, and whose "
        "tokens does it read past the prefix?",
        section="3.1",
    ),
    Mistake(
        10,
        fails=("test_every_suffix_split_count_matches",),
        messages=(r"NaN|nan",),  # 0 / 0; a suffix refused as empty is the learner's check, not this
        passes=(
            "test_worked_example_three_requests",
            "test_merge_states_equals_one_shot_softmax",
            "test_lse_is_natural_log",
        ),
        question="A member whose context ends where its prefix ends: what are l and acc for its suffix, "
        "and what does acc / l give?",
        section="3.3",
    ),
    Mistake(
        10,
        # The merge's weights e^(lse - m) taken from m = -inf while every slot read is empty: NaN for two
        # empty parts and for a padding sequence, right wherever a row's first tile of slots holds a part.
        fails=("test_merge_states_handles_empty_parts",),
        messages=(r"both parts empty",),
        passes=(
            "test_merge_states_equals_one_shot_softmax",
            "test_worked_example_three_requests",
            "test_every_suffix_split_count_matches",
        ),
        question="merge_states of two empty parts (lse = -inf for both): what is your merge's running max "
        "after its first tile of slots, and what is e^(lse - max) then?",
        section="3.4",
    ),
    Mistake(
        11,
        # The empty-prefix case separates it from pitfall 20: there the last group's prefix is 0.
        fails=("test_tiles_hold_one_group", "test_head_dims", "test_group_with_an_empty_prefix"),
        passes=(
            "test_prefix_counted_once",
            "test_groups_of_one_member",
            "test_members_one_past_the_tile",
            "test_merge_states_equals_one_shot_softmax",
        ),
        question="Sequence 2 is in no group: which of its partial slots did the prefix stage write, and "
        "which does your merge read?",
        section="3.4",
    ),
    Mistake(
        12,
        fails=("test_table_rows_are_read_through_their_stride",),
        passes=("test_worked_example_three_requests", "test_prefix_counted_once"),
        question="block_tables is a view of a wider table: where does row 1 start, in entries, and what "
        "does your kernel add to the table's pointer for it?",
        section="3.1",
    ),
    Mistake(
        13,
        fails=("test_gqa_group_wider_than_a_tile",),
        passes=("test_worked_example_three_requests", "test_prefix_tile_rows_map_to_heads"),
        question="256 query heads share one KV head: how many members fit in a 128-row tile, and what does "
        "your planner do with that number?",
        section="3.5",
    ),
    Mistake(
        24,
        fails=("test_plan_cascades_only_when_it_pays_and_cuts_by_its_rules",),
        messages=(r"the prefix-length half does not",),
        passes=("test_plan_covers_every_token_once", "test_plan_saves_every_read_but_one_per_group"),
        question="64 requests share a 16-token prefix and save 79% of the reads: which two conditions does "
        "section 3.5's rule 1 ask for, and does your plan() check the second?",
        section="3.5",
    ),
    Mistake(
        24,
        fails=("test_plan_cascades_only_when_it_pays_and_cuts_by_its_rules",),
        messages=(r"belongs to a group of one member",),
        passes=("test_plan_covers_every_token_once", "test_plan_saves_every_read_but_one_per_group"),
        question="One request holds a 64-token prefix of its own and 8 others share 48 tokens: which group "
        "does section 3.5's rule 1 ask to share at least MIN_CHUNK tokens, and how many members must it have?",
        section="3.5",
    ),
    Mistake(
        24,
        fails=("test_plan_cascades_only_when_it_pays_and_cuts_by_its_rules",),
        messages=(r"members_per_tile = \d+ where the largest group",),
        passes=("test_plan_covers_every_token_once", "test_plan_saves_every_read_but_one_per_group"),
        question="GROUP = 1 and a group of 8 members: how many members does 128 // GROUP put in a tile, and "
        "how many rows of each tile are then padding?",
        section="3.5",
    ),
    Mistake(
        24,
        fails=("test_plan_cascades_only_when_it_pays_and_cuts_by_its_rules",),
        messages=(r"not \(16, 2048, 8, 128\)", r"not \(4, 256\)"),
        passes=("test_plan_covers_every_token_once", "test_plan_saves_every_read_but_one_per_group"),
        question="How many programs does each stage's grid have per chunk or split, and how many programs "
        "per SM does section 3.5 aim at for each?",
        section="3.5",
    ),
    Mistake(
        8,
        # The planner's side of the padding: empty slots filled with a sequence id (0) instead of -1.
        # cascade_decode's own check then refuses the plan, which is the planner's mistake, not the check's.
        fails=("test_plan_covers_every_token_once",),
        messages=(r"holds sequence \d+ twice: a tile's empty slots are -1",),
        question="64 members in tiles of 3: what does your plan() write in the last tile's two empty slots, "
        "and which sequence does the kernel then read for them?",
        section="3.5",
    ),
    Mistake(
        25,
        fails=("test_plan_covers_every_token_once",),
        # A grouped sequence's suffix left uncovered (from a token past 0): the planner's form of pitfall
        # 20 leaves a sequence in no group uncovered instead, from token 0.
        passes=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_groups_of_one_member",
            "test_group_with_an_empty_prefix",
            "test_suffix_starts_after_the_prefix",
            "test_every_suffix_split_count_matches",
            "test_plan_saves_every_read_but_one_per_group",
        ),
        messages=(r"suffix not covered: the longest suffix is sequence \d+'s, context \d+ from token [1-9]",),
        question="Two groups with prefixes of 4096 and 2048 tokens, every context 4608: how long is each "
        "member's suffix, and what does your plan() take as the longest?",
        section="3.5",
    ),
    Mistake(
        24,
        # Rule 1 compared with > where it says "at least": only a case exactly on a line falls back.
        fails=("test_plan_saves_every_read_but_one_per_group",),
        messages=(r"rule 1 says at least",),
        passes=("test_plan_covers_every_token_once",),
        question="8 members share 96 tokens with 16 of their own: what share of the 896 tokens does "
        "cascading save, and does your plan() cascade at exactly three quarters (or at a prefix of exactly "
        "MIN_CHUNK)?",
        section="3.5",
    ),
    Mistake(
        14,
        fails=("test_plan_saves_every_read_but_one_per_group",),
        passes=("test_plan_covers_every_token_once",),
        question="Two requests share 1024 tokens: how many times does a cascading step still read them, and "
        "so how many reads does it save?",
        section="3.5",
    ),  # One exponential of the merge in base 2: only a running max that rises in a later tile of slots
    # makes the rescale differ from 1 (or 0), so merge_states (one tile) and 65 random slots pass.
    Mistake(
        5,
        fails=("test_merge_rescales_when_a_later_tile_of_slots_raises_the_max",),
        passes=("test_merge_states_equals_one_shot_softmax", "test_merge_reads_every_tile_of_slots"),
        question="Member 0's largest lse sits in the merge's second tile of slots: by what does your merge "
        "multiply the sum of the first tile when the max rises there, and in which base is that exponential?",
        section="3.4",
    ),
    Mistake(
        15,
        fails=("test_v_is_read_through_its_own_strides",),
        passes=("test_worked_example_three_requests", "test_q_and_cache_strides_are_used"),
        # K's token stride steps past V's real slots into the NaN that poisons every stale one.
        messages=(r"\bNaN\b",),
        question="v_cache's token and head strides differ from k_cache's here: which strides does your "
        "launch pass the kernels for V?",
        section="3.1",
    ),
    Mistake(
        16,
        # merge_states alone made for D up to 128: the kernels, which cascade_decode runs at D = 256, pass.
        fails=("test_merge_states_equals_one_shot_softmax[256]",),
        passes=("test_merge_states_equals_one_shot_softmax[64]", "test_widest_head_dim_is_read_whole"),
        question="D = 256 is admitted: does your merge_states accept it, and how many features of each row "
        "does it merge?",
        section="3.4",
    ),
    Mistake(
        16,
        fails=("test_widest_head_dim_is_read_whole",),
        # The features past the tile keep the NaN the harness fills fresh partial buffers with.
        messages=(r"\bNaN\b",),
        passes=("test_worked_example_three_requests", "test_head_dims", "test_dtypes"),
        question="D = 256 here: how many features does your kernels' tl.arange over the head dim cover, and "
        "who writes features 128 to 255 of the partial outputs the merge reads?",
        section="3.1",
    ),
    Mistake(
        18,
        fails=("test_group_with_an_empty_prefix",),
        passes=(
            "test_worked_example_three_requests",
            "test_groups_of_one_member",
            "test_tiles_hold_one_group",
        ),
        # No message: the unwritten slots read as NaN, or a launcher's own plan check refuses the plan.
        question="Group 1's prefix is 0 tokens: does your planner give it a tile, and if not, which of its "
        "members' partial slots does the merge read all the same?",
        section="3.5",
    ),
    # Reading row g coincides with the first member's row whenever group g starts at sequence g: the
    # dedicated case, and the two-group cases, tell it from pitfalls 6 and 12.
    Mistake(
        19,
        fails=("test_shared_pages_read_from_the_tiles_first_member", "test_tiles_hold_one_group"),
        passes=(
            "test_worked_example_three_requests",
            "test_members_one_past_the_tile",
            "test_every_prefix_chunk_count_matches",
            "test_prefix_counted_once",
            "test_sequences_in_no_group_start_at_token_0",
        ),
        question="Group 1's members are sequences 2 and 3: which row of block_tables holds the shared "
        "pages, and which row does your prefix tile read?",
        section="3.1",
    ),
    Mistake(
        20,
        fails=("test_sequences_in_no_group_start_at_token_0", "test_every_suffix_split_count_matches"),
        passes=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_groups_of_one_member",
            "test_group_with_an_empty_prefix",
        ),
        question="Sequence 2 has prefix_group = -1: which prefix length does your suffix stage give it, and "
        "what does prefix_lens[-1] name?",
        section="3.3",
    ),
    Mistake(
        20,
        # The same mistake in plan(): the suffix splits are sized for a start past the prefix, so the
        # kernels' guard sees a context longer than the plan covers (the suffix counts themselves pass).
        fails=("test_sequences_in_no_group_start_at_token_0",),
        passes=(
            "test_worked_example_three_requests",
            "test_prefix_counted_once",
            "test_groups_of_one_member",
            "test_group_with_an_empty_prefix",
        ),
        messages=(r"leaves more tokens after the prefix than the plan's suffix splits cover",),
        question="Sequence 2 has prefix_group = -1: at which token does your plan() start its suffix, and "
        "what does prefix_lens[-1] name?",
        section="3.3",
    ),
    Mistake(
        17,
        fails=("test_sequence_index_widened_to_int64",),
        passes=("test_worked_example_three_requests", "test_q_and_cache_strides_are_used"),
        question="Member 2's row of q starts 3 * 2**30 elements in: in which integer type does your kernel "
        "compute b * stride_qb, in the prefix tile and in the suffix stage?",
        section="3.1",
    ),
    Mistake(
        17,
        fails=("test_page_index_widened_to_int64",),
        passes=("test_worked_example_three_requests", "test_page_sizes"),
        question="Only block ids past 2**31 / stride_kb fail: in which integer type is each block id "
        "multiplied by the page stride, on the path that reads one id per page and on the one that "
        "gathers an id per token?",
        section="3.1",
    ),
    Mistake(
        15,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, PAGE, heads, groups, dtype, layouts and plan; which of these does your kernel handle only one "
        "at a time (a stride taken from another tensor, a tile sized for another D or PAGE)?",
        section="3",
    ),
]
