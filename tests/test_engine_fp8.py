"""The engine with an FP8 KV cache (EngineConfig.kv_cache_dtype = "fp8_e4m3", drills/engine/fp8.py).

K and V are stored as e4m3 by F3's store, decoded by F3's fp8_decode, and L4 reads a prompt step's pages
dequantized. Each test runs the tiny model on the CPU and names the mistake it catches. The kernel path
runs under the interpreter once (slow); the other tests use the torch path, which stores and reads the
same e4m3 codes with F3's rule.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from drills.engine.config import EngineConfig, tiny_config
from drills.engine.model import random_weights
from drills.solutions.c1_engine import SamplingParams
from tests.markers import CPU_KERNELS

# Untied: with the logits read off the embedding, each token predicts itself and every reply repeats it.
CONFIG = dataclasses.replace(tiny_config(), tie_word_embeddings=False)
VOCAB = CONFIG.vocab_size
E4M3 = torch.float8_e4m3fn
# Measured on the torch path (fp32 model, these prompts): the logits of an e4m3 cache differ from an
# fp32 cache's by at most 0.015 while both replies share their history (the tiny model's logits are
# about 0.8 at most); BOUND leaves room for other builds of torch.
LOGIT_BOUND = 0.05
# Greedy replies of 32 tokens, e4m3 against fp32 cache, agree for the first [32, 1, 8, 32] tokens of
# these four prompts: random weights leave near ties (the second prompt's second token), which a 6% step
# in K and V can flip. Every prompt's first token agrees, and 73 of 128 tokens in all.
FIRST_AGREE = 1
TOTAL_AGREE = 64


def _prompts(lens=(5, 40, 17, 33)) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lens]


def _llm(attention="torch", kv_cache_dtype="fp8_e4m3", parts=None, device="cpu", **settings):
    from drills.engine.llm import LLM

    return LLM(
        random_weights(CONFIG, stream=14),
        attention=attention,
        use="solutions",
        device=device,
        dtype=torch.float32,
        block_size=8,
        num_blocks=40,
        max_num_batched_tokens=24,  # the 33- and 40-token prompts in chunks
        kv_cache_dtype=kv_cache_dtype,
        parts=parts,
        quiet=True,
        **settings,
    )


def _run(llm, prompts, max_tokens):
    """Greedy replies and every step's logits, per request (in prompt order)."""
    logits: dict[int, list[torch.Tensor]] = {}

    def keep(seqs, rows):
        for i, seq in enumerate(seqs):
            logits.setdefault(seq.seq_id, []).append(rows[i].clone())

    llm.engine.on_logits = keep
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    ids = sorted(logits)
    return [o.token_ids for o in outs], [logits[i] for i in ids]


def _agree(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _shared_logit_gap(ref, got, ref_logits, got_logits) -> float:
    """The largest logit difference over the steps whose histories agree (the first step after a
    different token compares two different prefixes)."""
    gap = 0.0
    for a, b, la, lb in zip(ref, got, ref_logits, got_logits):
        for x, y in list(zip(la, lb))[: _agree(a, b) + 1]:
            gap = max(gap, float((x - y).abs().max()))
    return gap


@CPU_KERNELS
def test_the_kernels_serve_a_batch_through_f3_and_l4_on_dequantized_pages():
    """Catches: L1's store or F1's decode still called on an e4m3 cache (they would raise or misread
    its bytes), L4 handed the e4m3 pool, a wrong page in the dequantized copy, the scale left out."""
    from drills.solutions import f3_fp8_kv_cache as f3

    calls = {"store": 0, "decode": 0}

    def store(*args, **kw):
        calls["store"] += 1
        return f3.store_kvcache_fp8(*args, **kw)

    def decode(*args, **kw):
        calls["decode"] += 1
        return f3.fp8_decode(*args, **kw)

    def never(*args, **kw):
        raise AssertionError("an fp16/bf16 kernel was called on the e4m3 cache")

    parts = SimpleNamespace(
        store_kvcache_fp8=store, fp8_decode=decode, store_kvcache=never, split_kv_decode=never
    )
    prompts = _prompts((5, 20, 11))
    llm = _llm("kernels", parts=parts)
    assert llm.cache.k.dtype == E4M3 and llm.cache.v.dtype == E4M3
    got, got_logits = _run(llm, prompts, 4)
    assert calls["store"] and calls["decode"], calls
    assert llm.cache.k.float().abs().sum() > 0  # the codes are in the pool
    # The torch path over the same rule: the kernels differ from it by rounding only (they compute in
    # fp16, and quantize K and V rounded to fp16 first, so a value near a code's edge may take the next
    # code). Measured 0.008.
    ref, ref_logits = _run(_llm("torch"), prompts, 4)
    assert got == ref
    assert _shared_logit_gap(ref, got, ref_logits, got_logits) < 0.02
    # And against an fp32 cache, the bound the quantization costs.
    full, full_logits = _run(_llm("torch", kv_cache_dtype=None), prompts, 4)
    assert _shared_logit_gap(full, got, full_logits, got_logits) < LOGIT_BOUND


def test_fp8_logits_stay_near_the_full_cache_and_greedy_replies_agree():
    """Catches: a cache that stores without the clamp or reads codes without their scale (logits far
    off), or rounds K and V far coarser than e4m3 (replies part at once)."""
    prompts = _prompts()
    full, full_logits = _run(_llm(kv_cache_dtype=None), prompts, 32)
    fp8, fp8_logits = _run(_llm(), prompts, 32)
    assert _shared_logit_gap(full, fp8, full_logits, fp8_logits) < LOGIT_BOUND
    agree = [_agree(a, b) for a, b in zip(full, fp8)]
    assert min(agree) >= FIRST_AGREE and sum(agree) >= TOTAL_AGREE, agree
    assert any(x != y for x, y in zip(full_logits[0][0], fp8_logits[0][0]))  # the cache really is e4m3


def test_overlap_on_and_off_give_identical_replies_with_fp8():
    """Catches: the overlapped loop reading an e4m3 cache differently (a placeholder's K stored, a stale
    step) from the lockstep loop."""
    prompts = _prompts()
    off, _ = _run(_llm(overlap=False), prompts, 12)
    on, _ = _run(_llm(overlap=True), prompts, 12)
    assert on == off


def test_the_start_up_lines_say_which_lessons_an_fp8_cache_calls():
    """With an e4m3 cache F3 stores and decodes: L1's store and F1's and F2's decode are not called; with
    attention in torch, or without the option, F3 is not called either."""
    from drills.engine import sources

    chosen = sources.choose("solutions")
    fp8 = "\n".join(sources.describe(chosen, "kernels", fp8=True))
    assert "f3 store_kvcache_fp8, fp8_decode, plan: reference" in fp8, fp8
    for part in ("l1 store_kvcache", "f1 plan, split_kv_decode", "f2 plan, cascade_decode"):
        assert f"{part}: not called (the KV cache is e4m3" in fp8, fp8
    assert "l4 paged_prefill: reference" in fp8, fp8
    plain = "\n".join(sources.describe(chosen, "kernels"))
    assert (
        "f3 store_kvcache_fp8, fp8_decode, plan: not called" in plain
        and "l1 store_kvcache: reference" in plain
    )
    torch_fp8 = "\n".join(sources.describe(chosen, "torch", fp8=True))
    assert "f3 store_kvcache_fp8, fp8_decode, plan: not called (attention in torch)" in torch_fp8, torch_fp8


@pytest.mark.parametrize("bad", ["fp8", "e4m3", "FP8_E4M3", "fp8_e5m2", 8, torch.float8_e4m3fn, ""])
def test_a_bad_kv_cache_dtype_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype=bad)


def test_fp8_refuses_the_paths_that_read_fp16_or_bf16():
    """The fused RoPE store writes fp16 or bf16 and F2 reads them: asked for with an e4m3 cache they
    raise naming kv_cache_dtype; left at None the fused store is off."""
    for ok in ("auto", None, "fp8_e4m3"):
        EngineConfig(kv_cache_dtype=ok)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8_e4m3", cascade=True)
    fp8 = EngineConfig(kv_cache_dtype="fp8_e4m3", fused_kernels=True)
    assert not fp8.fused_store_on(torch.device("cpu"))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        dataclasses.replace(fp8, fused_store=True).fused_store_on(torch.device("cpu"))


def test_the_pool_holds_twice_the_blocks_for_the_same_memory(monkeypatch):
    """Catches: the pool sized by the fp16 block's bytes, which leaves half of an e4m3 budget unused."""
    from drills.engine import llm

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**9, 2 * 10**9))
    config = EngineConfig(max_num_seqs=4096)  # no cap from the requests: memory decides
    cuda = torch.device("cuda")
    half = llm.default_num_blocks(config, CONFIG, torch.bfloat16, cuda)
    e4m3 = llm.default_num_blocks(config, CONFIG, E4M3, cuda)
    assert e4m3 in (2 * half, 2 * half + 1), (half, e4m3)


@CPU_KERNELS
def test_dequantized_pages_follow_the_table_and_stay_inside_the_pool():
    """Catches: pages copied in the wrong order, the scale of another head, and a table entry past the
    pool (padding) read outside it."""
    from drills.engine.fp8 import dequantize_pages, quantize_e4m3

    g = torch.Generator().manual_seed(1)
    num_blocks, page, hkv, d = 5, 4, 2, 8
    x = torch.randn(num_blocks * page, hkv, d, generator=g) * 3
    scale = torch.tensor([0.5, 2.0])
    codes = quantize_e4m3(x, scale).view(num_blocks, page, hkv, d)
    tables = torch.tensor([[3, 1, 7], [0, -2, 4]], dtype=torch.int32)  # 7 and -2: padding past the pool
    k, v, new = dequantize_pages(codes, codes, scale, scale * 2, tables, torch.float32)
    assert new.tolist() == [[0, 1, 2], [3, 4, 5]]
    want = codes.float() * scale[:, None]
    for page_id, block in enumerate([3, 1, 4, 0, 0, 4]):
        assert torch.equal(k[page_id], want[block])
    assert torch.equal(v[0], 2 * want[3])


def test_the_benchmark_counts_agreeing_tokens_up_to_the_first_difference():
    """The benchmark's fp8 row reports its agreement with the bf16 row through these (the GPU run cannot
    fail on them): a reply counts its tokens before the first difference, at most AGREE_TOKENS."""
    from drills.benchmarks import c1_engine as bench

    n = bench.AGREE_TOKENS
    agree = bench.fp8_agreement([[7] * n, [1, 2, 3], [4]], [[7] * n, [1, 5, 3], [4]])
    assert agree == dict(requests=3, all_agree=1, fewest=1, mean=(n + 1 + 1) / 3)
    assert f"first {n} tokens in 1 of 3 requests" in bench.fp8_note(agree)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the e4m3 cache in compiled kernels"
)
def test_on_a_gpu_the_compiled_kernels_serve_fp8_as_the_cpu_rule_does():
    """Catches, on a GPU only: F3's compiled store or decode reading other codes than the interpreter's
    (the e4m3 cast rounds by hardware there), a CUDA graph or the overlap replaying a stale fp8 page.
    The same tiny model and prompts as the CPU test, CUDA graphs and overlap on (the GPU defaults), against
    the torch path's replies on the CPU: the same tokens, logits within the kernels' rounding."""
    prompts = _prompts((5, 20, 11))
    got, got_logits = _run(_llm("kernels", device="cuda"), prompts, 8)
    ref, ref_logits = _run(_llm("torch"), prompts, 8)
    got_logits = [[row.cpu() for row in rows] for rows in got_logits]
    assert got == ref, f"GPU kernels {got}, CPU torch path {ref}"
    assert _shared_logit_gap(ref, got, ref_logits, got_logits) < 0.02
