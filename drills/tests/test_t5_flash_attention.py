"""Grader for T5, FlashAttention forward. Each test is named for the mistake it catches.

Run: make test L=t5 (your drills/mine) or make test L=t5 IMPL=solutions. Every q, k and v is a view
into a larger buffer whose rows past Nq and Nk hold NaN: a kernel that reads past the last key (an
unmasked last block) gets NaN instead of a plausible wrong answer.
"""

from __future__ import annotations

import math

import pytest
import torch

from drills import validate
from drills.compare import assert_close, assert_untouched, mismatch
from drills.grading.grader.diagnose import Mistake, returned_problem
from drills.grading.grader.report import Stage
from drills.grading.shared.bigmem import SLICE_STRIDE, free_bytes, past_int32
from drills.grading.shared.launches import (
    assert_grids_fit,
    assert_runs_a_triton_kernel,
    record_launches,
    record_loads,
)
from drills.tests import bf16_everywhere, fill_past_fp16_range, keys_past_fp16_range, seeded, sizes
from drills.tests.domain import Domain, checks_besides

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK_M": (
        "test_keys_not_a_multiple_of_the_block",
        "test_rows_past_nq_not_written",
        "test_any_block_shape",
    ),
    "BLOCK_N": (
        "test_keys_not_a_multiple_of_the_block",
        "test_last_key_block_is_masked",
        "test_any_block_shape",
        "test_keys_are_walked_block_by_block",
    ),
    "CAUSAL": ("test_last_key_block_is_masked", "test_causal_is_aligned_bottom_right"),
    "D": ("test_head_dims",),  # 16 to 256, the widest the launcher admits
    "GROUP": ("test_kv_head_grouping_is_contiguous",),
    "MASKED": ("test_last_key_block_is_masked", "test_any_block_shape"),
    "STORE_LSE": ("test_lse_is_natural_log", "test_keys_not_a_multiple_of_the_block"),  # with and without
    # True for views whose rows lie past 2**31 elements apart (q alone, K and V, V alone), False elsewhere.
    "ROWS_INT64": ("test_batch_and_head_offsets_widened_to_int64", "test_head_dims"),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}

DIMS = ("b", "head", "query", "d")  # how a mismatch names its position

# What flash_attention admits, at its boundaries (drills/validate.py's head dims, so the domain cannot
# drift from the launcher): test_pairwise_domain_cases_match_the_oracle crosses every pair of them.
_D_LO, _D_HI = validate.HEAD_DIM_RANGE
DOMAIN = Domain(
    axes=dict(
        D=(_D_LO, _D_HI),  # the narrowest and the widest head dim: one D tile of 256
        heads=((2, 2), (3, 1), (4, 2)),  # (H, Hkv): MHA, MQA with GROUP 3, GROUP 2 (interleaving shows)
        # (Nq, Nk): one of each, Nq < Nk, Nq > Nk (its first rows see no key)
        lengths=((1, 1), (17, 40), (40, 17)),
        B=(1, 2),
        causal=(False, True),
        dtype=(torch.float16, torch.bfloat16),
        layout=("nan_padded_views", "heads_last", "v_heads_last"),  # v_heads_last: V's strides unlike K's
        scale=(None, 0.3),
        lse=(False, True),
    ),
)
LSE_DIMS = ("b", "head", "query")
PAD = 128  # NaN rows after the last query and the last key: more than any BLOCK_M or BLOCK_N
CANARY = 1234.5  # exactly representable in fp16, bf16 and fp32
# lse is fp32 computed from exact fp16 products: only the summation order and exp2/log2 differ.
LSE_TOL = dict(atol=1e-3, rtol=1e-4, rel=1e-4)


def make_qkv(B, H, Hkv, Nq, Nk, D, dtype=torch.float16, device="cpu", stream=0, heads_last=False):
    """Random q [B, H, Nq, D] and k, v [B, Hkv, Nk, D], each a view into a NaN-padded buffer.
    heads_last: the buffers are [B, N, heads, D] (as a fused QKV projection leaves them), so the views
    have strides (N * heads * D, D, heads * D, 1) instead of the contiguous ones."""
    gen = torch.Generator().manual_seed(seeded(stream))

    def one(heads, n):
        shape = (B, n + PAD, heads, D) if heads_last else (B, heads, n + PAD, D)
        buf = torch.full(shape, float("nan"), dtype=dtype, device=device)
        view = buf[:, :n].transpose(1, 2) if heads_last else buf[:, :, :n]  # [B, heads, n, D]
        view.copy_(torch.randn(B, heads, n, D, generator=gen).to(dtype))
        return view

    return one(H, Nq), one(Hkv, Nk), one(Hkv, Nk)


def packed_qkv(B, H, Hkv, N, D, device="cpu", stream=0):
    """q [B, H, N, D] and k, v [B, Hkv, N, D] as the three parts of one fused QKV projection's output
    [B, N, (H + 2 Hkv) * D], each viewed as [B, heads, N, D]: strides (N W, D, W, 1) with W = (H + 2 Hkv) D,
    none of them what a contiguous tensor would have. Nothing follows the buffer, so the last batch's
    rows end at its last element: a load of a row past N reads outside every tensor."""
    gen = torch.Generator().manual_seed(seeded(stream))
    W = (H + 2 * Hkv) * D
    buf = torch.randn(B, N, W, generator=gen).to(torch.float16).to(device)  # [B, N, W]

    def part(start, heads):
        return (
            buf[..., start * D : (start + heads) * D].view(B, N, heads, D).transpose(1, 2)
        )  # [B, heads, N, D]

    return part(0, H), part(H, Hkv), part(H + Hkv, Hkv)


def attention_reference(q, k, v, causal=False, scale=None):
    """fp32 oracle: the full score matrix, masked, softmaxed. Returns (out [B, H, Nq, D], lse [B, H, Nq]).
    A row that sees no key (Nq > Nk, causal) gets out = 0 and lse = -inf."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k = k.float().repeat_interleave(H // Hkv, dim=1)  # [B, H, Nk, D]: head h uses KV head h // GROUP
    v = v.float().repeat_interleave(H // Hkv, dim=1)
    s = q.float() @ k.transpose(-1, -2) * scale  # [B, H, Nq, Nk]
    if causal:
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Nk - Nq, float("-inf"))  # bottom-right: the last query sees every key
    lse = torch.logsumexp(s, dim=-1)  # [B, H, Nq]
    p = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)  # an all -inf row gives 0/0: weight 0
    return p @ v, lse


def launch_into_canary(impl, q, k, v, causal, scale, config=None):
    """Run the kernel through the launcher with out and lse views into canary-filled buffers (spare
    rows after each head's Nq rows, a spare head and batch on each side), and check that nothing
    outside them changed. Returns (out [B, H, Nq, D], lse [B, H, Nq])."""
    B, H, Nq, D = q.shape
    out_buf = torch.full((B + 2, H + 2, Nq + 2 * PAD, D), CANARY, dtype=q.dtype, device=q.device)
    lse_buf = torch.full((B + 2, H + 2, Nq + 2 * PAD), CANARY, dtype=torch.float32, device=q.device)
    out = out_buf[
        1 : B + 1, 1 : H + 1, PAD : PAD + Nq
    ]  # [B, H, Nq, D], stride(2) = D, stride(1) = (Nq + 2 PAD) D
    lse = lse_buf[1 : B + 1, 1 : H + 1, PAD : PAD + Nq]  # [B, H, Nq]
    impl._launch(q, k, v, causal, scale, out, lse, config=config)
    for buf, name in ((out_buf, "out"), (lse_buf, "lse")):
        keep = torch.zeros(buf.shape, dtype=torch.bool, device=buf.device)
        keep[1 : B + 1, 1 : H + 1, PAD : PAD + Nq] = True
        assert_untouched(
            buf,
            CANARY,
            keep,
            f"the buffer around {name} (rows past Nq stored?)",
            ("b+1", "head+1", f"query+{PAD}", "d")[: buf.dim()],
        )
    return out, lse


def attend(impl, q, k, v, causal=False, scale=None, return_lse=False):
    """Your flash_attention's result, after a first run into canary buffers: a store past the last
    query row is reported there instead of corrupting memory past flash_attention's tight allocation."""
    first, _ = launch_into_canary(
        impl, q, k, v, causal, 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    )
    result = impl.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    spec = (("out", q.shape, q.dtype),) + ((("lse", q.shape[:3], torch.float32),) if return_lse else ())
    wrong = returned_problem("flash_attention", result, spec)
    assert wrong is None, wrong
    out = result[0] if return_lse else result
    assert_close(out, first.float(), DIMS)  # the public function runs the same kernel
    return result


def check(impl, q, k, v, causal=False, scale=None, **tol):
    out = attend(impl, q, k, v, causal, scale)
    ref, _ = attention_reference(q, k, v, causal, scale)
    assert_close(out, ref, DIMS, **tol)
    return out


def assert_lse_close(lse, ref_lse):
    """Rows that see no key must be exactly -inf; every other row within LSE_TOL."""
    empty = ref_lse == float("-inf")
    assert not torch.isnan(lse).any(), "NaN in lse"
    bad = empty & (lse != float("-inf"))
    assert not bad.any(), f"{int(bad.sum())} rows that see no key have lse != -inf, e.g. {lse[bad][0].item()}"
    assert_close(lse.masked_fill(empty, 0.0), ref_lse.masked_fill(empty, 0.0), LSE_DIMS, **LSE_TOL)


# --- Section 2 "By hand": the 4 x 2 worked example through your kernel --------------------------------

EXAMPLE_Q = [[1, 0], [0, 1], [1, 1], [0, 0]]
EXAMPLE_K = [[1, 1], [0, 1], [1, 0], [0, 0]]
EXAMPLE_V = [[1, 0], [0, 1], [1, 1], [0, 0]]
EXAMPLE_SCALE = 1 / math.sqrt(2)  # the worked example's d = 2, kept when D is padded to 16


def example_tensors(device, rows=4, keys=4):
    """The worked example's first `rows` queries and first `keys` keys and values as [1, 1, n, 16]: D = 2 padded
    with 14 zero columns, which add 0 to every score and give 0 in the padded output columns (tl.dot
    needs D >= 16). Each is a view into a buffer with NaN rows after the worked example's 4, as in make_qkv."""

    def pad(m, n):
        buf = torch.full((1, 1, len(m) + PAD, 16), float("nan"), dtype=torch.float16, device=device)
        buf[:, :, : len(m)] = 0.0
        buf[0, 0, : len(m), :2] = torch.tensor(m, dtype=torch.float16)
        return buf[:, :, :n]

    return pad(EXAMPLE_Q, rows), pad(EXAMPLE_K, keys), pad(EXAMPLE_V, keys)


def test_worked_example_O1_to_three_decimals(impl, runtime):
    """O1 (the outputs of Q1 = Q[0:2]) ~ [[0.670, 0.500], [0.500, 0.500]]; the padded columns stay 0."""
    q, k, v = example_tensors(runtime.device)
    out = attend(impl, q, k, v, scale=EXAMPLE_SCALE)  # [1, 1, 4, 16]
    o1 = out[0, 0, :2, :2].float().cpu()
    assert torch.equal(torch.round(o1 * 1000), torch.tensor([[670.0, 500.0], [500.0, 500.0]])), (
        f"O1 = {o1.tolist()}, the hand iteration gives [[0.670, 0.500], [0.500, 0.500]]"
    )
    assert (out[..., 2:] == 0).all(), "zero-padded V columns must give zero output columns"
    ref, _ = attention_reference(q, k, v, scale=EXAMPLE_SCALE)
    assert_close(out, ref, DIMS)


def test_worked_example_state_after_each_key_block(impl, runtime):
    """The worked example's (m, l, O) after K1 and after K2, recovered from your kernel's lse and output:
    running on keys 0..1 only gives the state after K1; l = e^(lse - m), unnormalised O = out * l."""
    m = EXAMPLE_SCALE  # 0.707 in both rows, after K1 and after K2
    hand = {  # keys seen -> (l, unnormalised O), from the explainer's section 2
        2: ([1.493, 2.000], [[1.000, 0.493], [1.000, 1.000]]),
        4: ([2.986, 2.986], [[2.000, 1.493], [1.493, 1.493]]),
    }
    for n_keys, (l_hand, o_hand) in hand.items():
        q, k, v = example_tensors(runtime.device, rows=2, keys=n_keys)
        out, lse = attend(impl, q, k, v, scale=EXAMPLE_SCALE, return_lse=True)
        l = torch.exp(lse[0, 0].cpu() - m)  # [2]
        o = out[0, 0, :, :2].float().cpu() * l[:, None]  # [2, 2]
        after = "K1" if n_keys == 2 else "K2"
        assert torch.allclose(l, torch.tensor(l_hand), atol=2e-3), (
            f"l after {after} = {l.tolist()}, hand {l_hand}"
        )
        assert torch.allclose(o, torch.tensor(o_hand), atol=3e-3), (
            f"O after {after} = {o.tolist()}, hand {o_hand}"
        )


# --- Section 3 "The kernel": blocks, masks, strides, the online softmax ------------------------------


@pytest.mark.parametrize("Nq,Nk", [(37, 100), (5, 17), (1, 1), (40, 33)])
def test_keys_not_a_multiple_of_the_block(impl, runtime, Nq, Nk):
    """Nq and Nk that no block size divides: the last query block and the last key block are partial."""
    q, k, v = make_qkv(1, 2, 2, Nq, Nk, 64, device=runtime.device, stream=Nq * 1000 + Nk)
    check(impl, q, k, v)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_last_key_block_is_masked(impl, runtime, causal):
    """Keys past Nk must score -inf, not merely load as zeros: here every real score is negative, so a
    zero-filled key (score 0) would outweigh all of them. (Reading them unmasked reads NaN.)"""
    q, k, v = make_qkv(1, 2, 2, 20, 35, 64, device=runtime.device, stream=3)
    q.copy_(q.abs())
    k.copy_(-k.abs())
    check(impl, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_k_is_read_through_its_strides(impl, runtime, causal):
    """q, k, v as [B, N, heads, D] buffers viewed as [B, heads, N, D]: only the last dimension is
    contiguous. A kernel that assumes contiguous tensors, or swaps K's strides, reads other elements."""
    q, k, v = make_qkv(2, 2, 2, 33, 50, 64, device=runtime.device, stream=5, heads_last=True)
    assert not q.is_contiguous() and k.stride(2) == 2 * 64 and q.stride(2) == 2 * 64
    check(impl, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_q_k_v_are_read_through_their_strides(impl, runtime, causal):
    """q, k and v sliced out of one packed QKV buffer [B, N, (H + 2 Hkv) D]: every stride but the last
    differs from a contiguous tensor's (rows (H + 2 Hkv) D elements apart, heads D apart, batches N rows
    apart). A kernel that computes an offset from the shape instead of the strides reads other rows,
    heads or batches. The last query block of the last batch is partial and nothing follows the buffer."""
    q, k, v = packed_qkv(2, 2, 2, 45, 32, device=runtime.device, stream=67)
    assert q.stride(2) == 6 * 32 and k.stride(1) == 32 and not k.is_contiguous()
    check(impl, q, k, v, causal=causal)


def test_v_is_read_through_its_own_strides(impl, runtime):
    """k contiguous [B, Hkv, N, D] and v a heads-last view of a [B, N, Hkv, D] buffer (the layout a
    cache that stores V apart from K may have): every case above gives v k's layout, so a kernel that
    walks V with K's strides passed them. Here v's rows are Hkv * D apart and k's D apart, and v's
    batches lie 8 rows further apart than k's (its buffer holds 8 more NaN rows a batch), so each of
    V's three strides taken from K reads the wrong elements of V."""
    q, k, _ = make_qkv(2, 4, 2, 17, 40, 64, device=runtime.device, stream=73)
    _, _, values = make_qkv(2, 4, 2, 17, 40, 64, device=runtime.device, stream=74, heads_last=True)
    B, Hkv, Nk, D = values.shape
    buffer = torch.full((B, Nk + PAD + 8, Hkv, D), float("nan"), dtype=values.dtype, device=values.device)
    v = buffer[:, :Nk].transpose(1, 2)  # [B, Hkv, Nk, D], strides ((Nk + PAD + 8) Hkv D, D, Hkv D, 1)
    v.copy_(values)
    assert all(sk != sv for sk, sv in zip(k.stride()[:3], v.stride()[:3])), (k.stride(), v.stride())
    check(impl, q, k, v, causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_running_max_starts_at_minus_inf(impl, runtime, causal):
    """Every score is near -128 (q and k point in opposite directions). The running max must start at
    -inf: started at 0, it stays 0, every exp2(s - 0) underflows to 0 (2^-184 is below fp32's smallest
    number), and the output is 0 (with lse 0). Any start value at all is harmless as long as it is not
    above the scores, which is why only scores this far below zero show it."""
    q, k, v = make_qkv(1, 2, 2, 20, 50, 64, device=runtime.device, stream=71)
    q[..., 0] = 32.0
    k[..., 0] = -32.0  # q . k = -1024 + (63 random products), times 1/8
    scores = q.float() @ k.float().transpose(-1, -2) / 8.0  # [1, 2, 20, 50]
    assert (scores < -100).all(), "the case must have every score below -100"
    check(impl, q, k, v, causal=causal)


def test_online_softmax_rescales_old_blocks(impl, runtime):
    """Scores rise with the key position, so the running max grows block after block: dropping the
    rescale factor alpha = exp2(m_old - m_new) leaves early blocks over-weighted by up to e^11."""
    Nq, Nk, D = 20, sizes(runtime, 90, 1000), 64
    q, k, v = make_qkv(1, 1, 1, Nq, Nk, D, device=runtime.device, stream=7)
    q0 = q[0, 0, 0].float()  # [D]; every query row is close to it
    q.copy_((q0 + 0.1 * q[0, 0].float()).to(q.dtype))
    ramp = torch.linspace(0.5, 12.0, Nk, device=runtime.device)[:, None]  # score of key j
    k[0, 0] = (0.2 * k[0, 0].float() + ramp * math.sqrt(D) * q0 / q0.dot(q0)).to(k.dtype)
    check(impl, q, k, v)


def test_scale_is_applied(impl, runtime):
    """The default scale is 1 / sqrt(D), folded with log2(e) into the scores; an explicit one replaces it."""
    q, k, v = make_qkv(1, 2, 2, 24, 40, 128, device=runtime.device, stream=9)
    check(impl, q, k, v)
    check(impl, q, k, v, scale=0.3)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_output_is_normalised_by_the_softmax_sum(impl, runtime, causal):
    """With every V row equal to 1 the output is exactly 1, whatever the scores: the weights sum to 1.
    Forgetting acc / l leaves l (>= 1) in the output."""
    q, k, v = make_qkv(1, 2, 2, 30, 50, 64, device=runtime.device, stream=11)
    v.fill_(1.0)
    out = attend(impl, q, k, v, causal)
    # Every output the default scale 1 / sqrt(64) where 1 belongs: the weights sum to 1, and the scale
    # multiplied what came out of the softmax instead of the scores going in.
    assert not torch.allclose(out.float(), torch.full(out.shape, 0.125, device=out.device), atol=2e-3), (
        "every output is 0.125, the softmax scale 1 / sqrt(D), where the weights of each row sum to 1 and "
        "every V row is 1: the scale multiplies the output (after the softmax) instead of the scores q . k "
        "before it (section 3.3 folds it into qk_scale)"
    )
    assert_close(out, attention_reference(q, k, v, causal)[0], DIMS)
    assert_close(out, torch.ones(out.shape), DIMS)


@pytest.mark.parametrize(
    "causal,Nq,Nk",
    [(False, 37, 100), (True, 37, 100), (True, 100, 37)],
    ids=["noncausal", "causal", "causal-rows-that-see-no-key"],
)
def test_lse_is_natural_log(impl, runtime, causal, Nq, Nk):
    """lse must be log(sum(exp(scaled masked scores))) in base e: the kernel works in base 2 (exp2), so
    its m + log2(l) must be multiplied by ln 2 on the way out. A row that sees no key (Nq > Nk,
    causal) has lse = -inf. GQA here (H = 2, Hkv = 1), as everywhere in the last stage."""
    q, k, v = make_qkv(2, 2, 1, Nq, Nk, 64, device=runtime.device, stream=13 + Nq)
    out, lse = attend(impl, q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3], f"lse: {lse.dtype} {tuple(lse.shape)}"
    assert_lse_close(lse, ref_lse)
    assert_close(out, ref, DIMS)


PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (D = 256 with
    GQA, causal with Nq > Nk and V's strides unlike K's, lse in bf16...): a kernel right on each bound
    alone can still be wrong where two meet. A failure names the case's values."""

    def run(c):
        (H, Hkv), (Nq, Nk) = c["heads"], c["lengths"]
        shape = (c["B"], H, Hkv, Nq, Nk, c["D"])
        q, k, v = make_qkv(
            *shape, c["dtype"], runtime.device, stream=405, heads_last=c["layout"] == "heads_last"
        )
        if c["layout"] == "v_heads_last":
            _, _, v = make_qkv(*shape, c["dtype"], runtime.device, stream=406, heads_last=True)
        ref, ref_lse = attention_reference(q, k, v, c["causal"], c["scale"])
        if c["lse"]:  # through flash_attention(return_lse=True), after a run into canary buffers
            out, lse = attend(impl, q, k, v, c["causal"], c["scale"], return_lse=True)
            assert_lse_close(lse, ref_lse)
        else:  # one launch, into canary buffers (its lse is not asked for)
            scale = 1.0 / math.sqrt(c["D"]) if c["scale"] is None else c["scale"]
            out, _ = launch_into_canary(impl, q, k, v, c["causal"], scale)
        assert_close(out, ref, DIMS)

    DOMAIN.check_each(DOMAIN.cases(stream=405), run)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("Nq,Nk", [(37, 100), (100, 37)])
def test_rows_past_nq_not_written(impl, runtime, causal, Nq, Nk):
    """The last query block has rows past Nq; storing them writes into the next head's rows or past
    the end of out. out and lse are views into canary-filled buffers (every other test does the same
    first, through `attend`, before it calls flash_attention). lse is stored through the same mask;
    test_lse_is_natural_log checks its values."""
    q, k, v = make_qkv(2, 2, 2, Nq, Nk, 64, device=runtime.device, stream=Nq + causal)
    out, _ = launch_into_canary(impl, q, k, v, causal, 0.125)
    assert_close(out, attention_reference(q, k, v, causal)[0], DIMS)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("config", [(16, 16), (16, 32), (64, 16)], ids=lambda c: f"M{c[0]}xN{c[1]}")
def test_any_block_shape(impl, runtime, config, causal):
    """BLOCK_M and BLOCK_N are independent: with BLOCK_M > BLOCK_N several key blocks cross one query
    block's diagonal; with BLOCK_M < BLOCK_N one key block crosses several query blocks' diagonals."""
    q, k, v = make_qkv(1, 2, 2, 45, 77, 64, device=runtime.device, stream=17)
    out, _ = launch_into_canary(impl, q, k, v, causal, 0.125, config=(*config, 4, 2))
    assert_close(out, attention_reference(q, k, v, causal)[0], DIMS)


def test_diagonal_at_every_alignment(impl, runtime):
    """Causal, 20 queries against 16 to 35 keys in 16 x 16 blocks: the shift Nk - Nq takes every value
    from -4 to 15, so each query block's first row's last key (where the unmasked loop must stop) and its
    last row's last key (where the masked loop must stop) fall at every offset from a key-block boundary.
    A range one key long (full_end from m0 + shift + 2) or one key short (hi from m0 + BLOCK_M - 1 +
    shift) is right at 15 of 16 offsets, so the fixed shapes of the other checks can all miss it."""
    Nq, D = 20, 16
    for Nk in range(Nq - 4, Nq + 16):
        q, k, v = make_qkv(1, 1, 1, Nq, Nk, D, device=runtime.device, stream=211 + Nk)
        out, _ = launch_into_canary(impl, q, k, v, True, 0.25, config=(16, 16, 4, 1))
        problem = mismatch(out, attention_reference(q, k, v, True, 0.25)[0], DIMS)
        assert problem is None, f"Nq = {Nq}, Nk = {Nk} (shift {Nk - Nq}), 16 x 16 blocks:\n{problem}"


def blocks_above_the_diagonal(impl, runtime, Nq, Nk, config=(16, 16, 4, 1)):
    """Causal, B = H = 1, D = 16: for each program, its last query row (from the rows of q it loads) and
    every load of K or V whose keys all lie past that row's last visible key (i + Nk - Nq). Returns a
    description of the first such load, or None (also where loads are not seen: a GPU)."""
    q, k, v = make_qkv(1, 1, 1, Nq, Nk, 16, device=runtime.device, stream=223 + Nk)
    with record_loads(impl, q, k, v) as loads:
        launch_into_canary(impl, q, k, v, True, 0.25, config=config)
    if loads is None:
        return None
    last_row = loads.last_rows(0, 2, Nq)  # (launch, program) -> its last query row
    for load in loads.loads:
        key = (load.launch, load.program)
        if load.target == 0 or key not in last_row:
            continue
        keys = loads.indices(load, 2)
        last_key = last_row[key] + Nk - Nq  # the last key that program's last row may see
        if keys and min(keys) > last_key:
            name = "K" if load.target == 1 else "V"
            return (
                f"Nq = {Nq}, Nk = {Nk}, causal, blocks {config[0]} x {config[1]}: the program {load.program} "
                f"whose last query row is {last_row[key]} (it may see keys up to {last_key}) loaded {name} "
                f"rows {min(keys)} to {max(keys)}, a key block wholly above its diagonal; masked to -inf, "
                "its scores change no output, and on a GPU loading and multiplying it costs that program "
                "as much as a block it needs (about twice the arithmetic of causal attention in all): end "
                "the key loop at the last row's diagonal (hi = m0 + BLOCK_M + Nk - Nq, at most Nk)"
            )
    return None


def test_causal_skips_key_blocks_above_the_diagonal(impl, runtime):
    """Causal attention's output is the same whether a query block stops its key loop at its last row's
    diagonal or walks every key and masks the rest: only the loads tell. No program may load a block of
    K or V whose keys every row of it is masked from (the last query block legitimately loads them all).
    Square, and with a cached prefix (Nq < Nk): one small launch each, its loads recorded per program."""
    if not runtime.interpreter:
        pytest.skip("the loads of each program are seen under the interpreter only")
    for Nq, Nk in ((64, 64), (40, 72)):
        problem = blocks_above_the_diagonal(impl, runtime, Nq, Nk)
        assert problem is None, problem


def test_keys_are_walked_block_by_block(impl, runtime):
    """FlashAttention walks the keys in blocks of BLOCK_N with an online softmax; one tile that holds
    every key (BLOCK_N = next_pow2(Nk), a plain softmax) is right for short sequences and cannot run
    long ones (its tile grows with Nk). The launch must use the config it is given, and by default a
    BLOCK_N smaller than a sequence of a few hundred keys: several key blocks per query block."""
    q, k, v = make_qkv(1, 2, 2, 45, 77, 64, device=runtime.device, stream=73)
    with record_launches(impl) as launches:
        launch_into_canary(impl, q, k, v, False, 0.125, config=(16, 16, 4, 1))
    kernels = [c for c in launches.calls if c.name == "flash_attention_kernel"]
    assert kernels, "_launch did not launch flash_attention_kernel"
    for c in kernels:
        blocks = (c.constexprs.get("BLOCK_M"), c.constexprs.get("BLOCK_N"))
        assert blocks == (16, 16), (
            f"_launch was given config (16, 16, 4, 1) for Nk = 77 but launched "
            f"BLOCK_M, BLOCK_N = {blocks}: the launch must use the config it is given"
        )
        assert c.grid in ((), (6, 1, 1)), (
            f"grid {c.grid} for Nq = 45, BLOCK_M = 16, B * H = 2; expected (6, 1, 1): 3 query blocks "
            "times 2 heads, on one axis"
        )
    Nk = sizes(runtime, 100, 1000)
    q, k, v = make_qkv(1, 2, 2, 64, Nk, 64, device=runtime.device, stream=79)
    with record_launches(impl) as launches:
        impl.flash_attention(q, k, v)
    kernels = [c for c in launches.calls if c.name == "flash_attention_kernel"]
    assert kernels, "flash_attention did not launch flash_attention_kernel"
    for c in kernels:
        assert c.constexprs.get("BLOCK_N", Nk) < Nk, (
            f"BLOCK_N = {c.constexprs.get('BLOCK_N')} for Nk = {Nk}: one key block holds every key, so "
            "nothing is walked block by block (the default config is _config(D))"
        )


# --- Section 3.5 "Causal" -----------------------------------------------------------------------------


@pytest.mark.parametrize("Nq,Nk", [(37, 100), (37, 37), (64, 64), (1, 50), (70, 45)])
def test_causal_is_aligned_bottom_right(impl, runtime, Nq, Nk):
    """Query i sees keys j <= i + Nk - Nq: with Nq < Nk the queries are the last Nq positions (a chunk
    of a prompt after a cached prefix), so the last query sees every key. Top-left alignment
    (j <= i) agrees only when Nq == Nk."""
    q, k, v = make_qkv(1, 2, 2, Nq, Nk, 64, device=runtime.device, stream=19 + Nq + Nk)
    check(impl, q, k, v, causal=True)


def test_first_causal_row_sees_only_key_0(impl, runtime):
    """With Nq == Nk, query 0 sees key 0 alone: its output is exactly V[0]. A mask written j < i
    leaves it nothing (0 or NaN); one written j <= i + 1 lets it see key 1."""
    q, k, v = make_qkv(1, 2, 2, 40, 40, 64, device=runtime.device, stream=23)
    out = check(impl, q, k, v, causal=True)
    assert_close(out[:, :, 0], v[:, :, 0].float(), ("b", "head", "d"))


@pytest.mark.parametrize("Nq,Nk", [(100, 37), (50, 1)])
def test_fully_masked_rows_are_zero_not_nan(impl, runtime, Nq, Nk):
    """Nq > Nk, causal: the first Nq - Nk queries see no key at all. Their output must be 0 and their
    lse -inf (test_lse_is_natural_log checks it), never NaN (m = -inf makes exp2(m - m_new) and acc / l
    both 0/0 if unguarded). The rows after them see 1, 2, ... keys: query Nq - Nk sees key 0 alone."""
    q, k, v = make_qkv(1, 2, 2, Nq, Nk, 64, device=runtime.device, stream=29 + Nk)
    out = attend(impl, q, k, v, causal=True)
    empty = Nq - Nk
    assert not torch.isnan(out).any(), "NaN in out: a row that sees no key divided 0 by 0"
    assert (out[:, :, :empty] == 0).all(), "rows that see no key must be 0"
    assert_close(out[:, :, empty], v[:, :, 0].float(), ("b", "head", "d"))
    ref, _ = attention_reference(q, k, v, causal=True)
    assert_close(out, ref, DIMS)


def test_negative_causal_shift_is_not_clamped(impl, runtime):
    """Nq = 70 > Nk = 45: the shift Nk - Nq = -25 is negative, and query i sees keys j <= i - 25. Clamped
    to 0 it becomes the top-left rule j <= i: the first 25 rows see keys they must not, and every later
    row sees 25 keys too many. Only the rows that see at least one key are compared here (rows 25-69);
    the empty ones are test_fully_masked_rows_are_zero_not_nan's."""
    Nq, Nk = 70, 45
    q, k, v = make_qkv(1, 2, 2, Nq, Nk, 64, device=runtime.device, stream=83)
    out, _ = launch_into_canary(impl, q, k, v, True, 0.125)  # lse has its own test (test_lse_is_natural_log)
    ref, _ = attention_reference(q, k, v, causal=True, scale=0.125)
    seen = slice(Nq - Nk, Nq)
    assert_close(out[:, :, Nq - Nk], v[:, :, 0].float(), ("b", "head", "d"))
    assert_close(out[:, :, seen], ref[:, :, seen], ("b", "head", "query-25", "d"))


# --- Layout: heads, head dims, dtypes, sizes -----------------------------------------------------


@pytest.mark.parametrize(
    "H,Hkv,causal",
    [(8, 8, False), (8, 4, False), (6, 2, False), (9, 3, False), (8, 2, False), (8, 1, False), (8, 2, True)],
    ids=["group1-MHA", "group2", "group3", "group3x3", "group4", "group8-MQA", "group4-causal"],
)
def test_kv_head_grouping_is_contiguous(impl, runtime, H, Hkv, causal):
    """Query head h reads KV head h // GROUP, not h % Hkv (interleaved). The checks of the first two
    stages have H = Hkv; here H > Hkv, and once with the causal mask. GROUP = 3 (H = 6 or 9) is not a
    power of two: a GROUP rounded up to 4 gives query heads 4-7 KV head 1, not heads 3-5."""
    q, k, v = make_qkv(1, H, Hkv, 21, 40, 32, device=runtime.device, stream=31 + Hkv)
    check(impl, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("D", [16, 32, 64, 128, 256])
def test_head_dims(impl, runtime, D, causal):
    q, k, v = make_qkv(1, 2, 2, 19, 35, D, device=runtime.device, stream=37 + D)
    check(impl, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype, causal):
    """out in q's dtype; lse (fp32 whatever the dtype) is test_lse_is_natural_log's, and on a GPU
    test_long_sequences'."""
    B, H, Hkv, Nq, Nk = sizes(runtime, (1, 2, 2, 30, 50), (2, 4, 4, 700, 1500))
    q, k, v = make_qkv(B, H, Hkv, Nq, Nk, 128, dtype=dtype, device=runtime.device, stream=41)
    out = attend(impl, q, k, v, causal=causal)
    assert out.dtype == dtype
    assert_close(out, attention_reference(q, k, v, causal)[0], DIMS)


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_out_keeps_the_range_of_its_dtype(impl, runtime, dtype):
    """Every V element is 2^16 (bf16) or 2^13 (fp16) x (1 + |randn|) (fill_past_fp16_range), so every output element is too. bf16 outputs
    from 65536 up hold in bf16 and not in fp16 (largest 65504): a kernel that casts to tl.float16 where
    the tensors' own dtype belongs (p before P V, or out before the store) turns them into inf, or does
    not compile (tl.dot of fp16 p by bf16 v). The fp16 case is the same check inside fp16's range. Last,
    K from 2^16 up (bf16) with q scaled down to keep the scores: q and K cast to tl.float16 for the
    score dot turn them into inf."""
    q, k, v = make_qkv(1, 2, 2, 30, 50, 64, dtype=dtype, device=runtime.device, stream=89)
    fill_past_fp16_range(v)
    ref, _ = attention_reference(q, k, v, scale=0.125)
    out, _ = launch_into_canary(impl, q, k, v, False, 0.125)  # compared first: an inf here says so
    assert_close(out, ref, DIMS)
    out = impl.flash_attention(q, k, v)
    assert out.dtype == dtype, f"out is {out.dtype}, q is {dtype}"
    assert_close(out, ref, DIMS)
    q, k, v = make_qkv(1, 2, 2, 30, 50, 64, dtype=dtype, device=runtime.device, stream=90)
    keys_past_fp16_range(k, q)  # q . k as before, K past fp16's range in bf16
    out, _ = launch_into_canary(impl, q, k, v, False, 0.125)
    try:
        assert_close(out, attention_reference(q, k, v, scale=0.125)[0], DIMS)
    except AssertionError as e:
        raise AssertionError(f"K from 2^16 up in bf16 (q scaled down to keep the scores): {e}") from None


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_long_sequences(impl, runtime, causal):
    """GPU only: sequences of thousands of tokens, many query blocks and key blocks, with GQA."""
    if runtime.interpreter:
        pytest.skip("GPU only: thousands of tokens take minutes in the Triton interpreter")
    for B, H, Hkv, Nq, Nk, D in [
        (2, 8, 2, 2048, 2048, 128),
        (1, 4, 4, 1000, 3001, 64),
        (1, 8, 1, 4096, 4096, 64),
    ]:
        q, k, v = make_qkv(B, H, Hkv, Nq, Nk, D, device=runtime.device, stream=Nq + Nk)
        out, lse = attend(impl, q, k, v, causal=causal, return_lse=True)
        ref, ref_lse = attention_reference(q, k, v, causal)
        assert_close(out, ref, DIMS)
        assert_lse_close(lse, ref_lse)


# --- Offsets past 2**31 elements, on sparse buffers -----------------------------------------------


def slices_past_int32(n, D, axis, device, stream):
    """A [3, 1, n, D] (axis "batch") or [1, 3, n, D] (axis "head") fp16 view of random values whose
    batches or heads lie SLICE_STRIDE elements apart, WRAP elements into a buffer of zeros, and the
    buffer: slice 2 starts past element 2**31 of the view, and where an int32 offset would put it (the
    buffer's first n * D elements) reads zeros. On the CPU the buffer is a sparse file."""
    flat, wrap = past_int32(n * D, torch.float16, device)
    shape, strides = ((3, 1, n, D), (SLICE_STRIDE, n * D, D, 1))
    if axis == "head":
        shape, strides = ((1, 3, n, D), (3 * SLICE_STRIDE, SLICE_STRIDE, D, 1))
    if axis == "token":  # three tokens SLICE_STRIDE apart: token 2's row times its stride passes 2**31
        shape, strides = ((1, 1, 3, D), (3 * SLICE_STRIDE, 3 * SLICE_STRIDE, SLICE_STRIDE, 1))
    view = flat.as_strided(shape, strides, wrap)
    gen = torch.Generator().manual_seed(seeded(stream))
    view.copy_(torch.randn(shape, generator=gen).to(torch.float16))
    return view


# Which of q, k and v lie far apart, by case: a launcher that decides on int64 row offsets from some
# tensors' strides (q's alone, K's and V's alone, K's for V) must meet a case where only the others are.
# "out_token": only out, a view given to _launch (its docstring admits one), so a decision that reads
# q's, K's and V's strides but not out's stores its row 2 before the tensor.
FAR_ROWS = {"token": "qkv", "key_token": "kv", "value_token": "v", "query_token": "q", "out_token": "out"}


@pytest.mark.parametrize("axis", ["batch", "head", *FAR_ROWS])
def test_batch_and_head_offsets_widened_to_int64(impl, runtime, axis):
    """q, k and v with batches (or heads) 2**30 + 2**20 elements apart: batch 2's (head 2's) rows start
    past element 2**31, so b * stride_qb (h * stride_qh) computed in int32 wraps to a negative offset
    and reads zeros from 2**31 - 2**21 elements before the tensor. "token": three query and three key
    tokens that far apart (rows of one layer in a large pool), so a row index times stride_qm, stride_kn
    or stride_vn wraps the same way; "key_token", "value_token" and "query_token": only K and V, only V,
    or only q, so; "out_token": only out, whose row index times stride_om wraps on the store."""
    if runtime.interpreter and free_bytes() < 2**30:
        pytest.skip(
            f"needs about 1 GB of free memory for the touched pages and the interpreter; "
            f"{free_bytes() / 2**30:.1f} GB free"
        )
    far = FAR_ROWS.get(axis, "qkv")
    Nq, Nk, D = (3, 3, 16) if axis in FAR_ROWS else (20, 40, 16)

    def operand(name, n, stream):  # (1, 1, n, D) compact, or the case's far-apart view
        if name in far:
            return slices_past_int32(n, D, "token" if axis in FAR_ROWS else axis, runtime.device, stream)
        gen = torch.Generator().manual_seed(seeded(stream))
        return torch.randn((1, 1, n, D), generator=gen).to(torch.float16).to(runtime.device)

    q, k, v = operand("q", Nq, 31), operand("k", Nk, 32), operand("v", Nk, 33)
    if far == "out":  # flash_attention allocates a compact out: a far-apart one goes through _launch
        out = slices_past_int32(Nq, D, "token", runtime.device, 34)  # random: a row never stored shows
        lse = torch.full((1, 1, Nq), float("nan"), dtype=torch.float32, device=runtime.device)
        impl._launch(q, k, v, False, 1.0 / math.sqrt(D), out, lse)
    else:
        out, lse = impl.flash_attention(q, k, v, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v)
    assert_close(out, ref, DIMS)
    assert_lse_close(lse, ref_lse)


def test_returns_fresh_contiguous_out_and_lse(impl, runtime):
    """out is [B, H, Nq, D] in q's dtype (contiguous even when q is not); with return_lse, (out, lse)."""
    q, k, v = make_qkv(1, 2, 1, 9, 20, 64, device=runtime.device, stream=43, heads_last=True)
    out = attend(impl, q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    # q is a heads-last view here: torch.empty_like(q) keeps its strides, a fresh out does not.
    assert out.is_contiguous(), (
        f"out has strides {tuple(out.stride())} for shape {tuple(out.shape)}: flash_attention returns a "
        "fresh contiguous out even when q is a view (torch.empty_like(q) copies q's strides)"
    )
    pair = impl.flash_attention(q, k, v, return_lse=True)
    assert isinstance(pair, tuple) and len(pair) == 2, "return_lse=True returns (out, lse)"
    assert pair[1].shape == q.shape[:3] and pair[1].dtype == torch.float32


# --- The launcher rejects bad input before launching -----------------------------------------------


def _strided_last(t):
    return t.transpose(2, 3).contiguous().transpose(2, 3)  # same values, stride(-1) != 1


# name -> (how to spoil the arguments of a valid call, the error, what the message must name)
BAD_INPUTS = {
    "q_not_a_tensor": (lambda a: dict(q=a["q"].tolist()), TypeError, "q"),
    "q_rank": (lambda a: dict(q=a["q"][0]), ValueError, "q"),
    "q_fp32": (lambda a: dict(q=a["q"].float()), TypeError, "q"),
    "k_dtype": (lambda a: dict(k=a["k"].bfloat16()), TypeError, "k"),
    "v_rank": (lambda a: dict(v=a["v"][0]), ValueError, "v"),
    "k_batch": (lambda a: {n: a[n][:1] for n in ("k", "v")}, ValueError, "batch"),
    "v_shape": (lambda a: dict(v=a["v"][:, :, :5]), ValueError, "v"),
    "head_dim_mismatch": (lambda a: {n: a[n][..., :32] for n in ("k", "v")}, ValueError, "head dim"),
    "head_dim_not_pow2": (lambda a: {n: a[n][..., :48] for n in ("q", "k", "v")}, ValueError, "D"),
    "head_dim_8": (lambda a: {n: a[n][..., :8] for n in ("q", "k", "v")}, ValueError, "D"),
    "head_dim_512": (lambda a: {n: torch.cat([a[n]] * 8, dim=-1) for n in ("q", "k", "v")}, ValueError, "D"),
    "h_not_multiple_of_hkv": (lambda a: dict(q=a["q"][:, :3]), ValueError, "Hkv"),
    "nk_zero": (lambda a: {n: a[n][:, :, :0] for n in ("k", "v")}, ValueError, "Nk"),
    "nq_zero": (lambda a: dict(q=a["q"][:, :, :0]), ValueError, "Nq"),
    "q_last_dim_strided": (lambda a: dict(q=_strided_last(a["q"])), ValueError, "q"),
    "k_last_dim_strided": (lambda a: dict(k=_strided_last(a["k"])), ValueError, "k"),
    "mixed_devices": (lambda a: dict(k=a["k"].to("meta")), ValueError, "k"),
    "causal_not_bool": (lambda a: dict(causal=1), TypeError, "causal"),
    "return_lse_not_bool": (lambda a: dict(return_lse="yes"), TypeError, "return_lse"),
    "scale_not_a_number": (lambda a: dict(scale="0.1"), TypeError, "scale"),
    "scale_negative": (lambda a: dict(scale=-0.125), ValueError, "scale"),
    "scale_zero": (lambda a: dict(scale=0.0), ValueError, "scale"),
    "scale_nan": (lambda a: dict(scale=float("nan")), ValueError, "scale"),
    "scale_inf": (lambda a: dict(scale=float("inf")), ValueError, "scale"),
    "scale_bool": (lambda a: dict(scale=True), TypeError, "scale"),
    "scale_tensor": (lambda a: dict(scale=torch.tensor(0.125)), TypeError, "scale"),
    "k_not_a_tensor": (lambda a: dict(k=a["k"].tolist()), TypeError, "k"),
    "k_rank": (lambda a: dict(k=a["k"][0]), ValueError, "k"),
    "v_dtype": (lambda a: dict(v=a["v"].float()), TypeError, "v"),
    "hkv_zero": (lambda a: {n: a[n][:, :0] for n in ("k", "v")}, ValueError, "Hkv"),
    "v_last_dim_strided": (lambda a: dict(v=_strided_last(a["v"])), ValueError, "v"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    q, k, v = make_qkv(2, 4, 2, 8, 12, 64, device=runtime.device, stream=47)
    args = dict(q=q, k=k, v=v)
    args.update(spoil(args))
    with pytest.raises(error, match=names):
        impl.flash_attention(**args)


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


@pytest.mark.parametrize("axis", ["batch_heads", "batch", "query_blocks"])
def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime, axis):
    """CUDA allows 2**31 - 1 programs on grid axis 0 and only 65535 on axes 1 and 2, and Triton's
    interpreter checks neither. B * H = 1024 * 64 = 65536 (a batch of short prompts through a wide
    model) and cdiv(Nq, BLOCK_M) = 65537 query blocks (a sequence of eight million tokens, BLOCK_M =
    128) must both sit on axis 0. Run dry (every launch recorded and checked, none run), so one query,
    one key and D = 16 cost nothing. "batch": B = 70,000 alone (a batch of one-query rows through one
    head), so a grid with (query block, head) on axis 0 and the batch on axis 1 fails too, which the
    1024 x 64 case (1024 on axis 1) lets through."""
    if axis == "batch_heads":
        B, H, Nq = 1024, 64, 1
    elif axis == "batch":
        B, H, Nq = 70_000, 1, 1
    elif runtime.interpreter:
        # flash_attention's own output of 2**21 + 1 rows would take 1.5 s to come back on a CPU: _launch
        # with the interpreter's BLOCK_M = 32 is given an out whose rows are all one row (stride 0)
        B, H, Nq = 1, 1, 65536 * 32 + 1
    else:
        B, H, Nq = 1, 1, 65536 * 128 + 1  # 128: the largest BLOCK_M of _config
    # [B, H, Nq, D]; the rows of a long sequence all one row (stride 0): nothing reads them
    q = torch.zeros(B, H, 1, 16, dtype=torch.float16, device=runtime.device).expand(B, H, Nq, 16)
    k = torch.zeros(B, H, 1, 16, dtype=torch.float16, device=runtime.device)  # [B, Hkv, Nk, D]
    v = torch.zeros_like(k)
    if axis == "query_blocks" and runtime.interpreter:
        out = torch.zeros(B, H, 1, 16, dtype=torch.float16, device=runtime.device).expand(B, H, Nq, 16)
        assert_grids_fit(
            impl,
            lambda: impl._launch(q, k, v, False, 0.25, out, config=(32, 16, 4, 1)),
            f"_launch with B = {B}, H = {H}, Nq = {Nq}, BLOCK_M = 32",
        )
        return
    assert_grids_fit(
        impl,
        lambda: impl.flash_attention(q, k, v, return_lse=True),
        f"flash_attention with B = {B}, H = {H}, Nq = {Nq}",
    )


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_mean_of_v(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros output and the plain mean of
    V (a kernel that forgot the scores), so passing the other tests means something."""
    q, k, v = make_qkv(1, 4, 2, 37, 100, 64, device=runtime.device, stream=53)
    ref, lse = attention_reference(q, k, v)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
    mean_v = v.float().mean(dim=2, keepdim=True).repeat_interleave(2, dim=1).expand_as(ref)
    assert mismatch(mean_v.half(), ref) is not None
    assert mismatch(ref.half(), ref) is None  # and the oracle rounded to fp16 passes
    assert mismatch(lse / math.log(2), lse, **LSE_TOL) is not None  # lse in base 2 fails


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: flash_attention must compute them with your Triton kernel, not
    with torch (scaled_dot_product_attention, or a copy of the grader's oracle)."""
    q, k, v = make_qkv(1, 2, 2, 20, 35, 64, device=runtime.device, stream=17)
    assert_runs_a_triton_kernel(impl, lambda: impl.flash_attention(q, k, v), "flash_attention")


# --- Stages: the steep lesson in three steps (make test and make progress say which one you are in) ----
# Every check of the first two stages has H = Hkv and reads no lse, so a kernel with kvh = h and no
# lse store passes them; a case no pattern names belongs to the last stage.

STAGES = [
    Stage(
        "non-causal",
        (
            "test_worked_example_O1_to_three_decimals",
            "test_keys_not_a_multiple_of_the_block",
            "test_online_softmax_rescales_old_blocks",
            "test_scale_is_applied",
            "test_keys_are_walked_block_by_block",
            "test_runs_a_triton_kernel",
            "test_launcher_rejects_bad_input",
            "test_tolerance_rejects_zeros_and_mean_of_v",
            "test_out_keeps_the_range_of_its_dtype",
            "test_grid_fits_cuda_limits_at_largest_sizes",
            "*noncausal*",
        ),
        "attention over every key (causal=False, H = Hkv, no lse): the worked example, partial blocks, "
        "strides, the online softmax, the scale, the final division, rows past Nq, bf16 outputs past "
        "fp16's range",
    ),
    Stage(
        "causal",
        (
            "test_causal_is_aligned_bottom_right",
            "test_first_causal_row_sees_only_key_0",
            "test_fully_masked_rows_are_zero_not_nan",
            "test_negative_causal_shift_is_not_clamped",
            "*causal*",
        ),
        "causal=True: the mask aligned to the bottom right, each query block's key range, rows that see "
        "no key (Nq > Nk), and stage 1's checks with the mask on",
    ),
    Stage(
        "GQA and lse",
        (
            "test_kv_head_grouping_is_contiguous",
            "test_lse_is_natural_log",
            "test_worked_example_state_after_each_key_block",
            "test_returns_fresh_contiguous_out_and_lse",
            "test_long_sequences",
        ),
        "H > Hkv (query head h reads KV head h // GROUP) and return_lse=True (lse in base e, -inf for "
        "a row that sees no key)",
    ),
]


# --- Diagnosis: which pitfall of drills/content/t5_flash_attention.md a pattern of results points to -------
# The look-alikes and what tells them apart: the square causal cases (37-37, 64-64) agree under top-left
# and bottom-right alignment; 64-64 has no partial query or key block, so it passes every masking and
# padding mistake; test_last_key_block_is_masked[noncausal] and test_keys_not_a_multiple_of_the_block have no
# causal mask to blame; the by-hand cases (B = H = 1, one key block, contiguous rows) pass every mistake
# of rescaling, strides and grouping; test_negative_causal_shift_is_not_clamped compares only rows that
# see a key, so it passes the empty-row mistakes (9) and fails the clamp (15); a tl.float16 written where
# the tensors' dtype belongs (17) passes every fp16 case and fails the bf16 outputs past fp16's range.

MISTAKES = [
    Mistake(
        1,
        fails=(
            "test_first_causal_row_sees_only_key_0",
            "test_causal_is_aligned_bottom_right[37-37]",
            "test_fully_masked_rows_are_zero_not_nan[50-1]",
        ),
        passes=(
            "test_last_key_block_is_masked[noncausal]",
            "test_keys_not_a_multiple_of_the_block",
            "test_q_k_v_are_read_through_their_strides[noncausal]",
        ),
        question="With Nq = Nk = 40, which keys may query 0 see, and does your causal comparison let it "
        "see its own key?",
        section="3.5",
    ),
    Mistake(
        2,
        fails=("test_causal_is_aligned_bottom_right[37-100]", "test_causal_is_aligned_bottom_right[1-50]"),
        passes=(
            "test_causal_is_aligned_bottom_right[37-37]",
            "test_causal_is_aligned_bottom_right[64-64]",
            "test_first_causal_row_sees_only_key_0",
            "test_last_key_block_is_masked[noncausal]",
            "test_keys_not_a_multiple_of_the_block",
        ),
        question="Your causal results are right when Nq = Nk and wrong when Nq = 37, Nk = 100: with 63 keys "
        "already cached, which keys may query 0 see?",
        section="3.5",
    ),
    Mistake(
        3,
        fails=("test_any_block_shape", "test_causal_is_aligned_bottom_right[64-64]"),
        passes=(
            "test_fully_masked_rows_are_zero_not_nan[50-1]",
            "test_last_key_block_is_masked[noncausal]",
            "test_keys_not_a_multiple_of_the_block",
        ),
        question="For the query block of rows m0 to m0 + BLOCK_M - 1, which is the last key its FIRST row "
        "may see, and does your unmasked loop stop before it?",
        section="3.5",
    ),
    Mistake(
        3,
        # The twin: the masked loop ends at the FIRST row's last key (hi = m0 + 1 + shift), so the later
        # rows of a query block miss the key blocks past it. Only BLOCK_M > BLOCK_N shows it: one masked
        # key block then holds every row's diagonal. Pitfall 1 (j < i + shift) fails every causal shape.
        fails=("test_any_block_shape[M64xN16-causal]",),
        passes=(
            "test_any_block_shape[M16xN16-causal]",
            "test_any_block_shape[M16xN32-causal]",
            "test_last_key_block_is_masked[noncausal]",
            "test_keys_not_a_multiple_of_the_block",
            "test_worked_example_O1_to_three_decimals",
            "test_online_softmax_rescales_old_blocks",
            "test_q_k_v_are_read_through_their_strides[noncausal]",
            # every row still sees a key, so its weights sum to 1 (pitfall 23's m = -inf does not)
            "test_output_is_normalised_by_the_softmax_sum[causal]",
        ),
        question="With BLOCK_M = 64 and BLOCK_N = 16, which key is the last one the LAST row of a query "
        "block may see, and does your masked loop run that far?",
        section="3.5",
    ),
    Mistake(
        3,
        # The diagonal one key off: full_end from m0 + shift + 2, or hi from m0 + BLOCK_M - 1 + shift. Right
        # unless the shift puts that key on a key-block boundary, so only the sweep of every shift fails
        # for certain; an Nq > Nk case whose last row then sees no key may fail too, with -inf or NaN.
        fails=("test_diagonal_at_every_alignment",),
        passes=(
            "test_causal_is_aligned_bottom_right",
            "test_first_causal_row_sees_only_key_0",
            "test_last_key_block_is_masked[noncausal]",
            "test_keys_not_a_multiple_of_the_block",
            "test_worked_example_O1_to_three_decimals",
            "test_online_softmax_rescales_old_blocks",
        ),
        question="Shifts 0 to 15 in 16 x 16 blocks: for the query block of rows m0 to m0 + 15, which is the "
        "last key its first row may see and the last key its last row may see, and where do your unmasked "
        "and masked loops stop when either key starts a key block?",
        section="3.5",
    ),
    Mistake(
        4,
        fails=("test_last_key_block_is_masked[noncausal]", "test_keys_not_a_multiple_of_the_block[5-17]"),
        passes=("test_causal_is_aligned_bottom_right[64-64]", "test_keys_are_walked_block_by_block"),
        messages=(r"NaN|nan|out of bounds load of [kv]_ptr",),
        question="Nk = 35 with BLOCK_N = 16: what do keys 35 to 47 of the last block load, and what score "
        "does your kernel give them?",
        section="3.4",
    ),
    Mistake(
        4,
        # K loaded past Nk without a mask, its scores masked after: right answers, and a load past the
        # end of K that only a tight buffer shows (q, k and v packed, nothing after); the lane check
        # names the tensor nearest the address, so the quoted line tells it is K's load.
        fails=("test_q_k_v_are_read_through_their_strides",),
        passes=(
            "test_last_key_block_is_masked",
            "test_keys_not_a_multiple_of_the_block",
            "test_worked_example_O1_to_three_decimals",
        ),
        messages=(r"out of bounds load of \w+[^\n]*: (?:kt|k)\w* = tl\.load",),
        question="Nk = 45 with BLOCK_N = 16: which keys does your K load read in the last block, and what "
        "lies past key 44 when q, k and v are packed in one buffer?",
        section="3.4",
    ),
    Mistake(
        5,
        fails=("test_online_softmax_rescales_old_blocks",),
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_worked_example_state_after_each_key_block",
            "test_keys_not_a_multiple_of_the_block[1-1]",
            "test_keys_are_walked_block_by_block",
        ),
        question="When a later key block raises a row's max, what happens in your kernel to the l and the "
        "acc summed under the old max?",
        section="3.4",
    ),
    Mistake(
        5,
        fails=("test_output_is_normalised_by_the_softmax_sum", "test_worked_example_O1_to_three_decimals"),
        passes=(
            "test_keys_not_a_multiple_of_the_block[1-1]",
            "test_fully_masked_rows_are_zero_not_nan[50-1]",
        ),
        question="In the by-hand example O after K2 is [[2, 1.493], [1.493, 1.493]]: what is left to do "
        "before it is the output [[0.670, 0.500], [0.500, 0.500]]?",
        section="2",
    ),
    Mistake(
        6,
        fails=("test_scale_is_applied", "test_worked_example_O1_to_three_decimals"),
        passes=("test_output_is_normalised_by_the_softmax_sum", "test_keys_not_a_multiple_of_the_block[1-1]"),
        question="exp2(x) is 2^x: which two factors must multiply a raw score q . k before it goes "
        "through exp2, so that the weight is e^(score * scale)?",
        section="3.3",
    ),
    Mistake(
        6,
        fails=("test_lse_is_natural_log", "test_worked_example_state_after_each_key_block"),
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_keys_not_a_multiple_of_the_block",
            "test_scale_is_applied",
        ),
        question="Your output is right and your lse is not: in which base is m + log2(l), and what turns it "
        "into a natural log?",
        section="3.3",
    ),
    Mistake(
        6,
        # Only the default scale wrong (1 / sqrt of another dimension): every check that passes its own
        # scale passes, and every one through flash_attention's default fails.
        fails=("test_scale_is_applied",),
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_worked_example_state_after_each_key_block",
            "test_rows_past_nq_not_written",
            "test_any_block_shape",
            "test_negative_causal_shift_is_not_clamped",
            "test_output_is_normalised_by_the_softmax_sum",
        ),
        question="Every check that passes its own scale passes and the default does not: when scale is "
        "None, 1 / sqrt of which dimension of q does your flash_attention take?",
        section="3.3",
    ),
    Mistake(
        6,
        # The scale applied after the softmax (out * scale): every output off by that factor, most checks
        # fail, and only the all-ones V says which factor it is.
        fails=(
            "test_output_is_normalised_by_the_softmax_sum",
            "test_scale_is_applied",
            "test_worked_example_O1_to_three_decimals",
            "test_keys_not_a_multiple_of_the_block[1-1]",
        ),
        messages=(r"the scale multiplies the output",),
        question="With every V row 1, your output is 0.125 = 1 / sqrt(64): where does your kernel multiply "
        "by the scale, and which numbers must it multiply for e^(score * scale) to be the weight?",
        section="3.3",
    ),
    Mistake(
        7,
        fails=(
            "test_k_is_read_through_its_strides",
            "test_worked_example_O1_to_three_decimals",
            "test_causal_is_aligned_bottom_right[64-64]",
            "test_keys_not_a_multiple_of_the_block[1-1]",
        ),
        passes=("test_keys_are_walked_block_by_block",),
        question="Element (d, n) of the K^T tile is K[n, d]: at which address does it live, and which of "
        "your two offsets is multiplied by stride_kn?",
        section="3.2",
    ),
    Mistake(
        8,
        fails=("test_kv_head_grouping_is_contiguous[group2]",),
        passes=(
            "test_kv_head_grouping_is_contiguous[group1-MHA]",
            "test_kv_head_grouping_is_contiguous[group8-MQA]",
            "test_worked_example_O1_to_three_decimals",
            "test_online_softmax_rescales_old_blocks",
        ),
        question="With H = 8 and Hkv = 2, which KV head does your kernel give query head 1, and which "
        "should share KV head 0?",
        section="3.1",
    ),
    Mistake(
        8,
        fails=("test_kv_head_grouping_is_contiguous[group3]",),
        passes=(
            "test_kv_head_grouping_is_contiguous[group2]",
            "test_kv_head_grouping_is_contiguous[group4]",
            "test_worked_example_O1_to_three_decimals",
        ),
        question="Every power-of-two group passes and GROUP = 3 does not: with H = 6 and Hkv = 2, which "
        "KV head should query head 3 read, and what GROUP does your kernel receive?",
        section="3.1",
    ),
    Mistake(
        9,
        fails=(
            "test_fully_masked_rows_are_zero_not_nan[100-37]",
            "test_fully_masked_rows_are_zero_not_nan[50-1]",
        ),
        passes=(
            "test_negative_causal_shift_is_not_clamped",
            "test_causal_is_aligned_bottom_right[37-100]",
            "test_first_causal_row_sees_only_key_0",
        ),
        messages=(r"NaN|nan",),
        question="A row that sees no key has m = -inf and l = 0 after the loop: what do exp2(m_i - m_new) "
        "and acc / l give for it in your kernel?",
        section="3.5",
    ),
    Mistake(
        9,
        # out right (0) for a row that sees no key, and its lse 0 or finite where -inf belongs.
        fails=("test_lse_is_natural_log[causal-rows-that-see-no-key]",),
        passes=(
            "test_lse_is_natural_log[causal]",
            "test_lse_is_natural_log[noncausal]",
            "test_fully_masked_rows_are_zero_not_nan",
            "test_running_max_starts_at_minus_inf",
        ),
        messages=(r"rows that see no key have lse != -inf",),
        question="A row that sees no key has no scores at all: what is the log of an empty sum, and what "
        "does your kernel store as that row's lse?",
        section="3.6",
    ),
    Mistake(
        10,
        fails=("test_rows_past_nq_not_written", "test_worked_example_O1_to_three_decimals"),
        passes=("test_causal_is_aligned_bottom_right[64-64]",),
        messages=(r"canary elements of the buffer around out|out of bounds store of out_ptr|write race",),
        question="Nq = 37 with BLOCK_M = 32: which rows of the second query block does your kernel store, "
        "and whose memory comes after row 36?",
        section="3.6",
    ),
    Mistake(
        11,
        fails=("test_running_max_starts_at_minus_inf",),
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_worked_example_state_after_each_key_block",
            "test_keys_not_a_multiple_of_the_block",
            "test_online_softmax_rescales_old_blocks",
            "test_scale_is_applied",
            "test_causal_is_aligned_bottom_right[37-100]",
            "test_first_causal_row_sees_only_key_0",
            "test_diagonal_at_every_alignment",  # a diagonal one key off fails its causal case too
        ),
        question="Every score here is near -128: what is your running max after the first key block if it "
        "started at 0, and what is exp2 of a score minus it?",
        section="3.1",
    ),
    Mistake(
        12,
        fails=("test_q_k_v_are_read_through_their_strides",),
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_worked_example_state_after_each_key_block",
            "test_online_softmax_rescales_old_blocks",
        ),
        question="q, k and v here are slices of one packed QKV buffer: how many elements apart are two rows "
        "of q, and does your kernel take that from the strides or from D and Nq?",
        section="3.1",
    ),
    Mistake(
        13,
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_keys_not_a_multiple_of_the_block",
            "test_online_softmax_rescales_old_blocks",
            "test_k_is_read_through_its_strides",
            "test_running_max_starts_at_minus_inf",
        ),
        # The lane check names the tensor nearest the bad address: a K or V load past its end can land
        # nearest q, so the load the message quotes must not be one of K or V.
        messages=(r"out of bounds load of q_ptr(?![^\n]*: (?:kt|k|v|vt)\w* = tl\.load)",),
        question="Nq = 45 with BLOCK_M = 32: which rows does your q load read in the second query block, "
        "and what lies past row 44 of the last batch?",
        section="3.1",
    ),
    Mistake(
        14,
        fails=("test_keys_are_walked_block_by_block",),
        passes=(
            "test_worked_example_O1_to_three_decimals",
            "test_keys_not_a_multiple_of_the_block",
            "test_online_softmax_rescales_old_blocks",
        ),
        question="How many key blocks does one of your programs visit for Nk = 100, and which BLOCK_N does "
        "your launch use when _launch is given a config?",
        section="3.7",
    ),
    Mistake(
        15,
        fails=(
            "test_negative_causal_shift_is_not_clamped",
            "test_fully_masked_rows_are_zero_not_nan[100-37]",
        ),
        passes=(
            "test_causal_is_aligned_bottom_right[37-100]",
            "test_causal_is_aligned_bottom_right[1-50]",
            "test_causal_is_aligned_bottom_right[37-37]",
            "test_first_causal_row_sees_only_key_0",
        ),
        question="Nq = 70 and Nk = 45: what is Nk - Nq, and which keys may query 30 see? Does your kernel "
        "let the shift go below 0?",
        section="3.5",
    ),
    Mistake(
        15,
        # full_end not clipped at 0: the first query blocks of an Nq > Nk shape start their masked loop
        # at a negative key, and load before K (the harness names the tensor nearest the address, which
        # may be q). Nq <= Nk and the first causal row are right; so are q's padding rows (not 13).
        fails=("test_negative_causal_shift_is_not_clamped", "test_fully_masked_rows_are_zero_not_nan"),
        passes=(
            "test_causal_is_aligned_bottom_right[37-100]",
            "test_causal_is_aligned_bottom_right[1-50]",
            "test_causal_is_aligned_bottom_right[37-37]",
            "test_first_causal_row_sees_only_key_0",
            "test_rows_past_nq_not_written[*noncausal*]",
        ),
        messages=(r"out of bounds load",),
        question="Nq = 100 and Nk = 37: what is full_end for query block 0, and at which key does your "
        "masked loop start?",
        section="3.5",
    ),
    Mistake(
        16,
        fails=("test_batch_and_head_offsets_widened_to_int64",),
        passes=("test_kv_head_grouping_is_contiguous", "test_q_k_v_are_read_through_their_strides"),
        question="Batch 2 (or head 2, or token 2) starts 2 * (2**30 + 2**20) elements into q: in which "
        "integer type does your kernel compute its offset, and what does that type do past 2**31 - 1?",
        section="3.1",
    ),
    Mistake(
        17,
        fails=("test_out_keeps_the_range_of_its_dtype[bf16]",),
        passes=(
            "test_out_keeps_the_range_of_its_dtype[fp16]",
            "test_dtypes[fp16-noncausal]",
            "test_dtypes[fp16-causal]",
        ),
        question="Your fp16 cases pass and your bf16 ones do not: which dtype does your kernel give p before "
        "P V and out before the store, and what does fp16 make of a bf16 output of 65536?",
        section="3.4",
    ),
    Mistake(
        18,
        fails=("test_grid_fits_cuda_limits_at_largest_sizes",),
        messages=(r"past CUDA's limit on grid axis",),
        question="B = 1024 and H = 64, then B = 70,000 and H = 1: how many (batch, head) pairs is that, on "
        "which grid axis are the batches, and how many programs does CUDA allow there?",
        section="3.1",
    ),
    Mistake(
        19,
        fails=("test_v_is_read_through_its_own_strides",),
        passes=(
            "test_k_is_read_through_its_strides[causal]",
            "test_q_k_v_are_read_through_their_strides[causal]",
            # lse reads no V: an lse stored at another head's place fails here and in the V check.
            "test_lse_is_natural_log",
        ),
        question="k and v are both [B, Hkv, N, D], but are their rows the same number of elements apart? "
        "Which strides does your V pointer use?",
        section="3.2",
    ),
    Mistake(
        12,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, heads, lengths, B, causal, dtype, layout and options; which of these does your kernel handle "
        "only one at a time (a stride taken from another tensor, a tile sized for another D)?",
        section="3.1",
    ),
    Mistake(
        21,
        # lse stored through out's strides: every output right, lse past its end from the second head (or
        # batch) on, so the one-head checks pass; rows past Nq stored into lse (10's twin) fail them too.
        fails=("test_lse_is_natural_log", "test_kv_head_grouping_is_contiguous"),
        passes=(
            "test_diagonal_at_every_alignment",
            "test_online_softmax_rescales_old_blocks",
            "test_worked_example_O1_to_three_decimals",
        ),
        messages=(r"out of bounds store of lse_ptr|canary elements of the buffer around lse",),
        question="lse is [B, H, Nq] and out [B, H, Nq, D]: which strides does your lse store step by from one "
        "head to the next, and where does head 1's first lse land?",
        section="3.6",
    ),
    Mistake(
        23,
        # m_new from this block's scores alone: exact while every row sees a key of every block (a lower
        # max only rescales by more), and a row whose keys all lie masked in a later block gets m = -inf
        # there, which wipes (or overflows) what it summed. Only causal blocks past a row's diagonal do
        # that, so the normalisation check fails where pitfall 3's short loop (weights still summing to 1)
        # passes it.
        fails=(
            "test_any_block_shape[M64xN16-causal]",
            "test_output_is_normalised_by_the_softmax_sum[causal]",
        ),
        passes=(
            "test_output_is_normalised_by_the_softmax_sum[noncausal]",
            "test_online_softmax_rescales_old_blocks",
            "test_worked_example_O1_to_three_decimals",
        ),
        question="BLOCK_M = 64 and BLOCK_N = 16, causal: what is your m_new for a row whose keys in this "
        "block are all masked, and what happens then to the l and acc it summed before?",
        section="3.4",
    ),
    Mistake(
        22,
        # The key loop run to Nk: every output right (the blocks past the diagonal score -inf), and a
        # program loading key blocks wholly above its diagonal, which only the record of its loads shows.
        fails=("test_causal_skips_key_blocks_above_the_diagonal",),
        passes=(
            "test_causal_is_aligned_bottom_right",
            "test_diagonal_at_every_alignment",
            "test_any_block_shape",
            "test_fully_masked_rows_are_zero_not_nan",
        ),
        question="Nq = Nk = 64 in 16 x 16 blocks: which key blocks does your query block 0 load, and which of "
        "them can any of its rows see?",
        section="3.5",
    ),
    Mistake(
        20,
        # Half of each row of out never stored: NaN where the output buffer was never written.
        fails=("test_head_dims[256-*]",),
        passes=("test_head_dims[128-*]", "test_head_dims[16-*]", "test_worked_example_O1_to_three_decimals"),
        question="D = 256 here and every D up to 128 passes: how many features does your kernel's tile over "
        "the head dim cover, and who computes q.k over features 128 to 255 and stores them to out?",
        section="3.1",
    ),
]
