"""Grader for L5, one kernel for every step: sliding windows and attention sinks. Each test is named for
the mistake it catches.

Run: make test L=l5 (your drills/mine) or make test L=l5 IMPL=solutions. The cases are L4's (a poisoned,
shuffled page pool: NaN in every stale slot and unused block, garbage ids past each sequence's last page,
`out` a view into a canary-filled buffer), run with windows and sinks. The oracle gathers each sequence's
pages and runs a plain fp32 softmax over the keys p - window < j <= p, with one more logit per head, the
sink, in the denominator only.
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
    keys_past_fp16_range,
    raises_naming,
    seeded,
    sizes,
)
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import (
    HEAD_DIMS,
    KV_LAYOUTS,
    TABLE_LAYOUTS,
    V_UNLIKE_K_NEEDS_TWO_STRIDES,
    blocks_past,
    far_apart,
    gather_kv,
    grouping_cases,
    in_wider_table,
    int32_tensor,
    laid_out,
    launch_into_canary,
    pool_past_int32,
    rows_far_apart,
    shift_scores,
    skip_without_memory_for_sparse_pages,
    spoiled_call,
)
from drills.tests.test_l4_paged_prefill import BAD_INPUTS as L4_BAD_INPUTS
from drills.tests.test_l4_paged_prefill import (
    PrefillCase,
    _rows_past_int32,
    make_prefill_case,
    pooled_caches,
)

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK_M": (
        "test_band_covers_every_row_of_a_tile",
        "test_rows_past_a_sequence_end_not_written",
        "test_packed_group_wider_than_the_tile",  # GROUP = 40 widens the packed tile past 32 rows
    ),
    "BLOCK_N": ("test_window_sizes", "test_keys_past_the_context_are_not_read"),
    "BLOCK_Q": ("test_band_covers_every_row_of_a_tile", "test_rows_past_a_sequence_end_not_written"),
    "BLOCK_S": ("test_split_band_merges_every_split", "test_split_merge_reads_every_tile_of_splits"),
    "D": ("test_widest_head_dim_is_read_whole",),
    "GROUP": ("test_kv_head_grouping_is_contiguous",),
    "HEADS": ("test_band_covers_every_row_of_a_tile", "test_packed_group_wider_than_the_tile"),
    "MASKED": ("test_window_sizes", "test_keys_past_the_context_are_not_read"),
    "PAGE": ("test_page_sizes",),
    "SAME_KV": ("test_k_and_v_caches_with_different_strides",),
    "STORE_LSE": (
        "test_lse_includes_the_sink",
        "test_window_counts_from_the_absolute_position",
    ),  # with, without
    "WIDE": ("test_page_index_widened_to_int64", "test_v_page_offsets_widened_to_int64", "test_window_sizes"),
    "WINDOW": ("test_window_sizes", "test_equals_l4_without_window_or_sinks"),
    "SINKS": ("test_sinks_join_the_denominator_only", "test_window_sizes"),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}
BOUNDS_GAPS = {"GUARD": "no bound: the device guard's switch, on in every call but the benchmark's timing"}

DIMS = ("token", "head", "d")  # how a mismatch names its position: row of the packed q, query head, feature
LSE_DIMS = ("token", "head")
LSE_TOL = dict(atol=1e-3, rtol=1e-4, rel=1e-4)

# What unified_attention admits, at its boundaries (drills/validate.py's limits, so the domain cannot drift
# from the launcher): test_pairwise_domain_cases_match_the_oracle crosses every pair of them.
_D_LO, _D_HI = validate.HEAD_DIM_RANGE
WINDOW_MAX = 2**31 - 1  # the launcher's largest window (key positions are int32 in the kernel)
# (q_lens, context_lens) for a page size: every kind of row, each crossing a tile or page bound of its own.
# Few tokens and heads: the interpreter's time goes with programs, and the split's merge runs one per row
# and head.
BATCHES_BY_PAGE = {
    "pure_prefill": lambda P: ([17], [17]),  # no prefix; 17 new tokens: one past a 16-key tile
    "chunk_and_decode_over_prefixes": lambda P: ([5, 1], [P + 8, 2 * P + 9]),  # prefixes of P + 3 and 2 P + 8
    "decode_padding_chunk": lambda P: ([1, 0, 1, 6], [P + 2, 4, 1, P + 9]),  # every kind of row at once
}
# Sink logits around a shift: none, one that takes nearly all the weight (out near zero), one that weighs
# nothing (e^-40 against keys of order one).
SINK_SHIFTS = {"none": None, "large": 20.0, "very_negative": -40.0}
DOMAIN = Domain(
    axes=dict(
        D=(_D_LO, _D_HI),  # the narrowest and the widest head dim; D = 256 takes its own tile config
        PAGE=(1, 16, 32),  # pages smaller than a key tile, one tile, two tiles (any power of two)
        heads=((2, 2), (6, 2), (5, 1)),  # (Hq, Hkv): MHA, GROUP 3, MQA with GROUP 5 (packed rows padded)
        batch=tuple(BATCHES_BY_PAGE),
        dtype=(torch.float16, torch.bfloat16),
        q=("contiguous", "strided"),  # far-apart rows: test_rows_and_heads_widened_to_int64
        kv=KV_LAYOUTS,
        table=TABLE_LAYOUTS,
        # Each token sees itself only; under a page of 16; under a key tile (16) but past PAGE = 1; the
        # largest admitted, past every context (no window in effect, p - window near int32's floor).
        window=(None, 1, 5, 12, WINDOW_MAX),
        sinks=tuple(SINK_SHIFTS),
        split=("none", "forced2"),  # plan=None, or the band cut in two shares and merged
        lse=(False, True),
    ),
    rules=(V_UNLIKE_K_NEEDS_TWO_STRIDES,),
    limits=dict(head_dims=HEAD_DIMS),
)


def unified_reference(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    window=None,
    sinks=None,
    scale=None,
    window_from_chunk=False,
    sink_in_numerator=False,
    band_of_tiles=None,
    window_of_tiles=None,
):
    """fp32 oracle: for each sequence, gather its pages, score its new tokens against every key, keep
    key j for the token at position p when p - window < j <= p, append head h's sink logit as one more
    column of the softmax whose value is zero. Returns (out [total_q, Hq, D], lse [total_q, Hq]).
    Two wrong answers the diagnosis names: window_from_chunk=True counts the window from the token's index
    in its chunk instead of its position; sink_in_numerator=True gives the sink a value of one;
    band_of_tiles=(BLOCK_Q, BLOCK_N) lets each row see every key of its tile's band up to itself (the
    window narrows the key loop and masks nothing); window_of_tiles=BLOCK_Q counts every row's window
    back from the position of its tile's first row."""
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
        # Keys outside every window may be poisoned on purpose: zeros here, and hidden below.
        k = gather_kv(k_cache, block_tables[b], ctx).float().nan_to_num(0.0).repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, block_tables[b], ctx).float().nan_to_num(0.0).repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[first:last].float(), k) * scale  # [Hq, q_len, ctx]
        i = torch.arange(last - first, device=q.device)[:, None] + ctx - (last - first)  # positions
        j = torch.arange(ctx, device=q.device)[None, :]  # key positions
        hidden = j > i
        if window is not None and band_of_tiles is not None:
            block_q, block_n = band_of_tiles
            tok0 = torch.arange(last - first, device=q.device)[:, None] // block_q * block_q
            band_lo = (ctx - (last - first) + tok0 - window + 1).clamp(min=0) // block_n * block_n
            hidden = hidden | (j < band_lo)
        elif window is not None and window_of_tiles is not None:
            tok0 = torch.arange(last - first, device=q.device)[:, None] // window_of_tiles * window_of_tiles
            hidden = hidden | (j <= ctx - (last - first) + tok0 - window)
        elif window is not None:
            start = (i - (ctx - (last - first))) if window_from_chunk else i
            hidden = hidden | (j <= start - window)
        s = s.masked_fill(hidden, float("-inf"))
        if sinks is not None:
            sink = sinks.float().to(q.device)[:, None, None].expand(Hq, last - first, 1)
            s = torch.cat([s, sink], dim=-1)  # [Hq, q_len, ctx + 1]
            extra = torch.ones if sink_in_numerator else torch.zeros
            v = torch.cat([v, extra(1, Hq, D, device=q.device)], dim=0)  # [ctx + 1, Hq, D]
        out[first:last] = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v)
        lse[first:last] = torch.logsumexp(s, dim=-1).T
    return out, lse


def make_sinks(Hq, stream, device, shift=0.0):
    """[Hq] fp32 sink logits around `shift` (a few units apart: each head's own sink matters)."""
    gen = torch.Generator().manual_seed(seeded(stream))
    return (torch.randn(Hq, generator=gen) * 2 + shift).to(device)


SINK_SCALED = "the sink multiplied by the softmax scale, as a score is"
BAND_UNMASKED = "the window narrows the key loop and masks nothing"
SINKS_AS_CONTIGUOUS = "sinks read as if contiguous (entry h at h), where it is a view of stride 2"


def tiles_of(case):
    """(BLOCK_Q, BLOCK_N) of the launcher's config for this case: the reference's _config, which the stub
    gives the learner as it is (the stub contract holds it to the reference's code)."""
    from drills.launch import next_pow2
    from drills.solutions.l5_unified_attention import _config

    total_q, Hq, D = case.q.shape
    block_m, block_n, _, _, packed = _config(D, total_q / case.block_tables.shape[0])
    heads = Hq // case.k_cache.shape[2] if packed else 1
    return max(block_m, next_pow2(heads)) // heads, block_n


WINDOW_OF_THE_TILE = (
    "every row's window counted back from its tile's first row, not from the row's own position"
)


def wrong_answers(out, case, window, sinks, scale=None, tiles=None) -> str:
    """Which wrong answer `out` is, as a sentence ("" when none): the window one key too wide or too
    narrow, counted from each token's index in its chunk, no window at all, or (given tiles, the
    launcher's (BLOCK_Q, BLOCK_N)) a band without the window's mask; the sink's mistakes. They fail
    the same checks; only the rows themselves tell them apart."""
    variants = []
    if window is not None:
        variants += [
            (
                "window + 1 keys: the window's lower bound is off by one (j >= p - window)",
                dict(window=window + 1),
            ),
            (
                "window - 1 keys: the window's lower bound is off by one (j > p - window + 1)",
                dict(window=max(window - 1, 1)),
            ),
            (
                "the window counted from each token's index in its chunk, not its position",
                dict(window_from_chunk=True),
            ),
            ("no window at all", dict(window=None)),
        ]
        if tiles is not None:
            variants.append((WINDOW_OF_THE_TILE, dict(window_of_tiles=tiles[0])))
            variants.append(
                (
                    f"every key of the tile's band up to the row: {BAND_UNMASKED}",
                    dict(band_of_tiles=tiles),
                )
            )
    if sinks is not None:
        variants.append(("the sink in the numerator too (a key of value one)", dict(sink_in_numerator=True)))
        variants.append(
            ("the answer without the sink (its e^(sink - m) never joined the sum)", dict(sinks=None))
        )
        # A weight of 2^sink is e^(sink * ln 2): the sink loaded without log2 e in a base-2 kernel.
        variants.append(
            (
                "the sink's logit in natural units where the kernel counts in base 2 (a weight of 2^sink)",
                dict(sinks=sinks * math.log(2)),
            )
        )
        # The sink is a logit already: multiplied by the softmax scale, as a score q . k is, it weighs less.
        d_scale = 1.0 / math.sqrt(case.q.shape[-1]) if scale is None else scale
        variants.append(
            (
                f"{SINK_SCALED}, a weight of e^(sink * scale)",
                dict(sinks=sinks * d_scale),
            )
        )
        if sinks.dim() == 1 and sinks.stride(0) != 1:  # a view: stride 1 reads the entries between its own
            variants.append((SINKS_AS_CONTIGUOUS, dict(sinks=sinks.as_strided(sinks.shape, (1,)))))
        # Query head h's sink is sinks[h]; read by its KV head, or at its group's first head, it is another's.
        Hq, Hkv = case.q.shape[1], case.k_cache.shape[2]
        kv_of = torch.arange(Hq, device=sinks.device) // (Hq // Hkv)  # [Hq] each query head's KV head
        if Hq > Hkv:
            variants += [
                (
                    "each head's sink read at another head (sinks[h // GROUP], its KV head's index)",
                    dict(sinks=sinks[kv_of]),
                ),
                (
                    "each head's sink read at another head (sinks[h // GROUP * GROUP], its group's first)",
                    dict(sinks=sinks[kv_of * (Hq // Hkv)]),
                ),
            ]
    for text, change in variants:
        ref, _ = unified_reference(*case.args, **{**dict(window=window, sinks=sinks, scale=scale), **change})
        # A sink read at another head, read between a view's entries or scaled moves outputs by about as much
        # as the sinks differ: held to out's own dtype's tolerance, as the check itself holds the right answer.
        # So do a window one key off and a band without the mask: the kernel sums the same keys as the
        # answer named, rounded to out's dtype (8.1547 is 8.1562 in fp16).
        loose = (
            text.startswith("window ")
            or "another head" in text
            or text in (SINKS_AS_CONTIGUOUS,)
            or text.startswith(SINK_SCALED)
            or text.endswith(BAND_UNMASKED)
            or text == WINDOW_OF_THE_TILE
        )
        if mismatch(out.float(), ref) is None or (loose and mismatch(out, ref) is None):
            return f"the output is {text}"
    return ""


def check(impl, case, window=None, sinks=None, scale=None, plan=None, lse=False, **tol):
    """unified_attention on `case` with a canary-padded out, against the oracle: out [total_q, Hq, D].
    A mismatch says which wrong answer the output is, when it is one (wrong_answers). lse=True asks for
    lse in the same launch and holds it to the oracle's after out (one launch where a split's merge is
    the slow part under the interpreter)."""
    lse_box = []

    def launch(*args, **kw):
        result = impl.unified_attention(*args, window=window, sinks=sinks, plan=plan, return_lse=lse, **kw)
        if lse:
            lse_box.append(result[1])
            return result[0]
        return result

    out = launch_into_canary(launch, case, scale)
    ref, ref_lse = unified_reference(*case.args, window=window, sinks=sinks, scale=scale)
    problem = mismatch(out, ref, DIMS, **tol)
    if problem is not None:
        which = wrong_answers(out, case, window, sinks, scale, tiles=tiles_of(case))
        raise AssertionError(problem + (f"\n{which}" if which else ""))
    if lse:
        assert lse_box[0].dtype == torch.float32 and lse_box[0].shape == case.q.shape[:2], (
            f"lse: {lse_box[0].dtype} {tuple(lse_box[0].shape)}"
        )
        _lse_close(lse_box[0], ref_lse)
    return out


LSE_ONLY = "out matches, but the returned lse does not"


def _lse_close(lse, ref_lse):
    """lse held to the oracle's, after out matched: the message says so, since a wrong lse with a right out
    is a mistake of the lse alone (its base, its sink), never of the weights that made out."""
    problem = mismatch(lse, ref_lse, LSE_DIMS, **LSE_TOL)
    if problem is not None:
        raise AssertionError(f"{LSE_ONLY}:\n{problem}")


def check_lse(impl, case, window=None, sinks=None, plan=None):
    out, lse = impl.unified_attention(*case.args, window=window, sinks=sinks, return_lse=True, plan=plan)
    ref, ref_lse = unified_reference(*case.args, window=window, sinks=sinks)
    assert lse.dtype == torch.float32 and lse.shape == case.q.shape[:2], (
        f"lse: {lse.dtype} {tuple(lse.shape)}"
    )
    if mismatch(out, ref, DIMS) is None:
        _lse_close(lse, ref_lse)
    assert_close(lse, ref_lse, LSE_DIMS, **LSE_TOL)
    assert_close(out, ref, DIMS)


def mixed_case(runtime, stream, Hq=8, Hkv=2, D=64, PAGE=8, **paged):
    """A decode row over a long prefix, a chunk over a prefix, a padding row, a pure prefill and a decode row
    with ctx 1: every kind of row in one batch."""
    q_lens = sizes(runtime, [1, 21, 0, 13, 1], [1, 700, 0, 300, 1])
    ctx = sizes(runtime, [61, 50, 9, 13, 1], [4000, 2000, 9, 300, 1])
    return make_prefill_case(ctx, q_lens, Hq, Hkv, D, PAGE, stream=stream, device=runtime.device, **paged)


# --- Section 2 "By hand": one decode row at position 9, window 4, PAGE 4, then a sink of 1.5 ----------

HAND_SCORES = {
    6: 1.0,
    7: 0.0,
    8: 2.0,
    9: 1.0,
}  # q . k of the keys in the window; V[:, 0] = the key's position


def worked_example(device):
    """One sequence, context 10, one new token (position 9), Hq = Hkv = 1, D = 16, PAGE = 4, scale 1.
    Keys 0-5 score 100 (any of them read unmasked would take the whole softmax); keys 6-9 score as
    HAND_SCORES. Blocks are shuffled: pages 0, 1, 2 live in blocks 3, 0, 2; block 1 and the stale slots
    10, 11 are NaN."""
    D, PAGE = 16, 4
    k_cache = torch.full((4, PAGE, 1, D), float("nan"), dtype=torch.float16, device=device)
    v_cache = k_cache.clone()
    table = [3, 0, 2]
    for j in range(10):
        blk, slot = table[j // PAGE], j % PAGE
        k_cache[blk, slot, 0] = 0.0
        v_cache[blk, slot, 0] = 0.0
        k_cache[blk, slot, 0, 0] = HAND_SCORES.get(j, 100.0)
        v_cache[blk, slot, 0, 0] = float(j)
    q = torch.zeros(1, 1, D, dtype=torch.float16, device=device)
    q[0, 0, 0] = 1.0
    return PrefillCase(
        q,
        k_cache,
        v_cache,
        int32_tensor(device, *table).reshape(1, 3),
        int32_tensor(device, 0, 1),
        int32_tensor(device, 10),
    )


def test_worked_example_window_of_4(impl, runtime):
    """Section 2: position 9 with window 4 sees keys 6 to 9 only: out = 14.4655 / 1.8711 = 7.731 in
    feature 0, lse = 2 + ln 1.8711 = 2.627."""
    case = worked_example(runtime.device)
    out, lse = impl.unified_attention(*case.args, window=4, scale=1.0, return_lse=True)
    which = wrong_answers(out, case, 4, None, scale=1.0)
    assert abs(out[0, 0, 0].item() - 7.731) < 0.01, (
        f"out[0, 0, 0] = {out[0, 0, 0].item():.4f}, expected 7.731" + (f"\n{which}" if which else "")
    )
    assert abs(lse[0, 0].item() - 2.6265) < 1e-3, f"lse = {lse[0, 0].item():.4f}, expected 2.6265"


def test_worked_example_with_a_sink_of_1_5(impl, runtime):
    """Section 2: the same row with sinks = [1.5]: the running max starts at 1.5 and the sum at 1; the
    sum ends at 2.4776 and the numerator stays 14.4655: out = 5.838, lse = 2 + ln 2.4776 = 2.907."""
    case = worked_example(runtime.device)
    sinks = torch.tensor([1.5], device=runtime.device)
    out, lse = impl.unified_attention(*case.args, window=4, sinks=sinks, scale=1.0, return_lse=True)
    which = wrong_answers(out, case, 4, sinks, scale=1.0)
    assert abs(out[0, 0, 0].item() - 5.838) < 0.01, (
        f"out[0, 0, 0] = {out[0, 0, 0].item():.4f}, expected 5.838" + (f"\n{which}" if which else "")
    )
    assert abs(lse[0, 0].item() - 2.9073) < 1e-3, f"lse = {lse[0, 0].item():.4f}, expected 2.9073"


# --- Stage 1: the band ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window",
    [1, 5, 12, 40, WINDOW_MAX],
    ids=["w1", "w5-under-a-page", "w12-under-a-key-tile", "w40", "w-largest"],
)
def test_window_sizes(impl, runtime, window):
    """Every kind of row in one batch (decode rows, a chunk over a prefix, padding, a pure prefill) with a
    window of 1 (each token sees itself only), under a page (8), under a key tile (16 here), over a tile,
    and the largest admitted, 2**31 - 1, past every context (the same as no window: key + window then
    passes int32). lse too, from the same launch."""
    case = mixed_case(runtime, stream=301 + window % 97)
    check(impl, case, window=window, lse=True)


def test_window_counts_from_the_absolute_position(impl, runtime):
    """Decode rows and chunks after long prefixes: the row at position p sees p - window < j <= p, with p
    the cached prefix plus its index in the chunk. A window counted from the index alone lets a decode
    row (index 0) see every key of its band."""
    q_lens = sizes(runtime, [1, 1, 6], [1, 1, 100])
    ctx = sizes(runtime, [77, 45, 70], [3000, 1000, 2000])
    case = make_prefill_case(ctx, q_lens, 4, 2, 64, 8, stream=307, device=runtime.device)
    check(impl, case, window=21)


def test_window_on_prompts_without_a_prefix(impl, runtime):
    """Pure prefill (context = new tokens): a token's position is its index in the chunk, so counting the
    window either way gives the same answer here, and its bounds alone decide."""
    q_lens = sizes(runtime, [37, 20, 5], [2048, 777, 64])
    case = make_prefill_case(q_lens, q_lens, 8, 2, 64, 8, stream=309, device=runtime.device)
    check(impl, case, window=11)


@pytest.mark.parametrize("packed", [True, False], ids=["packed-group", "one-head"])
def test_band_covers_every_row_of_a_tile(impl, runtime, packed):
    """Through _launch with 16-row tiles and 16-key tiles: a chunk of 40 tokens after a prefix of 25 with
    window 37, so the rows of one tile have bands that start up to 15 keys apart. A band computed for a
    tile's first row misses keys of its later rows; one for its last row reads keys its first rows must
    not see unmasked."""
    case = make_prefill_case([65, 20], [40, 20], 4, 2, 64, 8, stream=311, device=runtime.device)
    out = torch.full_like(case.q, float("nan"))  # rows never written stay NaN
    impl._launch(*case.args, 0.125, out, window=37, config=(16, 16, 4, 1, packed))
    ref, _ = unified_reference(*case.args, window=37, scale=0.125)
    assert_close(out, ref, DIMS)


def poison_outside_bands(case, window):
    """NaN in K and V of every page whose keys no new token of its sequence may see (all before the first
    new token's window). Such pages hold live keys: only a kernel that loads tiles before the band reads
    them. Returns how many pages were poisoned."""
    PAGE = case.k_cache.shape[1]
    poisoned = 0
    for b, (n, ctx) in enumerate(zip(case.q_lens, case.context_lens.tolist())):
        if n == 0:
            continue
        first_key = max(ctx - n - window + 1, 0)  # the first new token's first key
        for p in range(first_key // PAGE):
            blk = int(case.block_tables[b, p])
            case.k_cache[blk] = float("nan")
            case.v_cache[blk] = float("nan")
            poisoned += 1
    return poisoned


def test_tiles_outside_the_band_are_never_loaded(impl, runtime):
    """Decode rows and a chunk over long prefixes with window 24 and PAGE 64: every page wholly before a
    sequence's band holds NaN. A kernel that loads every tile from key 0 and masks the ones outside the
    window computes the right numbers and reads the whole prefix: NaN here (with a key tile of at most 64)."""
    q_lens = sizes(runtime, [1, 1, 10], [1, 1, 100])
    ctx = sizes(runtime, [200, 140, 150], [8000, 4000, 2000])
    case = make_prefill_case(ctx, q_lens, 4, 2, 64, 64, stream=313, device=runtime.device)
    assert poison_outside_bands(case, 24) >= 4
    check(impl, case, window=24)


def test_equals_l4_without_window_or_sinks(impl, runtime):
    """window=None and sinks=None is L4's paged_prefill: the same numbers, up to rounding, on a mixed
    batch, with lse."""
    from drills.solutions.l4_paged_prefill import paged_prefill

    case = mixed_case(runtime, stream=317)
    out, lse = impl.unified_attention(*case.args, return_lse=True)
    ref, ref_lse = paged_prefill(*case.args, return_lse=True)
    assert_close(out, ref.float(), DIMS)
    assert_close(lse, ref_lse, LSE_DIMS, **LSE_TOL)


# --- Stage 2: sinks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [0.0, 20.0, -40.0], ids=["moderate", "large-out-to-zero", "very-negative"])
def test_sinks_join_the_denominator_only(impl, runtime, shift):
    """Sinks around 0 (they matter), around 20 (the sink takes nearly all the weight: out goes to zero),
    around -40 (no effect): the sink adds e^sink to the denominator and nothing to the numerator, once per
    row. With and without a window."""
    case = mixed_case(runtime, stream=331)
    sinks = make_sinks(8, 333, runtime.device, shift)
    # Outputs near zero (the large sink): fp16 rounding of tiny values makes the norm ratio meaningless,
    # so every element is held to 1e-3 instead; a sink left out gives outputs of order 1.
    tol = dict(atol=1e-3, rtol=0.0, rel=1.0) if shift > 10 else {}
    check(impl, case, sinks=sinks, **tol)
    check(impl, case, window=17, sinks=sinks, **tol)


def test_lse_includes_the_sink(impl, runtime):
    """lse = log of the whole denominator, e^sink included (a later merge needs it)."""
    case = mixed_case(runtime, stream=337)
    sinks = make_sinks(8, 339, runtime.device)
    check_lse(impl, case, sinks=sinks)
    check_lse(impl, case, window=9, sinks=sinks)


# --- Stage 3: the planner and the split band -------------------------------------------------------------


def decode_case(runtime, stream, B=5):
    ctx = sizes(runtime, [90, 1, 37, 150, 64][:B], [3000, 1, 777, 4000, 2048][:B])
    return make_prefill_case(ctx, [1] * B, 8, 2, 64, 8, stream=stream, device=runtime.device)


@pytest.mark.parametrize("splits", [2, 3, 17], ids=["2-splits", "3-splits", "17-splits"])
def test_split_band_merges_every_split(impl, runtime, splits):
    """Decode rows whose band is cut into 2, 3 or 17 shares (17: more splits than a merge tile of 16 and
    than some bands have tiles), with a window and sinks: the sink belongs to one split only, empty splits
    weigh nothing, and the merge rescales by each split's lse."""
    # Every split count launches `splits` programs per tile and head group: three rows (ctx 90: 6 key
    # tiles, shares of several tiles; ctx 1: one tile, every other share empty; ctx 37: a partial third)
    # leave shares empty with or without the window, and 17 splits more than any band has tiles.
    case = decode_case(runtime, 341, B=3)
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 8, num_splits=splits)
    sinks = make_sinks(8, 343, runtime.device)
    check(impl, case, sinks=sinks, plan=plan)
    check(impl, case, window=40, sinks=sinks, plan=plan, lse=True)


def test_split_merge_weighs_each_split_by_its_lse(impl, runtime):
    """No sinks: 17 splits of decode rows with a window, some shares empty. The merge weighs split s by
    e^(lse_s - max) (lse in natural log, as stored), an empty one (lse -inf) by 0, and returns the
    merged lse; a merge in another base, or an empty share's 0 / 0, shows here with no sink to blame."""
    case = decode_case(runtime, 341, B=3)
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 8, num_splits=17)
    check_lse(impl, case, window=40, plan=plan)


def test_split_shares_are_whole_tiles(impl, runtime):
    """q = 0 and no window or sink: every key scores 0, so the answer is the plain mean of V. Decode rows of
    192 keys in 5 splits: shares of whole tiles are 48 keys (3 tiles of 16; one 64-key tile on a GPU) with
    the last share empty, every other share with the same lse, so a merge in any base gives the mean. A
    share of 192 / 5 = 39 keys, not a whole number of tiles, starts split 1 at key 39: its last tile
    reaches into split 2's keys, which then count twice, and the last share's tile past the context."""
    case = make_prefill_case([192, 192], [1, 1], 4, 2, 64, 8, stream=461, device=runtime.device)
    case.q.zero_()
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 8, num_splits=5)
    check(impl, case, plan=plan)


def test_split_merge_starts_its_max_at_minus_inf(impl, runtime):
    """Decode rows whose every score is about -128, in 3 splits: each split's lse is past fp32's exp range
    below, so the merge's running max must start at -inf (the first lse sets it). Started at 0, every
    weight e^(lse - 0) underflows to 0 and the row comes out as if it had seen no key."""
    case = make_prefill_case([70, 33], [1, 1], 4, 2, 64, 8, stream=463, device=runtime.device)
    shift_scores(case, -128.0)
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 8, num_splits=3)
    check(impl, case, plan=plan, lse=True)


def test_split_merge_reads_every_tile_of_splits(impl, runtime):
    """65 splits, one more than the widest merge tile (64) holds, each one key tile of a decode row at
    1,040 keys: the last tile's keys score 4 where the others score about 0, so a merge that reads one
    tile of splits drops the last split and about a third of the weight. The planner gives a decode row
    hundreds of splits on a large GPU (4 programs per SM, in shares of 64 keys)."""
    D, PAGE, n = 16, 16, 16 * 65
    case = make_prefill_case([n], [1], 1, 1, D, PAGE, stream=451, device=runtime.device)
    t = torch.arange(n - 16, n, device=runtime.device)  # the last key tile, the 65th split's share
    blocks, slots = case.block_tables[0].long()[t // PAGE], t % PAGE
    q0 = case.q[0, 0].float()
    k_last = 4 * math.sqrt(D) * q0 / q0.dot(q0)  # [D]: q . k * scale = 4
    case.k_cache[blocks, slots, 0] = k_last.to(case.q.dtype)
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 1, PAGE, num_splits=65)
    try:
        check(impl, case, plan=plan, lse=True)
    except AssertionError as failure:
        out = impl.unified_attention(*case.args, plan=plan)
        which = split_tiles_answer(out, case, n - 16)
        raise AssertionError(f"{failure}\n{which}" if which else str(failure)) from None


def split_tiles_answer(out, case, cut) -> str:
    """What a 65-split merge's output is, as a sentence ("" when neither): the answer of the keys before
    `cut` alone (the splits past the merge's first tile dropped), or a mix of that answer and the last
    split's with another weight than their lse give (the running sum rescaled between tiles of splits in
    another base than the weights). out lies on the segment between the two answers in both cases."""
    keys = case.context_lens.clone()
    keys[0] = cut  # the first tile of splits' keys: a decode row at position cut - 1 sees exactly them
    head = PrefillCase(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q, keys)
    a, lse_a = unified_reference(*head.args)  # [1, 1, D], [1, 1]
    right, lse_all = unified_reference(*case.args)
    share = torch.exp(lse_a - lse_all)[..., None]  # the first tile's weight in the right answer
    b = (right - a * share) / (1 - share)  # the last split's answer, recovered from the right one
    got, d = out.float().flatten(), (a - b).flatten()
    if mismatch(out, a) is None:  # held to out's dtype's tolerance, as the check holds the right answer
        return "the output is the answer without the splits past the merge's first tile of splits"
    lam = float((got - b.flatten()).dot(d) / d.dot(d))  # out = lam * a + (1 - lam) * b, fitted
    if mismatch(out, lam * a + (1 - lam) * b) is not None:
        return ""
    return (
        f"the output weighs the first tile of splits {lam:.3f} where {float(share):.3f} "
        "belongs: the running sum is rescaled between tiles of splits in another base than the weights "
        "(exp2 beside exp)"
    )


def test_split_band_on_a_mixed_batch(impl, runtime):
    """A forced split on prefill chunks too: each tile's band is shared out, whatever its rows."""
    case = mixed_case(runtime, stream=347)
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 8, num_splits=3)
    sinks = make_sinks(8, 349, runtime.device)
    check(impl, case, window=13, sinks=sinks, plan=plan)


def test_planner_splits_small_decode_batches_only(impl, runtime):
    """plan(): a batch with a prefill chunk is not split; a small decode-only batch is, in shares of at
    least 64 keys of its longest band (the window's, when there is one); a wide one is not."""
    p = impl.plan([0, 1, 5], [100, 40], 2, 16, num_sms=132)
    assert p.num_splits == 1, f"a batch with a 4-token chunk: {p.num_splits} splits, expected 1"
    p = impl.plan([0, 1, 2], [4096, 100], 8, 16, num_sms=132)
    assert p.num_splits == 33, f"2 decode rows x 8 KV heads at 4096: {p.num_splits} splits, expected 33"
    p = impl.plan([0, 1, 2], [4096, 100], 8, 16, window=128, num_sms=132)
    assert p.num_splits == 2, f"the same with window 128: {p.num_splits} splits, expected 2"
    p = impl.plan(list(range(101)), [4096] * 100, 8, 16, num_sms=132)
    assert p.num_splits == 1, f"100 decode rows x 8 KV heads: {p.num_splits} splits, expected 1"
    # What no program reads does not count: padding rows (a CUDA graph's batch padded with q_len 0 rows) run
    # no program, and a window past the context leaves the band at the context.
    p = impl.plan([0, 1, 2] + [2] * 6, [4096, 100] + [0] * 6, 8, 16, num_sms=132)
    assert p.num_splits == 33, (
        f"2 decode rows x 8 KV heads at 4096 and 6 padding rows: {p.num_splits} splits, expected 33 "
        "(padding rows are not decode rows)"
    )
    p = impl.plan([0, 1], [100], 1, 16, window=8192, num_sms=132)
    assert p.num_splits == 2, (
        f"1 decode row x 1 KV head at 100 with window 8192: {p.num_splits} splits, expected 2 (the band is "
        "min(context, window) = 100 keys)"
    )


def test_planner_rejects_bad_input(impl, runtime):
    """plan() names what is wrong: a split count of 0 or past grid axis 1, cu_seqlens_q of the wrong
    length, a negative context, a window of 0."""
    with raises_naming(ValueError, "num_splits"):
        impl.plan([0, 1], [5], 1, 16, num_splits=0)
    with raises_naming(ValueError, "num_splits"):
        impl.plan([0, 1], [5], 1, 16, num_splits=65536)
    with raises_naming(ValueError, "cu_seqlens_q"):
        impl.plan([0, 1, 2], [5], 1, 16)
    with raises_naming(ValueError, "context_lens"):
        impl.plan([0, 1], [-5], 1, 16)
    with raises_naming(ValueError, "window"):
        impl.plan([0, 1], [5], 1, 16, window=0)


# --- L4's cases, with a window and sinks ------------------------------------------------------------


@grouping_cases("group1-MHA", "group3", "group8-MQA")
def test_kv_head_grouping_is_contiguous(impl, runtime, Hq, Hkv):
    """Query head h reads KV head h // GROUP and its own sink sinks[h]."""
    q_lens = sizes(runtime, [11, 1], [600, 1])
    ctx = sizes(runtime, [20, 30], [1000, 2000])
    case = make_prefill_case(ctx, q_lens, Hq, Hkv, 64, 8, stream=353 + Hq, device=runtime.device)
    check(impl, case, window=7, sinks=make_sinks(Hq, 355, runtime.device))


@pytest.mark.parametrize("PAGE", [1, 4, 32, 64])
def test_page_sizes(impl, runtime, PAGE):
    """PAGE from 1 to 64: a key tile over several pages or a part of one, a band starting inside a page."""
    case = make_prefill_case([45, 70], [13, 1], 4, 2, 64, PAGE, stream=359 + PAGE, device=runtime.device)
    check(impl, case, window=19, sinks=make_sinks(4, 361, runtime.device))


def test_rows_past_a_sequence_end_not_written(impl, runtime):
    """Sequences of 5, 3 and 11 new tokens: a tile's rows past its sequence's end belong to the next."""
    case = make_prefill_case([9, 3, 30], [5, 3, 11], 4, 2, 64, 8, stream=367, device=runtime.device)
    check(impl, case, window=4, sinks=make_sinks(4, 369, runtime.device))


def test_keys_past_the_context_are_not_read(impl, runtime):
    """Contexts of 33 and 19 with PAGE = 8: the last key tile runs into the stale tail and past it."""
    case = make_prefill_case([33, 19], [4, 19], 4, 2, 64, 8, stream=371, device=runtime.device, extra_pages=4)
    check(impl, case, window=10)


def test_pages_shuffled_and_shared(impl, runtime):
    """Three sequences share a cached prefix of two full pages; physical block 0 is in use."""
    q_lens = sizes(runtime, [6, 12, 1], [400, 1000, 1])
    ctx = sizes(runtime, [22, 40, 17], [1000, 1500, 700])
    case = make_prefill_case(
        ctx, q_lens, 8, 2, 64, 8, stream=373, device=runtime.device, shared_prefix_pages=2
    )
    check(impl, case, window=11, sinks=make_sinks(8, 375, runtime.device))


@pytest.mark.parametrize("splits", [1, 2], ids=["one-split", "2-splits"])
def test_table_rows_exactly_full(impl, runtime, splits):
    """Contexts of 40 and 48 with PAGE = 8 in a table of exactly 6 columns, a decode row and a 9-token
    chunk: the second sequence's pages fill its row, the last of the table, so context_lens[1] = max_pages
    * PAGE, the largest valid length. A guard bounded by ctx < max_pages * PAGE zeroes that sequence, and a
    table load masked with cols <= ctx reads past the end of block_tables; window 20, one split and two."""
    case = make_prefill_case([40, 48], [1, 9], 4, 2, 64, 8, stream=433, device=runtime.device)
    table = case.block_tables[:, :6].contiguous()  # [2, 6]: row 1 ends where the tensor ends
    case = PrefillCase(*case.args[:3], table, *case.args[4:])
    plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 8, num_splits=splits)
    check(impl, case, window=20, plan=plan)


def test_widest_head_dim_is_read_whole(impl, runtime):
    """D = 256, the widest head dim admitted."""
    case = make_prefill_case([21, 9], [5, 1], 2, 1, 256, 16, stream=379, device=runtime.device)
    check(impl, case, window=8, sinks=make_sinks(2, 381, runtime.device))


def test_k_and_v_caches_with_different_strides(impl, runtime):
    """k_cache contiguous, v_cache one layer of a NaN-filled pool: V's rows through V's strides."""
    case = make_prefill_case([30, 9], [12, 1], 8, 2, 64, 8, stream=383, device=runtime.device)
    _, v_cache = pooled_caches(case)
    check(impl, PrefillCase(case.q, case.k_cache, v_cache, *case.args[3:]), window=5)


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    case = make_prefill_case([20, 33], [9, 1], 4, 2, 64, 16, stream=389, dtype=dtype, device=runtime.device)
    out = check(impl, case, window=10, sinks=make_sinks(4, 391, runtime.device))
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_outputs_and_keys_past_fp16_range(impl, runtime, dtype):
    """V from 2^16 up in bf16 (fill_past_fp16_range): every output is past fp16's largest, 65504, so a
    P V dot or a store cast to tl.float16 makes it inf; unsplit and in two splits. Then K from 2^16 up
    with q scaled down to keep the scores (keys_past_fp16_range): a score dot of q and K cast to
    tl.float16 makes them inf. The fp16 case is the same check inside fp16's range."""
    case = make_prefill_case([26, 9], [7, 1], 4, 2, 32, 16, stream=401, dtype=dtype, device=runtime.device)
    sinks = make_sinks(4, 403, runtime.device)
    fill_past_fp16_range(case.v_cache)  # the stale slots' NaN stay NaN
    for splits in (1, 2):
        plan = impl.plan(case.cu_seqlens_q, case.context_lens, 2, 16, num_splits=splits)
        check(impl, case, window=9, sinks=sinks, plan=plan)
    case = make_prefill_case([26, 9], [7, 1], 4, 2, 32, 16, stream=405, dtype=dtype, device=runtime.device)
    keys_past_fp16_range(case.k_cache, case.q)  # q . k as before, K past fp16's range in bf16
    try:
        check(impl, case, window=9, sinks=sinks)
    except AssertionError as e:
        raise AssertionError(f"K from 2^16 up (q scaled down to keep the scores): {e}") from None


def test_packed_group_wider_than_the_tile(impl, runtime):
    """Decode rows pack a KV head's GROUP query heads into one tile (section 3.1): GROUP = 40 (Hq = 40
    on one KV head) is wider than the interpreter's 32-row tile (16 rows on a GPU for decode), so the
    tile widens to the next power of two, 64 rows, one token each. A tile left at its configured height
    computes only its first heads and leaves the others' rows unwritten."""
    case = make_prefill_case([20, 37], [1, 1], 40, 1, 32, 16, stream=407, device=runtime.device)
    check(impl, case, window=11, sinks=make_sinks(40, 409, runtime.device))


def test_q_and_cache_strides_are_used(impl, runtime):
    """q is every other head of a NaN-filled buffer, k_cache and v_cache layer 1 of a NaN-filled pool:
    only the last dimension is contiguous. sinks is every other entry of a buffer whose others are 30 (a
    sink that would take nearly all the weight): read as if contiguous, head h gets another's."""
    case = make_prefill_case([30, 9], [12, 1], 8, 2, 64, 8, stream=385, device=runtime.device)
    total_q, Hq, D = case.q.shape
    buffer = torch.full((total_q, 2 * Hq, D), float("nan"), dtype=case.q.dtype, device=runtime.device)
    q = buffer[:, 1::2]  # [total_q, Hq, D], strides (2 Hq D, 2 D, 1)
    q.copy_(case.q)
    k_cache, v_cache = pooled_caches(case)
    sinks = torch.full((16,), 30.0, device=runtime.device)[1::2]  # [8], stride 2: between, sinks of 30
    sinks.copy_(make_sinks(8, 387, runtime.device))
    check(impl, PrefillCase(q, k_cache, v_cache, *case.args[3:]), window=6, sinks=sinks)


def test_table_rows_are_read_through_their_stride(impl, runtime):
    """block_tables is a slice of a wider table: row b starts b * stride_bt entries in."""
    case = make_prefill_case([22, 40, 17], [6, 12, 1], 8, 2, 64, 8, stream=393, device=runtime.device)
    case.block_tables = in_wider_table(case.block_tables)
    check(impl, case, window=9)


def test_large_ragged_batch(impl, runtime):
    """Many sequences of random prefixes and chunk sizes, decode rows and empty rows among them, window
    and sinks."""
    gen = torch.Generator().manual_seed(seeded(395))
    B, top = sizes(runtime, (6, 24), (48, 1500))
    q_lens = torch.randint(0, top, (B,), generator=gen)
    q_lens[:2] = torch.tensor([1, 0])
    ctx = q_lens + torch.randint(0, 2 * top, (B,), generator=gen)
    # GROUP 4 at D = 128 as a 32-head model has it, with two KV heads: the interpreter's time goes with
    # programs (tiles x head groups), and the raggedness is what this case is for.
    Hq, Hkv = sizes(runtime, (8, 2), (32, 8))
    case = make_prefill_case(
        ctx.tolist(), q_lens.tolist(), Hq, Hkv, 128, 16, stream=395, device=runtime.device
    )
    check(impl, case, window=sizes(runtime, 19, 700), sinks=make_sinks(Hq, 396, runtime.device))


def test_sequence_search_covers_every_sequence(impl, runtime):
    """130 sequences of 1-3 new tokens: the search over cu_seqlens_q narrows [0, B) to one sequence. Then
    600 sequences, all but the last three padding rows (q_len 0, a program each that stores nothing): a
    search of a fixed number of halvings (8 cover 256 sequences, a CUDA graph's largest batch) stops short
    of the last ones, which the launcher admits whatever B is."""
    gen = torch.Generator().manual_seed(seeded(398))
    q_lens = torch.randint(1, 4, (130,), generator=gen)
    ctx = q_lens + torch.randint(0, 10, (130,), generator=gen)
    case = make_prefill_case(ctx.tolist(), q_lens.tolist(), 2, 1, 16, 4, stream=398, device=runtime.device)
    check(impl, case, window=3, sinks=make_sinks(2, 399, runtime.device))
    q_lens, ctx = [0] * 597 + [2, 1, 3], [0] * 597 + [7, 9, 3]
    case = make_prefill_case(ctx, q_lens, 2, 1, 16, 4, stream=400, device=runtime.device)
    check(impl, case, window=3, sinks=make_sinks(2, 401, runtime.device))


@pytest.mark.parametrize("far", ["q-rows", "out-rows", "table-rows", "kv-heads"])
def test_rows_and_heads_widened_to_int64(impl, runtime, far):
    """L4's offsets past 2**31 elements whose strides fit in int32, one tensor at a time, with a window and
    sinks: q's rows, or out's, 3 * 2**26 elements apart (rows from 11 on start past 2**31; out's stored by
    the kernel, then by the merge of 12 decode rows in 2 splits); block_tables'
    rows 1.5 * 2**30 entries apart (b * stride_bt wraps from sequence 2 on); the caches' KV heads 1.5 *
    2**30 elements apart (Hkv = 3: head0 from tl.program_id(0) is int32, kvh * stride_kh wraps for KV head
    2). Sparse files on a CPU."""
    sinks = make_sinks(6 if far == "kv-heads" else 4, 403, runtime.device)
    if far == "q-rows":
        case = make_prefill_case([9, 14], [5, 12], 4, 2, 64, 8, stream=400, device=runtime.device)
        check(impl, PrefillCase(_rows_past_int32(case.q, runtime), *case.args[1:]), window=5, sinks=sinks)
    elif far == "out-rows":
        case = make_prefill_case([9, 14], [5, 12], 4, 2, 64, 8, stream=404, device=runtime.device)
        out = _rows_past_int32(torch.full_like(case.q, float("nan")), runtime)  # unwritten rows stay NaN
        impl.unified_attention(*case.args, window=5, sinks=sinks, out=out)
        assert_close(out, unified_reference(*case.args, window=5, sinks=sinks)[0], DIMS)
        # 12 decode rows in 2 splits: the merge stores out's rows, each from its own program id.
        case = make_prefill_case(
            [3 + i for i in range(12)], [1] * 12, 4, 2, 64, 8, stream=407, device=runtime.device
        )
        out = _rows_past_int32(torch.full_like(case.q, float("nan")), runtime)
        impl.unified_attention(
            *case.args, window=5, sinks=sinks, out=out, plan=impl.UnifiedPlan(num_splits=2)
        )
        assert_close(out, unified_reference(*case.args, window=5, sinks=sinks)[0], DIMS)
    elif far == "table-rows":
        case = make_prefill_case([9, 14, 20], [5, 12, 3], 4, 2, 64, 8, stream=405, device=runtime.device)
        case.block_tables = rows_far_apart(case.block_tables, runtime)
        check(impl, case, window=6, sinks=sinks)
    else:  # decode rows beside a chunk of 20 new tokens
        case = make_prefill_case([20, 9, 30], [1, 1, 20], 6, 3, 64, 8, stream=406, device=runtime.device)
        k_cache, v_cache = (far_apart(c, runtime, dim=2) for c in (case.k_cache, case.v_cache))
        assert 2 * k_cache.stride(2) >= 2**31 > k_cache.stride(2)
        check(impl, PrefillCase(case.q, k_cache, v_cache, *case.args[3:]), window=7, sinks=sinks)


def test_page_index_widened_to_int64(impl, runtime):
    """Every page past 2**32 elements of the cache: block id * stride_kb in int64, in every key loop."""
    PAGE, Hkv, D = 16, 1, 128
    far_blocks = pool_past_int32(runtime, PAGE, Hkv, D, spare=96)
    case = make_prefill_case(
        [40, 7], [9, 1], 4, Hkv, D, PAGE, stream=397, device=runtime.device, **far_blocks
    )
    check(impl, case, window=20)


def test_v_page_offsets_widened_to_int64(impl, runtime):
    """k_cache under 2**31 elements, v_cache layer 3 of a 4-layer pool past 2**32: V's offsets in int64."""
    from drills.grading.shared import bigmem

    skip_without_memory_for_sparse_pages(runtime)
    PAGE, Hkv, D, layers = 16, 1, 128, 4
    far_blocks = blocks_past(2**30, PAGE, Hkv, D, spare=96)
    ctx = [40, 7]
    case = make_prefill_case(ctx, [9, 1], 4, Hkv, D, PAGE, stream=401, device=runtime.device, **far_blocks)
    pool = bigmem.sparse_empty((case.k_cache.shape[0], layers, PAGE, Hkv, D), case.q.dtype, runtime.device)
    v_cache = pool[:, layers - 1]
    if not runtime.interpreter:
        pool[:128].zero_()
    in_use = torch.cat([case.block_tables[b, : math.ceil(n / PAGE)] for b, n in enumerate(ctx)]).long()
    v_cache[in_use] = case.v_cache[in_use]
    check(impl, PrefillCase(case.q, case.k_cache, v_cache, *case.args[3:]), window=20)
    del pool, v_cache


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (window 1 with
    D = 256 at PAGE = 1, a very negative sink with a forced split, V's strides unlike K's under a window
    inside a page, lse with a large sink...): a kernel right on each bound alone can still be wrong where
    two meet. A failure names the case's values."""

    def run(c):
        Hq, Hkv = c["heads"]
        q_lens, lens = BATCHES_BY_PAGE[c["batch"]](c["PAGE"])
        case = make_prefill_case(
            lens, q_lens, Hq, Hkv, c["D"], c["PAGE"], stream=437, dtype=c["dtype"], device=runtime.device
        )
        laid = laid_out(case, runtime, c["q"], c["kv"], c["table"])  # the same values through other strides
        case = PrefillCase(
            laid.q, laid.k_cache, laid.v_cache, laid.block_tables, case.cu_seqlens_q, case.context_lens
        )
        shift = SINK_SHIFTS[c["sinks"]]
        sinks = None if shift is None else make_sinks(Hq, 439, runtime.device, shift)
        plan = None
        if c["split"] == "forced2":
            plan = impl.plan(case.cu_seqlens_q, case.context_lens, Hkv, c["PAGE"], num_splits=2)
        window, scale = c["window"], None
        lse_box = []

        def launch(*args, **kw):
            result = impl.unified_attention(
                *args, window=window, sinks=sinks, plan=plan, return_lse=c["lse"], **kw
            )
            if c["lse"]:
                lse_box.append(result[1])
                return result[0]
            return result

        out = launch_into_canary(launch, case, scale)
        ref, ref_lse = unified_reference(*case.args, window=window, sinks=sinks, scale=scale)
        # A large sink takes nearly all the weight: outputs near zero, held element by element (as in
        # test_sinks_join_the_denominator_only); a sink left out gives outputs of order one.
        tol = dict(atol=1e-3, rtol=0.0, rel=1.0) if c["sinks"] == "large" else {}
        problem = mismatch(out, ref, DIMS, **tol)
        if problem is not None:
            which = wrong_answers(out, case, window, sinks, scale)
            raise AssertionError(problem + (f"\n{which}" if which else ""))
        if c["lse"]:
            assert_close(lse_box[0], ref_lse, LSE_DIMS, **LSE_TOL)

    DOMAIN.check_each(DOMAIN.cases(stream=437), run)


# --- The launcher rejects bad input before launching -----------------------------------------------


def _sinks(value):
    return lambda a, dev: dict(sinks=value(a["q"].shape[1], dev))


BAD_INPUTS = {
    **L4_BAD_INPUTS,
    "window_zero": (lambda a, dev: dict(window=0), ValueError, "window"),
    "window_negative": (lambda a, dev: dict(window=-3), ValueError, "window"),
    "window_float": (lambda a, dev: dict(window=4.0), TypeError, "window"),
    "window_bool": (lambda a, dev: dict(window=True), TypeError, "window"),
    "window_past_int32": (lambda a, dev: dict(window=2**31), ValueError, "window"),
    "sinks_wrong_length": (_sinks(lambda h, dev: torch.zeros(h + 1, device=dev)), ValueError, "sinks"),
    "sinks_nan": (_sinks(lambda h, dev: torch.full((h,), float("nan"), device=dev)), ValueError, "sinks"),
    "sinks_inf": (_sinks(lambda h, dev: torch.full((h,), float("inf"), device=dev)), ValueError, "sinks"),
    "sinks_fp16": (
        _sinks(lambda h, dev: torch.zeros(h, dtype=torch.float16, device=dev)),
        TypeError,
        "sinks",
    ),
    "sinks_2d": (_sinks(lambda h, dev: torch.zeros(1, h, device=dev)), ValueError, "sinks"),
    "sinks_list": (_sinks(lambda h, dev: [0.0] * h), TypeError, "sinks"),
    "plan_not_a_plan": (lambda a, dev: dict(plan=3), TypeError, "plan"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    case = make_prefill_case([20, 3], [5, 3], 4, 2, 64, 16, stream=409, device=runtime.device, max_pages=4)
    args = spoiled_call(case, spoil, runtime.device)
    with raises_naming(error, names):
        impl.unified_attention(**args)


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: unified_attention must compute them with your Triton kernel."""
    case = make_prefill_case([37, 5], [12, 1], 8, 2, 64, 16, stream=419, device=runtime.device)
    sinks = make_sinks(8, 421, runtime.device)
    assert_runs_a_triton_kernel(
        impl, lambda: impl.unified_attention(*case.args, window=9, sinks=sinks), "unified_attention"
    )


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, unified_attention allocates [total_q, Hq, D] in q's dtype."""
    case = make_prefill_case([25, 3], [10, 3], 8, 2, 64, 16, stream=423, device=runtime.device)
    out = impl.unified_attention(*case.args, window=7)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype and out.device == case.q.device
    ref, _ = unified_reference(*case.args, window=7)
    assert_close(out, ref, DIMS)


def test_tolerance_rejects_zeros_no_window_and_a_counted_sink(runtime):
    """Not a test of your kernel: the comparison fails an all-zeros output, the answer without the window,
    with the window counted from the chunk, and with the sink in the numerator."""
    case = mixed_case(runtime, stream=431)
    sinks = make_sinks(8, 433, runtime.device)
    ref, lse = unified_reference(*case.args, window=9, sinks=sinks)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
    assert mismatch(unified_reference(*case.args, sinks=sinks)[0].half(), ref) is not None
    assert mismatch(
        unified_reference(*case.args, window=9, sinks=sinks, window_from_chunk=True)[0].half(), ref
    )
    assert mismatch(
        unified_reference(*case.args, window=9, sinks=sinks, sink_in_numerator=True)[0].half(), ref
    )
    assert mismatch(ref.half(), ref) is None


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """70,000 decode rows, split 3 ways with a window and sinks: tiles and head groups share grid axis 0,
    splits take axis 1, and the merge's rows axis 0. Run dry (every launch recorded and checked)."""
    B, PAGE, D = 70_000, 16, 16
    dev = runtime.device
    q = torch.zeros(B, 1, D, dtype=torch.float16, device=dev)  # [total_q, Hq, D]
    k_cache = torch.zeros(1, PAGE, 1, D, dtype=torch.float16, device=dev)  # [blocks, PAGE, Hkv, D]
    v_cache = torch.zeros_like(k_cache)
    block_tables = torch.zeros(B, 1, dtype=torch.int32, device=dev)  # [B, 1]
    cu_seqlens_q = torch.arange(B + 1, dtype=torch.int32, device=dev)  # [B + 1]
    context_lens = torch.ones(B, dtype=torch.int32, device=dev)  # [B]
    sinks = torch.zeros(1, device=dev)
    for splits in (1, 3):
        plan = impl.plan([0, 1], [1], 1, PAGE, num_splits=splits)
        assert_grids_fit(
            impl,
            lambda plan=plan: impl.unified_attention(
                q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, window=4, sinks=sinks,
                return_lse=True, check=False, plan=plan,
            ),
            f"unified_attention of 70,000 decode rows, {splits} splits",
        )  # fmt: skip


# --- Stages and diagnosis --------------------------------------------------------------------------

STAGES = [
    Stage(
        "the band",
        ("test_worked_example_window_of_4", "test_window_*", "test_band_*", "test_tiles_*", "test_equals_*"),
        "the 2D kernel with a window: which keys each row sees, and which tiles it loads",
    ),
    Stage(
        "sinks",
        ("test_worked_example_with_a_sink_of_1_5", "test_sinks_*", "test_lse_includes_the_sink"),
        "one more logit per head in each row's denominator, and in its lse",
    ),
    Stage(
        "the split band",
        ("test_split_*", "test_planner_*"),
        "the planner, and decode rows whose band is shared by several programs and merged",
    ),
]

# The look-alikes and what tells them apart: prompts without a prefix pass a window counted in the chunk;
# decode rows (one token a tile) pass a band computed for a tile's first row; cases without sinks pass every
# sink mistake; the unsplit sink cases pass a sink counted in every split; only the poisoned pages catch
# tiles read before the band. wrong_answers() names the window's and the numerator's wrong answers.
WORKED = "test_worked_example_window_of_4"
WORKED_SINK = "test_worked_example_with_a_sink_of_1_5"
MISTAKES = [
    # Operands cast to tl.float16: bf16 values past 65504 become inf; fp16 and every other bf16 case pass.
    Mistake(
        30,
        fails=("test_outputs_and_keys_past_fp16_range[bf16]",),
        passes=(
            "test_outputs_and_keys_past_fp16_range[fp16]",
            "test_dtypes",
            "test_equals_l4_without_window_or_sinks",
        ),
        messages=(r"NaN|nan|inf",),
        question="A bf16 V element of 70000: what is it as tl.float16, and what does your P V dot (or your "
        "score dot) cast its operands to?",
        section="3.5",
    ),
    Mistake(
        31,
        fails=("test_packed_group_wider_than_the_tile",),
        passes=("test_kv_head_grouping_is_contiguous", "test_band_covers_every_row_of_a_tile"),
        question="40 query heads share one KV head and a decode tile holds 32 rows: which heads does your "
        "tile compute, and how tall must it be to hold the whole group?",
        section="3.1",
    ),
    Mistake(
        8,
        fails=("test_table_rows_exactly_full",),
        # Only a row that fills its table is at the bound: every band, page and window check passes.
        passes=(
            WORKED,
            "test_keys_past_the_context_are_not_read",
            "test_band_covers_every_row_of_a_tile",
            "test_window_sizes",
            "test_page_sizes",
        ),
        messages=(r"device guard fired|out of bounds load of block_tables",),
        question="A context of 48 with PAGE = 8 in a table of 6 columns: is it a valid length, and which "
        "lengths do your guard and your table loads admit?",
        section="3",
    ),
    Mistake(
        1,
        fails=(WORKED, "test_window_sizes[w1]", "test_window_on_prompts_without_a_prefix"),
        messages=(r"window [+-] 1 keys",),
        question="Window 4 at position 9: is key 5 in the window? Count the keys your mask lets the row see.",
        section="2",
    ),
    Mistake(
        2,
        fails=("test_band_covers_every_row_of_a_tile",),
        passes=(WORKED, "test_window_sizes[w1]", "test_split_band_merges_every_split"),
        question="A tile of 16 new tokens at positions 100-115 with window 40: which keys does its LAST row see, "
        "and which stretch of keys does your kernel treat as seen by every row without a mask?",
        section="3.2",
    ),
    Mistake(
        2,
        # full_lo rounded down: the unmasked stretch starts inside the window's first tile (decode rows too).
        fails=("test_band_covers_every_row_of_a_tile", "test_split_band_merges_every_split"),
        passes=(WORKED, "test_keys_past_the_context_are_not_read"),
        question="A decode row at position 100 with window 40 and 16-key tiles: which is the first key every "
        "row of its tile sees, and is the tile starting at key 48 wholly inside its window?",
        section="3.2",
    ),
    Mistake(
        2,
        # full_end taken from the tile's last row: the unmasked stretch runs past the first rows' own keys,
        # and for a chunk shorter than a tile past the context, whose poisoned keys load unmasked as NaN.
        fails=("test_band_covers_every_row_of_a_tile", "test_equals_l4_without_window_or_sinks"),
        passes=(WORKED, WORKED_SINK, "test_pages_shuffled_and_shared"),
        messages=(r"NaN/inf values",),
        question="A chunk of 5 new tokens after 0 cached ones, 16-key tiles: which keys may row 0 see, and "
        "which stretch does your kernel load without a mask?",
        section="3.2",
    ),
    Mistake(
        16,
        # Rows whose window hides a whole edge tile before they met a key: with no sink their max is still
        # -inf, and exp2(-inf - -inf) is NaN. Without a window, or with a sink, every row's max is finite.
        fails=("test_window_sizes", "test_band_covers_every_row_of_a_tile"),
        passes=(WORKED, "test_equals_l4_without_window_or_sinks", "test_sinks_join_the_denominator_only"),
        messages=(r"NaN/inf values",),
        question="A tile of rows at positions 100-115 with window 4: which keys of the band's first tile "
        "does row 115 see, and what are its max and its exp2(s - max) there?",
        section="3.2",
    ),
    Mistake(
        3,
        fails=("test_sinks_join_the_denominator_only", WORKED_SINK),
        passes=("test_window_sizes", WORKED),
        messages=(r"sink in the numerator",),
        question="The sink is a key whose value is zero: what does it add to the sum l, and what to the "
        "accumulator acc?",
        section="3.3",
    ),
    Mistake(
        9,
        fails=("test_sinks_join_the_denominator_only",),
        messages=(r"sink's logit in natural units",),
        question="The kernel keeps its logits in base 2 (the scale carries log2 e). A sink of 2 must weigh "
        "e^2 = 7.39 beside them: what does exp2 of your loaded sink give?",
        section="3.3",
    ),
    Mistake(
        4,
        fails=("test_split_band_merges_every_split",),
        passes=(
            "test_sinks_join_the_denominator_only",
            "test_lse_includes_the_sink",
            WORKED_SINK,
            "test_split_merge_weighs_each_split_by_its_lse",
        ),
        question="With the band cut into 3 splits, how many times does the merged denominator hold e^sink, "
        "and how many of your splits start their sum at 1?",
        section="3.4",
    ),
    Mistake(
        5,
        fails=("test_lse_includes_the_sink", WORKED_SINK),
        # An lse in another base fails without a sink too (pitfall 26).
        passes=("test_sinks_join_the_denominator_only", "test_equals_l4_without_window_or_sinks"),
        question="In the worked example the sum ends at 2.4776 with the sink: what is lse, and what does your "
        "kernel store?",
        section="2",
    ),
    Mistake(
        6,
        fails=("test_window_counts_from_the_absolute_position", WORKED),
        passes=("test_window_on_prompts_without_a_prefix",),
        messages=(r"counted from each token's index in its chunk",),
        question="A decode row after 76 cached tokens: what is its position, and from what number does your "
        "kernel count its window back?",
        section="3.2",
    ),
    Mistake(
        7,
        fails=("test_tiles_outside_the_band_are_never_loaded",),
        passes=("test_window_sizes", WORKED, "test_window_counts_from_the_absolute_position"),
        messages=(r"NaN|out of bounds",),
        question="A decode row at position 199 with window 24: which is the first key tile it needs, and where "
        "does your key loop start?",
        section="3.2",
    ),
    Mistake(
        17,
        fails=("test_sinks_join_the_denominator_only",),
        # The worked example's scale is 1: a sink multiplied by it is unchanged there.
        passes=(WORKED_SINK,),
        messages=(SINK_SCALED,),
        question="A sink of 2 with D = 64 (scale 1/8): is the sink a score q . k still to be scaled, or a "
        "logit already? What weight does your kernel give it?",
        section="3.3",
    ),
    Mistake(
        18,
        fails=("test_q_and_cache_strides_are_used",),
        messages=(r"sinks read as if contiguous",),
        question="sinks is every other entry of a buffer: where does sinks[3] lie in memory, and where does "
        "your kernel (or your launcher, before it) read it?",
        section="3.3",
    ),
    Mistake(
        19,
        # Right up to 2**steps sequences: every other check runs at most 130.
        fails=("test_sequence_search_covers_every_sequence",),
        passes=("test_large_ragged_batch", WORKED, "test_window_sizes"),
        question="600 sequences, the last three with new tokens: how many halvings does the search over "
        "cu_seqlens_q need to reach sequence 599, and how many does yours make?",
        section="3.1",
    ),
    Mistake(
        10,
        fails=("test_kv_head_grouping_is_contiguous",),
        passes=(WORKED_SINK,),
        messages=(r"sink read at another head",),
        question="Hq = 8 and Hkv = 2: which entry of sinks belongs to query head 5, and which one does your "
        "kernel load for it?",
        section="3.3",
    ),
    Mistake(
        11,
        fails=("test_sinks_join_the_denominator_only", WORKED_SINK),
        passes=(WORKED,),
        messages=(r"answer without the sink",),
        question="In section 2 the running max starts at the sink, 1.5: what does the sum l start at, and "
        "what does your kernel start it at?",
        section="3.3",
    ),
    Mistake(
        12,
        fails=("test_window_sizes[w-largest]",),
        passes=(WORKED, "test_window_sizes[w1]", "test_window_sizes[w40]"),
        question="window = 2**31 - 1, the largest admitted: what is key 5 + window in int32, and how does your "
        "mask compare a key with the row's window?",
        section="3.2",
    ),
    Mistake(
        13,
        # 17 splits fit a merge tile of 32: only more splits than the widest tile (64) holds tell.
        fails=("test_split_merge_reads_every_tile_of_splits",),
        passes=("test_split_band_merges_every_split",),
        messages=(r"without the splits past the merge's first tile",),
        question="65 splits and a merge tile of at most 64: which splits does your merge read, and where is "
        "the 65th split's share of the band?",
        section="3.4",
    ),
    Mistake(
        26,
        # The merged lse in base 2 (m + log2 of the weights' sum): every output right, split or not, and
        # every unsplit lse; only the merged lse is off.
        fails=(
            "test_split_merge_weighs_each_split_by_its_lse",
            "test_split_merge_reads_every_tile_of_splits",
        ),
        passes=(
            "test_lse_includes_the_sink",
            "test_equals_l4_without_window_or_sinks",
            "test_split_shares_are_whole_tiles",
            "test_split_band_on_a_mixed_batch",
        ),
        messages=(LSE_ONLY,),
        question="Your merge's weights are e^(lse_s - m): in which base is their sum's log, and what lse does "
        "your merge store for a row?",
        section="3.4",
    ),
    Mistake(
        29,
        # Only splits whose lse lie below fp32's exp range show it; every other split check passes.
        fails=("test_split_merge_starts_its_max_at_minus_inf",),
        passes=(
            "test_split_merge_weighs_each_split_by_its_lse",
            "test_split_band_merges_every_split",
            "test_split_shares_are_whole_tiles",
        ),
        question="Every split of a row has lse about -125: what is e^(lse - m) in fp32 when the merge's m "
        "starts at 0, and where must m start?",
        section="3.4",
    ),
    Mistake(
        28,
        # An empty share's 0 / 0 (or partials never stored): NaN in every merge with an empty split, where
        # the one-tile splits of the 65-split check are never empty.
        fails=("test_split_merge_weighs_each_split_by_its_lse", "test_split_shares_are_whole_tiles"),
        passes=(
            "test_equals_l4_without_window_or_sinks",
            "test_sinks_join_the_denominator_only",
            "test_split_merge_reads_every_tile_of_splits",
        ),
        messages=(r"NaN/inf values",),
        question="A decode row of 192 keys in 5 splits of 48: which keys does split 4 read, what are its l "
        "and acc, and what does it store for o and lse?",
        section="3.5",
    ),
    Mistake(
        27,
        # Shares of one lse pass any merge; a share cut mid-tile counts the keys of a tile it shares twice.
        fails=("test_split_shares_are_whole_tiles",),
        passes=(
            "test_equals_l4_without_window_or_sinks",
            "test_sinks_join_the_denominator_only",
            "test_split_merge_reads_every_tile_of_splits",
        ),
        question="192 keys in 5 splits with 16-key tiles: where does split 1's share start, and which keys "
        "does the last tile of its loop read?",
        section="3.4",
    ),
    Mistake(
        15,
        # Without sinks, only the merge's weights can be wrong where the unsplit checks pass.
        fails=("test_split_merge_weighs_each_split_by_its_lse", "test_split_band_merges_every_split"),
        passes=(
            "test_window_sizes",
            "test_equals_l4_without_window_or_sinks",
            "test_split_shares_are_whole_tiles",  # shares of one lse: any base weighs them alike
        ),
        question="Split s stored lse_s in natural log. What weight does the merge give it, e^(lse_s - max) or "
        "2^(lse_s - max), and which does your merge compute?",
        section="3.4",
    ),
    Mistake(
        15,
        # Weights in e and the rescale between tiles of splits in 2 (or the reverse): one tile of splits
        # never rescales, so only the 65 splits tell, and the fitted weight of the first tile says how.
        fails=("test_split_merge_reads_every_tile_of_splits",),
        passes=("test_split_band_merges_every_split", "test_split_merge_weighs_each_split_by_its_lse"),
        messages=(r"rescaled between tiles of splits in another base",),
        question="The merge's running sum is rescaled by alpha when a later tile of splits raises the max: "
        "in which base are your lse and your max, and is alpha an exponential in that base?",
        section="3.4",
    ),
    Mistake(
        20,
        fails=("test_rows_and_heads_widened_to_int64",),
        passes=(
            WORKED,
            "test_q_and_cache_strides_are_used",
            "test_page_index_widened_to_int64",
            "test_split_shares_are_whole_tiles",  # its split case fails for a split's mistake too
        ),
        question="One tensor's rows or heads lie past 2**31 elements here and their stride fits in int32: "
        "in which integer type does your kernel multiply that index by its stride (q's and out's row, the "
        "sequence index b, the head index)?",
        section="3.1",
    ),
    Mistake(
        21,
        # Pure prefill: counting the window from the chunk is right there, so only this answer fits.
        fails=("test_window_on_prompts_without_a_prefix", WORKED),
        messages=(r"the window narrows the key loop and masks nothing",),
        question="A tile's band starts at its first row's window, rounded down to a key tile: which keys of "
        "that first tile does the tile's LAST row see, and which does your kernel let it see?",
        section="3.2",
    ),
    Mistake(
        22,
        # Only mixed batches hold a q_len = 0 sequence, whose table row is garbage.
        fails=("test_equals_l4_without_window_or_sinks", "test_large_ragged_batch"),
        passes=(
            WORKED,
            "test_band_covers_every_row_of_a_tile",
            "test_rows_past_a_sequence_end_not_written",
            "test_keys_past_the_context_are_not_read",
        ),
        messages=(r"device guard fired|out of bounds load",),
        question="A sequence with q_len = 0 still gets a tile: which keys would its program read, through "
        "which table row, and where does your kernel return?",
        section="3.2",
    ),
    Mistake(
        23,
        fails=("test_band_covers_every_row_of_a_tile", "test_split_band_merges_every_split"),
        passes=(WORKED, "test_keys_past_the_context_are_not_read"),
        messages=(r"elements before its start",),
        question="A tile whose first row sits at position 3 with window 37: where does its band start, and "
        "which keys does your first key tile load?",
        section="3.2",
    ),
    Mistake(
        24,
        # Every band that starts past key 0 loses its end, unsplit too; bands from key 0 (the worked example,
        # no window, a window past the context) are whole. Loading tiles before the band passes the window
        # checks, and a band computed for one row passes the keys-past-the-context one.
        fails=(
            "test_window_sizes",
            "test_band_covers_every_row_of_a_tile",
            "test_keys_past_the_context_are_not_read",
            "test_tiles_outside_the_band_are_never_loaded",
        ),
        passes=(
            WORKED,
            WORKED_SINK,
            "test_equals_l4_without_window_or_sinks",
            "test_split_merge_reads_every_tile_of_splits",
        ),
        question="A decode row at position 100 with window 40: its band is keys 48-100. Which keys does your "
        "first (or only) share of the band start and stop at, and is band_lo in that sum?",
        section="3.4",
    ),
    Mistake(
        26,
        # lse stored in base 2: every lse check fails, sinks or not, and every output is right.
        fails=("test_lse_includes_the_sink", "test_equals_l4_without_window_or_sinks"),
        passes=("test_sinks_join_the_denominator_only", "test_keys_past_the_context_are_not_read"),
        question="The kernel's m and log2(l) are in base 2 units. The worked example's sum ends at 2.4776 "
        "with m = 1.5 (natural): what lse does your kernel store, and in which base?",
        section="3.5",
    ),
    Mistake(
        2,
        # Every row's window counted back from the tile's first row: the rows after it lose their newest
        # keys' share of the window. One-row tiles (the worked examples) and no window pass; only the rows
        # tell it from a share counted from key 0 (pitfall 24), which fails the same checks.
        fails=(
            "test_window_sizes",
            "test_band_covers_every_row_of_a_tile",
            "test_keys_past_the_context_are_not_read",
            "test_tiles_outside_the_band_are_never_loaded",
            "test_window_counts_from_the_absolute_position",
        ),
        passes=(WORKED, WORKED_SINK, "test_equals_l4_without_window_or_sinks"),
        messages=(WINDOW_OF_THE_TILE,),
        question="A tile of 16 new tokens at positions 100-115 with window 40: where does the window of its "
        "last row start, and from which row's position does your kernel count it back?",
        section="3.2",
    ),
    Mistake(
        25,
        # The window's oldest keys up to the next tile boundary are lost: the worked example's window (keys
        # 6-9, band from tile 16) loses every key; no window keeps band_lo = 0 and passes.
        # Three conditions, fewer than pitfall 1's: a window one key off fails the same checks and its
        # message names it.
        fails=(WORKED, "test_band_covers_every_row_of_a_tile"),
        passes=("test_equals_l4_without_window_or_sinks",),
        question="A decode row at position 100 with window 40: its window starts at key 61. Which key tile "
        "does your band start at, and does any tile before it hold a key the row sees?",
        section="3.2",
    ),
    Mistake(
        14,
        fails=("test_planner_splits_small_decode_batches_only",),
        messages=(r"padding rows are not decode rows|min\(context, window\)",),
        question="A decode batch padded with q_len 0 rows, and a row of 100 keys under a window of 8192: how "
        "many programs does each padding row run, and how long is that row's band?",
        section="3.4",
    ),
    Mistake(
        2,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, PAGE, heads, batch, dtype, layouts, window, sinks and split; which of these does your kernel "
        "handle only one at a time (a band computed for another page size, a stride taken from another "
        "tensor, a sink added in every split)?",
        section="3.2",
    ),
]
