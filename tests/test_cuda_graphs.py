"""The decode-step APIs inside CUDA graphs, as a serving engine runs them (GPU only).

An engine records one decode step per batch size as a CUDA graph, then, step after step, writes the new
values into the same buffers (queries, caches, block tables, lengths, slots) and replays the graph. So
the public functions must launch without reading device memory on the host, and the replay must give
what an eager call on the same values gives. These tests capture the references' public functions
(L1 store_kvcache, L2 paged_decode, F1 split_kv_decode) and replay them on new values, padding
sequences (context_lens = 0) and padding slots (-1) included. A learner's file runs the same launchers
and checks (the stub contract), so what holds here holds for theirs.

Also here: drills.launch, which calls a kernel's compiled binary directly, must keep apart what Triton
keeps apart (a misaligned view is another binary).
"""

from __future__ import annotations

import pytest
import torch

import drills.runtime
from drills import device_errors
from drills.compare import assert_close
from drills.tests.paged_kv import make_paged_case, paged_attention_reference

if drills.runtime.current().interpreter:
    pytest.skip(
        "CUDA-graph capture needs a GPU; under the interpreter these checks are skipped",
        allow_module_level=True,
    )

from drills.engine.config import tiny_config  # noqa: E402
from drills.solutions import f1_split_kv_decode as f1  # noqa: E402 - after the GPU check
from drills.solutions import l1_paged_kv_cache as l1  # noqa: E402
from drills.solutions import l2_paged_decode as l2  # noqa: E402
from tests.test_engine_prompt_graphs import sharp_tiny_weights, watch_logits, watch_replays  # noqa: E402

HQ, HKV, D, PAGE, MAX_PAGES, NUM_BLOCKS = 8, 2, 64, 16, 8, 48
DIMS = ("b", "head", "d")
# Lengths of the captured step, then of the steps replayed: ragged, padding sequences (0), one full table.
CAPTURED = [37, 0, 20, 5]
REPLAYED = [[3, 50, 0, 64], [0, 0, 1, 16], [128, 77, 0, 0]]


def case(lens, stream):
    return make_paged_case(
        lens, HQ, HKV, D, PAGE, device="cuda", stream=stream, num_blocks=NUM_BLOCKS, max_pages=MAX_PAGES
    )


def capture(fn) -> torch.cuda.CUDAGraph:
    fn()  # compile and warm up outside the capture, as an engine does
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def load(buffers, new) -> None:
    """Write a new step's values into the captured buffers, in place (what the engine does per step)."""
    for buffer, value in zip(buffers, new):
        buffer.copy_(value)


def test_l2_paged_decode_replays_new_values():
    buffers = case(CAPTURED, stream=1).args
    out = torch.empty_like(buffers[0])
    graph = capture(lambda: l2.paged_decode(*buffers, out=out))
    for i, lens in enumerate(REPLAYED):
        step = case(lens, stream=10 + i)
        load(buffers, step.args)
        graph.replay()
        eager = l2.paged_decode(*step.args, check=True)
        assert torch.equal(out, eager), f"replay {i} (lengths {lens}) differs from an eager call"
        assert_close(out, paged_attention_reference(*step.args)[0], DIMS)
        assert (out[torch.tensor(lens) == 0] == 0).all(), "a padding sequence's output must be 0"


@pytest.mark.parametrize("splits", [None, 4], ids=["planned", "four-splits"])
def test_f1_split_kv_decode_replays_new_values(splits):
    """One plan for the whole graph: it covers the longest length the graph will see (the table's
    capacity), as an engine plans for the graph's bucket, not for one step."""
    buffers = case(CAPTURED, stream=2).args
    plan = f1.plan([MAX_PAGES * PAGE] * len(CAPTURED), HKV, PAGE, num_splits=splits)
    out = torch.empty_like(buffers[0])
    lse = []
    graph = capture(lambda: lse.append(f1.split_kv_decode(*buffers, plan=plan, out=out, return_lse=True)[1]))
    captured_lse = lse[-1]  # the buffer the graph writes
    for i, lens in enumerate(REPLAYED):
        step = case(lens, stream=20 + i)
        load(buffers, step.args)
        graph.replay()
        eager, eager_lse = f1.split_kv_decode(*step.args, plan=plan, return_lse=True, check=True)
        assert torch.equal(out, eager) and torch.equal(captured_lse, eager_lse), (
            f"replay {i} (lengths {lens}) differs from an eager call"
        )
        ref, ref_lse = paged_attention_reference(*step.args)
        assert_close(out, ref, DIMS)
        pad = torch.tensor(lens) == 0
        assert (out[pad] == 0).all() and (captured_lse[pad] == float("-inf")).all()
        assert torch.allclose(captured_lse[~pad], ref_lse[~pad], atol=2e-3, rtol=1e-3)


def test_l1_store_kvcache_replays_new_values():
    N, pool_slots = 6, NUM_BLOCKS * PAGE
    gen = torch.Generator(device="cuda").manual_seed(3)
    key = torch.randn(N, HKV, D, device="cuda", generator=gen, dtype=torch.float16)
    value = torch.randn_like(key)
    slots = torch.randperm(pool_slots, device="cuda", generator=gen)[:N]
    slots[2] = -1  # a padding slot: writes nothing
    k_cache = torch.zeros(NUM_BLOCKS, PAGE, HKV, D, device="cuda", dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    graph = capture(lambda: l1.store_kvcache(key, value, k_cache, v_cache, slots))
    for i in range(3):
        new_key, new_value = torch.randn_like(key), torch.randn_like(value)
        new_slots = torch.randperm(pool_slots, device="cuda", generator=gen)[:N]
        new_slots[i] = -1
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        l1.store_kvcache(new_key, new_value, expected_k, expected_v, new_slots, check=True)
        load((key, value, slots), (new_key, new_value, new_slots))
        graph.replay()
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v), f"replay {i}"


def test_a_bad_value_replayed_is_contained_and_named():
    """The device error word has a fixed address, so a captured graph's kernels record into it on every
    replay: a length the engine got wrong between replays is contained (that row zeros, the others as
    an eager call gives them) and named by raise_device_errors(), and the next valid replay is clean."""
    buffers = case(CAPTURED, stream=3).args
    out = torch.empty_like(buffers[0])
    graph = capture(lambda: l2.paged_decode(*buffers, out=out))
    device_errors.raise_device_errors("cuda")
    step = case(REPLAYED[0], stream=30)
    load(buffers, step.args)
    buffers[4][1] = MAX_PAGES * PAGE + 1  # context_lens[1] past what its table row holds
    graph.replay()
    with pytest.raises(ValueError, match=r"context_lens\[1\] = 129"):
        device_errors.raise_device_errors("cuda")
    assert (out[1] == 0).all(), "the row with the bad length must be zeros"
    eager = l2.paged_decode(*step.args, check=True)
    keep = torch.arange(len(CAPTURED), device="cuda") != 1
    assert torch.equal(out[keep], eager[keep]), "the valid rows of the replay changed"
    load(buffers, step.args)
    graph.replay()
    device_errors.raise_device_errors("cuda")  # valid again: nothing recorded
    assert torch.equal(out, eager)


def test_capture_refuses_device_value_checks():
    """check=True reads device values, which capture forbids: a ValueError naming check, before any
    launch; and split_kv_decode without a plan would read the lengths, so it asks for plan."""
    buffers = case(CAPTURED, stream=4).args
    out = torch.empty_like(buffers[0])
    plan = f1.plan(buffers[4], HKV, PAGE)
    l2.paged_decode(*buffers, out=out)  # compiled before the capture
    f1.split_kv_decode(*buffers, plan=plan, out=out)
    torch.cuda.synchronize()
    for call, name in (
        (lambda: l2.paged_decode(*buffers, out=out, check=True), "check"),
        (lambda: f1.split_kv_decode(*buffers, out=out), "plan"),
    ):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(ValueError, match=name):
            with torch.cuda.graph(graph):
                call()
        torch.cuda.synchronize()


def test_eager_call_needs_no_device_sync():
    """With a plan and check left at None, an eager call reads nothing from the device: under
    torch's sync debug mode ("error"), any device-to-host copy raises."""
    buffers = case(CAPTURED, stream=5).args
    plan = f1.plan(buffers[4].tolist(), HKV, PAGE)
    out = torch.empty_like(buffers[0])
    l2.paged_decode(*buffers, out=out)
    f1.split_kv_decode(*buffers, plan=plan, out=out)
    torch.cuda.set_sync_debug_mode("error")
    try:
        l2.paged_decode(*buffers, out=out)
        f1.split_kv_decode(*buffers, plan=plan, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_launch_keeps_misaligned_views_apart():
    """A binary compiled for 16-byte-aligned pointers must not run a q that starts 2 bytes later:
    launch() keys on each pointer's alignment, as Triton does, so the misaligned q gets a binary of
    its own, and both results are right."""
    from drills.launch import cached_binaries

    step = case(CAPTURED, stream=6)
    ref = paged_attention_reference(*step.args)[0]
    numel = step.q.numel()
    buf = torch.empty(numel + 8, device="cuda", dtype=step.q.dtype)
    seen = []
    for start in (0, 1, 0, 1, 8):  # elements: 0 and 8 start 16-byte aligned, 1 does not
        q = buf[start : start + numel].view_as(step.q)
        q.copy_(step.q)
        before = cached_binaries()
        assert_close(l2.paged_decode(q, *step.args[1:]), ref, DIMS)
        seen.append(cached_binaries() - before)
    assert seen[0] <= 1 and seen[1] == 1, f"new binaries per call {seen}: the misaligned q reused one"
    assert seen[2:] == [0, 0, 0], f"new binaries per call {seen}: a seen alignment was not reused"


# --- The engine's decode steps as graphs (drills/engine/graphs.py DecodeGraphs) ----------------------


def _graph_llm(weights, **options):
    """The engine of these tests on the GPU: the references, 8 sequences of 256 tokens at most."""
    from drills.engine.llm import LLM

    return LLM(weights, use="solutions", quiet=True, max_num_seqs=8, max_model_len=256, **options)


def _engine_tokens(weights, prompts, cuda_graphs, max_tokens=12):
    from drills.solutions.c1_engine import SamplingParams

    llm = _graph_llm(weights, num_blocks=64, cuda_graphs=cuda_graphs)
    rows = watch_logits(llm.engine)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    steps = llm.engine.stats.graph_steps
    return [o.token_ids for o in outs], [torch.stack(rows[i]) for i in sorted(rows)], steps


def test_engine_decode_graphs_replay_what_eager_steps_compute():
    """Five ragged requests (a batch of 5 padded to the graph of 8, then fewer as none finish early):
    with decode steps replayed as CUDA graphs, the same tokens as eager steps, and logits within bf16
    noise of them (a graph's decode plan is made for the longest context, so its splits differ)."""
    config = tiny_config()
    weights = sharp_tiny_weights(stream=5, dtype=torch.bfloat16, device="cuda")
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=g).tolist() for n in (1, 7, 16, 23, 40)]
    eager, eager_logits, none = _engine_tokens(weights, prompts, cuda_graphs=False)
    graphed, graphed_logits, replays = _engine_tokens(weights, prompts, cuda_graphs=True)
    assert none == 0 and replays > 0, f"{replays} decode steps ran as graphs"
    for a, b in zip(eager_logits, graphed_logits):
        assert (a - b).abs().max().item() < 0.1, "graph replays gave other logits than eager steps"
    assert graphed == eager, f"tokens with graphs {graphed}, eager {eager}"


# --- Steps with prompt tokens as graphs (drills/engine/graphs.py PromptGraphs) ----------------------

BUDGET = 48  # max_num_batched_tokens of these runs: the token count the prompt graphs are captured for


def _prompt_graph_run(weights, prompts, prompt_graphs: bool, **options):
    """Greedy tokens, every sampled logits row and the KV cache of one run with decode graphs on and the
    prompt graphs on or off; and, per prompt-graph replay, (sequences, padded batch, decode rows)."""
    from drills.solutions.c1_engine import SamplingParams

    llm = _graph_llm(
        weights,
        num_blocks=96,
        max_num_batched_tokens=BUDGET,
        cuda_graphs=True,
        prompt_graphs=prompt_graphs,
        **options,
    )
    rows, replays = watch_logits(llm.engine), watch_replays(llm.engine)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert llm.engine.stats.prompt_graph_steps == len(replays)
    logits = [torch.stack(rows[i]) for i in sorted(rows)]
    return [o.token_ids for o in outs], logits, (llm.cache.k.clone(), llm.cache.v.clone()), replays


@pytest.mark.parametrize(
    "options",
    [
        dict(fused_kernels=True, fused_store=True),
        dict(fused_kernels=True, fused_store=False),
        dict(fused_kernels=False),
    ],
    ids=["fused_store", "l1_store", "torch_ops"],
)
def test_prompt_graphs_replay_what_eager_prompt_steps_compute(options):
    """Ragged prompts in chunks of a 48-token budget, one of them twice (prefix hits): every step that
    fills the budget replays a prompt graph, padded to the next batch size with sequences of no tokens,
    some with decode rows beside the chunks. Against the same run with those steps eager: the same
    tokens, logits within bf16 noise, and the same K and V in the cache (a stale slot, length, table
    row or logits row in the static buffers shows in one of them)."""
    config = tiny_config()
    weights = sharp_tiny_weights(stream=6, dtype=torch.bfloat16, device="cuda")
    g = torch.Generator().manual_seed(8)
    lens = (1, 5, 13, 30, 47, 2, 64, 9, 100, 17, 33)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=g).tolist() for n in lens]
    prompts.append(list(prompts[6]))  # 64 tokens again: four cached blocks, its context past its chunk
    eager, eager_logits, eager_cache, none = _prompt_graph_run(weights, prompts, False, **options)
    graphed, graphed_logits, graphed_cache, replays = _prompt_graph_run(weights, prompts, True, **options)
    assert not none, "prompt_graphs=False replayed a prompt graph"
    assert replays, "no step with prompt tokens replayed a graph"
    assert any(b < batch for b, batch, _ in replays), f"no replay was padded: {replays}"
    assert any(decode for _, _, decode in replays), f"no replay had decode rows beside a chunk: {replays}"
    assert len(eager_logits) == len(graphed_logits) == len(prompts)
    for i, (a, b) in enumerate(zip(eager_logits, graphed_logits)):
        assert a.shape == b.shape, f"request {i}: {b.shape[0]} sampled rows with graphs, {a.shape[0]} eager"
        diff = (a - b).abs().max().item()
        assert diff < 0.1, f"request {i}: graph replays gave logits {diff:.3f} from eager steps'"
    assert graphed == eager, f"tokens with prompt graphs {graphed}, eager {eager}"
    for name, a, b in zip("KV", eager_cache, graphed_cache):
        torch.testing.assert_close(b.float(), a.float(), atol=0.05, rtol=0.02, msg=f"{name} in the cache")
