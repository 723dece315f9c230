"""Grader for F3, an FP8 (e4m3) KV cache. Each test is named for the mistake it catches.

Run: make test L=f3 (your drills/mine) or make test L=f3 IMPL=solutions. The store is compared bit for
bit with torch's e4m3 cast of clamp(x / scale); the decode with an fp32 oracle on the dequantized cache
(code * its KV head's scale), on every case of F1's grader: caches poisoned with the NaN code past every
sequence's end and in unused blocks, garbage block ids past every last page.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from drills.compare import assert_close, mismatch
from drills.grading.grader.diagnose import Mistake
from drills.grading.grader.report import Stage
from drills.grading.shared import bigmem
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel
from drills.tests import bf16_everywhere, fill_past_fp16_range, seeded, sizes
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import (
    CANARY,
    CONTEXT_PATTERNS,
    E4M3,
    MARGIN,
    Fp8Case,
    blocks_read,
    call_with_canary_out,
    fits_this_machine,
    fp8_case,
    grouping_cases,
    in_layer_pool,
    in_wider_table,
    int32_tensor,
    laid_out,
    live_slots,
    make_paged_case,
    overlapping_caches,
    paged_attention_reference,
    pool_past_int32,
    q_rows_far_apart,
    shift_scores,
    skip_without_memory_for_sparse_pages,
    spoiled_call,
    strided_q,
    v_strides_unlike_k,
    with_entry,
)
from drills.tests.test_f1_split_kv_decode import DOMAIN as F1_DOMAIN

# Each constexpr of the reference's kernels -> the tests that cross it (make contract).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK_N": ("test_last_page_is_masked", "test_every_split_count_matches_unsplit"),
    "BLOCK_S": ("test_merge_reads_every_tile_of_splits", "test_many_splits_merge_with_rescale"),
    "D": ("test_widest_head_dim_is_read_whole", "test_store_pads_heads_and_features"),
    "D_PAD": ("test_store_pads_heads_and_features", "test_compute_scales_amax_rule"),  # D = 40, 24
    "BLOCK_M": ("test_compute_scales_amax_rule",),  # 70 rows: one past a 64-row tile
    "PER_HEAD": ("test_compute_scales_amax_rule",),  # both ways
    "GROUP": ("test_kv_head_grouping_is_contiguous",),
    "GROUP_PAD": ("test_kv_head_grouping_is_contiguous",),  # GROUP = 32 pads past 16
    "Hkv": ("test_store_pads_heads_and_features",),
    # Hkv = 3 pads to 4, then 65 past 64: past a head tile fixed at a usual model's 8 KV heads
    "HKV_PAD": ("test_store_pads_heads_and_features",),
    "PAGE": (
        "test_last_page_is_masked",
        "test_page_sizes_gathered_token_by_token",
        "test_store_writes_only_its_slots",
    ),
    "WRITE_LSE": (
        "test_padding_sequences_give_zero_and_lse_minus_inf",
        "test_split_ranges_cover_each_key_once",
    ),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes", "test_store_grid_fits_cuda_limits"),
}
BOUNDS_GAPS = {"GUARD": "no bound: the device guard's switch, on in every call but the benchmark's timing"}

DIMS = ("b", "head", "d")
STORE_DIMS = ("token", "head", "d")
# What fp8_decode and store_kvcache_fp8 admit, at their boundaries: F1's domain (drawn from
# drills/validate.py's limits, so it cannot drift from the launchers), crossed with the scales' two shapes
# and values that clamp; test_pairwise_domain_cases_match_the_oracle crosses every pair.
# amax scales with room to spare, or a quarter of it: every value past a quarter of its head's amax then
# divides past 448 and must clamp (a third of a normal sample's values), the largest codes in every page.
ROOM = {"in_range": 1.0, "clamping": 0.25}
DOMAIN = Domain(
    axes=dict(
        **F1_DOMAIN.axes,  # D, PAGE 1 to 128, GQA groups, lengths, dtype, q/KV/table layouts, scale, plan
        scales=("per_tensor", "per_head"),  # k_scale and v_scale [1] or [Hkv]
        values=tuple(ROOM),
    ),
    rules=F1_DOMAIN.rules,
    limits=dict(**F1_DOMAIN.limits, dtypes=(torch.float16, torch.bfloat16)),
)
# Every finite e4m3 value, sorted, and the midpoints between neighbours (ties of the rounding).
_CODES = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
E4M3_VALUES = _CODES[_CODES.isfinite()].unique()  # [253]: -448 .. 448, one zero
MIDPOINTS = (E4M3_VALUES[1:] + E4M3_VALUES[:-1]) / 2


# --- Building F3 cases: F1's paged cases, quantized ---------------------------------------------------


def amax_scales(cache, case, per_head=True, room=1.0):
    """Scales that map each KV head's largest live value to 448 / room (the amax rule): computed over
    the blocks a sequence reads, poison (NaN) ignored. Per head they differ, as real heads' do."""
    PAGE = cache.shape[1]
    x = (
        cache[blocks_read(case, PAGE).to(cache.device)].float().nan_to_num(0.0).abs()
    )  # [blocks, PAGE, Hkv, D]
    amax = x.amax(dim=(0, 1, 3)) if per_head else x.amax().reshape(1)
    return (torch.where(amax > 0, amax, torch.ones_like(amax)) * room / 448.0).cpu()


def fp8(case, per_head=True, room=1.0) -> Fp8Case:
    """The F1 case with its caches stored as e4m3 under amax scales (fp8_case)."""
    return fp8_case(
        case, amax_scales(case.k_cache, case, per_head, room), amax_scales(case.v_cache, case, per_head, room)
    )


def make(lens, Hq, Hkv, D, PAGE, per_head=True, **kw) -> Fp8Case:
    return fp8(make_paged_case(lens, Hq, Hkv, D, PAGE, **kw), per_head)


def oracle(case, scale=None):
    return paged_attention_reference(
        *case.args[:5], scale=scale, k_scale=case.k_scale, v_scale=case.v_scale
    )  # (out [B, Hq, D], lse [B, Hq]) fp32 on the dequantized cache


def check(impl, case, plan=None, scale=None):
    """Run through a canary-wrapped `out` with return_lse, compare out and lse with the fp32 oracle."""
    lse_box = []

    def call(out):
        o, lse = impl.fp8_decode(*case.args, scale=scale, plan=plan, out=out, return_lse=True)
        lse_box.append(lse)
        return o

    out = _into_canary_out(call, case.q)
    ref, ref_lse = oracle(case, scale)
    problem = mismatch(out, ref, DIMS)
    if problem is not None:
        # Keys past the context loaded as zeros and left unmasked score 0: each adds e^0 = 1 to the
        # denominator and nothing to the numerator, up to the end of the last key tile (of any size).
        total = ref_lse.exp()  # [B, Hq] the softmax's denominator
        for tile in (16, 32, 64, 128):
            pad = (-case.context_lens % tile).float().to(ref.device)[:, None]  # [B, 1] zero keys
            if (
                mismatch(out, ref * torch.where(total > 0, total / (total + pad), 1.0)[..., None], DIMS)
                is None
            ):
                problem += (
                    "\nthe output is the answer with the keys past the context scored 0 instead of -inf"
                )
                break
        else:
            problem += _dequantized_in_q_dtype(case, scale, out) or _scale_misapplied(case, scale, out)
        raise AssertionError(problem)
    lse = lse_box[0]
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape, "lse must be [B, Hq] float32"
    empty = ref_lse == float("-inf")
    assert (lse[empty] == float("-inf")).all(), "a padding sequence's lse (context_lens = 0) must be -inf"
    tol = dict(atol=2e-3, rtol=1e-3, rel=1e-3)
    problem = mismatch(lse.masked_fill(empty, 0.0), ref_lse.masked_fill(empty, 0.0), ("b", "head"), **tol)
    if problem is not None:
        base2 = (ref_lse / math.log(2)).masked_fill(empty, 0.0)
        if mismatch(lse.masked_fill(empty, 0.0), base2, ("b", "head"), **tol) is None:
            problem += "\nthe returned lse is in base 2 (log2 of the sum), where lse is the natural log"
        else:
            problem += _dequantized_in_q_dtype(case, scale, out, lse)
        raise AssertionError(f"out matches, but the returned lse does not:\n{problem}")
    return out, lse


OUT_STRIDES = "out stored through"


def _into_canary_out(call, q):
    """call_with_canary_out, and when rows landed in the canary around out: a line saying so where they
    are exactly where out's rows would be with q's strides, or with a contiguous out's (out is a view
    whose rows are farther apart than q's, so a store that takes either layout misses it)."""
    try:
        return call_with_canary_out(call, q)
    except AssertionError as failure:
        if "canary elements of the buffer around out" not in str(failure):
            raise
        B, Hq, D = q.shape
        buffer = torch.full((B + 2, Hq + 2 * MARGIN, D), CANARY, dtype=q.dtype, device=q.device)
        out = buffer[1 : B + 1, MARGIN : MARGIN + Hq]  # call_with_canary_out's layout, again
        call(out)
        changed = (buffer != CANARY).flatten()
        b, h, d = (torch.arange(n, device=q.device) for n in (B, Hq, D))
        for what, (sb, sh, sd) in (("q's strides", q.stride()), ("as if contiguous", (Hq * D, D, 1))):
            at = out.storage_offset() + b[:, None, None] * sb + h[None, :, None] * sh + d[None, None, :] * sd
            at = at.flatten()
            if int(at.max()) >= buffer.numel() or int(at.min()) < 0:
                continue
            layout = torch.zeros_like(changed)
            layout[at] = True
            if changed.any() and not (changed & ~layout).any():
                raise AssertionError(
                    f"{failure}\n{OUT_STRIDES} {what}: every element stored sits where out's rows would be "
                    f"with strides {tuple(int(x) for x in (sb, sh, sd))}, while out is a view with strides "
                    f"{out.stride()}; store through out's own strides"
                ) from None
        raise


SCALE_TWICE = "applied twice"
K_DIVIDES = "logits divided by k_scale"
V_IN_LOGITS = "v_scale folded into the logits"


def _scale_misapplied(case, scale, out):
    """A line saying so when out is the answer with a scale in the wrong place, else '': k_scale (or
    v_scale) applied twice (multiplied into each code on load and folded into the logits, or the output,
    too: code * scale**2), the logits divided by k_scale, or v_scale folded into the logits with K's."""
    k, v = case.k_scale.float(), case.v_scale.float()
    for scales, what in (
        (dict(k_scale=k**2, v_scale=v), f"k_scale {SCALE_TWICE}, code * k_scale**2"),
        (dict(k_scale=k, v_scale=v**2), f"v_scale {SCALE_TWICE}, code * v_scale**2"),
        (dict(k_scale=1 / k, v_scale=v), f"the {K_DIVIDES}, where a cached K is code * k_scale"),
        (dict(k_scale=k * v, v_scale=torch.ones_like(v)), f"{V_IN_LOGITS}, and the output without it"),
    ):
        if torch.equal(scales["k_scale"], k) and torch.equal(scales["v_scale"], v):
            continue  # scales of 1: the same answer as the rule's
        ref, _ = paged_attention_reference(*case.args[:5], scale=scale, **scales)
        if mismatch(out, ref, DIMS) is None:
            return f"\nthe output is the answer with {what}: apply each scale once, where section 3.3 does"
    return ""


ROUNDED_TO_Q_DTYPE = "dequantized in q's dtype"


def _dequantized_in_q_dtype(case, scale, out, lse=None):
    """A line saying so when out (and lse, when given) are the answer with K or V dequantized in q's dtype
    (code * scale rounded to fp16 or bf16 before the dots: a second rounding the fold never makes), else
    ''. Rounded to nearest, as a GPU converts, or toward zero, as the interpreter converts to bf16."""
    if case.k_cache.numel() > 2**24:
        return ""
    dtype = case.q.dtype

    def rounded(cache, s, chop):  # [num_blocks, PAGE, Hkv, D] code * scale in q's dtype, NaN poison kept
        x = cache.float() * s.float().reshape(1, 1, -1, 1)
        return ((x.view(torch.int32) & -65536).view(torch.float32) if chop else x).to(dtype)

    for chop in (False, True) if dtype == torch.bfloat16 else (False,):
        k, v = rounded(case.k_cache, case.k_scale, chop), rounded(case.v_cache, case.v_scale, chop)
        for what, kv, scales in (
            ("K", (k, case.v_cache), dict(v_scale=case.v_scale)),
            ("K and V", (k, v), {}),
            ("V", (case.k_cache, v), dict(k_scale=case.k_scale)),
        ):
            ref, ref_lse = paged_attention_reference(case.q, *kv, *case.args[3:5], scale=scale, **scales)
            if mismatch(out, ref, DIMS) is None and (
                lse is None or mismatch(lse, ref_lse, ("b", "head"), atol=2e-3, rtol=1e-3, rel=1e-3) is None
            ):
                return (
                    f"\nthe output is the answer with {what} {ROUNDED_TO_Q_DTYPE} ({dtype}) before the dot: "
                    "code * scale rounded there, where the codes enter the dot exact and the scale "
                    "multiplies in float32"
                )
    return ""


def fixed_plan(impl, chunk, max_len):
    """A plan with an exact chunk size, bypassing the planner: how the tests force empty splits."""
    return impl.DecodePlan(num_splits=math.ceil(max_len / chunk), chunk=chunk, max_len=max_len)


def forced(impl, case, splits):
    return impl.plan(case.context_lens, case.k_cache.shape[2], case.k_cache.shape[1], num_splits=splits)


# --- Stage 1: the quantizing store ---------------------------------------------------------------------

CANARY_CODE = 0x35  # an e4m3 code (0.8125) no test stores where it is not written


def _store(impl, key, value, slots, PAGE, num_blocks, k_scale, v_scale, caches=None):
    """Store into canary-filled caches (or the `caches` given, filled here) and compare every byte with
    torch's quantize of the rows stored; every other byte must still hold the canary."""
    N, Hkv, D = key.shape
    if caches is None:
        caches = [torch.empty(num_blocks, PAGE, Hkv, D, dtype=E4M3, device=key.device) for _ in range(2)]
    for c in caches:
        c.view(torch.uint8).fill_(CANARY_CODE)
    impl.store_kvcache_fp8(key, value, caches[0], caches[1], slots, k_scale, v_scale)
    live = slots >= 0
    for name, x, scale, cache in (
        ("k_cache", key, k_scale, caches[0]),
        ("v_cache", value, v_scale, caches[1]),
    ):
        want = torch.full(cache.shape, CANARY_CODE, dtype=torch.uint8, device=key.device)
        flat = want.view(-1, Hkv, D)
        s = scale.float().reshape(-1, 1)  # [Hkv or 1, 1]
        ratio = (x[live].float() / s).clamp(-448.0, 448.0)  # [rows, Hkv, D] x / scale, as torch divides
        flat[slots[live]] = ratio.to(E4M3).view(torch.uint8)
        got = cache.view(torch.uint8).reshape(-1, Hkv, D)
        bad = got != flat
        if bad.any():
            stored = got[slots[live]].cpu()  # [rows, Hkv, D] the codes of the rows stored
            for what, alts in _wrong_roundings(ratio.cpu()).items():
                if any(bool((stored == alt).all()) for alt in alts):
                    raise AssertionError(
                        f"{int(bad.sum())} bytes of {name} differ from torch's e4m3, each as a store that "
                        f"{what} would store them: your store {what}"
                    )
            if any(torch.equal(stored, c) for c in _interpreter_cast_codes(ratio.cpu())):
                raise AssertionError(
                    f"{int(bad.sum())} bytes of {name} differ from torch's e4m3, each the code Triton's "
                    f"interpreter casts x / scale to: {CAST_LEFT_TO_ROUND}"
                )
            if torch.equal(stored, _reciprocal_codes(x[live], s).cpu()):
                raise AssertionError(
                    f"{int(bad.sum())} bytes of {name} differ from torch's e4m3, each the code of "
                    f"x * (1 / scale): {RECIPROCAL}"
                )
            wrong = stored != flat[slots[live]].cpu()  # [rows, Hkv, D]
            if bool((ratio.cpu().abs()[wrong] < 2**-6).all()):
                raise AssertionError(
                    f"{int(bad.sum())} bytes of {name} differ from torch's e4m3, {SUBNORMAL}"
                )
        if bad.any():
            slot, h, d = bad.nonzero()[0].tolist()
            rows = (slots == slot).nonzero().flatten().tolist()
            bad_slots = bad.any(dim=(1, 2)).nonzero().flatten().tolist()
            if bad_slots == [0] and rows and bool((got[0] == CANARY_CODE).all()):
                raise AssertionError(
                    f"{int(bad.sum())} bytes of {name} differ from torch's e4m3, all of slot 0, which row "
                    f"{rows[0]} stores to and which kept its canary: {SLOT_ZERO}"
                )
            if not rows:
                raise AssertionError(
                    f"{int(bad.sum())} bytes of {name} differ; first at slot {slot}, head {h}, d {d}, which no "
                    f"row stores to (it held the canary 0x{CANARY_CODE:02x}, now 0x{int(got[slot, h, d]):02x})"
                )
            i = rows[0]
            xv, sv = float(x[i, h, d]), float(s[h if s.shape[0] > 1 else 0])
            g, w = int(got[slot, h, d]), int(flat[slot, h, d])
            gv = torch.tensor([g], dtype=torch.uint8).view(E4M3).float().item()
            wv = torch.tensor([w], dtype=torch.uint8).view(E4M3).float().item()
            raise AssertionError(
                f"{int(bad.sum())} bytes of {name} differ from torch's e4m3; first: row {i} (slot {slot}), head "
                f"{h}, d {d}: x = {xv!r}, scale = {sv!r}, x / scale = {xv / sv!r}; stored code 0x{g:02x} "
                f"(= {gv!r}), want 0x{w:02x} (= {wv!r})"
            )


# Slot 0 is block 0's first token, a real slot: only -1 marks a padding row.
SLOT_ZERO = "your store skips slot 0 as if it were padding, where only slot -1 marks a padding row"


# x * (1 / scale) rounds twice (the reciprocal, then the product): near a code's rounding edge it lands on
# the other side of x / scale rounded once.
RECIPROCAL = "your store multiplies by 1 / scale, which rounds twice, where the rule divides once (div_rn)"


# e4m3's subnormal range: below its smallest normal value 2**-6, codes are 2**-9 apart at every size.
SUBNORMAL = (
    "every one where x / scale is below 2**-6 in size, e4m3's subnormal range (codes 2**-9 apart there, "
    "whatever the exponent): your store rounds those values to another step"
)


# The cast itself asked to round: right on a GPU (cvt.rn.satfinite), not under the interpreter.
CAST_LEFT_TO_ROUND = (
    "your store leaves the rounding to .to(tl.float8e4nv), which Triton's interpreter does not do to "
    "nearest even (a GPU's cast does); round by hand first (section 3.1), so that the cast only repacks"
)


def _interpreter_cast_codes(ratio):
    """ratio (x / scale, clamped, float32) as Triton's interpreter casts it to tl.float8e4nv, as e4m3 bytes,
    for each rounding mode the cast may be given: [] where this Triton converts elsewhere."""
    try:
        import numpy as np
        import triton.language as tl
        from triton._C.libtriton import ir
        from triton.runtime.interpreter import _convert_float
    except ImportError:
        return []
    x = ratio.float().contiguous().numpy()
    codes = []
    for mode in (ir.ROUNDING_MODE.RTNE, ir.ROUNDING_MODE.RTZ):
        try:
            out = np.asarray(_convert_float(x, tl.float32, tl.float8e4nv, mode), dtype=np.uint8)
        except Exception:  # noqa: BLE001 - another Triton's private converter: no recognizer then
            continue
        codes.append(torch.from_numpy(out.reshape(x.shape).copy()))
    return codes


def _reciprocal_codes(x, s):
    """x [rows, Hkv, D] stored by a store that multiplies by 1 / s [Hkv or 1, 1], as e4m3 bytes."""
    return (x.float() * (1.0 / s)).clamp(-448.0, 448.0).to(E4M3).view(torch.uint8)


def _wrong_roundings(ratio):
    """ratio (x / scale, clamped) rounded three wrong ways, as e4m3 bytes: {what the store does: [everywhere,
    only where e4m3 is normal]} (a bit trick's rounding, with the subnormal step's FPU rounding left as is)."""
    pos = E4M3_VALUES[E4M3_VALUES >= 0]  # [127] 0 .. 448, ascending
    mag = ratio.abs()
    wrong = {
        "rounds ties away from zero, torch's to the even code": pos[
            torch.bucketize(mag, (pos[1:] + pos[:-1]) / 2, right=True)
        ],  # a tie goes up
        "rounds ties toward zero, torch's to the even code": pos[
            torch.bucketize(mag, (pos[1:] + pos[:-1]) / 2, right=False)
        ],  # a tie goes down: half a step less one ulp added, without the kept bit that makes it even
        "rounds toward zero (drops the low bits), torch's to the nearest": pos[
            torch.bucketize(mag, pos, right=True) - 1
        ],
    }
    return {
        what: [
            torch.where(keep, torch.copysign(up, ratio), ratio).to(E4M3).view(torch.uint8)
            for keep in (torch.ones_like(mag, dtype=torch.bool), mag >= 2**-6)
        ]
        for what, up in wrong.items()
    }


def _rows(values, Hkv, D, dtype, device, stream):
    """values (a 1-D tensor) spread over [N, Hkv, D] rows in a shuffled order, N = cdiv(len, Hkv * D)."""
    gen = torch.Generator().manual_seed(seeded(stream))
    n = -(-len(values) // (Hkv * D)) * Hkv * D
    padded = torch.cat([values, values[torch.randint(len(values), (n - len(values),), generator=gen)]])
    return padded[torch.randperm(n, generator=gen)].reshape(-1, Hkv, D).to(dtype).to(device)


def _slots(N, PAGE, num_blocks, device, stream, padding=()):
    gen = torch.Generator().manual_seed(seeded(stream))
    slots = torch.randperm(num_blocks * PAGE, generator=gen)[:N]
    slots[list(padding)] = -1
    return slots.to(device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_store_rounds_to_nearest_even(impl, runtime, dtype):
    """x / scale exactly halfway between two e4m3 values (every midpoint up to 240, scale 1/8 so that
    the division is exact) must go to the even code, as torch's cast does; random values to the nearest.
    Subnormal codes (below 2**-6) included. A cast that truncates (drops the low bits) stores the code
    below for about half the values."""
    mids = MIDPOINTS[MIDPOINTS.abs() < 240]
    gen = torch.Generator().manual_seed(seeded(41))
    rand = (torch.randn(3000, generator=gen) * 40).clamp(-239, 239)
    tiny = torch.randn(500, generator=gen) * 0.02  # near and below e4m3's smallest normal, 2**-6
    values = torch.cat([mids, -0.0 * torch.ones(4), rand, tiny]) / 8  # x = code value * scale
    Hkv, D = 2, 32
    key = _rows(values, Hkv, D, dtype, runtime.device, 42)
    value = _rows(values.flip(0), Hkv, D, dtype, runtime.device, 43)
    scale = torch.tensor([0.125], device=runtime.device)
    N, PAGE = key.shape[0], 16
    _store(
        impl,
        key,
        value,
        _slots(N, PAGE, N // PAGE + 3, runtime.device, 44),
        PAGE,
        N // PAGE + 3,
        scale,
        scale,
    )


def _store_bf16_past_fp16s_range(impl, runtime):
    """bf16 keeps float32's exponent range: rows of every e4m3 value times 2**100 (scale 2**100) and times
    2**-100 (scale 2**-100) divide exactly back to those values. Narrowed to fp16 on the way (largest
    65504, smallest 2**-24), the large ones become inf and store 448, the small ones 0."""
    for factor, stream in ((2.0**100, 150), (2.0**-100, 152)):
        key = _rows(E4M3_VALUES * factor, 2, 16, torch.bfloat16, runtime.device, stream)
        scale = torch.tensor([factor], device=runtime.device)
        N, PAGE = key.shape[0], 16
        blocks = N // PAGE + 2
        _store(
            impl,
            key,
            key.flip(0),
            _slots(N, PAGE, blocks, runtime.device, stream + 1),
            PAGE,
            blocks,
            scale,
            scale,
        )


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, "bf16-past-fp16"], ids=["fp16", "bf16", "bf16-past-fp16"]
)
def test_store_clamps_values_past_448(impl, runtime, dtype):
    """x / scale past +-448 (e4m3fn's largest finite value; it has no infinity) must store +-448: 449,
    464 (halfway to 480, where an unclamped round goes up), 1000, and fp16's largest 65504, among exact
    e4m3 values below 240 that need no rounding. Without the clamp, the cast makes NaN or garbage codes.
    bf16-past-fp16: bf16 x far past fp16's range, with a scale that brings x / scale back to e4m3's."""
    if dtype == "bf16-past-fp16":
        _store_bf16_past_fp16s_range(impl, runtime)
        return
    big = torch.tensor([449.0, 464.0, 470.0, 500.0, 1000.0, 4096.0, 60000.0, 65504.0])
    exact = E4M3_VALUES[E4M3_VALUES.abs() < 240]
    values = torch.cat([big, -big, exact.repeat(4)])  # x / scale with scale 1: x itself
    Hkv, D = 2, 16
    key = _rows(values, Hkv, D, dtype, runtime.device, 45)
    value = _rows(-values, Hkv, D, dtype, runtime.device, 46)
    one = torch.tensor([1.0], device=runtime.device)
    N, PAGE = key.shape[0], 16
    _store(
        impl, key, value, _slots(N, PAGE, N // PAGE + 2, runtime.device, 47), PAGE, N // PAGE + 2, one, one
    )


def test_store_keeps_codes_up_to_448(impl, runtime):
    """Every e4m3 value from 240 to 448 (and their negatives) stored with scale 1 must come back
    unchanged: e4m3fn (NVIDIA's, OCP's) reaches 448. AMD's e4m3fnuz stops at 240, so a store that
    clamps there, or that reads the exponent with fnuz's bias of 8, changes them."""
    top = E4M3_VALUES[E4M3_VALUES.abs() >= 240]
    values = torch.cat([top.repeat(8), E4M3_VALUES[E4M3_VALUES.abs() < 2]])
    key = _rows(values, 1, 16, torch.float16, runtime.device, 48)
    one = torch.tensor([1.0], device=runtime.device)
    N, PAGE = key.shape[0], 8
    _store(
        impl,
        key,
        key.flip(0),
        _slots(N, PAGE, N // PAGE + 2, runtime.device, 49),
        PAGE,
        N // PAGE + 2,
        one,
        one,
    )


def test_store_scale_per_kv_head(impl, runtime):
    """k_scale and v_scale with one entry per KV head (4 heads, scales 1/64 .. 1/8, K's and V's
    different): head h of every row divides by its own scale. One scale for all heads, or V's scale
    for K, stores the wrong codes. Then one scale per tensor ([1], stride 0) beside one per head, both
    ways round: each scale is read through its own stride, and one read through the other's takes head
    0's scale for every head, or reads past its one entry (scales both per head, or both per tensor,
    hide it)."""
    Hkv, D, N, PAGE = 4, 32, 40, 16
    gen = torch.Generator().manual_seed(seeded(50))
    key = (torch.randn(N, Hkv, D, generator=gen) * 3).half().to(runtime.device)
    value = (torch.randn(N, Hkv, D, generator=gen) * 2).half().to(runtime.device)
    k_scale = torch.tensor([1 / 64, 1 / 32, 1 / 16, 1 / 8], device=runtime.device)
    v_scale = torch.tensor([0.05, 0.013, 0.021, 0.008], device=runtime.device)
    slots = _slots(N, PAGE, 5, runtime.device, 51)
    _store(impl, key, value, slots, PAGE, 5, k_scale, v_scale)
    one = torch.tensor([0.02], device=runtime.device)
    _store(impl, key, value, slots, PAGE, 5, one, v_scale)
    _store(impl, key, value, slots, PAGE, 5, k_scale, one)
    table = torch.stack([k_scale, v_scale], dim=1)  # [Hkv, 2]: per-head scales may be strided views
    try:
        _store(impl, key, value, slots, PAGE, 5, table[:, 0], table[:, 1])
    except AssertionError as e:
        raise AssertionError(f"scales as strided views (columns of one [Hkv, 2] table): {e}") from None


@pytest.mark.parametrize("PAGE", [1, 16, 128, "cache-past-int32"])
def test_store_writes_only_its_slots(impl, runtime, PAGE):
    """slot_mapping = -1 marks a padding row (a batch padded to a captured graph's size): nothing is
    written for it. Every byte no row owns must keep its canary; PAGE 1, 16 and 128, and a cache past
    2**32 elements (_store_past_int32)."""
    if PAGE == "cache-past-int32":
        _store_past_int32(impl, runtime)
        return
    Hkv, D, N = 2, 16, 21
    gen = torch.Generator().manual_seed(seeded(52 + PAGE))
    key = torch.randn(N, Hkv, D, generator=gen).half().to(runtime.device)
    value = torch.randn(N, Hkv, D, generator=gen).half().to(runtime.device)
    blocks = -(-N // PAGE) + 2
    slots = _slots(N, PAGE, blocks, runtime.device, 53 + PAGE, padding=(0, 7, 20))
    scale = torch.tensor([0.02], device=runtime.device)
    _store(impl, key, value, slots, PAGE, blocks, scale, scale * 2)


def test_store_pads_heads_and_features(impl, runtime):
    """Hkv = 3 and D = 40, neither a power of two (tl.arange needs one): the padded lanes must be
    masked, and per-head scales read only Hkv entries. Then Hkv = 65 (the store admits any number of KV
    heads), a tile of next_pow2(Hkv) = 128 rows: a head tile fixed at the 8 KV heads of a usual GQA model,
    or capped there, stores heads 0-7 only and leaves the others' bytes as they were."""
    Hkv, D, N, PAGE = 3, 40, 9, 4
    gen = torch.Generator().manual_seed(seeded(54))
    key = torch.randn(N, Hkv, D, generator=gen).bfloat16().to(runtime.device)
    value = torch.randn(N, Hkv, D, generator=gen).bfloat16().to(runtime.device)
    k_scale = torch.tensor([0.01, 0.02, 0.03], device=runtime.device)
    _store(impl, key, value, _slots(N, PAGE, 4, runtime.device, 55), PAGE, 4, k_scale, k_scale.flip(0))
    Hkv, D, N = 65, 24, 5
    key = torch.randn(N, Hkv, D, generator=gen).half().to(runtime.device)
    value = torch.randn(N, Hkv, D, generator=gen).half().to(runtime.device)
    k_scale = (torch.rand(Hkv, generator=gen) * 0.02 + 0.005).to(runtime.device)  # [Hkv], each its own
    try:
        _store(impl, key, value, _slots(N, PAGE, 3, runtime.device, 62), PAGE, 3, k_scale, k_scale.flip(0))
    except AssertionError as e:
        raise AssertionError(f"Hkv = 65 KV heads: {e}") from None


def test_store_reads_strided_rows_and_writes_a_layer_of_a_pool(impl, runtime):
    """key is a view of a fused qkv projection [N, 3, Hkv, D] (row stride 3 * Hkv * D), value one of a
    head-major buffer [Hkv, N, D] (row stride D, head stride N * D: neither is key's), the caches one
    layer of a pool [num_blocks, 2 layers, PAGE, Hkv, D] (block stride 2 * PAGE * Hkv * D, not PAGE
    token strides): every stride must come from its own tensor, and the other layer keeps its canary."""
    Hkv, D, N, PAGE, blocks = 2, 16, 12, 8, 3
    gen = torch.Generator().manual_seed(seeded(56))
    qkv = torch.randn(N, 3, Hkv, D, generator=gen).half().to(runtime.device)
    value = torch.randn(Hkv, N, D, generator=gen).half().to(runtime.device).transpose(0, 1)  # [N, Hkv, D]
    pool = torch.empty(blocks, 2, PAGE, Hkv, D, dtype=E4M3, device=runtime.device)
    pool2 = torch.empty_like(pool)
    pool.view(torch.uint8).fill_(CANARY_CODE)
    pool2.view(torch.uint8).fill_(CANARY_CODE)
    scale = torch.tensor([0.03, 0.05], device=runtime.device)
    slots = _slots(N, PAGE, blocks, runtime.device, 57)
    _store(impl, qkv[:, 1], value, slots, PAGE, blocks, scale, scale, caches=[pool[:, 1], pool2[:, 1]])
    assert (pool[:, 0].view(torch.uint8) == CANARY_CODE).all(), "the store wrote into layer 0 of the pool"


def _store_past_int32(impl, runtime):
    """A cache of 2**32 + 8192 elements (4.3 GB of e4m3: a sparse file on the CPU) whose rows go to its
    last 4 blocks, from key and value rows 1.5 * 2**30 elements apart: block * stride(0) and the row
    index times key's stride both pass 2**31, so int32 offsets wrap (a row lands in the cache's first
    blocks, or is read from before key). Every byte of the last blocks must be torch's code or keep its
    canary, and blocks 0-3 must keep theirs."""
    skip_without_memory_for_sparse_pages(runtime)
    PAGE, Hkv, D, N = 16, 1, 128, 4
    first = 2**32 // (PAGE * Hkv * D)  # the first block that starts 2**32 elements in
    caches = [bigmem.sparse_empty((first + 4, PAGE, Hkv, D), E4M3, runtime.device) for _ in range(2)]
    for cache in caches:  # the only pages the test touches
        cache[:4].view(torch.uint8).fill_(CANARY_CODE)
        cache[first:].view(torch.uint8).fill_(CANARY_CODE)
    gen = torch.Generator().manual_seed(seeded(59))
    rows = torch.randn(N, Hkv, D, generator=gen).half().to(runtime.device)
    key = q_rows_far_apart(rows, runtime)  # [N, Hkv, D], row 2 starts 3 * 2**30 elements in
    local = _slots(N, PAGE, 4, runtime.device, 60)  # [N] slots inside the last 4 blocks
    # x / scale well inside e4m3's range: this case is about where the codes go, not which they are.
    k_scale = torch.tensor([0.03], device=runtime.device)
    v_scale = torch.tensor([0.05], device=runtime.device)
    impl.store_kvcache_fp8(key, key, *caches, first * PAGE + local, k_scale, v_scale)
    for name, cache, s in (("k_cache", caches[0], k_scale), ("v_cache", caches[1], v_scale)):
        want = torch.full((4 * PAGE, Hkv, D), CANARY_CODE, dtype=torch.uint8, device=runtime.device)
        want[local] = (rows.float() / s).clamp(-448.0, 448.0).to(E4M3).view(torch.uint8)
        tail = cache[first:].view(torch.uint8).reshape(-1, Hkv, D)  # [4 * PAGE, Hkv, D], 2**32 elements in
        if not torch.equal(tail, want):
            slot = int((tail != want).any(dim=(1, 2)).nonzero()[0])
            want[local] = _reciprocal_codes(rows, s.reshape(-1, 1))
            if torch.equal(tail, want):  # every row where it belongs, with other codes
                raise AssertionError(
                    f"{name}: the rows are in their slots, each the code of x * (1 / scale): {RECIPROCAL}"
                )
            raise AssertionError(
                f"{name}: slot {first * PAGE + slot} (in the last 4 blocks, 2**32 elements in) does not hold "
                f"torch's codes of its row: the row index times key's stride, or block * stride(0), "
                "wrapped around in int32"
            )
        low = cache[:4].view(torch.uint8)
        if not (low == CANARY_CODE).all():
            raise AssertionError(
                f"{name}: blocks 0-3 were written, and no row's slot is there: block * stride(0) = 2**32 "
                "wrapped around to 0 in int32"
            )
    del caches, key


def test_compute_scales_amax_rule(impl, runtime):
    """compute_scales gives amax / 448 per tensor ([1]) or per KV head ([Hkv]); an all-zero head gets a
    positive scale (1), never 0 (a division by zero at the store). 70 rows (past a 64-row tile) of
    D = 24 (not a power of two), the largest values in the last rows and the last features. NaN or an
    infinity (of either sign) in the calibration raises ValueError naming k or v. Last, a calibration that
    is a strided view, read through its strides."""
    gen = torch.Generator().manual_seed(seeded(58))
    k = torch.randn(70, 3, 24, generator=gen).half()
    v = torch.randn(70, 3, 24, generator=gen).half()
    k[:, 1] *= 10
    k[69, 2, 23] = 50.0  # the tensor's amax in the last head: a per-tensor scale read from head 0 misses it
    v[:, 2] = 0
    k, v = k.to(runtime.device), v.to(runtime.device)
    ks, vs = impl.compute_scales(k, v)
    assert ks.shape == (1,) and ks.dtype == torch.float32, f"per tensor: [1] float32, got {tuple(ks.shape)}"
    torch.testing.assert_close(ks.cpu(), k.float().abs().amax().reshape(1).cpu() / 448)
    ks, vs = impl.compute_scales(k, v, per_head=True)
    assert ks.shape == (3,) and vs.shape == (3,), "per head: one scale per KV head"
    torch.testing.assert_close(ks.cpu(), k.float().abs().amax(dim=(0, 2)).cpu() / 448)
    # Exactly 1, as documented: a tiny floor (amax clamped to 1e-12) is positive too, but clips every later
    # value of that head to 448 * scale, nearly 0.
    assert float(vs[2]) == 1.0, (
        f"an all-zero head gets scale 1 (any positive scale stores its zeros), got {float(vs[2])}"
    )
    k[3, 2, 5] = float("nan")
    with pytest.raises(ValueError, match="k"):
        impl.compute_scales(k, v, per_head=True)
    # -inf too: its |x| is inf, a scale of inf that would store every value as 0.
    k[3, 2, 5] = 0.0
    v[5, 0, 7] = float("-inf")
    try:
        impl.compute_scales(k, v)
    except ValueError as e:
        assert re.search(r"\bv\b", str(e)), f"the ValueError must name v: {e}"
    else:
        raise AssertionError(
            "compute_scales returned scales for a v holding -inf: |x| = inf makes its scale inf (every value "
            "would store as 0); it must raise ValueError naming v"
        )
    # Calibration K and V are often views of one fused projection: K the first 24 features of rows of 48
    # per head, [2, 35, 3, 24] with strides (35 * 144, 144, 48, 1), so a row is not Hkv * D elements long
    # nor a head D (pitfall 15). The other half of each row holds 1000, which an assumed stride reads.
    buf = torch.full((2, 35, 3, 48), 1000.0).half()
    buf[..., :24] = torch.randn(2, 35, 3, 24, generator=gen).half()
    buf[1, 34, 2, 5] = 7.0  # the amax, in the last row of the last head
    k = buf.to(runtime.device)[..., :24]
    for per_head in (True, False):
        ks, _ = impl.compute_scales(k, k, per_head=per_head)
        want = k.float().abs().amax(dim=(0, 1, 3)).cpu() / 448
        want = want if per_head else want.amax().reshape(1)
        if not torch.allclose(ks.cpu(), want):
            raise AssertionError(
                f"compute_scales of a strided calibration view (per_head={per_head}) gave {ks.cpu().tolist()}, "
                f"want amax / 448 = {want.tolist()}: strides assumed from the shape read the 1000s between "
                "the view's rows"
            )


# name -> (how to spoil the arguments of a valid store, the error, what the message names)
STORE_BAD_INPUTS = {
    "k_cache_fp16": (lambda a: dict(k_cache=a["k_cache"].half()), TypeError, "k_cache"),
    "v_cache_fnuz": (lambda a: dict(v_cache=a["v_cache"].view(torch.float8_e4m3fnuz)), TypeError, "v_cache"),
    "k_cache_e5m2": (lambda a: dict(k_cache=a["k_cache"].view(torch.float8_e5m2)), TypeError, "k_cache"),
    "key_fp32": (lambda a: dict(key=a["key"].float()), TypeError, "key"),
    "slot_mapping_int32": (lambda a: dict(slot_mapping=a["slot_mapping"].int()), TypeError, "slot_mapping"),
    "slot_past_cache": (lambda a: dict(slot_mapping=a["slot_mapping"] + 10**6), ValueError, "slot_mapping"),
    "k_scale_zero": (lambda a: dict(k_scale=torch.zeros(1)), ValueError, "k_scale"),
    "v_scale_negative": (lambda a: dict(v_scale=torch.tensor([-0.1])), ValueError, "v_scale"),
    "k_scale_nan": (lambda a: dict(k_scale=torch.tensor([float("nan")])), ValueError, "k_scale"),
    "v_scale_inf": (lambda a: dict(v_scale=torch.tensor([float("inf")])), ValueError, "v_scale"),
    "k_scale_fp16": (lambda a: dict(k_scale=torch.ones(1).half()), TypeError, "k_scale"),
    "k_scale_wrong_length": (lambda a: dict(k_scale=torch.ones(3)), ValueError, "k_scale"),
    "v_scale_one_head_zero": (lambda a: dict(v_scale=torch.tensor([0.1, 0.0])), ValueError, r"v_scale\[1\]"),
    "v_cache_is_k_cache": (lambda a: dict(v_cache=a["k_cache"]), ValueError, "v_cache"),
    "k_scale_not_a_tensor": (lambda a: dict(k_scale=0.5), TypeError, "k_scale"),
}


@pytest.mark.parametrize("name", list(STORE_BAD_INPUTS))
def test_store_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = STORE_BAD_INPUTS[name]
    dev = runtime.device
    args = dict(
        key=torch.ones(4, 2, 16, dtype=torch.float16, device=dev),
        value=torch.ones(4, 2, 16, dtype=torch.float16, device=dev),
        k_cache=torch.zeros(2, 4, 2, 16, device=dev).to(E4M3),
        v_cache=torch.zeros(2, 4, 2, 16, device=dev).to(E4M3),
        slot_mapping=torch.tensor([0, 3, -1, 5], device=dev),
        k_scale=torch.ones(1, device=dev),
        v_scale=torch.ones(2, device=dev),
    )
    spoiled = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in spoil(args).items()}
    args.update(spoiled)
    with pytest.raises(error, match=names):
        impl.store_kvcache_fp8(**args, check=True)


def test_store_runs_a_triton_kernel(impl, runtime):
    """The right bytes are not enough: store_kvcache_fp8 must write them with your Triton kernel."""
    dev = runtime.device
    key = torch.randn(5, 2, 16).half().to(dev)
    caches = [torch.zeros(2, 4, 2, 16, device=dev).to(E4M3) for _ in range(2)]
    slots = torch.tensor([0, 3, -1, 5, 6], device=dev)
    s = torch.tensor([0.01], device=dev)
    assert_runs_a_triton_kernel(
        impl,
        lambda: (impl.store_kvcache_fp8(key, key, *caches, slots, s, s), caches[0])[1],
        "store_kvcache_fp8",
    )


def test_store_grid_fits_cuda_limits(impl, runtime):
    """70,000 tokens stored in one call (a long prefill chunk): tokens belong on grid axis 0, the only
    one past 65535 programs. Run dry."""
    dev = runtime.device
    N = 70_000
    key = torch.zeros(N, 1, 16, dtype=torch.float16, device=dev)
    caches = [torch.zeros(N // 16 + 1, 16, 1, 16, device=dev).to(E4M3) for _ in range(2)]
    slots = torch.arange(N, device=dev)
    s = torch.ones(1, device=dev)
    assert_grids_fit(
        impl,
        lambda: impl.store_kvcache_fp8(key, key, *caches, slots, s, s, check=False),
        "store_kvcache_fp8 of 70,000 tokens",
    )


# --- Stage 2: decode over the e4m3 cache, the split count forced -------------------------------------


def _scaled(case, k_scale, v_scale):
    """The same e4m3 codes read with other scales: the dequantized cache (and the oracle) change with them."""
    dev = case.q.device
    return Fp8Case(
        *case.args[:5],
        torch.as_tensor(k_scale, dtype=torch.float32).to(dev),
        torch.as_tensor(v_scale, dtype=torch.float32).to(dev),
    )


def _k_codes_enter_the_dot_exact(impl, runtime):
    """bf16 q and keys sharing a large common part: every logit is about 1540 and they differ by tens,
    so lse must be right to 0.1%. The codes widen to bf16 exactly and k_scale multiplies the logit in
    float32; code * k_scale rounded to bf16 first (8 bits, 2**-9 of itself) moves the logits by units,
    and lse and the softmax's weights with them."""
    base = make_paged_case([45, 30], 8, 2, 64, 16, dtype=torch.bfloat16, device=runtime.device, stream=70)
    gen = torch.Generator().manual_seed(seeded(71))
    direction = torch.randn(64, generator=gen).sign()  # [D] +-1: the keys' common part
    live = ~base.k_cache.isnan()
    keys = direction * 3.0 + torch.randn(base.k_cache.shape, generator=gen) * 0.3  # [blocks, PAGE, Hkv, D]
    base.k_cache.copy_(torch.where(live, keys.to(base.k_cache.device, base.k_cache.dtype), base.k_cache))
    q = direction * 8.0 + torch.randn(base.q.shape, generator=gen) * 0.1  # [B, Hq, D]
    base.q.copy_(q.to(base.q.device, base.q.dtype))
    case = fp8_case(base, amax_scales(base.k_cache, base), [1.0])  # v_scale 1, as the other cases here
    for splits in (1, 2):
        check(impl, case, plan=forced(impl, case, splits), scale=1.0)


@pytest.mark.parametrize("splits", [1, 3, "codes-exact"])
def test_k_scale_multiplies_the_logits(impl, runtime, splits):
    """v_scale = 1 and one k_scale per KV head (0.004 and 0.011 on codes up to 448): the logits are
    q . (code * k_scale) * scale. Divided by k_scale, they are tens of thousands of times too large, and
    the softmax is one-hot. codes-exact: the codes enter the dot as they are, k_scale after it."""
    if splits == "codes-exact":
        _k_codes_enter_the_dot_exact(impl, runtime)
        return
    case = make([37, 50], 8, 2, 64, 16, device=runtime.device, stream=60)
    case = _scaled(case, [0.004, 0.011], [1.0])
    check(impl, case, plan=forced(impl, case, splits))


@pytest.mark.parametrize("splits", [1, 3])
def test_v_scale_multiplies_the_output(impl, runtime, splits):
    """k_scale = 1/448 per tensor and v_scale per KV head (0.01 and 0.003): the output is the softmax
    average of code * v_scale. Folded into the softmax scale instead, v_scale sharpens the logits and
    never reaches the output."""
    case = make([37, 50], 8, 2, 64, 16, device=runtime.device, stream=61)
    case = _scaled(case, [1 / 448], [0.01, 0.003])
    check(impl, case, plan=forced(impl, case, splits))


@pytest.mark.parametrize("splits", [1, 3])
def test_uniform_scores_read_only_v_scale(impl, runtime, splits):
    """q = 0: every logit is 0 whatever k_scale is, so the output is the plain mean of V, v_scale times
    the mean code. Only V's scale may reach the output here: k_scale multiplied into it (applied after
    the softmax instead of to the logits) scales it by 0.02."""
    case = make([37, 50], 8, 2, 64, 16, device=runtime.device, stream=62)
    case.q.zero_()
    case = _scaled(case, [0.02], [0.015, 0.004])
    check(impl, case, plan=forced(impl, case, splits))


def test_per_head_scales_follow_the_kv_head(impl, runtime):
    """GQA with 4 query heads per KV head and 4 KV heads, each with its own k_scale and v_scale: query
    head h reads the scales of KV head h // 4. Indexed by the query head, heads 1 to 3's scales are read
    by the wrong heads (and query heads past 3 read past the scales)."""
    case = make([45, 20], 16, 4, 64, 16, device=runtime.device, stream=63)
    case = _scaled(case, [0.003, 0.009, 0.005, 0.012], [0.02, 0.004, 0.011, 0.007])
    for splits in (1, 2):
        check(impl, case, plan=forced(impl, case, splits))
    # The same scales as the columns of one [Hkv, 2] table (K's, V's), stride 2: read through their stride.
    table = torch.stack([case.k_scale, case.v_scale], dim=1)
    strided = Fp8Case(*case.args[:5], table[:, 0], table[:, 1])
    try:
        check(impl, strided, plan=forced(impl, strided, 1))
    except AssertionError as e:
        raise AssertionError(f"scales as strided views (columns of one [Hkv, 2] table): {e}") from None


def test_q_keeps_its_precision(impl, runtime):
    """Scales of 1 and codes of small integers, so the cache is exact: the only rounding left is q's. q
    holds fp16 values that e4m3 cannot (3 mantissa bits against 10): a dot taken in fp8, q cast down to
    e4m3, moves every logit by up to 6%."""
    base = make_paged_case([40, 23], 8, 2, 64, 16, device=runtime.device, stream=64)
    gen = torch.Generator().manual_seed(seeded(65))
    for cache in (base.k_cache, base.v_cache):
        live = ~cache.isnan()
        cache[live] = torch.randint(-6, 7, (int(live.sum()),), generator=gen).to(cache.dtype).to(cache.device)
    case = fp8_case(base, [1.0], [1.0])
    check(impl, case, plan=forced(impl, case, 1), scale=0.05)


def test_accuracy_against_the_fp16_cache(impl, runtime):
    """The lesson's reported bound (section 5): random K and V (standard normal, per-head amax scales), the
    decode over the e4m3 cache against the fp32 oracle over the unquantized fp16 cache. e4m3 keeps 3
    mantissa bits, so each cached value is off by up to 1/32 of itself; the output's relative error
    ||out - ref|| / ||ref|| stays below 0.06 and its largest element error below 0.06 (outputs are
    about 0.12 in size). Past that, something other than e4m3's rounding is wrong."""
    base = make_paged_case([200, 77], 8, 2, 64, 16, device=runtime.device, stream=66)
    case = fp8(base)
    out = impl.fp8_decode(*case.args, plan=forced(impl, case, 2))
    assert_close(out, oracle(case)[0], DIMS)  # first: the kernel computes what the cache holds
    ref, _ = paged_attention_reference(*base.args)
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    worst = (out.float() - ref).abs().max().item()
    assert rel < 0.06 and worst < 0.06, (
        f"against the fp16 cache: relative error {rel:.4f}, largest element error {worst:.4f}; the bound is "
        "0.06 for both"
    )


def test_every_split_count_matches_unsplit(impl, runtime):
    """Split counts 1 .. pages + 3: the result must not depend on how the keys are cut."""
    n = sizes(runtime, 40, 1000)  # 2.5 pages: counts 1 .. 6, the last three past the pages
    case = make([n], 8, 2, 64, 16, device=runtime.device, stream=1)
    pages = math.ceil(n / 16)
    unsplit, _ = check(impl, case, plan=forced(impl, case, 1))
    counts = range(2, pages + 4) if runtime.interpreter else [2, 3, 5, 8, 16, 31, 63, pages, pages + 3]
    for splits in counts:
        out, _ = check(impl, case, plan=forced(impl, case, splits))
        assert_close(out, unsplit.float(), DIMS)


def test_empty_splits_do_not_divide_zero_by_zero(impl, runtime):
    """A ragged batch with a 16-token chunk: short sequences get splits with no tokens, which must weigh
    0 (lse = -inf), not 0/0 = NaN."""
    lens = sizes(runtime, [70, 1, 17, 33], [1000, 1, 17, 250, 999])
    case = make(lens, 8, 2, 64, 16, device=runtime.device, stream=2, extra_pages=4)
    check(impl, case, plan=fixed_plan(impl, 16, max(lens)))
    check(impl, case, plan=fixed_plan(impl, 16, max(lens) + 48))


@pytest.mark.parametrize("splits", [1, 4], ids=["one-split", "merged"])
def test_padding_sequences_give_zero_and_lse_minus_inf(impl, runtime, splits):
    """context_lens[b] = 0 is a padding sequence: output 0, lse -inf, the rows around it unaffected."""
    case = make([37, 0, 50, 0], 8, 2, 64, 16, device=runtime.device, stream=22)
    out, lse = check(impl, case, plan=forced(impl, case, splits))
    assert (out[[1, 3]] == 0).all(), "a padding sequence (context_lens = 0) must output 0"
    assert (lse[[1, 3]] == float("-inf")).all(), "a padding sequence's lse must be -inf (it saw no key)"


def _with_scores(case, scores):
    """Sequence 0's keys set (before quantizing) so that query head 0 scores about `scores` [n]."""
    n, D = len(scores), case.q.shape[-1]
    t = torch.arange(n, device=case.q.device)
    blocks, slots = case.block_tables[0].long()[t // case.k_cache.shape[1]], t % case.k_cache.shape[1]
    q0 = case.q[0, 0].float()
    k = scores.to(q0.device)[:, None] * math.sqrt(D) * q0 / q0.dot(q0)  # [n, D]
    case.k_cache[blocks, slots, 0] = k.to(case.q.dtype)
    return case


def test_many_splits_merge_with_rescale(impl, runtime):
    """Scores rise along the sequence over 80 splits, more than the merge reads at once (64): the merge's
    running sum must be rescaled when a later group of splits raises the max."""
    n, D = 16 * 80, 64
    base = make_paged_case([n, 100], 4, 1, D, 16, device=runtime.device, stream=16, poison=False)
    t = torch.arange(n, device=runtime.device)
    blocks, slots = base.block_tables[0].long()[t // 16], t % 16
    q0 = base.q[0, 0].float()
    ramp = torch.linspace(0.0, 15.0, n, device=runtime.device)[:, None]
    k = 0.3 * base.k_cache[blocks, slots, 0].float() + ramp * math.sqrt(D) * q0 / q0.dot(q0)
    base.k_cache[blocks, slots, 0] = k.to(base.q.dtype)
    check(impl, fp8(base), plan=fixed_plan(impl, 16, n))


MERGE_TILE_EDGES = (17, 65)


@pytest.mark.parametrize("splits", MERGE_TILE_EDGES, ids=[f"splits{s}" for s in MERGE_TILE_EDGES])
def test_merge_reads_every_tile_of_splits(impl, runtime, splits):
    """One split more than a merge tile of 16 or 64 holds: the first and last splits hold the same high
    score, so a merge that reads one tile of splits only drops the last and half the weight."""
    n = 16 * splits
    base = make_paged_case([n], 1, 1, 64, 16, device=runtime.device, stream=27)
    scores = torch.zeros(n)
    scores[0] = scores[n - 16] = 8.0
    check(impl, fp8(_with_scores(base, scores)), plan=fixed_plan(impl, 16, n))


def test_split_ranges_cover_each_key_once(impl, runtime):
    """Every score 0 and equal splits: the output is the plain mean of V, so only split ranges that
    overlap or leave a gap change it. Outputs only (no lse asked)."""
    for chunk, n in ((16, 64), (32, 96)):
        case = fp8(
            _with_scores(make_paged_case([n], 4, 1, 64, 16, device=runtime.device, stream=28), torch.zeros(n))
        )
        plan = fixed_plan(impl, chunk, n)
        out = call_with_canary_out(
            lambda out, case=case, plan=plan: impl.fp8_decode(*case.args, plan=plan, out=out), case.q
        )
        assert_close(out, oracle(case)[0], DIMS)


def test_split_merge_shifts_by_the_max(impl, runtime):
    """Every score about +128: each split's lse is past fp32's exp range, so the merge must shift by the max."""
    base = shift_scores(make_paged_case([70, 33], 8, 2, 64, 16, device=runtime.device, stream=19), 128.0)
    case = fp8(base)
    _, lse = check(impl, case, plan=forced(impl, case, 3))
    assert lse.min().item() > 88.7, "every head's lse should be past fp32's exp range here"


def test_max_starts_at_minus_inf(impl, runtime):
    """Every score about -128: a running max that starts at 0 underflows every exp2."""
    base = shift_scores(make_paged_case([70, 33], 8, 2, 64, 16, device=runtime.device, stream=20), -128.0)
    case = fp8(base)
    for splits in (1, 3):
        _, lse = check(impl, case, plan=forced(impl, case, splits))
    assert lse.max().item() < -104, "every head's lse should be below fp32's exp range here"


def test_q_strides_are_used(impl, runtime):
    """q is every other head of a NaN-filled [B, 2 * Hq, D] buffer."""
    case = fp8(strided_q(make_paged_case([40, 9], 8, 2, 64, 16, device=runtime.device, stream=21)))
    for splits in (1, 3):
        check(impl, case, plan=forced(impl, case, splits))


def test_table_rows_are_read_through_their_stride(impl, runtime):
    """block_tables is a view of a wider table of -1: rows start at b * stride(0)."""
    case = make([35, 48, 70], 8, 2, 64, 16, device=runtime.device, stream=23)
    case.block_tables = in_wider_table(case.block_tables)
    for splits in (1, 3):
        check(impl, case, plan=forced(impl, case, splits))


@pytest.mark.parametrize("PAGE", [4, 16])
def test_cache_strides_are_used(impl, runtime, PAGE):
    """k_cache and v_cache are layer 1 of a NaN-coded e4m3 pool [num_blocks, layers, PAGE, Hkv, 2, D]."""
    case = fp8(
        in_layer_pool(make_paged_case([40, 9], 8, 2, 64, PAGE, device=runtime.device, stream=22 + PAGE))
    )
    check(impl, case, plan=forced(impl, case, 2))


def test_v_is_read_through_its_own_strides(impl, runtime):
    """v_cache head-major: V read through K's strides reads the wrong tokens and heads."""
    for PAGE, splits in ((16, (1, 2)), (4, (2,))):
        base = make_paged_case([40, 9], 8, 2, 64, PAGE, device=runtime.device, stream=24 + PAGE)
        case = fp8(v_strides_unlike_k(base))
        for n in splits:
            check(impl, case, plan=forced(impl, case, n))


def test_widest_head_dim_is_read_whole(impl, runtime):
    """D = 256, the widest head dim the launcher admits, unsplit and split."""
    case = make([19], 2, 1, max(DOMAIN["head_dims"]), 16, device=runtime.device, stream=26)
    for n in (1, 2):
        check(impl, case, plan=forced(impl, case, n))


def test_lse_is_natural_log(impl, runtime):
    """lse must be torch.logsumexp of the scaled scores of the dequantized K (base e), k_scale included."""
    case = make([45, 3], 8, 2, 64, 16, device=runtime.device, stream=3)
    check(impl, case, plan=forced(impl, case, 1))
    check(impl, case, plan=forced(impl, case, 1), scale=0.37)


@pytest.mark.parametrize("splits", [1, 4])
def test_last_page_is_masked(impl, runtime, splits):
    lens = [1, 15, 16, 17, 31] + sizes(runtime, [], [777, 1000])
    case = make(lens, 8, 2, 64, 16, device=runtime.device, stream=4)
    check(impl, case, plan=forced(impl, case, splits))


@pytest.mark.parametrize("splits", [1, 2], ids=["one-split", "merged"])
def test_table_rows_exactly_full(impl, runtime, splits):
    """Contexts of 20 and 32 with PAGE = 16 in a table of exactly 2 columns, over an e4m3 cache: the second
    sequence's pages fill its row, the last of the table, so context_lens[1] = max_pages * PAGE, the
    largest valid length. A guard bounded by ctx < max_pages * PAGE zeroes that sequence, and a read of the
    entry after its last page reads past the end of block_tables. The pool has exactly the 4 blocks the
    pages need, so block id num_blocks - 1, the largest valid one, is in use too; one split and two."""
    case = make([20, 32], 4, 2, 64, 16, device=runtime.device, stream=68, max_pages=2, num_blocks=4)
    assert case.block_tables.shape[1] * 16 == 32  # no spare column
    assert 3 in case.block_tables.flatten().tolist()  # block num_blocks - 1, the largest valid id, in use
    check(impl, case, plan=forced(impl, case, splits))


@grouping_cases("group1-MHA", "group2", "group3", "group4", "group8", "group32-MQA")
def test_kv_head_grouping_is_contiguous(impl, runtime, Hq, Hkv):
    """Query head h reads KV head h // GROUP (and its scales). GROUP = 3 is not a power of two."""
    case = make(sizes(runtime, [40, 9], [300, 129]), Hq, Hkv, 64, 16, device=runtime.device, stream=Hq + Hkv)
    check(impl, case, plan=forced(impl, case, 2))


@pytest.mark.parametrize("PAGE", [1, 2, 8, 16, 64, 128])
def test_page_sizes_gathered_token_by_token(impl, runtime, PAGE):
    """Pages from 1 token (gathered token by token) to 128 (eight tiles per page)."""
    lens = sizes(runtime, [37, 5, 20], [1000, 5, 333])
    if PAGE == 128:
        lens = sizes(runtime, [150, 5], [1000, 333])
    case = make(lens, 8, 2, 64, PAGE, device=runtime.device, stream=PAGE)
    for splits in (1, 3):
        check(impl, case, plan=forced(impl, case, splits))


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    """q in fp16 or bf16; the e4m3 codes widen exactly to either."""
    case = make(
        sizes(runtime, [33, 4], [1500, 17]), 8, 2, 128, 16, dtype=dtype, device=runtime.device, stream=8
    )
    check(impl, case, plan=forced(impl, case, 3))


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_out_keeps_the_range_of_its_dtype(impl, runtime, dtype):
    """V about 2^16 (bf16) or 2^13 (fp16), its scale with it: bf16 outputs past fp16's 65504 must be stored
    in out's own dtype."""
    base = make_paged_case([40, 17], 8, 2, 64, 16, dtype=dtype, device=runtime.device, stream=21)
    fill_past_fp16_range(base.v_cache)
    case = fp8(base)
    for splits in (1, 3):
        check(impl, case, plan=forced(impl, case, splits))
    # q from 2^16 up (bf16) and k_scale as much smaller, so the logits stay as they were: every code is
    # exact in fp16, q is not, and a dot whose q is cast to tl.float16 turns it into inf.
    base = make_paged_case([40, 17], 8, 2, 64, 16, dtype=dtype, device=runtime.device, stream=23)
    case = fp8(base)
    m = (
        2.0**16 if dtype == torch.bfloat16 else 2.0**13
    )  # fill_past_fp16_range's: the fp16 case stays in range
    qf = case.q.float()
    case.q.copy_((torch.sign(qf) * (qf.abs() + 1) * m).to(dtype))
    case = Fp8Case(*case.args[:5], case.k_scale / m, case.v_scale)
    try:
        check(impl, case, plan=forced(impl, case, 1))
    except AssertionError as e:
        raise AssertionError(f"q from 2^16 up (k_scale scaled down to keep the logits): {e}") from None


def test_sequence_index_widened_to_int64(impl, runtime):
    """q's rows 1.5 * 2**30 elements apart: b * stride_qb needs int64. Then out's rows as far apart (a view
    of a large activation buffer): b * stride_ob too, in the split kernel's store (one split) and in the
    merge's (three), each its own program id."""
    case = make([20, 9, 33], 4, 2, 64, 16, device=runtime.device, stream=22)
    wide = Fp8Case(q_rows_far_apart(case.q, runtime), *case.args[1:])
    for splits in (1, 3):
        check(impl, wide, plan=forced(impl, wide, splits))
    ref = oracle(case)[0]
    for splits in (1, 3):
        out = q_rows_far_apart(torch.full_like(case.q, float("nan")), runtime)  # rows never stored stay NaN
        impl.fp8_decode(*case.args, out=out, plan=forced(impl, case, splits))
        assert_close(out, ref, DIMS)


def test_page_index_widened_to_int64(impl, runtime):
    """Block ids past 2**32 / page stride (a sparse e4m3 pool of about 4.3 GB): int32 offsets wrap onto
    the pool's first blocks, on the one-page tile (PAGE = 16) and the token-by-token gather (PAGE = 8)."""
    Hkv, D = 1, 128
    for PAGE, lens, splits in (
        (16, sizes(runtime, [40, 7], [300, 45]), (1, 3)),
        (8, [sizes(runtime, 40, 100)], (2,)),
    ):
        far = pool_past_int32(runtime, PAGE, Hkv, D, spare=64)
        case = make(lens, 4, Hkv, D, PAGE, device=runtime.device, stream=9 + PAGE, **far)
        for n in splits:
            check(impl, case, plan=forced(impl, case, n))


@pytest.mark.parametrize("splits", [1, 3])
def test_runs_a_triton_kernel(impl, runtime, splits):
    """The right numbers are not enough: fp8_decode must compute them with your Triton kernels."""
    case = make([45, 3], 8, 2, 64, 16, device=runtime.device, stream=17)
    plan = forced(impl, case, splits)
    assert_runs_a_triton_kernel(impl, lambda: impl.fp8_decode(*case.args, plan=plan), "fp8_decode")


# name -> (how to spoil the arguments of a valid fp8_decode call, the error, what the message names)
BAD_INPUTS = {
    "k_cache_fp16": (lambda a, impl, dev: dict(k_cache=a["k_cache"].float().half()), TypeError, "k_cache"),
    "v_cache_fnuz": (
        lambda a, impl, dev: dict(v_cache=a["v_cache"].view(torch.float8_e4m3fnuz)),
        TypeError,
        "v_cache",
    ),
    "q_fp32": (lambda a, impl, dev: dict(q=a["q"].float()), TypeError, "q"),
    "k_scale_zero": (lambda a, impl, dev: dict(k_scale=torch.zeros(1, device=dev)), ValueError, "k_scale"),
    "v_scale_negative": (
        lambda a, impl, dev: dict(v_scale=-torch.ones(1, device=dev)),
        ValueError,
        "v_scale",
    ),
    "k_scale_nan": (
        lambda a, impl, dev: dict(k_scale=torch.full((2,), float("nan"), device=dev)),
        ValueError,
        "k_scale",
    ),
    "v_scale_inf": (
        lambda a, impl, dev: dict(v_scale=torch.full((1,), float("inf"), device=dev)),
        ValueError,
        "v_scale",
    ),
    "k_scale_wrong_length": (
        lambda a, impl, dev: dict(k_scale=torch.ones(4, device=dev)),
        ValueError,
        "k_scale",
    ),
    "v_scale_float64": (
        lambda a, impl, dev: dict(v_scale=torch.ones(1, dtype=torch.float64, device=dev)),
        TypeError,
        "v_scale",
    ),
    "k_scale_rank2": (lambda a, impl, dev: dict(k_scale=torch.ones(1, 2, device=dev)), ValueError, "k_scale"),
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
    "live_block_id_past_pool": (
        lambda a, impl, dev: dict(block_tables=with_entry(a["block_tables"], 0, 1, a["k_cache"].shape[0])),
        ValueError,
        r"block_tables\[0, 1\]",
    ),
    "scale_zero": (lambda a, impl, dev: dict(scale=0.0), ValueError, "scale"),
    "v_cache_is_k_cache": (lambda a, impl, dev: dict(v_cache=a["k_cache"]), ValueError, "v_cache"),
    "v_cache_overlaps_k_cache": (
        lambda a, impl, dev: overlapping_caches(a["k_cache"]),
        ValueError,
        "v_cache",
    ),
    "plan_not_a_plan": (lambda a, impl, dev: dict(plan=4), TypeError, "plan"),
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
    "plan_past_the_table": (
        lambda a, impl, dev: dict(plan=impl.plan([10**6, 5], 2, 16)),
        ValueError,
        "plan.max_len",
    ),
    "plan_too_short": (lambda a, impl, dev: dict(plan=impl.plan([8], 2, 16)), ValueError, "plan"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    case = make([20, 5], 4, 2, 64, 16, device=runtime.device, stream=14)
    args = spoiled_call(case, spoil, impl, runtime.device)
    with pytest.raises(error, match=names):
        impl.fp8_decode(**args)


# --- Every pair of the domain's boundary values in one case ----------------------------------------

PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def _copy_in_layout(cache):
    """A copy of an e4m3 view with its shape, strides and offset, over a storage of its own that holds the
    NaN code outside the view."""
    n = cache.untyped_storage().nbytes() // cache.element_size()
    flat = torch.full((n,), float("nan"), device=cache.device).to(E4M3)
    copy = flat.as_strided(cache.shape, cache.stride(), cache.storage_offset())
    copy.copy_(cache)
    return copy


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (D = 256 at
    PAGE = 1, per-tensor scales under GQA, clamped codes with 17 splits, V's strides unlike K's...): a
    kernel right on each bound alone can still be wrong where two meet. The first and last token of each
    page and sequence (and a padding row of slot -1) go through your store_kvcache_fp8 into the case's
    caches, their slots NaN-coded before, which must then equal torch's codes byte for byte; fp8_decode
    reads them. V's strides unlike K's are not the store's to take (it needs one layout for both): those
    caches hold torch's codes. A failure names the case's values."""
    domain = fits_this_machine(DOMAIN, runtime)

    def run(c):
        Hq, Hkv = c["heads"]
        PAGE = c["PAGE"]
        lens = CONTEXT_PATTERNS[c["lens"]](PAGE)
        base = make_paged_case(
            lens, Hq, Hkv, c["D"], PAGE, dtype=c["dtype"], device=runtime.device, stream=443
        )
        base = laid_out(base, runtime, c["q"], c["kv"], c["table"])
        want = fp8(base, per_head=c["scales"] == "per_head", room=ROOM[c["values"]])  # torch's codes
        k_cache, v_cache = want.k_cache, want.v_cache
        if c["kv"] != "v_unlike_k":
            # The first and last token of every page and of every sequence (the interpreter's time goes
            # with rows stored), their slots NaN-coded first, then stored by your kernel with a padding row.
            blocks, slots = live_slots(base)  # [N] each: every token a sequence holds
            last = torch.tensor(lens).cumsum(0)[torch.tensor(lens) > 0] - 1
            pick = (slots == 0) | (slots == PAGE - 1)
            pick[last.to(pick.device)] = True
            blocks, slots = blocks[pick], slots[pick]
            key, value = base.k_cache[blocks, slots], base.v_cache[blocks, slots]  # [n, Hkv, D]
            pad = torch.zeros_like(key[:1])  # a padding row: slot -1, stored nowhere
            slot_mapping = torch.cat([blocks * PAGE + slots, torch.tensor([-1], device=blocks.device)])
            k_cache, v_cache = _copy_in_layout(want.k_cache), _copy_in_layout(want.v_cache)
            for cache in (k_cache, v_cache):
                cache.view(torch.uint8)[blocks, slots] = 0x7F  # the NaN code: what a missed row leaves
            impl.store_kvcache_fp8(
                torch.cat([key, pad]), torch.cat([value, pad]), k_cache, v_cache, slot_mapping,
                want.k_scale, want.v_scale,
            )  # fmt: skip
            for name, got, expected in (
                ("k_cache", k_cache, want.k_cache),
                ("v_cache", v_cache, want.v_cache),
            ):
                bad = got.view(torch.uint8) != expected.view(torch.uint8)  # [num_blocks, PAGE, Hkv, D]
                if bad.any():
                    blk, slot, h, d = bad.nonzero()[0].tolist()
                    only_slot_0 = not bad.flatten(2).any(2).flatten()[1:].any()  # block 0's first token
                    raise AssertionError(
                        f"store_kvcache_fp8: {int(bad.sum())} bytes of {name} differ from torch's e4m3 of "
                        f"clamp(x / scale); first at block {blk}, slot {slot}, head {h}, d {d}: code "
                        f"0x{int(got.view(torch.uint8)[blk, slot, h, d]):02x}, want "
                        f"0x{int(expected.view(torch.uint8)[blk, slot, h, d]):02x}"
                        + (f" (cache slot 0, the only one missed: {SLOT_ZERO})" if only_slot_0 else "")
                    )
        case = Fp8Case(
            want.q, k_cache, v_cache, want.block_tables, want.context_lens, want.k_scale, want.v_scale
        )
        plan = {
            "planner": None,
            "unsplit": forced(impl, case, 1),
            "chunk16": fixed_plan(impl, 16, max(lens)),
        }[c["plan"]]
        # Not a test of your kernel: the comparison fails an all-zeros output on this case.
        assert mismatch(torch.zeros_like(case.q), oracle(case, c["scale"])[0]) is not None
        check(impl, case, plan=plan, scale=c["scale"])

    domain.check_each(domain.cases(stream=443), run)


@pytest.mark.parametrize("splits", [1, 2])
def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime, splits):
    """70,000 sequences in one decode step: sequences belong on grid axis 0, in the split kernel and in
    the merge. Run dry (every launch recorded and checked, none run)."""
    B, PAGE, D, dev = 70_000, 16, 16, runtime.device
    q = torch.zeros(B, 1, D, dtype=torch.float16, device=dev)
    k_cache = torch.zeros(2, PAGE, 1, D, device=dev).to(E4M3)
    tables = torch.arange(2, dtype=torch.int32, device=dev).repeat(B, 1)
    lens = torch.full((B,), 2 * PAGE, dtype=torch.int32, device=dev)
    one = torch.ones(1, device=dev)
    p = impl.plan(lens, 1, PAGE, num_splits=splits)
    assert_grids_fit(
        impl,
        lambda: impl.fp8_decode(
            q, k_cache, k_cache.clone(), tables, lens, one, one, plan=p, return_lse=True, check=False
        ),
        f"fp8_decode of 70,000 sequences in {splits} split(s)",
    )


# --- Stage 3: the planner's own choice -------------------------------------------------------------


@pytest.mark.parametrize(
    "lens,Hkv", [([1], 8), ([32768], 8), ([512] * 256, 8), ([5, 3000, 17], 2), ([16], 1)]
)
def test_plan_never_returns_empty_or_zero_splits(impl, lens, Hkv):
    """Whatever it chooses, every split of the longest sequence has tokens and chunks are tile-sized."""
    for want in (None, 1, 7, 10_000):
        p = impl.plan(lens, Hkv, 16, num_sms=132, num_splits=want)
        assert p.num_splits >= 1 and p.max_len == max(lens)
        assert (p.num_splits - 1) * p.chunk < max(lens) <= p.num_splits * p.chunk, f"{p}: an empty last split"
        assert p.chunk % 16 == 0, f"{p}: a chunk of {p.chunk} tokens is not a whole number of 16-token tiles"


def test_default_plan_shared_and_shuffled_pages(impl, runtime):
    """plan() splits only when the grid is starved; plan=None: fp8_decode plans from context_lens itself,
    over shared and shuffled pages, B = 1 too."""
    assert impl.plan([2048] * 128, 8, 16, num_sms=132).num_splits == 1
    assert impl.plan([32768], 8, 16, num_sms=132).num_splits >= 132 // 8
    case = make(
        sizes(runtime, [64, 40], [2048, 700]),
        8,
        2,
        128,
        16,
        device=runtime.device,
        stream=6,
        shared_prefix_pages=2,
    )
    check(impl, case)
    one = make([sizes(runtime, 150, 32768)], 32, 8, 128, 16, device=runtime.device, stream=7)
    check(impl, one)


def test_default_plan_per_tensor_scales(impl, runtime):
    """One scale per tensor ([1]) with the planner's own choice: every head reads entry 0."""
    case = make([90, 33, 0], 8, 2, 64, 8, per_head=False, device=runtime.device, stream=67)
    check(impl, case)


BAD_PLANS = {
    "page_size_not_pow2": (([10], 2, 12), {}, ValueError, "page_size"),
    "num_splits_zero": (([10], 2, 16), dict(num_splits=0), ValueError, "num_splits"),
    "num_kv_heads_zero": (([10], 0, 16), {}, ValueError, "num_kv_heads"),
    "lengths_empty": (([], 2, 16), {}, ValueError, "context_lens"),
    "length_negative": (([10, -1], 2, 16), {}, ValueError, r"context_lens\[1\]"),
}


@pytest.mark.parametrize("name", list(BAD_PLANS))
def test_plan_rejects_bad_arguments(impl, name):
    args, kwargs, error, names = BAD_PLANS[name]
    with pytest.raises(error, match=names):
        impl.plan(*args, **kwargs)


# --- Stages: the store, then decode with the split count forced, then the planner --------------------

STAGES = [
    Stage(
        "store",
        ("test_store_*", "test_compute_scales_amax_rule"),
        "store_kvcache_fp8: codes bit for bit torch's e4m3 of clamp(x / scale): ties to even, the clamp at "
        "448, per-head scales, padding rows and strided views; compute_scales' amax rule",
    ),
    Stage(
        "decode, fixed splits",
        (
            "test_k_scale_multiplies_the_logits",
            "test_v_scale_multiplies_the_output",
            "test_uniform_scores_read_only_v_scale",
            "test_per_head_scales_follow_the_kv_head",
            "test_q_keeps_its_precision",
            "test_accuracy_against_the_fp16_cache",
            "test_every_split_count_matches_unsplit",
            "test_empty_splits_do_not_divide_zero_by_zero",
            "test_padding_sequences_give_zero_and_lse_minus_inf",
            "test_many_splits_merge_with_rescale",
            "test_merge_reads_every_tile_of_splits",
            "test_split_ranges_cover_each_key_once",
            "test_split_merge_shifts_by_the_max",
            "test_max_starts_at_minus_inf",
            "test_q_strides_are_used",
            "test_table_rows_are_read_through_their_stride",
            "test_cache_strides_are_used",
            "test_v_is_read_through_its_own_strides",
            "test_widest_head_dim_is_read_whole",
            "test_lse_is_natural_log",
            "test_last_page_is_masked",
            "test_kv_head_grouping_is_contiguous",
            "test_page_sizes_gathered_token_by_token",
            "test_dtypes",
            "test_out_keeps_the_range_of_its_dtype",
            "test_sequence_index_widened_to_int64",
            "test_page_index_widened_to_int64",
            "test_runs_a_triton_kernel",
            "test_launcher_rejects_bad_input",
            "test_grid_fits_cuda_limits_at_largest_sizes",
        ),
        "fp8_split_kernel with the split count forced through plan(num_splits=k): k_scale folded into the "
        "logits, v_scale on the output, per-head scales by KV head, and every case of F1's grader",
    ),
    Stage(
        "planner",
        (
            "test_plan_*",
            "test_default_plan_*",
            "test_launcher_rejects_bad_input[plan_too_short]",
            "test_launcher_rejects_bad_input[plan_past_the_table]",
        ),
        "fp8_decode with plan=None: plan() choosing the split count from the lengths (F1's rule)",
    ),
]


# --- Diagnosis: which pitfall of section 6 a pattern of results points at ----------------------------

# The scale mistakes are told apart by three decode checks: k_scale alone (v_scale = 1), v_scale alone
# (k_scale = 1/448), and q = 0, where every logit is 0 whatever K's scale, so only V's reaches the output.
K_ALONE, V_ALONE = "test_k_scale_multiplies_the_logits", "test_v_scale_multiplies_the_output"
UNIFORM, EXACT_CACHE = "test_uniform_scores_read_only_v_scale", "test_q_keeps_its_precision"
MISTAKES = [
    # Per-head scales read at entry h (stride 1 assumed): right for every contiguous scale tensor.
    Mistake(
        27,
        fails=("test_per_head_scales_follow_the_kv_head",),
        passes=(
            "test_default_plan_per_tensor_scales",
            EXACT_CACHE,
            "test_store_rounds_to_nearest_even",
            "test_k_scale_multiplies_the_logits",
        ),
        messages=(r"scales as strided views",),
        question="k_scale is column 0 of a [4, 2] table of K's and V's scales: at which element does KV "
        "head 2's scale sit, and which one does your kernel load?",
        section="3.4",
    ),
    Mistake(
        27,
        fails=("test_store_scale_per_kv_head",),
        passes=("test_store_rounds_to_nearest_even", "test_store_pads_heads_and_features"),
        messages=(r"scales as strided views",),
        question="k_scale is column 0 of a [4, 2] table of K's and V's scales: at which element does head 2's "
        "scale sit, and which one does your store load?",
        section="3.4",
    ),
    # A head tile fixed (or capped) at a usual model's KV heads: every store of 8 heads or fewer passes.
    Mistake(
        25,
        fails=("test_store_pads_heads_and_features",),
        passes=("test_store_scale_per_kv_head", "test_store_rounds_to_nearest_even"),
        messages=(r"Hkv = 65 KV heads",),
        question="Hkv = 65: how many rows does your store's head tile have, and which heads does it store?",
        section="3.2",
    ),
    # q cast to tl.float16 for the dot: bf16 q past 65504 is inf; the codes fit fp16, so nothing else shows.
    Mistake(
        26,
        fails=("test_out_keeps_the_range_of_its_dtype[bf16]",),
        passes=("test_out_keeps_the_range_of_its_dtype[fp16]", "test_dtypes", "test_q_keeps_its_precision"),
        messages=(r"q from 2\^16 up",),
        question="A bf16 q element of 70000: what is it as tl.float16, and which dtype do your dot's operands "
        "take?",
        section="3.3",
    ),
    Mistake(
        9,
        fails=("test_table_rows_exactly_full",),
        passes=("test_last_page_is_masked", "test_every_split_count_matches_unsplit"),
        messages=(r"device guard fired|out of bounds load of block_tables",),
        question="A context of 32 with PAGE = 16 in a table of 2 columns: is it a valid length, and which "
        "lengths do your guard and your table loads admit?",
        section="3.5",
    ),
    Mistake(
        17,
        # Only K's (or V's) second rounding: every scale lands where it belongs, so a test with no other
        # rounding left (EXACT_CACHE, scales of 1) and the store pass.
        fails=("test_k_scale_multiplies_the_logits[codes-exact]",),
        messages=(ROUNDED_TO_Q_DTYPE,),
        passes=(
            UNIFORM,
            EXACT_CACHE,
            "test_store_rounds_to_nearest_even",
            "test_store_clamps_values_past_448",
        ),
        question="k_scale = 0.011 and a code of 13: is 13 * 0.011 a bfloat16 value? Where does your kernel "
        "multiply K by its scale, and in which dtype is the product kept?",
        section="3.3",
    ),
    Mistake(
        1,
        # Divided logits are k_scale**2 too large everywhere, the per-head check too; K rounded in q's dtype
        # (pitfall 17) moves them by 2**-9 only, which that check's tolerance holds.
        fails=(K_ALONE, "test_per_head_scales_follow_the_kv_head"),
        passes=(UNIFORM, EXACT_CACHE, "test_store_rounds_to_nearest_even"),
        messages=(K_DIVIDES,),
        question="A cached K element is code * k_scale. With k_scale = 0.004, is q . K larger or smaller "
        "than q . code, and what does your kernel multiply the logits by?",
        section="2",
    ),
    Mistake(
        2,
        # Its fp16 case: bf16 rows narrowed to fp16 (pitfall 19) fail only the bf16-past-fp16 case.
        fails=("test_store_clamps_values_past_448[fp16]",),
        # Slot 0 taken for a padding row fails the clamp's case too (its row 21 goes to slot 0): it fails
        # every PAGE of test_store_writes_only_its_slots, which no clamp passes.
        passes=(
            "test_store_rounds_to_nearest_even",
            "test_store_keeps_codes_up_to_448",
            "test_store_writes_only_its_slots[1]",
        ),
        question="x / scale = 1000: e4m3fn has no infinity and its largest finite value is 448. What must "
        "happen to 1000 before it is rounded and cast, and what does your store do with it?",
        section="3.1",
    ),
    Mistake(
        3,
        # One scale per tensor fails too: v_scale never reaches the output, whatever head reads it (a per-head
        # v_scale read at the wrong head is right there, and is pitfall 5).
        fails=(V_ALONE, UNIFORM, "test_default_plan_per_tensor_scales"),
        passes=(K_ALONE, "test_store_rounds_to_nearest_even"),
        messages=(V_IN_LOGITS,),
        question="V = code * v_scale enters the output linearly, after the softmax: if v_scale multiplies "
        "the logits instead, what happens to the softmax, and who scales the output?",
        section="2",
    ),
    Mistake(
        4,
        # One scale per tensor fails too: what sets it apart from indexing the scales by query head.
        fails=(K_ALONE, UNIFORM, "test_default_plan_per_tensor_scales"),
        passes=(EXACT_CACHE, "test_store_rounds_to_nearest_even"),
        question="With q = 0 every logit is 0, whatever k_scale is: which of the two scales can still "
        "change the output, and where does your kernel apply K's?",
        section="2",
    ),
    Mistake(
        5,
        # Right wherever one scale serves every head (per tensor): read by query head or at entry 0.
        fails=("test_per_head_scales_follow_the_kv_head",),
        passes=(
            "test_default_plan_per_tensor_scales",
            EXACT_CACHE,
            "test_store_rounds_to_nearest_even",
            "test_store_scale_per_kv_head",  # scales read as if contiguous (27) fail there too
        ),
        question="Hq = 16 and Hkv = 4, so k_scale has 4 entries: which entry belongs to the program of KV "
        "head 2, and which one does your kernel load?",
        section="3.4",
    ),
    Mistake(
        5,
        # One scale read through the other's stride: right while K's and V's scales are both per head or
        # both per tensor, wrong where one is [1] (stride 0) and the other [Hkv].
        fails=(K_ALONE, "test_v_scale_multiplies_the_output", UNIFORM),
        passes=(
            "test_per_head_scales_follow_the_kv_head",
            "test_default_plan_per_tensor_scales",
            EXACT_CACHE,
        ),
        question="k_scale has Hkv entries and v_scale one (stride 0): at which stride does your kernel read "
        "each of them, and which scale does the program of KV head 1 then get?",
        section="3.4",
    ),
    Mistake(
        5,
        # A scale assumed per head (k_scale[kvh], no stride): a one-entry scale is read past its end.
        fails=(UNIFORM, V_ALONE),
        passes=("test_store_rounds_to_nearest_even",),
        messages=(r"out of bounds load of [kv]_scale_ptr",),
        question="k_scale may hold one entry, read by every head with stride 0: which entry does your "
        "kernel load for KV head 1, and does it exist?",
        section="3.4",
    ),
    Mistake(
        5,
        fails=("test_store_scale_per_kv_head",),
        passes=(
            "test_store_rounds_to_nearest_even",
            "test_store_writes_only_its_slots",
            "test_store_keeps_codes_up_to_448",
            "test_store_clamps_values_past_448",
            "test_per_head_scales_follow_the_kv_head",  # the decode's scales are right: only the store's
        ),
        question="k_scale has one entry (stride 0) and v_scale Hkv: at which stride does your store read "
        "each of them, and which scale does head 2's value then divide by?",
        section="3.4",
    ),
    Mistake(
        14,
        fails=("test_store_rounds_to_nearest_even",),
        passes=("test_store_clamps_values_past_448", "test_store_keeps_codes_up_to_448"),
        messages=(r"rounds ties away from zero",),
        question="x / scale = 42 lies exactly halfway between the e4m3 values 40 and 44: which one has the "
        "even code, and which one does your rounding pick?",
        section="3.1",
    ),
    Mistake(
        14,
        fails=("test_store_rounds_to_nearest_even",),
        passes=("test_store_clamps_values_past_448", "test_store_keeps_codes_up_to_448"),
        messages=(r"rounds ties toward zero",),
        question="x / scale = 46 lies exactly halfway between the e4m3 values 44 and 48: which one "
        "has the even code, and which one does your rounding pick when it adds 0x7FFFF alone?",
        section="3.1",
    ),
    Mistake(
        20,
        fails=("test_store_rounds_to_nearest_even",),
        messages=(r"leaves the rounding to \.to\(tl\.float8e4nv\)",),
        question="Your store casts x / scale to tl.float8e4nv and lets the cast round: which rounding does a "
        "GPU's cast do, which does Triton's interpreter do, and what does section 3.1 do first so that "
        "the cast has nothing left to round?",
        section="3.1",
    ),
    Mistake(
        18,
        fails=("test_store_rounds_to_nearest_even",),
        passes=("test_store_clamps_values_past_448", "test_store_keeps_codes_up_to_448"),
        messages=(r"e4m3's subnormal range",),
        question="x / scale = 0.0146: is it a normal e4m3 value, and how far apart are the two codes around "
        "it? Below which size does your rounding switch to that step?",
        section="3.1",
    ),
    Mistake(
        19,
        fails=("test_store_clamps_values_past_448[bf16-past-fp16]",),
        passes=(
            "test_store_rounds_to_nearest_even",
            "test_store_clamps_values_past_448[fp16]",
            "test_store_clamps_values_past_448[bf16]",
        ),
        question="key is bf16 and holds 2**100 with scale 2**100: what is x / scale, and what does your "
        "store divide if it first converts x to fp16?",
        section="3.2",
    ),
    Mistake(
        6,
        fails=("test_store_rounds_to_nearest_even",),
        passes=("test_store_clamps_values_past_448", "test_store_keeps_codes_up_to_448"),
        messages=(r"rounds toward zero",),
        question="x / scale = 350 lies between the e4m3 values 320 and 352: which one is nearest, and which "
        "one does dropping the low mantissa bits give?",
        section="2",
    ),
    Mistake(
        7,
        fails=("test_store_keeps_codes_up_to_448",),
        passes=("test_store_rounds_to_nearest_even",),
        question="The cache is torch.float8_e4m3fn: what is its largest finite value, and what is the "
        "largest of AMD's e4m3fnuz, whose exponent bias is 8?",
        section="3.1",
    ),
    Mistake(
        8,
        fails=(EXACT_CACHE,),
        passes=(UNIFORM, "test_store_rounds_to_nearest_even"),
        question="The cache here is exact (small integers, scale 1): the only rounding left is q's. Which "
        "dtype does q have in your dot, and how many mantissa bits does it keep there?",
        section="3.3",
    ),
    Mistake(
        10,
        fails=("test_store_writes_only_its_slots[cache-past-int32]",),
        passes=(
            "test_store_writes_only_its_slots[16]",
            "test_store_reads_strided_rows_and_writes_a_layer_of_a_pool",
        ),
        messages=(r"wrapped around",),
        question="PAGE = 16, Hkv = 1, D = 128: slot 2**25 + 5 starts 2**32 + 640 elements into the cache, "
        "and key's row 2 starts 3 * 2**30 elements in. In which integer type does your store compute each?",
        section="6",
    ),
    Mistake(
        11,
        fails=("test_lse_is_natural_log",),
        messages=(r"lse is in base 2",),
        question="Your kernel keeps m and log2(l) in base 2. For a row whose denominator is e^3, what is "
        "lse, and what does your kernel store?",
        section="6",
    ),
    Mistake(
        12,
        fails=("test_last_page_is_masked",),
        messages=(r"scored 0 instead of -inf",),
        question="A context of 37 read in tiles of 16: what score does key 40 of the last tile get in your "
        "kernel, and what weight does it then add to the softmax's sum?",
        section="6",
    ),
    Mistake(
        12,
        # A split's end not cut at the context: its last chunk reads table entries past the last page,
        # which the device guard reports (the split ranges themselves still cover each key once).
        fails=("test_last_page_is_masked", "test_table_rows_exactly_full"),
        passes=("test_split_ranges_cover_each_key_once", "test_store_rounds_to_nearest_even"),
        messages=(r"device guard fired[^\n]*reads block id",),
        question="A context of 37 in a split of chunk 64: where does the split's key loop stop, and which "
        "table entries does it read for keys 37 to 63?",
        section="6",
    ),
    Mistake(
        13,
        fails=("test_page_sizes_gathered_token_by_token[1]", "test_page_sizes_gathered_token_by_token[8]"),
        passes=(
            "test_page_sizes_gathered_token_by_token[16]",
            "test_page_sizes_gathered_token_by_token[64]",
            "test_last_page_is_masked",
        ),
        question="PAGE = 4 and a tile of 16 keys: how many pages does one tile span, and how many block ids "
        "does your kernel load for it?",
        section="6",
    ),
    Mistake(
        15,
        # The decode's cache addressed as if contiguous: a block taken as PAGE token strides.
        fails=("test_cache_strides_are_used",),
        passes=("test_page_sizes_gathered_token_by_token", "test_last_page_is_masked"),
        question="k_cache is layer 1 of a pool [num_blocks, layers, PAGE, Hkv, 2, D]: how many elements apart "
        "are two blocks, and how far apart does your decode put them?",
        section="6",
    ),
    Mistake(
        15,
        # block_tables' rows taken as max_pages apart (or another tensor's stride): right for every
        # contiguous table, wrong for a view of a wider one.
        fails=("test_table_rows_are_read_through_their_stride",),
        passes=("test_last_page_is_masked", "test_table_rows_exactly_full", "test_cache_strides_are_used"),
        question="block_tables is a view of a wider table: how many entries apart are two of its rows, and "
        "how far apart does your kernel take them?",
        section="6",
    ),
    Mistake(
        15,
        # V's rows read through K's strides: right whenever the two caches share a layout.
        fails=("test_v_is_read_through_its_own_strides",),
        passes=("test_cache_strides_are_used", "test_page_sizes_gathered_token_by_token"),
        question="v_cache is head-major where k_cache is token-major: which strides does your decode use to "
        "find token t's V, and whose are they?",
        section="6",
    ),
    Mistake(
        16,
        # Only values at a code's rounding edge show it: the message says which codes they are.
        messages=(r"multiplies by 1 / scale",),
        passes=("test_store_clamps_values_past_448", "test_store_writes_only_its_slots[16]"),
        question="scale = 0.03 and x = 3 * 2**-12 in float32: x / scale is 0.0244140625, halfway between two "
        "codes. What is x * (1 / scale), and which code does each store?",
        section="3.1",
    ),
    Mistake(
        21,
        # Any other miss of the amax rule (a scale off, a floor for the all-zero head, NaN or inf kept); the
        # strided view's own message names pitfall 15 instead.
        fails=("test_compute_scales_amax_rule",),
        messages=(r"not close|all-zero head|DID NOT RAISE|must raise",),
        question="K of 3 heads whose largest |x| are 2, 9 and 50: which elements does your compute_scales "
        "take the per-tensor amax over, what does an all-zero head get, and is the scale amax / 448?",
        section="3.4",
    ),
    Mistake(
        15,
        # A calibration view read as if contiguous: only compute_scales' strided case fails.
        fails=("test_compute_scales_amax_rule",),
        messages=(r"strided calibration view",),
        question="k = kv[..., :24] of a [2, 35, 3, 48] buffer: how many elements apart are two of its rows, "
        "and which stride does your compute_scales launch with?",
        section="3.4",
    ),
    Mistake(
        15,
        # Contiguous rows and caches hide every stride taken from another tensor or assumed.
        fails=("test_store_reads_strided_rows_and_writes_a_layer_of_a_pool",),
        # Contiguous rows and caches pass; a rounding mistake fails them too.
        passes=(
            "test_store_rounds_to_nearest_even",
            "test_store_writes_only_its_slots[16]",
            "test_store_pads_heads_and_features",
        ),
        question="key is a view of a fused qkv buffer, value one of a head-major buffer, the caches one layer "
        "of a pool: which tensor's strides does your store use for each load and each store, and where does "
        "block b of the layer start?",
        section="6",
    ),
    Mistake(
        22,
        # K's scale applied on load and folded too: logits k_scale times too small. Scales of 1 hide it.
        fails=(K_ALONE, "test_per_head_scales_follow_the_kv_head"),
        passes=(UNIFORM, EXACT_CACHE, "test_store_rounds_to_nearest_even"),
        messages=(SCALE_TWICE,),
        question="Your kernel multiplies each K code by k_scale as it loads it: where else does k_scale "
        "reach the logits, and how many times does a logit then hold it?",
        section="3.3",
    ),
    Mistake(
        22,
        # V's scale applied on load and on the output: the output v_scale times too small.
        fails=(V_ALONE, UNIFORM, "test_default_plan_per_tensor_scales"),
        passes=(K_ALONE, EXACT_CACHE),
        messages=(SCALE_TWICE,),
        question="Your kernel multiplies each V code by v_scale as it loads it: does it multiply the output "
        "by v_scale again at the end?",
        section="3.3",
    ),
    Mistake(
        15,
        # out's rows stored through q's strides (or out taken as contiguous): out is a view of a wider
        # buffer in every decode check, so every one fails, and the canary around out names the layout.
        fails=("test_q_strides_are_used",),
        messages=(OUT_STRIDES,),
        question="q is contiguous and out a view of every sequence's rows in a wider buffer: whose strides "
        "does your kernel (and your merge) store out's rows through?",
        section="6",
    ),
    Mistake(
        23,
        # Slot 0 taken for padding: only the checks whose rows use slot 0 fail, each naming it.
        fails=("test_store_*",),
        messages=(SLOT_ZERO,),
        question="slot_mapping = [0, 5, -1]: which rows are padding, and which test does your store use "
        "to skip one?",
        section="3.2",
    ),
    Mistake(
        24,
        # Only rows (of q or out) or pages past 2**31 elements show it: every small case passes.
        fails=("test_sequence_index_widened_to_int64",),
        passes=(
            "test_q_strides_are_used",
            "test_last_page_is_masked",
            "test_every_split_count_matches_unsplit",
            "test_page_sizes_gathered_token_by_token",
        ),
        question="out's rows are 1.5 * 2**30 elements apart: in which integer type does your split kernel, "
        "and your merge, compute b * stride_ob?",
        section="6",
    ),
    Mistake(
        24,
        fails=("test_page_index_widened_to_int64",),
        passes=(
            "test_q_strides_are_used",
            "test_last_page_is_masked",
            "test_every_split_count_matches_unsplit",
            "test_page_sizes_gathered_token_by_token",
        ),
        question="Block ids past 2**32 / the block stride: in which integer type does your decode compute "
        "block id * stride(0)?",
        section="6",
    ),
    Mistake(
        5,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, PAGE, heads, lengths, dtype, layouts, plan, scales and values; which of these does your store "
        "or decode handle only one at a time (a scale's stride taken for per-head scales, a stride taken "
        "from another tensor, a tile sized for another D or PAGE)?",
        section="3.4",
    ),
]
