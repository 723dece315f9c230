"""PromptGraphs' own logic on any device: which steps replay a graph, and what its buffers hold.

A CUDA graph replays the kernels it captured on whatever its static buffers hold at replay time, so
everything PromptGraphs adds to a step is in those buffers: the step's tokens, positions and slots, its
cu_seqlens_q with the padding sequences held at the step's total, its lengths, block tables and logits
rows. Here each capture is replaced by its own closure, re-run on replay into the output the capture
returned (_EagerGraph): on a CPU, under the interpreter, the same buffers reach the same kernels. A
stale boundary, slot, table row or logits row then shows as it would on the GPU: a guard's error, or
other logits and tokens than the eager steps'. tests/test_cuda_graphs.py runs the real captures on a GPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import drills.runtime
from drills.engine import graphs
from drills.engine.config import EngineConfig, tiny_config
from drills.engine.llm import LLM
from drills.engine.model import random_weights
from drills.solutions.c1_engine import SamplingParams

BUDGET, SEQS, MODEL_LEN, PAGE = 32, 4, 128, 16


class _EagerGraph:
    """A captured closure, re-run on replay into the output its capture returned."""

    def __init__(self, run):
        self.run = run
        self.out = run().clone()

    def replay(self):
        self.out.copy_(self.run())

    def pool(self):
        return None


def _eager_capture(run, pool):
    graph = _EagerGraph(run)
    return graph, graph.out


def _device():
    """The kernels' device: the interpreter's CPU, or the GPU where Triton compiles."""
    return drills.runtime.current().device


@pytest.fixture
def eager_graphs(monkeypatch):
    monkeypatch.setattr(graphs, "_capture_one", _eager_capture)
    monkeypatch.setattr(graphs, "_capturing", contextlib.nullcontext)


def sharp_tiny_weights(stream: int, dtype=torch.float32, device="cpu"):
    """tiny_config()'s random weights, the QKV and gate/up projections scaled by 5: sharper attention and
    MLP, so that greedy tokens depend on the context (tests/test_cuda_graphs.py uses them too)."""
    weights = random_weights(tiny_config(), stream=stream, dtype=dtype, device=device)
    for layer in weights.layers:
        layer.wqkv.mul_(5)
        layer.w_gate_up.mul_(5)
    return weights


def watch_logits(engine) -> dict:
    """{seq_id: [each sampled logits row, an fp32 copy]}, filled as `engine` steps."""
    rows = {}

    def on_logits(seqs, logits):
        for seq, row in zip(seqs, logits):
            rows.setdefault(seq.seq_id, []).append(row.float().clone())

    engine.on_logits = on_logits
    return rows


def watch_replays(engine) -> list:
    """[(sequences, padded batch, decode rows)] of each step `engine` replays through its PromptGraphs,
    filled as it steps (empty, and nothing watched, without prompt graphs)."""
    replays, graphs_ = [], engine.prompt_graphs
    if graphs_ is not None:
        replay = graphs_.run

        def watched(inputs, batch):
            lens = inputs.cu_seqlens_q.diff().tolist()
            replays.append((len(lens), batch, sum(n == 1 for n in lens)))
            return replay(inputs, batch)

        graphs_.run = watched
    return replays


def _run(with_graphs: bool):
    """Greedy tokens, each request's sampled logits rows and the cache, on the kernel path of the
    runtime's device; with_graphs attaches PromptGraphs for the 32-token budget; and, per replay,
    (sequences, padded batch, decode rows)."""
    llm = LLM(
        sharp_tiny_weights(stream=6),
        use="solutions",
        quiet=True,
        attention="kernels",
        device=_device(),
        dtype=torch.float32,
        cuda_graphs=False,  # the decode graphs need a GPU; the prompt graphs are attached below
        max_num_seqs=SEQS,
        num_blocks=40,
        block_size=PAGE,
        max_model_len=MODEL_LEN,
        max_num_batched_tokens=BUDGET,
    )
    engine = llm.engine
    if with_graphs:
        engine.prompt_graphs = graphs.PromptGraphs(
            engine.model, engine.attention, PAGE, MODEL_LEN, SEQS, BUDGET, fused=engine.fused
        )
    rows, replays = watch_logits(engine), watch_replays(engine)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 6, 19, 40, 3, 33)]
    prompts.append(list(prompts[3]))  # 40 tokens again: two cached blocks, its context past its chunk
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert engine.stats.prompt_graph_steps == len(replays)
    logits = [torch.stack(rows[i]) for i in sorted(rows)]
    return [o.token_ids for o in outs], logits, llm.cache.k.clone(), replays


def test_padded_prompt_steps_compute_what_eager_steps_compute(eager_graphs):
    """Budget-filling steps through PromptGraphs' buffers, padded to the next batch size with sequences
    of no tokens, some with decode rows beside the chunks: the same tokens, logits and K as eager steps."""
    eager, eager_logits, eager_k, none = _run(False)
    graphed, graphed_logits, graphed_k, replays = _run(True)
    assert not none
    assert replays, "no step filled the budget: the test's prompts no longer reach PromptGraphs"
    assert any(b < batch for b, batch, _ in replays), f"no replay was padded: {replays}"
    assert any(decode for _, _, decode in replays), f"no replay had decode rows beside a chunk: {replays}"
    for i, (a, b) in enumerate(zip(eager_logits, graphed_logits)):
        assert a.shape == b.shape, (
            f"request {i}: {b.shape[0]} sampled rows through the graphs, {a.shape[0]} eager"
        )
        diff = (a - b).abs().max().item()
        assert diff < 1e-3, f"request {i}: logits {diff:.2e} from the eager steps'"
    assert graphed == eager, f"tokens through the prompt graphs {graphed}, eager {eager}"
    torch.testing.assert_close(graphed_k, eager_k, atol=1e-3, rtol=1e-3, msg="K in the cache")


def test_only_steps_of_the_captured_token_count_replay(eager_graphs):
    """batch_for: a step of another token count, or a pure decode step, runs eagerly (None); a batch
    of B sequences replays the smallest captured batch >= B; fewer sequences than the budget needs
    at max_model_len get no graph at all."""
    from types import SimpleNamespace

    llm = LLM(
        random_weights(tiny_config(), 0), use="solutions", quiet=True, attention="kernels", device=_device()
    )
    step = [SimpleNamespace(num_new=n) for n in (20, 1, 1, 10)]  # 32 tokens, 4 sequences
    pg = graphs.PromptGraphs(llm.model, llm.engine.attention, PAGE, MODEL_LEN, 8, BUDGET)
    assert pg.batches == [1, 2, 4, 8]
    assert pg.batch_for(step) == 4
    assert pg.batch_for(step[:3] + [SimpleNamespace(num_new=9)]) is None  # 31 tokens
    assert pg.batch_for(step[:1] + [SimpleNamespace(num_new=12)]) == 2
    assert pg.batch_for([SimpleNamespace(num_new=1)] * 32) is None  # pure decode: the decode graphs'
    # 32 tokens of at most 8 each: a batch below 4 never holds them, so none is captured.
    narrow = graphs.PromptGraphs(llm.model, llm.engine.attention, 8, 8, 8, BUDGET)
    assert narrow.batches == [4, 8]


class _NoGraph:
    def replay(self):
        pass

    def pool(self):
        return None


def test_replay_buffers_hold_the_step_and_its_padding(monkeypatch):
    """After a step of 7 sequences, one of 5 replays the same graph of 8: every buffer must hold the new
    step's values, and padding sequences 5-7 a boundary at the total (no tokens), not the 7-sequence
    step's boundaries, which would give them tokens and decreasing cu_seqlens_q; the logits rows too."""
    from types import SimpleNamespace

    outputs = []

    def capture(run, pool):  # no forward: only the buffers are under test
        outputs.append(torch.arange(8 * 3, dtype=torch.float32).view(8, 3))
        return _NoGraph(), outputs[-1]

    monkeypatch.setattr(graphs, "_capture_one", capture)
    monkeypatch.setattr(graphs, "_capturing", contextlib.nullcontext)
    llm = LLM(
        random_weights(tiny_config(), 0), use="solutions", quiet=True, attention="kernels", device=_device()
    )
    pg = graphs.PromptGraphs(llm.model, llm.engine.attention, PAGE, MODEL_LEN, 8, BUDGET)

    def step(lens, width, stream):
        g = torch.Generator().manual_seed(stream)
        cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
        rows = (cu[1:] - 1).to(torch.int64)[: len(lens) - 1]  # all but the last sample
        return SimpleNamespace(
            input_ids=torch.randint(0, 256, (BUDGET,), generator=g),
            positions=torch.randint(0, MODEL_LEN, (BUDGET,), generator=g),
            slot_mapping=torch.randint(-1, 600, (BUDGET,), generator=g),
            cu_seqlens_q=cu,
            context_lens=torch.tensor(lens, dtype=torch.int32) + 3,
            block_tables=torch.randint(0, 40, (len(lens), width), generator=g, dtype=torch.int32),
            logits_rows=rows,
        )

    big, small = step([6, 1, 1, 9, 5, 8, 2], 3, 1), step([10, 1, 12, 1, 8], 2, 2)
    assert pg.batch_for([SimpleNamespace(num_new=n) for n in [6, 1, 1, 9, 5, 8, 2]]) == 8
    assert pg.batch_for([SimpleNamespace(num_new=n) for n in [10, 1, 12, 1, 8]]) == 8
    pg.run(big, 8)
    logits = pg.run(small, 8)
    assert pg.cu_seqlens[:9].tolist() == small.cu_seqlens_q.tolist() + [BUDGET] * 3
    for name in ("input_ids", "positions", "slot_mapping"):
        buffer = {"input_ids": pg.ids, "positions": pg.positions, "slot_mapping": pg.slots}[name]
        assert torch.equal(buffer.cpu(), getattr(small, name)), f"{name} is not the step's"
    assert torch.equal(pg.context_lens[:5].cpu(), small.context_lens)
    assert torch.equal(pg.block_tables[:5, :2].cpu(), small.block_tables)
    assert torch.equal(pg.logits_rows[:4].cpu(), small.logits_rows)
    assert logits.shape == (4, 3), "the logits are cut to the step's sampled rows"


def test_prompt_graphs_asked_for_without_cuda_graphs_is_refused():
    """prompt_graphs=True where the decode graphs cannot run (a CPU, or attention in torch) raises,
    naming the setting, instead of running eagerly while the settings say otherwise."""
    with pytest.raises(ValueError, match="prompt_graphs"):
        EngineConfig(prompt_graphs=True).prompt_graphs_on(torch.device("cpu"))
    with pytest.raises(ValueError, match="prompt_graphs"):
        EngineConfig(attention="torch", prompt_graphs=True).prompt_graphs_on(torch.device("cuda"))
    assert EngineConfig().prompt_graphs_on(torch.device("cpu")) is False
    assert EngineConfig(prompt_graphs=False).prompt_graphs_on(torch.device("cuda")) is False
