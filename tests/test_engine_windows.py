"""The engine serves gpt-oss-style layers: sliding windows and attention sinks, through L5.

A tiny model alternates a 5-token window (smaller than two pages of 4, past one) with a full layer, and
every layer carries sink logits. The engine runs it on the course's kernels (L5 for the windowed layer,
L4 and F1 for the full one) in chunked prefill and decode steps, and must give, token for token under
greedy, what a plain-torch forward of the same model gives (oracle.greedy_generate: the window as a
mask, the sink as one more column of the softmax). CPU only, Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from drills.device_errors import error_word
from drills.engine.attention import KernelAttention, PagedKVCache
from drills.engine.config import tiny_config
from drills.engine.model import Llama, check_sinks, forward, random_weights
from drills.engine.oracle import ReferenceAttention, causal_attention, packed_step
from drills.solutions import f1_split_kv_decode, l1_paged_kv_cache, l4_paged_prefill, l5_unified_attention
from drills.solutions.c1_engine import SamplingParams
from tests.markers import CPU_KERNELS

WINDOW = 5
# Untied: with the logits read off the embedding each token predicts itself and every output repeats.
CONFIG = dataclasses.replace(tiny_config(), tie_word_embeddings=False, windows=(WINDOW, None), sinks=True)
PLAIN = dataclasses.replace(CONFIG, windows=None, sinks=False)
NEW_TOKENS = 6
PAGE = 4


def _prompts(lens=(11, 3, 23)) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, CONFIG.vocab_size, (n,), generator=g).tolist() for n in lens]


def _weights(config=CONFIG):
    return random_weights(config, stream=3)


def _without_features(weights):
    """The same weights as a plain Llama: no window, no sinks."""
    layers = [dataclasses.replace(layer, sinks=None) for layer in weights.layers]
    return dataclasses.replace(weights, config=PLAIN, layers=layers)


def _engine_tokens(
    weights, prompts, attention="kernels", parts=None, device="cpu", **settings
) -> list[list[int]]:
    from drills.engine.llm import LLM

    llm = LLM(
        weights,
        attention=attention,
        use="solutions",
        parts=parts,
        device=device,
        dtype=torch.float32,
        block_size=PAGE,
        num_blocks=40,
        max_num_batched_tokens=16,  # the 23-token prompt runs in chunks over its cached prefix
        quiet=True,
        **settings,
    )
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    return [o.token_ids for o in outs]


class _AsTheCacheHolds(ReferenceAttention):
    """The oracle fed the fp16 values the kernels' cache holds (q, k and v rounded, the output rounded as
    the kernels' is), computed in fp32: a tie broken by rounding cannot fail the test."""

    def __call__(self, layer, q, k, v, meta):
        def r(t):
            return t.half().float()

        return r(super().__call__(layer, r(q), r(k), r(v), meta))


def _oracle_tokens(weights, prompts, rounded=True) -> list[list[int]]:
    model = Llama(weights)
    got = []
    for prompt in prompts:
        attention = (_AsTheCacheHolds if rounded else ReferenceAttention)(
            model.config, [layer.sinks for layer in model.weights.layers]
        )
        tokens, new = [], list(prompt)
        for _ in range(NEW_TOKENS):
            context = len(prompt) + len(tokens) - len(new)
            ids, positions, rows, meta = packed_step([(0, new, context)])
            tokens.append(int(forward(model, ids, positions, attention, meta, rows)[0].argmax()))
            new = [tokens[-1]]
        got.append(tokens)
    return got


@pytest.fixture(scope="module")
def served():
    """The windowed model's tokens from the oracle and from the kernel engine, overlap off."""
    weights, prompts = _weights(), _prompts()
    return SimpleNamespace(
        weights=weights,
        prompts=prompts,
        oracle=_oracle_tokens(weights, prompts),
        engine=_engine_tokens(weights, prompts, overlap=False),
    )


@CPU_KERNELS
def test_windowed_layers_with_sinks_match_the_torch_oracle_token_for_token(served):
    assert served.engine == served.oracle, (
        "the engine's greedy tokens differ from the oracle's (window mask + sink in the denominator): "
        f"engine {served.engine}, oracle {served.oracle}"
    )


@CPU_KERNELS
def test_the_window_and_the_sinks_change_the_tokens(served):
    # Otherwise the test above could not fail: an engine that ignored both must give other tokens.
    plain = _oracle_tokens(_without_features(served.weights), served.prompts)
    assert plain != served.oracle, "the window and the sinks do not change this model's greedy tokens"
    no_sinks = [
        dataclasses.replace(layer, sinks=torch.full_like(layer.sinks, -1e4))
        for layer in served.weights.layers
    ]
    only_window = _oracle_tokens(dataclasses.replace(served.weights, layers=no_sinks), served.prompts)
    assert only_window != served.oracle, "the sinks alone do not change this model's greedy tokens"


@CPU_KERNELS
def test_overlap_on_gives_the_same_tokens_as_lockstep(served):
    overlapped = _engine_tokens(served.weights, served.prompts, overlap=True)
    assert overlapped == served.engine, f"overlap on: {overlapped}, off: {served.engine}"


class _ReplayedGraph:
    """A decode graph as a captured CUDA graph treats the host's state: one warm-up run, then the capture
    run; each replay runs it again with the attention's plans as the capture left them and nothing reset
    in between (a replay calls no begin_step). A tensor that one run made and the next one reads instead
    of making its own then shows as stale here, as it is on a GPU (the warm-up's, there)."""

    def __init__(self, run, attention):
        self.run, self.attention = run, attention
        run()  # the warm-up on the side stream
        self.plans = (dict(attention.unified_plans), attention.plan)
        self.out = run().clone()

    def replay(self):
        self.attention.unified_plans, self.attention.plan = dict(self.plans[0]), self.plans[1]
        self.out.copy_(self.run())

    def pool(self):
        return None


@CPU_KERNELS
def test_decode_graph_replays_make_their_rows_lengths_each_time(monkeypatch):
    """Catches: the windowed layers' decode rows (the lengths clamped for padding rows) kept from an
    earlier run of the forward, as a graph captured after its warm-up run keeps them (on an H200 the
    tokens left the oracle's at the first decode step a graph replayed)."""
    import contextlib

    from drills.engine import graphs
    from drills.engine.llm import LLM

    weights, prompts = _weights(), _prompts()
    llm = LLM(
        weights, attention="kernels", use="solutions", device="cpu", dtype=torch.float32, block_size=PAGE,
        num_blocks=40, max_num_batched_tokens=16, max_model_len=64, max_num_seqs=4, quiet=True,
    )  # fmt: skip
    engine = llm.engine
    monkeypatch.setattr(
        graphs, "_capture_one", lambda run, pool: (g := _ReplayedGraph(run, engine.attention), g.out)
    )
    monkeypatch.setattr(graphs, "_capturing", contextlib.nullcontext)
    engine.graphs = graphs.DecodeGraphs(engine.model, engine.attention, PAGE, 64, 4, fused=engine.fused)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    assert engine.stats.graph_steps > 0, "no decode step replayed a graph: the test no longer reaches them"
    got, want = [o.token_ids for o in outs], _oracle_tokens(weights, prompts)
    assert got == want, f"through replayed decode graphs {got}, oracle {want}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: L5 compiled, CUDA graphs")
def test_on_a_gpu_compiled_l5_under_cuda_graphs_and_overlap_matches_the_oracle():
    """Catches, on a GPU only: L5 compiled differently from its interpretation, a captured decode graph
    that replays a stale window start or sink, the overlap reading a placeholder's row. CUDA graphs and
    the overlap on (the GPU defaults), token for token against the same oracle as the CPU tests."""
    # Not the `served` fixture: its CPU engine runs the kernels in the interpreter, which a process that
    # compiles them for the GPU cannot also do.
    weights, prompts = _weights(), _prompts()
    oracle = _oracle_tokens(weights, prompts)
    got = _engine_tokens(weights, prompts, device="cuda")
    assert got == oracle, f"GPU engine {got}, oracle {oracle}"


@CPU_KERNELS
def test_torch_attention_path_serves_windows_and_sinks_too(served):
    got = _engine_tokens(served.weights, served.prompts, attention="torch", overlap=False)
    assert got == _oracle_tokens(served.weights, served.prompts, rounded=False)


class _Spy:
    """The kernels the engine calls, counted (layer calls per kernel) and passed through."""

    def __init__(self):
        self.calls = {}

        def counted(name, fn):
            def run(*args, **kwargs):
                self.calls[name] = self.calls.get(name, 0) + 1
                return fn(*args, **kwargs)

            return run

        self.parts = SimpleNamespace(
            paged_prefill=counted("paged_prefill", l4_paged_prefill.paged_prefill),
            split_kv_decode=counted("split_kv_decode", f1_split_kv_decode.split_kv_decode),
            unified_attention=counted("unified_attention", l5_unified_attention.unified_attention),
        )


@CPU_KERNELS
def test_full_layers_stay_on_l4_and_f1_and_give_todays_tokens():
    """A window wider than every context and no sinks: the windowed layer runs L5 and the full layer L4
    and F1, and the tokens are the no-window engine's (L5 with its features off is L4)."""
    prompts = _prompts((11, 3))
    wide = dataclasses.replace(PLAIN, windows=(64, None))
    weights = dataclasses.replace(_weights(PLAIN), config=wide)
    spy, plain_spy = _Spy(), _Spy()
    got = _engine_tokens(weights, prompts, parts=spy.parts, overlap=False)
    today = _engine_tokens(_weights(PLAIN), prompts, parts=plain_spy.parts, overlap=False)
    assert got == today, f"window 64 over contexts below it: {got}, the no-window engine: {today}"
    assert "unified_attention" not in plain_spy.calls, "a model without windows or sinks called L5"
    steps = plain_spy.calls["paged_prefill"] + plain_spy.calls["split_kv_decode"]  # 2 layers a step
    assert spy.calls.get("unified_attention") == steps // 2, (
        f"the windowed layer should run L5 once a step ({steps // 2} steps): {spy.calls}"
    )
    assert spy.calls["paged_prefill"] + spy.calls["split_kv_decode"] == steps // 2, (
        f"the full layer should stay on L4 and F1 once a step: {spy.calls}"
    )


@CPU_KERNELS
def test_decode_padding_rows_of_a_graph_batch_are_served():
    """A CUDA graph's decode batch pads with rows of one token over context length 0, which L5's guard
    refuses as such: the engine must still serve the real rows (and raise nothing)."""
    cache = PagedKVCache(CONFIG, 8, PAGE, torch.float16)
    parts = SimpleNamespace(
        unified_plan=l5_unified_attention.plan,
        plan=f1_split_kv_decode.plan,
        store_kvcache=l1_paged_kv_cache.store_kvcache,
        **vars(_Spy().parts),
    )
    attn = KernelAttention(cache, parts, CONFIG.num_heads, windows=list(CONFIG.windows), sinks=[None, None])
    g = torch.Generator().manual_seed(0)
    Hq, Hkv, D = CONFIG.num_heads, CONFIG.num_kv_heads, CONFIG.head_dim
    cache.k.copy_(torch.randn(cache.k.shape, generator=g).half())
    cache.v.copy_(torch.randn(cache.v.shape, generator=g).half())
    meta = SimpleNamespace(
        slot_mapping=torch.tensor([4 * PAGE + 2, -1]),  # row 1 is padding
        context_lens=torch.tensor([11, 0], dtype=torch.int32),
        block_tables=torch.tensor([[3, 1, 4], [0, 0, 0]], dtype=torch.int32),
        is_decode=True,
        context_lens_list=[11, 0],
        cu_seqlens_q=None,  # a captured decode step's inputs carry none
    )
    attn.begin_step(meta)
    q = torch.randn(2, Hq, D, generator=g)
    k, v = torch.randn(2, Hkv, D, generator=g), torch.randn(2, Hkv, D, generator=g)
    before = error_word("cpu").clone()
    out = attn(0, q, k, v, meta)
    assert torch.equal(error_word("cpu"), before), "the padding row raised a device error"
    keys = torch.cat([cache.k[0, b] for b in (3, 1, 4)])[:11]  # (11, Hkv, D)
    values = torch.cat([cache.v[0, b] for b in (3, 1, 4)])[:11]
    want = causal_attention(q[:1].half().float(), keys.float(), values.float(), D**-0.5, WINDOW)
    torch.testing.assert_close(out[:1].float(), want, atol=2e-3, rtol=2e-3)


def test_bad_windows_and_sinks_raise_naming_the_field():
    with pytest.raises(ValueError, match="windows"):
        dataclasses.replace(CONFIG, windows=(WINDOW,))
    with pytest.raises(ValueError, match=r"windows\[1\]"):
        dataclasses.replace(CONFIG, windows=(WINDOW, 0))
    with pytest.raises(ValueError, match=r"windows\[0\]"):
        dataclasses.replace(CONFIG, windows=(True, None))
    with pytest.raises(TypeError, match="sinks"):
        dataclasses.replace(CONFIG, sinks=1)
    weights = _weights()
    missing = dataclasses.replace(
        weights, layers=[dataclasses.replace(weights.layers[0], sinks=None)] + weights.layers[1:]
    )
    with pytest.raises(ValueError, match=r"layers\[0\]\.sinks"):
        check_sinks(missing)
    bad = torch.full((CONFIG.num_heads,), float("nan"))
    nan = dataclasses.replace(
        weights, layers=[weights.layers[0], dataclasses.replace(weights.layers[1], sinks=bad)]
    )
    with pytest.raises(ValueError, match=r"layers\[1\]\.sinks"):
        Llama(nan)
    with pytest.raises(ValueError, match=r"layers\[0\]\.sinks"):
        Llama(dataclasses.replace(weights, config=PLAIN))


@CPU_KERNELS
def test_the_benchmarks_gpt_oss_model_builds_and_serves_on_the_cpu():
    """make bench L=c1's gpt-oss-shaped row, shrunk for a CPU: its config (alternating windows of 128,
    sinks) and random weights build, the engine serves them, and the roofline's byte count takes sinks."""
    from drills.benchmarks import c1_engine as bench_c1
    from drills.engine.config import gpt_oss_shaped_config
    from drills.engine.llm import LLM

    full = gpt_oss_shaped_config(4)
    assert full.windows == (128, None, 128, None) and full.sinks
    assert (full.num_heads, full.num_kv_heads, full.head_dim) == (64, 8, 64)
    weights = bench_c1.gpt_oss_weights(
        "cpu", torch.float32, 2, hidden_size=64, intermediate_size=64, vocab_size=300
    )
    assert weights.layers[0].sinks.shape == (64,) and weights.layers[0].sinks.dtype == torch.float32
    llm = LLM(weights, attention="torch", use="solutions", device="cpu", num_blocks=64, quiet=True)
    prompts = [list(range(140)), list(range(7, 30))]  # one past the 128-token window
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    bench_c1._check_outputs(llm, prompts, [o.token_ids for o in outs], steps=3, top=1)
    stats = SimpleNamespace(decode_steps=2, decode_context_tokens=300)
    assert bench_c1.decode_bytes(llm, stats) > 0
