"""The engine's fused kernels (drills/engine/fused.py) against the torch ops they replace.

Each kernel rounds where the torch path rounds, so the comparisons are tight: in fp32 RMSNorm differs
only in the order of its sum of squares and RoPE by a fused multiply-add; in bf16 by a unit or a few. A whole forward through
them must give the torch forward's logits, and the engine the same greedy tokens. They run on the
kernels' device: the interpreter on a CPU, compiled on a GPU. Each test is named for the mistake it
catches.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import drills.runtime
from drills.device_errors import raise_device_errors
from drills.engine import fused
from drills.engine.config import tiny_config
from drills.engine.model import Llama, apply_rope, forward, random_weights, rms_norm
from drills.engine.oracle import ReferenceAttention, packed_step

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Half a unit in the last place of each dtype, relative: the sum of squares in another order may move
# the rsqrt by about that, and the product with the weight rounds once more.
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _exact(dtype) -> float:
    """The tolerance of a result that rounds exactly as torch does: 0, except that Triton's interpreter
    casts fp32 to bf16 by truncation, not to nearest (measured, Triton 3.6): one bf16 unit there."""
    interpreted = torch.device(_device()).type == "cpu"
    return 2**-7 if dtype == torch.bfloat16 and interpreted else 0.0


def _device():
    return drills.runtime.current().device


def _rows(T, H, dtype, stream):
    g = torch.Generator().manual_seed(stream)
    return (torch.randn(T, H, generator=g) * 2).to(dtype).to(_device())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [96, 100])  # 100: a row width that is no power of two (masked columns)
def test_rms_norm_is_normalised_by_the_mean_square_and_scaled_by_the_weight(dtype, H):
    x = _rows(5, H, dtype, 1)
    w = (1 + 0.1 * torch.randn(H, generator=torch.Generator().manual_seed(2))).to(dtype).to(_device())
    got = fused.rms_norm(x, w, 1e-5)
    ref = rms_norm(x, w, 1e-5)
    assert got.abs().max() > 0.5, "the output is (nearly) all zeros"
    torch.testing.assert_close(got.float(), ref.float(), rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_residual_is_added_in_place_and_the_sum_is_what_is_normalised(dtype):
    x, h = _rows(7, 96, dtype, 3), _rows(7, 96, dtype, 4)
    w = torch.ones(96, dtype=dtype, device=_device()) * 1.5
    expected_h = h + x  # the torch path's `h = h + delta`, rounded to the dtype
    got = fused.rms_norm(x, w, 1e-5, residual=h)
    tol = _exact(dtype)
    torch.testing.assert_close(h, expected_h, rtol=tol, atol=tol)  # the stream itself, exactly
    torch.testing.assert_close(
        got.float(), rms_norm(expected_h, w, 1e-5).float(), rtol=RTOL[dtype], atol=RTOL[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_rotates_q_and_k_heads_in_place_and_leaves_v_alone(dtype):
    Hq, Hkv, D, T = 6, 2, 16, 9
    model = Llama(random_weights(tiny_config(), stream=5, device=_device()))
    qkv = _rows(T, (Hq + 2 * Hkv) * D, dtype, 6)
    positions = torch.tensor([0, 1, 2, 700, 5, 5, 1023, 9, 3], device=_device())
    before = qkv.clone()
    fused.rope_(qkv, positions, model.rope_cos, model.rope_sin, Hq + Hkv, D)
    cos = model.rope_cos[positions].to(dtype)[:, None, :]
    sin = model.rope_sin[positions].to(dtype)[:, None, :]
    want_q = apply_rope(before[:, : Hq * D].view(T, Hq, D), cos, sin)
    want_k = apply_rope(before[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D), cos, sin)
    # fp32: a compiled kernel may contract a product and a sum into one fused multiply-add (one unit).
    # bf16: the interpreter's casts truncate, and on an H200 the compiled kernel differed from torch's
    # four multiplies by up to 0.03 (measured, Triton 3.6) where q1 cos - q2 sin cancels: a few units.
    tol = {torch.float16: RTOL[dtype], torch.float32: 2e-6}.get(dtype, RTOL[dtype])
    atol = 0.07 if dtype == torch.bfloat16 else tol
    torch.testing.assert_close(qkv[:, : Hq * D].view(T, Hq, D), want_q, rtol=tol, atol=atol)
    torch.testing.assert_close(qkv[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D), want_k, rtol=tol, atol=atol)
    assert torch.equal(qkv[:, (Hq + Hkv) * D :], before[:, (Hq + Hkv) * D :]), "v's columns were written"


def test_a_position_past_the_rope_table_is_named_not_read():
    model = Llama(random_weights(tiny_config(), stream=5, device=_device()))
    qkv = _rows(3, 10 * 16, torch.float32, 7)
    positions = torch.tensor([0, 5000, 1], device=_device())  # the table holds 1,024 positions
    fused.rope_(qkv, positions, model.rope_cos, model.rope_sin, 8, 16)
    with pytest.raises(ValueError, match=r"positions\[1\] = 5000"):
        raise_device_errors(_device())


def _store_case(dtype, cache_dtype, T=7, Hq=6, Hkv=2, D=16, num_blocks=5, page=4):
    """qkv rows, positions, ragged slots (a padding row, a page boundary, the last slot) and NaN caches."""
    model = Llama(random_weights(tiny_config(), stream=5, device=_device()))
    qkv = _rows(T, (Hq + 2 * Hkv) * D, dtype, 20)
    positions = torch.tensor([0, 1, 3, 4, 900, 7, 2], device=_device())[:T]
    slots = torch.tensor([2, -1, 3, 4, num_blocks * page - 1, 9, 12], device=_device())[:T]
    shape = (num_blocks, page, Hkv, D)
    kc = torch.full(shape, float("nan"), dtype=cache_dtype, device=_device())
    vc = torch.full(shape, float("nan"), dtype=cache_dtype, device=_device())
    return model, qkv, positions, slots, kc, vc


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)],
    ids=str,
)
def test_rope_store_rotates_as_rope_does_and_stores_k_and_v_in_their_slots_only(dtype, cache_dtype):
    """The fused store must leave qkv exactly as rope_ leaves it, put row t's rotated K and its V in slot
    slots[t] (bit for bit, in the cache's dtype), store nothing for a padding row, and write no other
    slot: every other slot of the NaN-filled caches stays NaN."""
    Hq, Hkv, D = 6, 2, 16
    model, qkv, positions, slots, kc, vc = _store_case(dtype, cache_dtype)
    want = fused.rope_(qkv.clone(), positions, model.rope_cos, model.rope_sin, Hq + Hkv, D)
    fused.rope_store_(qkv, positions, model.rope_cos, model.rope_sin, Hq, kc, vc, slots)
    raise_device_errors(_device())
    assert torch.equal(qkv, want), "qkv is not what rope_ makes of it (q, k rotated; v untouched)"
    flat_k, flat_v = kc.view(-1, Hkv, D), vc.view(-1, Hkv, D)  # slot s is row s
    real = slots >= 0
    k = want[:, Hq * D : (Hq + Hkv) * D].reshape(-1, Hkv, D).to(cache_dtype)
    v = want[:, (Hq + Hkv) * D :].reshape(-1, Hkv, D).to(cache_dtype)
    assert torch.equal(flat_k[slots[real]], k[real]), "a stored K is not the rotated K of its row"
    assert torch.equal(flat_v[slots[real]], v[real]), "a stored V is not its row's V"
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=_device())
    untouched[slots[real]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all(), (
        "a slot no row maps to was written"
    )


def test_a_slot_outside_the_cache_is_named_and_not_stored():
    model, qkv, positions, slots, kc, vc = _store_case(torch.float32, torch.float32, T=3)
    slots = torch.tensor([0, kc.shape[0] * kc.shape[1], -1], device=_device())  # one past the last slot
    fused.rope_store_(qkv, positions, model.rope_cos, model.rope_sin, 6, kc, vc, slots)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 20"):
        raise_device_errors(_device())
    assert kc.isnan().sum() == kc.numel() - 2 * 16, "only row 0's K (2 heads x 16) may have been stored"


def test_rope_store_refuses_bad_arguments_naming_them():
    model, qkv, positions, slots, kc, vc = _store_case(torch.float32, torch.float32)
    cos, sin = model.rope_cos, model.rope_sin
    with pytest.raises(ValueError, match="v_cache must match"):
        fused.rope_store_(qkv, positions, cos, sin, 6, kc, vc[:, :2], slots)
    with pytest.raises(ValueError, match="same memory"):
        fused.rope_store_(qkv, positions, cos, sin, 6, kc, kc, slots)
    with pytest.raises(ValueError, match="qkv must have"):
        fused.rope_store_(qkv, positions, cos, sin, 5, kc, vc, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        fused.rope_store_(qkv, positions, cos, sin, 6, kc, vc, slots[:3])
    with pytest.raises(ValueError, match="k_cache must have contiguous"):
        fused.rope_store_(qkv, positions, cos, sin, 6, kc.transpose(2, 3), vc.transpose(2, 3), slots)
    with pytest.raises(TypeError, match="k_cache must be float16"):
        fused.rope_store_(qkv, positions, cos, sin, 6, kc.int(), vc.int(), slots)
    every_other = torch.zeros(2 * slots.shape[0], dtype=slots.dtype, device=slots.device)[::2]
    with pytest.raises(ValueError, match="slot_mapping must be contiguous"):  # read at t, not at 2t
        fused.rope_store_(qkv, positions, cos, sin, 6, kc, vc, every_other)
    with pytest.raises(ValueError, match="positions must be contiguous"):
        fused.rope_store_(qkv, every_other, cos, sin, 6, kc, vc, slots)
    with pytest.raises(ValueError, match="cos must be"):  # an empty table has no row 0 to fall back on
        fused.rope_store_(qkv, positions, cos[:0], sin, 6, kc, vc, slots)


def test_fused_store_asked_for_without_the_kernel_path_is_refused():
    from drills.engine.config import EngineConfig

    for config in (
        EngineConfig(attention="torch", fused_store=True),
        EngineConfig(fused_kernels=False, fused_store=True),
    ):
        with pytest.raises(ValueError, match="fused_store needs"):
            config.fused_store_on(torch.device("cpu"))
    assert not EngineConfig(attention="torch").fused_store_on(torch.device("cpu"))  # None: off, silently


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inter", [160, 1500])  # 1500: more than one column block per row, masked
def test_silu_applies_to_the_gate_half_and_multiplies_the_up_half(dtype, inter):
    gu = _rows(4, 2 * inter, dtype, 8)
    gate, up = gu.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = fused.silu_mul(gu)
    tol = 1e-6 if dtype == torch.float32 else RTOL[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_bad_arguments_raise_naming_them():
    x = _rows(2, 96, torch.float32, 9)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fused.rms_norm([1.0], x[0], 1e-5)
    with pytest.raises(ValueError, match="weight"):
        fused.rms_norm(x, x[0, :10].contiguous(), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        fused.rms_norm(x, x[0].contiguous(), 1e-5, residual=x[:1])
    with pytest.raises(ValueError, match="gate_up"):
        fused.silu_mul(x[:, :95])
    with pytest.raises(ValueError, match="x must have contiguous rows"):
        fused.rms_norm(x.t(), x[:, 0].contiguous(), 1e-5)
    with pytest.raises(ValueError, match="positions"):
        fused.rope_(x, torch.zeros(3, dtype=torch.int64, device=x.device), x, x, 2, 16)


def test_fused_forward_gives_the_torch_forwards_logits():
    """A packed prefill of three sequences (7, 1 and 12 tokens) through both forwards."""
    model = Llama(random_weights(tiny_config(), stream=10, device=_device()))
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (7, 1, 12)]
    ids, positions, rows, meta = packed_step([(i, p, 0) for i, p in enumerate(prompts)])
    ids, positions, rows = ids.to(_device()), positions.to(_device()), rows.to(_device())
    ref = forward(model, ids, positions, ReferenceAttention(model.config), meta, rows)
    got = forward(model, ids, positions, ReferenceAttention(model.config), meta, rows, fused=True)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_engine_greedy_tokens_are_the_same_fused_or_not():
    from drills.engine.llm import LLM
    from drills.solutions.c1_engine import SamplingParams

    weights = random_weights(tiny_config(), stream=12)
    g = torch.Generator().manual_seed(13)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 33)]
    outs = {}
    for on in (False, True):
        llm = LLM(
            weights,
            attention="torch",
            use="solutions",
            device=_device(),
            dtype=torch.float32,
            num_blocks=32,
            fused_kernels=on,
            quiet=True,
        )
        res = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        outs[on] = [r.token_ids for r in res]
    assert outs[True] == outs[False]


def _kernel_llm(**options):
    """The tiny model on the kernel path, on the kernels' device (compiled on a GPU: CUDA graphs, the
    fused forward), with `options` for the engine."""
    from drills.engine.llm import LLM

    weights = random_weights(tiny_config(), stream=18)
    return LLM(
        weights, attention="kernels", use="solutions", device=_device(), block_size=16, quiet=True, **options
    )


def test_the_fused_store_fills_the_cache_as_l1s_store_does():
    """The engine on the kernels with the fused forward, once through L1's store_kvcache and once through
    the fused RoPE kernel's store: the same greedy tokens and, bit for bit, the same KV cache."""
    from drills.solutions.c1_engine import SamplingParams

    g = torch.Generator().manual_seed(19)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 21, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    runs = {}
    for on in (False, True):
        llm = _kernel_llm(
            num_blocks=8, max_num_seqs=4, fused_kernels=True, fused_store=on, prefix_caching=False
        )
        assert llm.engine.attention.fused_store == on
        l1 = "not called (the fused RoPE kernel" in "\n".join(llm.describe())
        assert l1 == on, "the start-up lines do not say whether L1's store_kvcache runs"
        runs[on] = (
            [o.token_ids for o in llm.generate(prompts, params)],
            llm.cache.k.clone(),
            llm.cache.v.clone(),
        )
    assert runs[True][0] == runs[False][0], "the fused store changed a greedy token"
    assert torch.equal(runs[True][1].nan_to_num(), runs[False][1].nan_to_num()), "K in the cache differs"
    assert torch.equal(runs[True][2].nan_to_num(), runs[False][2].nan_to_num()), "V in the cache differs"


def _overlap_llm(on: bool, eos_id=None):
    from drills.engine.llm import LLM

    llm = LLM(
        random_weights(tiny_config(), stream=14),
        attention="torch",
        use="solutions",
        device="cpu",
        dtype=torch.float32,
        block_size=8,
        num_blocks=14,  # too few for all prompts at once: preemptions happen
        max_num_batched_tokens=24,  # prompts in chunks
        overlap=on,
        quiet=True,
    )
    llm.engine.eos_id = eos_id
    return llm


def test_the_overlapped_loop_gives_the_same_tokens_and_counts():
    """Tokens left on the device for a step (placeholders on the host) must come out exactly as the
    step-by-step loop's, through chunked prefill and preemptions, with ragged max_tokens."""
    from drills.solutions.c1_engine import SamplingParams

    g = torch.Generator().manual_seed(15)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 40, 17, 33, 9, 60)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (20, 3, 31, 8, 1, 14)]
    runs = {}
    for on in (False, True):
        llm = _overlap_llm(on)
        streamed = [[] for _ in prompts]
        outs = llm.generate(prompts, params, on_token=lambda i, t, got=streamed: got[i].append(t))
        tokens = [o.token_ids for o in outs]
        assert streamed == tokens, "streamed tokens differ from the completions (a placeholder streamed)"
        assert all(t < 256 for ts in tokens for t in ts), "a placeholder reached a completion"
        s = llm.engine.stats
        runs[on] = (tokens, s.output_tokens, llm.engine.scheduler.num_preemptions, s.overlap_steps)
    assert runs[True][0] == runs[False][0]
    assert runs[True][1:3] == runs[False][1:3], "(output tokens, preemptions) differ"
    assert runs[True][3] > 0 and runs[False][3] == 0, "the overlap was not taken (or taken when off)"
    assert runs[False][2] > 0, "the pool was meant to be small enough for a preemption"


def test_a_request_that_may_stop_on_eos_is_overlapped_and_stops_where_lockstep_stops():
    """With an end-of-sequence token, the overlapped loop still runs every step one ahead: the request
    that produces it ran one step too many, and ends exactly where the step-by-step loop ends it."""
    from drills.solutions.c1_engine import SamplingParams

    g = torch.Generator().manual_seed(16)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 11)]
    first = _overlap_llm(False).generate(prompts, SamplingParams(temperature=0.0, max_tokens=16))
    eos = first[0].token_ids[3]  # a token the first request really produces
    outs = {}
    for on in (False, True):
        llm = _overlap_llm(on, eos_id=eos)
        outs[on] = [
            (o.token_ids, o.finish_reason)
            for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16))
        ]
        outs[on] = (outs[on], llm.engine.stats.overlap_steps, llm.engine.stats.steps)
    assert outs[True][0] == outs[False][0]
    assert outs[True][0][0][1] == "stop"
    assert outs[True][1] == outs[True][2], "a step ran in lockstep while its requests could stop on eos"


def test_the_overlapped_loop_on_the_kernels_gives_the_same_tokens():
    """The kernel path on the kernels' device: on a GPU the overlap runs with CUDA graphs, the pinned
    input copy and the fused forward, the configuration the benchmark times."""
    from drills.solutions.c1_engine import SamplingParams

    g = torch.Generator().manual_seed(17)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 21, 40, 8)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (9, 4, 12, 1)]
    runs = {}
    for on in (False, True):
        llm = _kernel_llm(num_blocks=32, max_num_seqs=8, overlap=on)
        runs[on] = [o.token_ids for o in llm.generate(prompts, params)]
        assert (llm.engine.stats.overlap_steps > 0) == on
    assert runs[True] == runs[False]


def test_decode_inputs_built_on_the_device_on_the_kernels_path():
    """Decode steps' inputs built on the device (DeviceBatch: block-table rows kept there, new ids only),
    on the kernel path and its device (on a GPU: CUDA graphs padding the batch, the pinned copy, the
    overlap), each step compared with C1's prepare_inputs: the same tokens as without them."""
    from drills.solutions.c1_engine import SamplingParams, prepare_inputs

    g = torch.Generator().manual_seed(20)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 21, 40, 8, 15)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (19, 4, 12, 1, 17)]
    runs = {}
    for on in (False, True):
        llm = _kernel_llm(num_blocks=32, max_num_seqs=8, overlap=True, device_inputs=on)
        if on:
            llm.engine.batch.check = prepare_inputs
        runs[on] = [o.token_ids for o in llm.generate(prompts, params)]
        assert (llm.engine.batch is not None and llm.engine.batch.built > 0) == on
    assert runs[True] == runs[False]
