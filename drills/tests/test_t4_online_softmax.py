"""Grader for T4, online softmax and the merge of partial (m, l) states. Each test is named for the
mistake it catches.

Run: make test L=t4 (your drills/mine) or make test L=t4 IMPL=solutions. The oracle below is plain
fp32 PyTorch and does not scan: the state after a block is the max and the shifted sum of the whole
prefix up to that block, computed in one shot.
"""

from __future__ import annotations

import math

import pytest
import torch

from drills.compare import assert_close, assert_untouched, mismatch
from drills.grading.grader.diagnose import Mistake, returned_out_problem, returned_problem
from drills.grading.shared.bigmem import WRAP, free_bytes, rows_past_int32
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel, record_launches
from drills.tests import bf16_everywhere, seeded, sizes
from drills.tests.domain import Domain, checks_besides

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK": (
        "test_last_block_is_masked",
        "test_non_power_of_two_shapes",
        "test_merge_covers_states_past_one_program",
    ),
    "TRACE": ("test_worked_example_trace_one_element_at_a_time", "test_worked_example_final_state"),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}

# The explainer's hand trace of x = [2, 1, 4, 3], one element per block, to four decimals.
HAND_X = [2.0, 1.0, 4.0, 3.0]
HAND_M = [2.0, 2.0, 4.0, 4.0]
HAND_L = [1.0, 1.3679, 1.1851, 1.5530]
FOUR_DECIMALS = dict(atol=5e-5, rtol=0.0, rel=1e-4)

# What softmax_stats and online_softmax admit, at their boundaries (the launchers' own limits below):
# test_pairwise_domain_cases_match_the_oracle crosses every pair of these values.
_BLOCK_MAX, _SPLITS_MAX = 65536, 1024
DOMAIN = Domain(
    axes=dict(
        shape=((1, 1), (3, 17), (2, 100)),  # (M, N): one element, one past a 16-wide block, a ragged row
        block=(None, 1, 16, _BLOCK_MAX),  # the default, one column a step, a tile, the widest admitted
        splits=(1, 4, 16),  # 16 splits of 100 columns in blocks of 16: the last splits are empty
        dtype=(torch.float16, torch.bfloat16, torch.float32),
        x=("contiguous", "nan_past_each_row"),  # rows a view of a wider NaN-filled buffer
        scores=("randn_x3", "rising", "minus_inf"),  # rising: the max grows in every later block
        fn=("softmax_stats", "online_softmax"),
    ),
    limits=dict(
        dtypes=(torch.float16, torch.bfloat16, torch.float32),
        block_max=_BLOCK_MAX,  # block: a power of two up to this
        splits_max=_SPLITS_MAX,  # splits: a power of two up to this
        merge_tile=1024,  # the reference merge's tile of states (merge_stats takes any number of states)
    ),
)
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

CANARY = 1234.5  # exactly representable in fp16, bf16 and fp32; no probability is near it
NEG_INF = float("-inf")


# --- The oracle ------------------------------------------------------------------------------------


def stats_reference(x):
    """(m, l) per row of x [M, N] in fp32: m = max, l = sum exp(x - m); (-inf, 0) for a row of -inf."""
    xf = x.float()
    m = xf.amax(dim=1)  # [M]
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, torch.exp(xf - shift[:, None]).sum(dim=1)


def trace_reference(x, block):
    """The state after each block = the stats of the prefix that ends with that block: [M, steps]."""
    N = x.shape[1]
    states = [stats_reference(x[:, : min(end, N)]) for end in range(block, N + block, block)]
    return torch.stack([m for m, _ in states], dim=1), torch.stack([l for _, l in states], dim=1)


def merge_reference(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)


def softmax_reference(x):
    """fp32 softmax over the last dim; a row of only -inf gets zeros (torch.softmax gives NaN)."""
    return torch.softmax(x.float(), dim=-1).nan_to_num(nan=0.0)


# --- Comparison helpers ------------------------------------------------------------------------------


def assert_stats_close(m, l, m_ref, l_ref, dims=("row",), **tol):
    """m and l fp32 with the oracle's shape; m = -inf exactly where the oracle's is (rows or prefixes of
    only -inf, whose l must be 0), never NaN; the finite entries within the fp32 tolerance."""
    # Worded as returned_problem words it ("returned m as float16 where float32 belongs"), so that the
    # diagnosis names a wrong return (partial states kept in x's dtype, say), not a pitfall of the math.
    wrong = returned_problem(
        "your function",
        (m, l),
        (("m", tuple(m_ref.shape), torch.float32), ("l", tuple(l_ref.shape), torch.float32)),
    )
    assert wrong is None, wrong
    for name, t in (("m", m), ("l", l)):
        assert not torch.isnan(t).any(), f"NaN in {name} at {tuple(torch.isnan(t).nonzero()[0].tolist())}"
    m, l = m.cpu(), l.cpu()
    m_ref, l_ref = m_ref.cpu(), l_ref.cpu()
    empty = torch.isneginf(m_ref)
    wrong = torch.isneginf(m) != empty
    if wrong.any():
        first = tuple(wrong.nonzero()[0].tolist())
        raise AssertionError(
            f"m is -inf exactly where nothing finite has been seen; at {first} got "
            f"m = {m[first].item()}, expected {m_ref[first].item()}"
        )
    if (~empty).any():
        assert_close(m[~empty], m_ref[~empty], **tol)
    assert_close(l, l_ref, dims, **tol)


def randn(shape, runtime, stream, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seeded(stream))
    return (scale * torch.randn(shape, generator=gen)).to(dtype).to(runtime.device)


def poisoned_view(x):
    """x as a view whose rows are followed by NaN columns: reading past the end of a row reads NaN."""
    M, N = x.shape
    buffer = torch.full((M, N + 8), float("nan"), dtype=x.dtype, device=x.device)
    buffer[:, :N] = x
    return buffer[:, :N]


def softmax_into_canary(impl, x, **kwargs):
    """online_softmax writing into a view of a canary-filled buffer (spare rows and columns around it);
    checks that it wrote there, returned it, and changed nothing outside."""
    M, N = x.shape
    buffer = torch.full((M + 2, N + 16), CANARY, dtype=x.dtype, device=x.device)
    out = buffer[1 : M + 1, 8 : 8 + N]  # [M, N], rows N + 16 apart
    returned = impl.online_softmax(x, out=out, **kwargs)
    wrong = returned_out_problem("online_softmax", returned, out)
    assert wrong is None, wrong
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=x.device)
    keep[1 : M + 1, 8 : 8 + N] = True
    assert_untouched(
        buffer, CANARY, keep, "the buffer around out (a store past the row's end?)", ("row+1", "col+8")
    )
    return out


def check_stats(impl, x, **kwargs):
    m, l = impl.softmax_stats(x, **kwargs)
    assert_stats_close(m, l, *stats_reference(x))
    return m, l


def check_softmax(impl, x, **kwargs):
    out = softmax_into_canary(impl, x, **kwargs)
    assert_close(out, softmax_reference(x), ("row", "col"))
    return out


def check_trace(impl, x, block):
    m_trace, l_trace = impl.softmax_stats_trace(x, block)
    assert_stats_close(m_trace, l_trace, *trace_reference(x, block), dims=("row", "block"))
    return m_trace, l_trace


# --- Section 2 "By hand": the worked example's numbers through your functions ----------------------------------


def test_worked_example_trace_one_element_at_a_time(impl, runtime):
    """x = [2, 1, 4, 3] with block = 1: (2, 1) -> (2, 1.3679) -> (4, 1.1851) -> (4, 1.5530)."""
    x = torch.tensor([HAND_X], device=runtime.device)
    m_trace, l_trace = check_trace(impl, x, 1)
    assert_close(m_trace[0], torch.tensor(HAND_M), ("step",), **FOUR_DECIMALS)
    assert_close(l_trace[0], torch.tensor(HAND_L), ("step",), **FOUR_DECIMALS)


@pytest.mark.parametrize("block", [None, 1, 2, 4, 64])
def test_worked_example_final_state(impl, runtime, block):
    """Whatever the block size, [2, 1, 4, 3] ends at m = 4, l = 1.5530."""
    x = torch.tensor([HAND_X], device=runtime.device)
    m, l = check_stats(impl, x, block=block)
    assert_close(m, torch.tensor([4.0]), **FOUR_DECIMALS)
    assert_close(l, torch.tensor([1.5530]), **FOUR_DECIMALS)


def test_worked_example_trace_two_elements_per_block(impl, runtime):
    """block = 2: (2, 1.3679) after [2, 1], then (4, 1.5530) after [4, 3]."""
    x = torch.tensor([HAND_X], device=runtime.device)
    m_trace, l_trace = check_trace(impl, x, 2)
    assert_close(m_trace[0], torch.tensor([2.0, 4.0]), **FOUR_DECIMALS)
    assert_close(l_trace[0], torch.tensor([1.3679, 1.5530]), **FOUR_DECIMALS)


def test_order_changes_the_trace_not_the_result(impl, runtime):
    """[2, 1, 3, 4] (the data [2, 1, 4, 3] with its last two swapped) passes through other states,
    (3, 1.5032) after three elements, but ends at the same (4, 1.5530): the sum is over a set."""
    x = torch.tensor([[2.0, 1.0, 3.0, 4.0]], device=runtime.device)
    m_trace, l_trace = check_trace(impl, x, 1)
    assert_close(m_trace[0], torch.tensor([2.0, 2.0, 3.0, 4.0]), **FOUR_DECIMALS)
    assert_close(l_trace[0], torch.tensor([1.0, 1.3679, 1.5032, 1.5530]), **FOUR_DECIMALS)


def test_worked_example_merge_of_two_halves(impl, runtime):
    """The state of [2, 1] is (2, 1.3679), of [4, 3] is (4, 1.3679); merged: (4, 1.5530), computed by
    your softmax_stats on each half and your merge_stats."""
    left = torch.tensor([HAND_X[:2]], device=runtime.device)
    right = torch.tensor([HAND_X[2:]], device=runtime.device)
    m_a, l_a = check_stats(impl, left)
    m_b, l_b = check_stats(impl, right)
    assert_close(l_a, torch.tensor([1.3679]), **FOUR_DECIMALS)
    m, l = impl.merge_stats(m_a, l_a, m_b, l_b)
    assert_close(m, torch.tensor([4.0]), **FOUR_DECIMALS)
    assert_close(l, torch.tensor([1.5530]), **FOUR_DECIMALS)


def _hand_states(x, base_terms, base_rescale):
    """The state after each element of the row x, the terms e^(x - m) and the rescale e^(m_old - m_new)
    each taken in the base given (math.e, or 2 for a tl.exp2 without its log2(e) factor)."""
    m, l, trace = float("-inf"), 0.0, []
    for v in x:
        m_new = max(m, v)
        l = l * (base_rescale ** (m - m_new) if m > float("-inf") else 0.0) + base_terms ** (v - m_new)
        m = m_new
        trace.append(l)
    return trace


def _base_two_where(got, candidates):
    """The name of the candidate (name -> expected values) that got matches to four decimals, or None."""
    for name, values in candidates.items():
        if all(abs(g - v) <= 1e-4 * max(1.0, abs(v)) for g, v in zip(got, values)):
            return name
    return None


def test_exponentials_are_base_e(impl, runtime):
    """Every exponential of this lesson is e^z: the terms e^(x - m), the rescale e^(m_old - m_new), the
    merge's weights and p. tl.exp2, the instruction T5 takes with log2(e) folded into its scale, gives
    2^z here: a softmax at the wrong temperature. The worked example [2, 1, 4, 3] through each
    function, and each wrong answer a 2^z in one place gives, to name that place."""
    x = torch.tensor([HAND_X], device=runtime.device)
    e = math.e
    right = _hand_states(HAND_X, e, e)
    where = {
        "the terms e^(x - m)": _hand_states(HAND_X, 2.0, e),
        "the rescale e^(m_old - m_new)": _hand_states(HAND_X, e, 2.0),
        "both the terms and the rescale": _hand_states(HAND_X, 2.0, 2.0),
    }
    _, l_trace = impl.softmax_stats_trace(x, 1)
    got = [float(v) for v in l_trace[0].float().cpu()]
    place = _base_two_where(got, where) if _base_two_where(got, {"e": right}) is None else None
    assert place is None, (
        f"l after each element of [2, 1, 4, 3] = {[round(g, 4) for g in got]}, the right {[round(v, 4) for v in right]}: "
        f"what 2^z where e^z belongs gives in {place} of softmax_stats_kernel"
    )
    m_a, l_a, m_b, l_b = (torch.tensor([v], device=runtime.device) for v in (2.0, right[1], 4.0, right[1]))
    _, l = impl.merge_stats(m_a, l_a, m_b, l_b)
    base_two = right[1] * 2.0 ** (2.0 - 4.0) + right[1]
    assert abs(float(l[0]) - base_two) > 1e-4, (
        f"merge of (2, {right[1]:.4f}) and (4, {right[1]:.4f}) gave l = {float(l[0]):.4f}, the right "
        f"{right[3]:.4f}: what 2^z where e^z belongs gives in merge_stats_kernel's weights"
    )
    p = impl.online_softmax(x)
    p_base_two = torch.tensor([[2.0 ** (v - 4.0) / right[3] for v in HAND_X]])
    assert mismatch(p.float().cpu(), p_base_two) is not None, (
        f"p = {p[0].tolist()}: what 2^(x - m) / l gives where e^(x - m) / l belongs in "
        "softmax_normalize_kernel"
    )


# --- Section 5 "Pitfalls": the statistics pass -------------------------------------------------------


def test_old_sum_is_rescaled_when_the_max_grows(impl, runtime):
    """Every row rises from left to right, so every block raises the max: an l summed under an old max
    must be multiplied by exp(m_old - m_new), an exponential (not the difference, not 1)."""
    M, N = sizes(runtime, (4, 100), (300, 5000))
    ramp = torch.linspace(-3.0, 9.0, N, device=runtime.device)
    x = ramp + 0.5 * randn((M, N), runtime, stream=1)
    for block in sizes(runtime, [16], [16, 256]):
        check_trace(impl, x, block)
        check_stats(impl, x, block=block)


def test_first_block_starts_from_minus_inf(impl, runtime):
    """All entries negative: a state that starts at m = 0 instead of -inf never sees a larger max, so
    m stays 0 and l is summed against it. Below about -104 every e^(x - 0) underflows to 0, so l = 0
    and every p = 0. N is a multiple of the block: no padding lane takes part."""
    M, N = sizes(runtime, (3, 48), (257, 3008))
    for offset in (-3.0, -300.0):
        x = offset - randn((M, N), runtime, stream=2).abs()
        check_trace(impl, x, 16)
        check_stats(impl, x, block=16)
        check_softmax(impl, x, block=16)


def test_large_magnitudes_do_not_overflow(impl, runtime):
    """Entries of magnitude 1e4: exp(x) overflows fp32 at x = 89, so every exponent must be shifted by
    the running max before exp."""
    M, N = sizes(runtime, (4, 100), (1823, 781))
    for dtype in (torch.float32, torch.float16):
        x = randn((M, N), runtime, stream=3, dtype=dtype, scale=1e4)
        check_stats(impl, x, block=16)
        check_softmax(impl, x, block=16)


def test_minus_inf_entries(impl, runtime):
    """Masked entries (-inf) anywhere, including whole leading blocks of a row: the state stays
    (-inf, 0) until the first finite entry, without computing -inf - (-inf) = NaN."""
    M, N = sizes(runtime, (5, 70), (512, 4000))
    x = randn((M, N), runtime, stream=4)
    gen = torch.Generator().manual_seed(seeded(4))
    x[(torch.rand(M, N, generator=gen) < 0.3).to(runtime.device)] = NEG_INF
    x[1, :40] = NEG_INF  # the first blocks of row 1 hold nothing
    x[2, 1:] = NEG_INF  # one finite entry, first
    x[3, :-1] = NEG_INF  # one finite entry, last
    check_trace(impl, x, 16)
    check_stats(impl, x, block=16)
    check_softmax(impl, x, block=16)


def test_row_of_only_minus_inf_is_the_empty_state(impl, runtime):
    """A fully masked row has no distribution: its stats are defined as m = -inf, l = 0 (no NaN), and
    online_softmax writes zeros for it (torch.softmax would write NaN)."""
    x = randn((3, 40), runtime, stream=5)
    x[1] = NEG_INF
    for block in (None, 16):
        m, l = check_stats(impl, x, block=block)
        assert m[1].item() == NEG_INF and l[1].item() == 0.0, f"row 1 is all -inf: got ({m[1]}, {l[1]})"
        out = check_softmax(impl, x, block=block)
        assert (out[1] == 0).all(), "a row of only -inf must get p = 0, not NaN"


def test_last_block_is_masked(impl, runtime):
    """N is not a multiple of the block, and the columns past each row's end are NaN. Lanes past the end
    must read -inf, not 0: every real entry is negative here, so a 0 would win the max."""
    M, N = sizes(runtime, (4, 37), (700, 1001))
    x = poisoned_view(-1.0 - randn((M, N), runtime, stream=6).abs())
    for block in (8, 16, 64):
        check_stats(impl, x, block=block)
        check_trace(impl, x, block)
        check_softmax(impl, x, block=block)


def test_rows_are_read_through_their_strides(impl, runtime):
    """x is a column slice of a wider buffer, so its rows are stride_xm = N + 24 elements apart, not N;
    out is a view with rows N + 16 apart. The columns around x hold 50, larger than any entry of x: a
    kernel that steps from row to row by N reads them, and its max and sum show it. N is a multiple of
    every block here, so no mask is involved."""
    M, N = sizes(runtime, (5, 64), (300, 4096))
    wide = torch.full((M, N + 24), 50.0, device=runtime.device)  # [M, N + 24]
    wide[:, 8 : 8 + N] = randn((M, N), runtime, stream=26, scale=3.0)
    x = wide[:, 8 : 8 + N]  # [M, N], rows N + 24 apart
    assert x.stride() == (N + 24, 1)
    for block in (16, None):
        check_stats(impl, x, block=block)
        check_softmax(impl, x, block=block)
    check_trace(impl, x, 16)


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 100), (3, 781)], ids=str)
def test_non_power_of_two_shapes(impl, runtime, shape):
    """Rows of 1, 5, 100 and 781 columns with the default block and with 16-column blocks."""
    x = randn(shape, runtime, stream=sum(shape), scale=3.0)
    for block in (None, 16):
        check_stats(impl, x, block=block)
        check_softmax(impl, x, block=block)


def test_large_non_power_of_two_sizes(impl, runtime):
    """1823 x 781 with the default block and 128-column blocks; 64 rows of 100003 columns."""
    if runtime.interpreter:
        pytest.skip(
            "GPU only: 1.4M and 6.4M elements take minutes in the interpreter "
            "(test_non_power_of_two_shapes covers the same edges small)"
        )
    x = randn((1823, 781), runtime, stream=7, scale=4.0)
    for block in (None, 128):
        check_stats(impl, x, block=block)
        check_softmax(impl, x, block=block)
    x = randn((64, 100003), runtime, stream=8, scale=4.0)
    check_stats(impl, x)
    check_softmax(impl, x, splits=16)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, bf16_everywhere()], ids=["fp32", "fp16", "bf16"]
)
def test_dtypes(impl, runtime, dtype):
    """Statistics are fp32 whatever x is; p comes back in x's dtype."""
    x = randn(sizes(runtime, (5, 90), (1823, 781)), runtime, stream=9, dtype=dtype, scale=3.0)
    check_stats(impl, x, block=32)
    out = check_softmax(impl, x, block=32)
    assert out.dtype == dtype, f"online_softmax must return x's dtype {dtype}, got {out.dtype}"


# --- Section 5 "Pitfalls": merging states -------------------------------------------------------------


def random_states(runtime, shape, stream):
    """Valid states (m, l) with maxes spread over +-20: each l >= 1, as a real state's is."""
    gen = torch.Generator().manual_seed(seeded(stream))
    m = 20 * torch.randn(shape, generator=gen)
    l = 1 + 50 * torch.rand(shape, generator=gen)
    return m.to(runtime.device), l.to(runtime.device)


def test_merge_matches_one_shot_union(impl, runtime):
    """The stats of the left and right parts of each row, merged, equal the stats of the whole row."""
    M, N = sizes(runtime, (4, 90), (1000, 5000))
    x = randn((M, N), runtime, stream=10, scale=3.0)
    x[0, :50] += 10.0  # the max on the left in row 0
    x[1, 50:] += 10.0  # on the right in row 1
    for cut in (1, 37, 50, N - 1):
        left, right = x[:, :cut].contiguous(), x[:, cut:].contiguous()
        m, l = impl.merge_stats(*impl.softmax_stats(left, block=16), *impl.softmax_stats(right, block=16))
        assert_stats_close(m, l, *stats_reference(x))


def test_merge_shifts_to_the_larger_max(impl, runtime):
    """Each l is relative to its own max: before adding, both must be rescaled to the common max
    m = max(m_a, m_b). With maxes far apart, the smaller state's share underflows to 0, not to NaN."""
    m_a, l_a = random_states(runtime, (64,), stream=11)
    m_b, l_b = random_states(runtime, (64,), stream=12)
    m_b[:8] = m_a[:8] + 1e4  # b dominates completely
    m_b[8:16] = m_a[8:16]  # equal maxes: the sums simply add
    m, l = impl.merge_stats(m_a, l_a, m_b, l_b)
    assert_stats_close(m, l, *merge_reference(m_a, l_a, m_b, l_b))


def test_merge_with_maxes_beyond_fp32_exp_range(impl, runtime):
    """Maxes of several hundred, of either sign: e^m alone is inf above m = 88.7 and 0 below -103.3 in
    fp32, so a merge that weights each l by e^m and divides by e^(max) afterwards (right on paper) gives
    inf / inf = NaN, or 0 / 0. Shifted by the common max, every exponent is <= 0 and nothing overflows."""
    gen = torch.Generator().manual_seed(seeded(27))
    n = 48
    m_a = 200.0 + 100.0 * torch.rand(n, generator=gen)  # [n] in [200, 300)
    m_a[n // 3 : 2 * n // 3] *= -1.0  # a third far below zero: e^m_a underflows
    m_b = m_a + 10.0 * torch.randn(n, generator=gen)  # close to a: both shares count
    m_b[2 * n // 3 :] = -m_a[2 * n // 3 :]  # the last third: a at +200..300, b at -300..-200
    l_a = 1 + 50 * torch.rand(n, generator=gen)
    l_b = 1 + 50 * torch.rand(n, generator=gen)
    a = (m_a.to(runtime.device), l_a.to(runtime.device))
    b = (m_b.to(runtime.device), l_b.to(runtime.device))
    m, l = impl.merge_stats(*a, *b)
    assert_stats_close(m, l, *merge_reference(*a, *b))


def test_merge_is_commutative(impl, runtime):
    m_a, l_a = random_states(runtime, (100,), stream=13)
    m_b, l_b = random_states(runtime, (100,), stream=14)
    ab = impl.merge_stats(m_a, l_a, m_b, l_b)
    ba = impl.merge_stats(m_b, l_b, m_a, l_a)
    assert_stats_close(*ab, *merge_reference(m_a, l_a, m_b, l_b))
    assert_stats_close(*ba, *ab)


def test_merge_is_associative(impl, runtime):
    """(a + b) + c = a + (b + c): any tree of merges gives the same state, which split softmax relies on."""
    a, b, c = (random_states(runtime, (100,), stream=s) for s in (15, 16, 17))
    left = impl.merge_stats(*impl.merge_stats(*a, *b), *c)
    right = impl.merge_stats(*a, *impl.merge_stats(*b, *c))
    assert_stats_close(*left, *merge_reference(*merge_reference(*a, *b), *c))
    assert_stats_close(*right, *left)


def test_merge_with_the_empty_state_is_identity(impl, runtime):
    """(-inf, 0) is what a split with no columns holds. Merged with (m, l) it gives (m, l); two empty
    states give the empty state, not -inf - (-inf) = NaN."""
    m_a, l_a = random_states(runtime, (10,), stream=18)
    m_e = torch.full_like(m_a, NEG_INF)
    l_e = torch.zeros_like(l_a)
    assert_stats_close(*impl.merge_stats(m_a, l_a, m_e, l_e), m_a, l_a)
    assert_stats_close(*impl.merge_stats(m_e, l_e, m_a, l_a), m_a, l_a)
    assert_stats_close(*impl.merge_stats(m_e, l_e, m_e, l_e), m_e, l_e)


def test_merge_takes_any_shape(impl, runtime):
    """States are elementwise: a [3, 5] state (say, 3 heads x 5 query rows) merges lane by lane, and the
    result keeps the shape."""
    a = random_states(runtime, (3, 5), stream=19)
    b = random_states(runtime, (3, 5), stream=20)
    m, l = impl.merge_stats(*a, *b)
    assert_stats_close(m, l, *merge_reference(*a, *b), dims=("head", "row"))


def _merge_tile(impl, runtime):
    """The widest tile of states the learner's merge launch declares (its largest power-of-two int
    constexpr other than the launch options), so the next case crosses it; the reference's is 1024."""
    with record_launches(impl) as launches:
        impl.merge_stats(*random_states(runtime, (4,), 43), *random_states(runtime, (4,), 44))
    tiles = [
        v
        for call in launches.calls
        for k, v in call.constexprs.items()
        if k not in LAUNCH_OPTIONS and isinstance(v, int) and not isinstance(v, bool) and v > 0
    ]
    return max([DOMAIN["merge_tile"], *tiles])


def test_merge_covers_states_past_one_program(impl, runtime):
    """Three tiles of states less a few (3000 for the reference's 1024-wide tile): a merge launched as
    one program, or with a grid rounded down, leaves the states past its tiles unwritten. The maxes rise
    along the array, so a state from the first tile standing in for a later one is far off too."""
    n = 3 * _merge_tile(impl, runtime) - 72  # [n]: one past every tile bound, and a ragged last tile
    a = random_states(runtime, (n,), stream=45)
    b = random_states(runtime, (n,), stream=46)
    ramp = torch.linspace(0.0, 80.0, n, device=runtime.device)  # later states hold larger maxes
    a, b = (a[0] + ramp, a[1]), (b[0] + ramp, b[1])
    m, l = impl.merge_stats(*a, *b)
    assert_stats_close(m, l, *merge_reference(*a, *b), dims=("state",))


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (16 splits with
    one-column blocks, scores rising in every later block in bf16, -inf entries in a strided row...): a
    kernel right on each bound alone can still be wrong where two meet. A failure names the case."""

    def run(c):
        (M, N), kwargs = c["shape"], dict(block=c["block"], splits=c["splits"])
        x = randn((M, N), runtime, stream=408, scale=3.0)  # fp32 first: the score patterns are exact there
        if c["scores"] == "rising":
            x += torch.linspace(0.0, 40.0, N, device=x.device)
        elif c["scores"] == "minus_inf":
            x[:, ::3] = float("-inf")
            if M > 1:
                x[-1] = float("-inf")  # a row of only -inf: the empty state
        x = x.to(c["dtype"])
        if c["x"] == "nan_past_each_row":
            x = poisoned_view(x)
        if c["fn"] == "softmax_stats":
            check_stats(impl, x, **kwargs)
        else:
            check_softmax(impl, x, **kwargs)

    DOMAIN.check_each(DOMAIN.cases(stream=408), run)


# --- Splits: several programs per row, merged --------------------------------------------------------


def test_trace_rows_start_at_row_times_steps(impl, runtime):
    """The trace is [M, cdiv(N, BLOCK)]: row r's state after block j lives at r * cdiv(N, BLOCK) + j. Each
    row traced alone is checked first; 3 rows of 5 columns in blocks of 2 (3 steps, the last partial)
    then show a row offset counted as N // BLOCK, or left out, as rows that are right alone and not
    together."""
    x = randn((3, 5), runtime, stream=28, scale=2.0)
    for r in range(3):
        check_trace(impl, x[r : r + 1].clone(), 2)
    try:
        check_trace(impl, x, 2)
    except AssertionError as e:
        pytest.fail(
            "each row's trace is right alone, but not with 3 rows: row r's trace starts at r * cdiv(N, BLOCK) "
            f"(here r * 3) in the [M, cdiv(N, BLOCK)] buffers. {e}"
        )


def test_partial_states_stored_at_split_row(impl, runtime):
    """The statistics pass stores split s's state of row r at [s, r] of the [splits, M] buffers, which
    the merge reads as splits rows of M states. Stored at [r, s] (flat r * splits + s), the merge folds
    the wrong states together: right for one row or one split, wrong for 3 rows of 2 splits, where the
    result is named when it equals what that layout gives."""
    M, S, W = 3, 2, 4  # 3 rows, 2 splits of one 4-column block each
    x = randn((M, S * W), runtime, stream=27, scale=2.0)
    m, l = impl.softmax_stats(x, block=W, splits=S)
    # Each (row, split)'s own state, as a [row, split] layout lays them out flat.
    flat = [stats_reference(x[r : r + 1, s * W : (s + 1) * W]) for r in range(M) for s in range(S)]
    # Read back as [split, row], row i merges the flat entries i, M + i, ...: one state of S parts.
    swapped = [[flat[s * M + i] for s in range(S)] for i in range(M)]
    m_swapped = torch.stack([torch.stack([p[0][0] for p in parts]).amax() for parts in swapped])  # [M]
    l_swapped = torch.stack(
        [sum(p[1][0] * torch.exp(p[0][0] - mi) for p in parts) for parts, mi in zip(swapped, m_swapped)]
    )  # [M]
    m_ref, l_ref = stats_reference(x)
    if not torch.allclose(m_swapped, m_ref) and m.shape == (M,) and l.shape == (M,):
        looks_swapped = torch.allclose(
            m.float().cpu(), m_swapped.cpu(), rtol=1e-4, atol=1e-4
        ) and torch.allclose(l.float().cpu(), l_swapped.cpu(), rtol=1e-4, atol=1e-4)
        assert not looks_swapped, (
            "the merged states are those of partial states stored at [row, split] (flat row * splits + split) "
            "and read at [split, row]: store split s's state of row r at s * M + r"
        )
    assert_stats_close(m, l, m_ref, l_ref)


@pytest.mark.parametrize("splits", [2, 4, 16, _SPLITS_MAX])
def test_splits_match_one_pass(impl, runtime, splits):
    """Each split scans N / splits columns; merged, the states equal the one-pass state. With 16 splits
    of 16-column blocks over 100 columns, the last splits hold no columns at all (empty states). 1024,
    the most the launcher admits, in one-column blocks: 100 splits hold a column, the rest are empty,
    and a merge of a fixed count of halvings (or of the first 16 states) stops short of them."""
    M, N = sizes(runtime, (3, 100), (256, 30000))
    x = randn((M, N), runtime, stream=21, scale=3.0)
    x[0, -5:] += 20.0  # row 0's max in the last split
    x[1, :5] += 20.0  # row 1's in the first
    # 1024 splits take blocks of one column, so 100 of them hold a column: past any 16 of them.
    block = 1 if splits == _SPLITS_MAX else 16
    with record_launches(impl) as launches:
        check_stats(impl, x, block=block, splits=splits)
    # One pass over the whole row gives the same numbers, so only the launch shows splits ignored.
    grids = [c.grid for c in launches.calls if c.name == "softmax_stats_kernel" and c.grid]
    if grids:
        programs = max(math.prod(g) for g in grids)
        assert programs >= M * splits, (
            f"softmax_stats(x, splits={splits}) with {M} rows launched softmax_stats_kernel on grids "
            f"{grids}: at most {programs} programs where {M} rows in {splits} splits are {M * splits}; "
            "the splits argument was not used"
        )
    check_softmax(impl, x, block=block, splits=splits)


def test_probabilities_use_the_final_state(impl, runtime):
    """p = exp(x - m) / l needs the (m, l) of the WHOLE row. Normalising with a state from before the row
    is finished (one split's, or the running state at the time a block is written) leaves p unnormalised.
    The max sits at the very end of every row here."""
    M, N = sizes(runtime, (3, 64), (128, 8192))
    x = randn((M, N), runtime, stream=22)
    x[:, -1] = 8.0
    check_softmax(impl, x, block=8, splits=4)
    check_softmax(impl, x, block=8)


def test_rows_sum_to_one(impl, runtime):
    """Every p is divided by the row's l, so each row of the output sums to 1."""
    x = randn(sizes(runtime, (4, 50), (1000, 3000)), runtime, stream=23, scale=2.0)
    out = check_softmax(impl, x, block=16)
    assert_close(out.float().sum(dim=1), torch.ones(x.shape[0]), ("row",))


# --- Offsets past 2**31 elements, on sparse buffers -----------------------------------------------


@pytest.mark.parametrize("splits", [1, 2])
def test_row_offsets_widened_to_int64(impl, runtime, splits):
    """Row 2 of x and of out starts 2 * (2**30 + 2**20) elements in, past 2**31: row * stride computed
    in int32 wraps to a negative offset, 2**31 - 2**21 elements before row 0, so both passes read that
    row from the wrong place (zeros) and the second stores it there. 70 columns in blocks of 16."""
    if runtime.interpreter and free_bytes() < 2**30:
        pytest.skip(
            f"needs about 1 GB of free memory for the touched pages and the interpreter; "
            f"{free_bytes() / 2**30:.1f} GB free"
        )
    N = 70
    gen = torch.Generator().manual_seed(seeded(41))
    x, _ = rows_past_int32(N, runtime.device)
    x.copy_(torch.randn(3, N, generator=gen).to(torch.float16))
    m, l = impl.softmax_stats(x, block=16, splits=splits)
    assert_stats_close(m, l, *stats_reference(x))
    out, out_flat = rows_past_int32(N, runtime.device)
    out.fill_(CANARY)
    impl.online_softmax(x, block=16, splits=splits, out=out)
    assert (out_flat[:N] == 0).all(), (
        f"a row of out was stored {WRAP} elements before row 0: the row offset row * stride wrapped "
        "around in int32"
    )
    assert_close(out, softmax_reference(x), ("row", "col"))


# --- The launchers reject bad input before launching ----------------------------------------------


def _x(device):
    return torch.randn(3, 20).to(device)


# name -> (the function, how to build its arguments, the error, what the message must name)
BAD_INPUTS = {
    "x_not_a_tensor": ("both", lambda d: dict(x=_x(d).tolist()), TypeError, "x"),
    "x_rank_1": ("both", lambda d: dict(x=_x(d)[0]), ValueError, "x"),
    "x_rank_3": ("both", lambda d: dict(x=_x(d)[None]), ValueError, "x"),
    "x_int64": ("both", lambda d: dict(x=_x(d).long()), TypeError, "x"),
    "x_float64": ("both", lambda d: dict(x=_x(d).double()), TypeError, "x"),
    "x_last_dim_strided": ("both", lambda d: dict(x=torch.randn(20, 3).to(d).t()), ValueError, "x"),
    "x_no_columns": ("both", lambda d: dict(x=torch.empty(3, 0, device=d)), ValueError, "x"),
    "x_no_rows": ("both", lambda d: dict(x=torch.empty(0, 8, device=d)), ValueError, "x"),
    "x_on_meta": ("both", lambda d: dict(x=_x("meta")), ValueError, "x"),
    "block_not_pow2": ("both", lambda d: dict(x=_x(d), block=12), ValueError, "block"),
    "block_float": ("both", lambda d: dict(x=_x(d), block=16.0), TypeError, "block"),
    "block_zero": ("both", lambda d: dict(x=_x(d), block=0), ValueError, "block"),
    "block_too_large": ("both", lambda d: dict(x=_x(d), block=2**17), ValueError, "block"),
    "splits_zero": ("both", lambda d: dict(x=_x(d), splits=0), ValueError, "splits"),
    "splits_not_pow2": ("both", lambda d: dict(x=_x(d), splits=3), ValueError, "splits"),
    "splits_bool": ("both", lambda d: dict(x=_x(d), splits=True), TypeError, "splits"),
    "trace_block_missing": ("softmax_stats_trace", lambda d: dict(x=_x(d), block=None), TypeError, "block"),
    "trace_block_not_pow2": ("softmax_stats_trace", lambda d: dict(x=_x(d), block=3), ValueError, "block"),
    "trace_x_rank_1": ("softmax_stats_trace", lambda d: dict(x=_x(d)[0], block=4), ValueError, "x"),
    "out_wrong_shape": (
        "online_softmax",
        lambda d: dict(x=_x(d), out=torch.empty(3, 19, device=d)),
        ValueError,
        "out",
    ),
    "out_wrong_dtype": ("online_softmax", lambda d: dict(x=_x(d), out=_x(d).half()), TypeError, "out"),
    "out_last_dim_strided": (
        "online_softmax",
        lambda d: dict(x=_x(d), out=torch.empty(20, 3, device=d).t()),
        ValueError,
        "out",
    ),
    "block_bool": ("both", lambda d: dict(x=_x(d), block=True), TypeError, "block"),
    "splits_too_large": ("both", lambda d: dict(x=_x(d), splits=2048), ValueError, "splits"),
    "splits_float": ("both", lambda d: dict(x=_x(d), splits=2.0), TypeError, "splits"),
    "out_not_a_tensor": ("online_softmax", lambda d: dict(x=_x(d), out=_x(d).tolist()), TypeError, "out"),
    "out_rank_3": (
        "online_softmax",
        lambda d: dict(x=_x(d), out=torch.empty(1, 3, 20, device=d)),
        ValueError,
        "out",
    ),
    "out_on_meta": (
        "online_softmax",
        lambda d: dict(x=_x(d), out=torch.empty(3, 20, device="meta")),
        ValueError,
        "out",
    ),
    # Two programs would write one row of memory, or read a row of x another has already overwritten.
    "out_rows_overlap": (
        "online_softmax",
        lambda d: dict(x=_x(d), out=torch.empty(1, 20, device=d).expand(3, 20)),
        ValueError,
        "out",
    ),
    "out_over_x_shifted_a_row": ("online_softmax", lambda d: _shifted_a_row(_x(d)), ValueError, "out"),
}


def _shifted_a_row(x):
    """x (a copy) and out, the same memory one row further on: a partial overlap."""
    buffer = torch.zeros(x.shape[0] + 1, x.shape[1], dtype=x.dtype, device=x.device)  # [M + 1, N]
    buffer[:-1] = x
    return dict(x=buffer[:-1], out=buffer[1:])


def _states(device, n=6):
    return dict(
        m_a=torch.randn(n, device=device),
        l_a=torch.ones(n, device=device),
        m_b=torch.randn(n, device=device),
        l_b=torch.ones(n, device=device),
    )


BAD_MERGES = {
    "m_a_fp16": (lambda d: dict(m_a=torch.randn(6, device=d).half()), TypeError, "m_a"),
    "m_b_not_a_tensor": (lambda d: dict(m_b=[0.0] * 6), TypeError, "m_b"),
    "l_b_wrong_shape": (lambda d: dict(l_b=torch.ones(5, device=d)), ValueError, "l_b"),
    # As many states, another shape: a check of numel() alone lets it by.
    "l_b_same_numel_other_shape": (lambda d: dict(l_b=torch.ones(2, 3, device=d)), ValueError, "l_b"),
    "l_a_strided": (lambda d: dict(l_a=torch.ones(12, device=d)[::2]), ValueError, "l_a"),
    "m_b_on_meta": (lambda d: dict(m_b=torch.randn(6, device="meta")), ValueError, "m_b"),
    "m_a_not_a_tensor": (lambda d: dict(m_a=[0.0] * 6), TypeError, "m_a"),
    "l_a_fp64": (lambda d: dict(l_a=torch.ones(6, device=d, dtype=torch.float64)), TypeError, "l_a"),
    "m_b_strided": (lambda d: dict(m_b=torch.randn(12, device=d)[::2]), ValueError, "m_b"),
    # Same shape as the others but transposed: flat offsets would pair the wrong lanes, so it is refused.
    "l_b_transposed": (
        lambda d: {
            **{n: t.reshape(2, 3) for n, t in _states(d).items()},
            "l_b": torch.ones(3, 2, device=d).t(),
        },
        ValueError,
        "l_b",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launchers_reject_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    which, build, error, names = BAD_INPUTS[name]
    functions = ["softmax_stats", "online_softmax"] if which == "both" else [which]
    for fn in functions:
        kwargs = build(runtime.device)
        if fn == "softmax_stats_trace":
            kwargs.setdefault("block", 4)
        with pytest.raises(error, match=names):
            getattr(impl, fn)(**kwargs)


@pytest.mark.parametrize("name", list(BAD_MERGES))
def test_merge_rejects_bad_input(impl, runtime, name):
    spoil, error, names = BAD_MERGES[name]
    args = _states(runtime.device)
    args.update(spoil(runtime.device))
    with pytest.raises(error, match=names):
        impl.merge_stats(**args)


# --- Your kernel does the work ------------------------------------------------------------------


@pytest.mark.parametrize(
    "function", ["softmax_stats", "softmax_stats_trace", "merge_stats", "online_softmax"]
)
def test_runs_a_triton_kernel(impl, runtime, function):
    """The right numbers are not enough: each function must compute them with your Triton kernels, not
    with torch (torch.logsumexp, torch.softmax, or a copy of the grader's oracle)."""
    x = randn((4, 100), runtime, stream=40)
    calls = {
        "softmax_stats": lambda: impl.softmax_stats(x),
        "softmax_stats_trace": lambda: impl.softmax_stats_trace(x, 32),
        "merge_stats": lambda: impl.merge_stats(
            *random_states(runtime, (4,), 41), *random_states(runtime, (4,), 42)
        ),
        "online_softmax": lambda: impl.online_softmax(x),
    }
    assert_runs_a_triton_kernel(impl, calls[function], function)


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_uniform(runtime):
    """Not a test of your kernels: proves the comparisons fail an all-zeros output, a uniform 1/N output
    and all-zero stats, so passing the other tests means something."""
    x = randn((8, 100), runtime, stream=24, scale=3.0)
    ref = softmax_reference(x)
    assert mismatch(torch.zeros_like(ref), ref) is not None
    assert mismatch(torch.full_like(ref, 1 / x.shape[1]), ref) is not None
    assert mismatch(ref.half(), ref) is None  # and the oracle rounded to fp16 passes
    m_ref, l_ref = stats_reference(x)
    with pytest.raises(AssertionError):
        assert_stats_close(torch.zeros_like(m_ref), torch.zeros_like(l_ref), m_ref, l_ref)
    with pytest.raises(AssertionError):  # the right m with a sum that was never rescaled is caught too
        assert_stats_close(m_ref, l_ref * math.e, m_ref, l_ref)


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, online_softmax allocates [M, N] in x's dtype."""
    x = randn((3, 30), runtime, stream=25, dtype=torch.float16)
    out = impl.online_softmax(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert_close(out, softmax_reference(x), ("row", "col"))


def test_out_may_be_x(impl, runtime):
    """In place, online_softmax(x, out=x, splits=4): the statistics pass has read all of x before the
    second pass writes, and each lane of that pass reads its element before writing it."""
    x = randn((3, 30), runtime, stream=26, dtype=torch.float32)
    expected = softmax_reference(x)
    returned = impl.online_softmax(x, block=4, splits=4, out=x)
    wrong = returned_out_problem("online_softmax", returned, x)
    assert wrong is None, wrong
    assert_close(x, expected, ("row", "col"))


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


@pytest.mark.parametrize("fn", ["softmax_stats", "online_softmax"])
def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime, fn):
    """70,000 rows, more than the 65535 programs CUDA allows on grid axes 1 and 2 (axis 0 allows
    2**31 - 1), in two splits: rows on axis 0, splits (at most 1024) on axis 1. A grid of (splits, M)
    launches on the CPU and fails on a GPU with "invalid argument". Run dry (every launch recorded and
    checked, none run), so 4 columns a row cost nothing."""
    x = torch.zeros(70_000, 4, device=runtime.device)  # [M, N]: M past 65535
    assert_grids_fit(impl, lambda: getattr(impl, fn)(x, splits=2), f"{fn} of 70,000 rows in 2 splits")


# --- Diagnosis: which pitfall of drills/content/t4_online_softmax.md a pattern of results points to -------
# Single-block cases (test_worked_example_final_state[4]: x = [2, 1, 4, 3] in one block) never rescale, so they
# separate the rescale mistakes (1) from the ones that break every block (2, 3, 4). Rows whose N is a
# multiple of the block (test_first_block_starts_from_minus_inf, test_rows_are_read_through_their_strides)
# have no padding lane, so they separate the masking mistakes (7, 12) from the start value (5) and the
# strides (14).

MISTAKES = [
    Mistake(
        1,
        fails=(
            "test_worked_example_trace_one_element_at_a_time",
            "test_old_sum_is_rescaled_when_the_max_grows",
        ),
        # A rescale of 2^(m_old - m_new) fails the same checks: its base is what tells it apart.
        passes=(
            "test_worked_example_final_state[4]",
            "test_merge_shifts_to_the_larger_max",
            "test_exponentials_are_base_e",
        ),
        question="At step 3 of the by-hand trace the max jumps from 2 to 4: what max is the sum 1.3679 "
        "measured against, and what must happen to it before e^(4 - 4) is added?",
        section="2",
    ),
    Mistake(
        2,
        fails=("test_worked_example_trace_one_element_at_a_time", "test_worked_example_final_state[4]"),
        passes=("test_merge_shifts_to_the_larger_max",),
        messages=(r"NaN in l at \(0, 0\)",),
        question="At step 1 of the by-hand trace m is still -inf: what factor does your kernel multiply "
        "the empty sum l = 0 by, and is it a finite number between 0 and 1?",
        section="2",
    ),
    Mistake(
        3,
        fails=("test_worked_example_final_state[4]", "test_large_magnitudes_do_not_overflow"),
        passes=("test_merge_shifts_to_the_larger_max",),
        question="For x = [2, 1, 4, 3] your l is far from 1.5530: is each term e^x, or e^(x - m)? And what "
        "is e^x in fp32 for an entry of 1e4?",
        section="2",
    ),
    Mistake(
        4,
        fails=(
            "test_worked_example_trace_one_element_at_a_time",
            "test_worked_example_final_state[4]",
            "test_large_magnitudes_do_not_overflow",
        ),
        passes=("test_merge_shifts_to_the_larger_max",),
        messages=(r"got m = -inf, expected",),
        question="Your m is still -inf after a block of finite entries: where does the new max go once a "
        "block has been folded in?",
        section="3.3",
    ),
    Mistake(
        5,
        fails=("test_first_block_starts_from_minus_inf",),
        passes=(
            "test_worked_example_final_state",
            "test_non_power_of_two_shapes",
            "test_merge_shifts_to_the_larger_max",
        ),
        # A state started at 0 is a wrong value, not programs writing over each other: a trace whose
        # step index forgets the row (every row's trace at row 0's place) fails here with a write race.
        messages=(r"^(?![\s\S]*write race)",),
        question="For a row whose entries are all below -3, what is max(m, x) after the first block if m "
        "starts at 0, and what is e^(x - 0) for x = -300?",
        section="3.2",
    ),
    Mistake(
        6,
        fails=("test_row_of_only_minus_inf_is_the_empty_state",),
        messages=(r"NaN|nan",),  # its symptom: claimed, so that NaN is not read as a load without other=
        passes=(
            "test_worked_example_final_state",
            "test_first_block_starts_from_minus_inf",
            "test_non_power_of_two_shapes",
        ),
        question="For a row of only -inf, what does your kernel compute for x - m_new, and for l times 1 / l "
        "when l = 0?",
        section="3.3",
    ),
    Mistake(
        7,
        fails=("test_last_block_is_masked", "test_worked_example_final_state[64]"),
        passes=("test_first_block_starts_from_minus_inf", "test_rows_are_read_through_their_strides"),
        question="N = 37 with BLOCK = 16: what do lanes 37 to 47 of the last block load, and what do they "
        "add to m and l?",
        section="3.3",
    ),
    Mistake(
        7,
        # The lanes past the row masked but loaded without other=: they read NaN here (undefined on a GPU).
        fails=("test_last_block_is_masked",),
        passes=("test_first_block_starts_from_minus_inf", "test_rows_are_read_through_their_strides"),
        messages=(r"NaN|nan",),
        question="N = 37 with BLOCK = 16: your load is masked, but what value do lanes 37 to 47 hold "
        "after it, and what do they add to m and l?",
        section="3.3",
    ),
    Mistake(
        7,
        # The merge's last tile of states loaded without the mask: it reads past the states it was given,
        # which the harness reports by name; the math of the merge itself may be right.
        fails=(
            "test_worked_example_merge_of_two_halves",
            "test_merge_shifts_to_the_larger_max",
            "test_merge_covers_states_past_one_program",
        ),
        passes=("test_worked_example_final_state", "test_first_block_starts_from_minus_inf"),
        # Its store unmasked instead: the harness names the store past the merged states.
        messages=(r"out of bounds (?:load of [ml]_[ab]_ptr|store of [ml]_ptr)",),
        question="A merge of 4 states runs one tile of 1024 lanes: which lanes of your merge's loads point "
        "past the 4 states, and what keeps them from being read?",
        section="3.4",
    ),
    Mistake(
        8,
        fails=("test_worked_example_merge_of_two_halves", "test_merge_shifts_to_the_larger_max"),
        passes=(
            "test_worked_example_final_state",
            "test_first_block_starts_from_minus_inf",
            "test_exponentials_are_base_e",  # else weights of 2^(m - max) (22)
        ),
        question="Merging (2, 1.3679) with (4, 1.3679): against which max is each l measured, and by what "
        "must each be multiplied before they are added?",
        section="2",
    ),
    Mistake(
        9,
        fails=("test_merge_with_the_empty_state_is_identity",),
        messages=(r"NaN|nan",),  # its symptom: claimed, so that NaN is not read as a load without other=
        passes=("test_merge_shifts_to_the_larger_max", "test_merge_takes_any_shape"),
        question="Two empty states (-inf, 0) meet in your merge: what is m_a - shift when both maxes are "
        "-inf?",
        section="3.4",
    ),
    Mistake(
        9,
        # The shift guarded on one state's max (m_a == -inf) rather than the merged one: an empty a with
        # a real b shifts by 0, so b's sum comes out times e^(m_b), finite and far off, never NaN.
        fails=("test_merge_with_the_empty_state_is_identity",),
        passes=(
            "test_merge_shifts_to_the_larger_max",
            "test_merge_takes_any_shape",
            "test_worked_example_merge_of_two_halves",
            "test_first_block_starts_from_minus_inf",
            "test_worked_example_final_state",
        ),
        question="Merge the empty state (-inf, 0) as a with (3, 1) as b: what shift does your merge take, "
        "and what is l_b times e^(m_b - shift) then?",
        section="3.4",
    ),
    Mistake(
        21,
        # Every number right: one program per row gives the state of the whole row too.
        fails=("test_splits_match_one_pass",),
        messages=(r"the splits argument was not used",),
        question="softmax_stats(x, splits=4) on 3 rows: how many programs does your statistics pass "
        "launch, and where in your launcher is splits read?",
        section="3.1",
    ),
    Mistake(
        17,
        # n taken as the first dimension, not numel(): flat arrays of any length merge right, a [3, 5]
        # state merges 3 of its 15 and leaves the rest as the harness filled them (NaN).
        fails=("test_merge_takes_any_shape", "test_splits_match_one_pass"),
        passes=(
            "test_merge_covers_states_past_one_program",
            "test_merge_shifts_to_the_larger_max",
            "test_worked_example_final_state",
        ),
        question="merge_stats gets [3, 5] states: how many does your launch count as n, and who merges "
        "the other 12?",
        section="3.4",
    ),
    Mistake(
        25,
        # Every one-row trace right: only the row offset of the [M, steps] trace buffers is wrong.
        fails=("test_trace_rows_start_at_row_times_steps",),
        passes=(
            "test_worked_example_trace_one_element_at_a_time",
            "test_worked_example_final_state",
            "test_non_power_of_two_shapes",
            "test_splits_match_one_pass",
            "test_rows_sum_to_one",
        ),
        messages=(r"each row's trace is right alone",),
        question="3 rows of 5 columns in blocks of 2: how many trace entries has each row, and at which "
        "index does your kernel store row 1's first one?",
        section="3.3",
    ),
    Mistake(
        24,
        # The merge reads [split, row]: a [row, split] layout folds other rows' states into each row.
        fails=("test_partial_states_stored_at_split_row",),
        passes=(
            "test_worked_example_final_state",
            "test_rows_sum_to_one",
            "test_merge_takes_any_shape",
            "test_merge_shifts_to_the_larger_max",
            "test_row_offsets_widened_to_int64[1]",
        ),
        messages=(r"stored at \[row, split\]",),
        question="3 rows and 2 splits: at which flat index of m_ptr does your kernel store split 1's state "
        "of row 0, and which index does the merge read it from?",
        section="3.1",
    ),
    Mistake(
        23,
        # Two splits merge right (each strided view holds one row); from four on, read flat, a view
        # pairs the wrong splits. Pitfall 10's state of one split fails two splits already.
        fails=("test_splits_match_one_pass[4]",),
        passes=(
            "test_splits_match_one_pass[2]",
            "test_merge_takes_any_shape",
            "test_merge_shifts_to_the_larger_max",
            "test_merge_covers_states_past_one_program",
            "test_worked_example_final_state",
        ),
        question="Your tree of merges is right for 2 splits and wrong for 4: are the partial states you "
        "hand the merge contiguous, and which splits does a flat read of them take?",
        section="3.4",
    ),
    Mistake(
        22,
        fails=("test_exponentials_are_base_e",),
        messages=(r"2\^z where e\^z belongs|2\^\(x - m\) / l gives",),
        question="tl.exp2(z) is 2^z: which of your exponentials were meant to be e^z, and what factor "
        "turns one into the other?",
        section="2",
    ),
    Mistake(
        10,
        fails=("test_probabilities_use_the_final_state", "test_splits_match_one_pass"),
        passes=("test_merge_shifts_to_the_larger_max", "test_merge_takes_any_shape", "test_rows_sum_to_one"),
        question="Which (m, l) does your second pass divide by when a row has several splits: the merged "
        "state of the whole row, or the state of one split?",
        section="3.5",
    ),
    Mistake(
        19,
        # Right up to 16 splits; only the largest count admitted shows a merge that stops short.
        fails=(f"test_splits_match_one_pass[{_SPLITS_MAX}]",),
        passes=(
            "test_splits_match_one_pass[16]",
            "test_probabilities_use_the_final_state",
            "test_merge_takes_any_shape",
            "test_merge_covers_states_past_one_program",  # else a merge kernel of one program (17)
        ),
        question="splits = 1024: how many rounds of merges does your launcher run, and how many partial "
        "states are left when it returns?",
        section="3.4",
    ),
    Mistake(
        18,
        # Columns past the first split never written: they still hold the canary of out's buffer.
        fails=("test_splits_match_one_pass", "test_probabilities_use_the_final_state"),
        passes=("test_merge_shifts_to_the_larger_max", "test_merge_takes_any_shape", "test_rows_sum_to_one"),
        messages=(r"got 1234\.5",),
        question="With 4 splits, how many programs per row does your statistics pass launch, how many does "
        "your second pass launch, and which columns does each program of the second pass write?",
        section="3.5",
    ),
    Mistake(
        11,
        fails=("test_rows_sum_to_one",),
        passes=(
            "test_worked_example_final_state",
            "test_merge_shifts_to_the_larger_max",
            "test_exponentials_are_base_e",  # else p = 2^(x - m) / l (22)
        ),
        # Undivided, every row is off by its factor l >= 1: a relative error of a percent or more, not
        # the 0.03% of an fp32 output rounded through fp16.
        messages=(
            r"relative error \|\|out - ref\|\| / \|\|ref\|\| = ([1-9](?![.\d]*e-)|0\.[1-9]|0\.0[1-9])",
        ),
        question="What does each row of your output sum to, and which number of the state should it have "
        "been divided by?",
        section="3.5",
    ),
    Mistake(
        12,
        fails=("test_non_power_of_two_shapes", "test_out_is_allocated_when_not_given"),
        passes=("test_rows_are_read_through_their_strides", "test_worked_example_final_state"),
        messages=(r"canary elements of the buffer around out|out of bounds store of out_ptr|write race",),
        question="N = 37 with BLOCK = 16: which columns does the last block of your second pass store to?",
        section="3.5",
    ),
    Mistake(
        13,
        fails=("test_merge_with_maxes_beyond_fp32_exp_range",),
        messages=(r"NaN|nan",),  # e^m overflows: claimed, as the lesson's own exponential without its shift
        passes=(
            "test_merge_takes_any_shape",
            "test_merge_with_the_empty_state_is_identity",
            "test_worked_example_final_state",
        ),
        question="For m_a = 250, what is e^(m_a) in fp32, and what is it for m_a = -250? Does your merge "
        "ever take e of a max on its own?",
        section="3.4",
    ),
    Mistake(
        14,
        fails=("test_rows_are_read_through_their_strides",),
        passes=(
            "test_worked_example_final_state",
            "test_merge_shifts_to_the_larger_max",
            "test_non_power_of_two_shapes",
        ),
        question="x here is a column slice of a wider buffer: how many elements apart are its rows, and "
        "what does your kernel multiply the row index by?",
        section="3.1",
    ),
    Mistake(
        14,
        fails=("test_rows_are_read_through_their_strides",),
        passes=(
            "test_worked_example_final_state",
            "test_merge_shifts_to_the_larger_max",
            "test_out_is_allocated_when_not_given",
        ),
        messages=(r"canary elements of the buffer around out",),
        question="out here is a view whose rows are N + 16 elements apart: what does your second pass "
        "multiply the row index by when it stores p?",
        section="3.5",
    ),
    Mistake(
        15,
        fails=("test_row_offsets_widened_to_int64",),
        passes=(
            "test_rows_are_read_through_their_strides",
            "test_last_block_is_masked",
            "test_exponentials_are_base_e",  # its merge of two splits fails too with 2^z weights
        ),
        question="Row 2 starts 2 * (2**30 + 2**20) elements into x: in which integer type does your kernel "
        "compute row * stride_xm, and what does that type do past 2**31 - 1?",
        section="3.1",
    ),
    Mistake(
        16,
        fails=("test_dtypes[fp32]",),
        passes=("test_dtypes[fp16]",),
        question="x is fp32: in which dtype does your kernel store p, and where in your code is that dtype "
        "written?",
        section="3.5",
    ),
    Mistake(
        17,
        fails=("test_merge_covers_states_past_one_program",),
        # The states past the launched tiles keep the NaN the harness fills fresh tensors with.
        messages=(r"NaN in [ml] at \(\d{4,}",),
        passes=(
            "test_merge_shifts_to_the_larger_max",
            "test_merge_takes_any_shape",
            "test_splits_match_one_pass[16]",  # 1024 splits of 3 rows are 1536 states: past one program
        ),
        question="merge_stats gets 3000 states and your merge kernel holds BLOCK of them per program: how "
        "many programs does your launch start, and who writes state 2999?",
        section="3.4",
    ),
    Mistake(
        7,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "shape, block, splits, dtype, row layout, scores and function; which of these does your kernel "
        "handle only one at a time (a mask sized for another block, a state merged without its max)?",
        section="3.3",
    ),
    Mistake(
        20,
        # Only splits past the row's last block are empty: 2 and 4 splits of 100 columns all hold some.
        fails=("test_splits_match_one_pass[16]",),
        passes=("test_splits_match_one_pass[2]", "test_splits_match_one_pass[4]"),
        messages=(r"NaN in [ml] at",),
        question="16 splits of 100 columns in blocks of 16: which splits hold no column, and what does your "
        "kernel store for them?",
        section="3.2",
    ),
]
