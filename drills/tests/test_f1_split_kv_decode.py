"""Grader for F1, split-KV paged decode with a planner. Each test is named for the mistake it catches.

Run: make test L=f1 (your drills/mine) or make test L=f1 IMPL=solutions. Caches are poisoned as in L2:
NaN past every sequence's end and in unused blocks, garbage block ids past every last page.
"""
from __future__ import annotations

import math

import pytest
import torch

from drills.compare import assert_close, mismatch
from drills.tests import seeded
from drills.tests.launches import assert_runs_a_triton_kernel
from drills.tests.paged_kv import call_with_canary_out, make_paged_case, paged_attention_reference

DIMS = ("b", "head", "d")


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
    assert_close(lse, ref_lse, ("b", "head"), atol=2e-3, rtol=1e-3, rel=1e-3)
    return out, lse


def fixed_plan(impl, chunk, max_len):
    """A plan with an exact chunk size, bypassing the planner: how the tests force empty splits."""
    return impl.DecodePlan(num_splits=math.ceil(max_len / chunk), chunk=chunk, max_len=max_len)


def small(runtime, cpu, gpu):
    return cpu if runtime.interpreter else gpu


# --- Splitting ---------------------------------------------------------------------------------


def test_every_split_count_matches_unsplit(impl, runtime):
    """Split counts 1 .. pages + 3 through plan(num_splits=...): the result must not depend on how the
    keys are cut. Gaps or overlaps between split ranges change it."""
    n = small(runtime, 70, 1000)
    case = make_paged_case([n], 8, 2, 64, 16, device=runtime.device, seed=1)
    pages = math.ceil(n / 16)
    unsplit, _ = check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=1))
    counts = range(1, pages + 4) if runtime.interpreter else [1, 2, 3, 5, 8, 16, 31, 63, pages, pages + 3]
    for splits in counts:
        out, _ = check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))
        assert_close(out, unsplit.float(), DIMS)


def test_empty_splits_do_not_divide_zero_by_zero(impl, runtime):
    """A ragged batch with a 16-token chunk: the short sequences get many splits with no tokens. An
    empty split must contribute weight 0 (lse = -inf), not 0/0 = NaN."""
    lens = small(runtime, [70, 1, 17, 33], [1000, 1, 17, 250, 999])
    case = make_paged_case(lens, 8, 2, 64, 16, device=runtime.device, seed=2)
    check(impl, case, plan=fixed_plan(impl, 16, max(lens)))
    # More splits than the longest sequence has tiles: trailing splits are empty for everyone.
    check(impl, case, plan=fixed_plan(impl, 16, max(lens) + 48))


def test_many_splits_merge_with_rescale(impl, runtime):
    """Scores rise along the sequence and there are more splits (80) than the merge reads at once (64),
    so the merge's running max changes between groups of splits: its running sum must be rescaled."""
    n, D = 16 * 80, 64
    case = make_paged_case([n, 100], 4, 1, D, 16, device=runtime.device, seed=16, poison=False)
    t = torch.arange(n, device=runtime.device)
    blocks, slots = case.block_tables[0].long()[t // 16], t % 16
    q0 = case.q[0, 0].float()  # [D]
    ramp = torch.linspace(0.0, 15.0, n, device=runtime.device)[:, None]  # head 0's score for token t
    k = 0.3 * case.k_cache[blocks, slots, 0].float() + ramp * math.sqrt(D) * q0 / q0.dot(q0)
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)  # [n, D]
    check(impl, case, plan=fixed_plan(impl, 16, n))  # 80 splits of one tile each


def test_lse_is_natural_log(impl, runtime):
    """lse must equal torch.logsumexp of the scaled scores (base e). Base 2, or forgetting to convert
    back after exp2 tricks, is off by a factor ln 2."""
    case = make_paged_case([45, 3], 8, 2, 64, 16, device=runtime.device, seed=3)
    for splits in (1, 3):
        check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=2), scale=0.37)


# --- L2's edge cases, through the split path -------------------------------------------------


@pytest.mark.parametrize("splits", [1, 4])
def test_last_page_is_masked(impl, runtime, splits):
    lens = [1, 15, 16, 17, 31] + small(runtime, [], [777, 1000])
    case = make_paged_case(lens, 8, 2, 64, 16, device=runtime.device, seed=4)
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=splits))


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (8, 2), (16, 2), (32, 1)],
                         ids=["group1-MHA", "group2", "group4", "group8", "group32-MQA"])
def test_kv_head_grouping_is_contiguous(impl, runtime, Hq, Hkv):
    case = make_paged_case(small(runtime, [40, 9], [300, 129]), Hq, Hkv, 64, 16, device=runtime.device, seed=Hq + Hkv)
    check(impl, case, plan=impl.plan(case.context_lens, Hkv, 16, num_splits=2))


@pytest.mark.parametrize("PAGE", [1, 2, 8, 16, 64])
def test_page_sizes_gathered_token_by_token(impl, runtime, PAGE):
    """Pages smaller than a 16-token tile are gathered token by token through the block table."""
    lens = small(runtime, [37, 5, 20], [1000, 5, 333])
    case = make_paged_case(lens, 8, 2, 64, PAGE, device=runtime.device, seed=PAGE)
    for splits in (1, 3):
        check(impl, case, plan=impl.plan(case.context_lens, 2, PAGE, num_splits=splits))


def test_shared_and_shuffled_pages_single_sequence(impl, runtime):
    case = make_paged_case(small(runtime, [64, 40], [2048, 700]), 8, 2, 128, 16, device=runtime.device,
                           seed=6, shared_prefix_pages=2)
    check(impl, case)  # the planner's own choice
    one = make_paged_case([small(runtime, 150, 32768)], 32, 8, 128, 16, device=runtime.device, seed=7)
    check(impl, one)  # B = 1: the case split-KV exists for


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    if dtype == torch.bfloat16 and runtime.interpreter:
        pytest.skip("bf16 runs on a GPU only: the Triton interpreter's tl.dot returns garbage for bf16 "
                    "(seen in Triton 3.6 and 3.9)")
    case = make_paged_case(small(runtime, [33, 4], [1500, 17]), 8, 2, 128, 16, dtype=dtype,
                           device=runtime.device, seed=8)
    check(impl, case, plan=impl.plan(case.context_lens, 2, 16, num_splits=3))


def test_page_index_widened_to_int64(impl, runtime):
    """Block ids above 2**31 / page stride: int32 offsets read the wrong page (GPU only)."""
    if runtime.interpreter:
        pytest.skip("GPU only: the cache must hold more than 2**31 elements (over 4 GB per cache)")
    PAGE, Hkv, D = 16, 1, 128
    first = 2**31 // (PAGE * Hkv * D) + 8
    case = make_paged_case([300, 45], 4, Hkv, D, PAGE, device=runtime.device, seed=9,
                           num_blocks=first + 64, first_block=first, poison=False)
    for splits in (1, 4):
        check(impl, case, plan=impl.plan(case.context_lens, Hkv, PAGE, num_splits=splits))
    gathered = make_paged_case([100], 4, Hkv, D, 8, device=runtime.device, seed=10,
                               num_blocks=2**31 // (8 * D) + 64, first_block=2**31 // (8 * D) + 8, poison=False)
    check(impl, gathered, plan=impl.plan(gathered.context_lens, Hkv, 8, num_splits=2))


# --- merge_states -----------------------------------------------------------------------------


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


def test_merge_states_is_associative_and_handles_empty_parts(impl, runtime):
    gen = torch.Generator().manual_seed(seeded(12))
    R, D, dev = 20, 32, runtime.device
    s = torch.randn(R, 24, generator=gen) * 4
    v = torch.randn(R, 24, D, generator=gen)
    parts = [_state(s[:, i:i + 8], v[:, i:i + 8]) for i in (0, 8, 16)]
    (a_o, a_l), (b_o, b_l), (c_o, c_l) = [(o.to(dev), l.to(dev)) for o, l in parts]
    left = impl.merge_states(*impl.merge_states(a_o, a_l, b_o, b_l), c_o, c_l)
    right = impl.merge_states(a_o, a_l, *impl.merge_states(b_o, b_l, c_o, c_l))
    assert_close(left[0], right[0].float(), ("row", "d"), atol=1e-5, rtol=1e-5, rel=1e-5)
    assert_close(left[1], right[1], ("row",), atol=1e-5, rtol=1e-5, rel=1e-5)
    empty_o, empty_l = torch.zeros_like(a_o), torch.full_like(a_l, float("-inf"))
    o, lse = impl.merge_states(a_o, a_l, empty_o, empty_l)  # an empty part changes nothing
    assert_close(o, a_o, ("row", "d"), atol=1e-6, rtol=1e-6, rel=1e-6)
    o, lse = impl.merge_states(empty_o, empty_l, empty_o, empty_l)  # both empty: 0 and -inf, no NaN
    assert not torch.isnan(o).any() and (o == 0).all() and (lse == float("-inf")).all()


def test_merge_states_fp16_outputs(impl, runtime):
    gen = torch.Generator().manual_seed(seeded(13))
    s, v = torch.randn(8, 16, generator=gen), torch.randn(8, 16, 64, generator=gen)
    (o_a, l_a), (o_b, l_b) = _state(s[:, :5], v[:, :5]), _state(s[:, 5:], v[:, 5:])
    dev = runtime.device
    o, lse = impl.merge_states(o_a.half().to(dev), l_a.to(dev), o_b.half().to(dev), l_b.to(dev))
    assert o.dtype == torch.float16 and lse.dtype == torch.float32
    assert_close(o, _state(s, v)[0], ("row", "d"))


# --- plan() -------------------------------------------------------------------------------------


@pytest.mark.parametrize("lens,Hkv", [([1], 8), ([32768], 8), ([4096] * 8, 8), ([1024] * 64, 8),
                                      ([512] * 256, 8), ([5, 3000, 17], 2), ([16], 1)])
def test_plan_never_returns_empty_or_zero_splits(impl, lens, Hkv):
    """Whatever it chooses, every split of the longest sequence has tokens and chunks are tile-sized."""
    for forced in (None, 1, 7, 10_000):
        p = impl.plan(lens, Hkv, 16, num_sms=132, num_splits=forced)
        assert p.num_splits >= 1 and p.chunk >= 1 and p.max_len == max(lens)
        assert (p.num_splits - 1) * p.chunk < max(lens) <= p.num_splits * p.chunk, \
            f"{p}: the last split of the longest sequence is empty, or the splits do not cover it"
        if forced is not None:
            assert p.num_splits <= forced


def test_plan_splits_only_when_the_grid_is_starved(impl):
    big = impl.plan([2048] * 128, 8, 16, num_sms=132)  # 1024 programs already
    assert big.num_splits == 1
    one = impl.plan([32768], 8, 16, num_sms=132)  # 8 programs on 132 SMs
    assert one.num_splits >= 132 // 8


# --- Your kernel does the work ------------------------------------------------------------------


@pytest.mark.parametrize("splits", [1, 3])
def test_runs_a_triton_kernel(impl, runtime, splits):
    """The right numbers are not enough: split_kv_decode and merge_states must compute them with your
    Triton kernels, not with torch (or a copy of the grader's oracle), split or not."""
    case = make_paged_case([45, 3], 8, 2, 64, 16, device=runtime.device, seed=17)
    plan = impl.plan(case.context_lens, 2, 16, num_splits=splits)
    assert_runs_a_triton_kernel(impl, lambda: impl.split_kv_decode(*case.args, plan=plan), "split_kv_decode")
    gen = torch.Generator().manual_seed(seeded(18))
    (o_a, l_a), (o_b, l_b) = [(torch.randn(6, 32, generator=gen).to(runtime.device),
                               torch.randn(6, generator=gen).to(runtime.device)) for _ in range(2)]
    assert_runs_a_triton_kernel(impl, lambda: impl.merge_states(o_a, l_a, o_b, l_b), "merge_states")


# --- The launcher rejects bad input ----------------------------------------------------------


def test_launcher_rejects_bad_input(impl, runtime):
    case = make_paged_case([20, 5], 4, 2, 64, 16, device=runtime.device, seed=14)
    with pytest.raises(TypeError, match="q"):
        impl.split_kv_decode(case.q.float(), *case.args[1:])
    with pytest.raises(TypeError, match="block_tables"):
        impl.split_kv_decode(case.q, case.k_cache, case.v_cache, case.block_tables.long(), case.context_lens)
    with pytest.raises(ValueError, match="context_lens"):
        bad = torch.tensor([20, 0], dtype=torch.int32, device=runtime.device)
        impl.split_kv_decode(*case.args[:4], bad)
    with pytest.raises(ValueError, match="PAGE"):
        kc = case.k_cache.repeat(1, 3, 1, 1)[:, :48].contiguous()  # 48 tokens a page: not a power of two
        impl.split_kv_decode(case.q, kc, kc, case.block_tables, case.context_lens)
    with pytest.raises(TypeError, match="plan"):
        impl.split_kv_decode(*case.args, plan=4)
    with pytest.raises(ValueError, match="plan"):
        impl.split_kv_decode(*case.args, plan=impl.plan([8], 2, 16))  # planned for shorter contexts
    with pytest.raises(ValueError, match="page_size"):
        impl.plan([10], 2, 12)
    with pytest.raises(ValueError, match="num_splits"):
        impl.plan([10], 2, 16, num_splits=0)
    with pytest.raises(ValueError, match="lse_b"):
        o = torch.zeros(4, 64, device=runtime.device)
        impl.merge_states(o, torch.zeros(4, device=runtime.device), o, torch.zeros(3, device=runtime.device))


def test_tolerance_rejects_zeros(runtime):
    """Not a test of your kernel: the comparison fails an all-zeros output."""
    case = make_paged_case([37, 20], 8, 2, 64, 16, device=runtime.device, seed=15)
    ref, _ = paged_attention_reference(*case.args)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
