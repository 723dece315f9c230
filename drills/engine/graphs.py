"""The graph runner: decode steps captured once as CUDA graphs, then replayed with each step's inputs.

A decode step has the same shapes every time for a given batch, which is what a CUDA graph needs, and
at small batch it is bound by its kernel launches: a replay issues them all at once. One graph is
captured per batch size in GRAPH_BATCHES up to max_num_seqs; a step replays the next size up, padded
by prepare_inputs(pad_to=...) with rows the kernels skip. Steps with prompt tokens run eagerly.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from drills.engine import collector
from drills.engine.model import forward

# Decode batch sizes captured as graphs: a step pads up to the next one (at most 1.5x the rows past 32).
GRAPH_BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class DecodeGraphs:
    """Decode steps captured as CUDA graphs, one per batch size in GRAPH_BATCHES up to max_num_seqs.

    Every graph reads its inputs from the same static buffers; a step copies its StepInputs into them
    (padded to the graph's batch by prepare_inputs) and replays. F1's plan is made once per graph, for
    the longest context the engine allows, so no replay depends on a length read on the host.

    model          model.Llama on a CUDA device
    attention      the engine's attention.KernelAttention (its cache is the one the graphs read)
    max_model_len  the longest context a replay may meet (the plan's and the block tables' width)
    fused          capture the forward through fused.py's kernels
    """

    def __init__(
        self, model, attention, block_size: int, max_model_len: int, max_num_seqs: int, fused: bool = False
    ):
        device = model.device
        self.batches = [b for b in GRAPH_BATCHES if b <= max_num_seqs] or [max_num_seqs]
        if self.batches[-1] < max_num_seqs:
            self.batches.append(max_num_seqs)
        top = self.batches[-1]
        pages = -(-max_model_len // block_size)
        self.ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.slots = torch.full((top,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(top, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(top, pages, dtype=torch.int32, device=device)
        self.graphs, self.outputs = {}, {}
        gc.collect()  # no dead cycle left to free CUDA memory, pinned memory or events mid-capture
        with collector.paused():
            self._capture(model, attention, max_model_len, fused)
        torch.cuda.synchronize()

    def _capture(self, model, attention, max_model_len: int, fused: bool) -> None:
        pool = None
        for b in reversed(self.batches):  # largest first, so the smaller ones reuse its memory pool
            meta = _StaticInputs(
                slot_mapping=self.slots[:b],
                context_lens=self.context_lens[:b],
                block_tables=self.block_tables[:b],
                is_decode=True,
                context_lens_list=[0] * b,
            )
            attention.begin_step(meta, plan_len=max_model_len)

            def run(b=b, meta=meta):
                return forward(model, self.ids[:b], self.positions[:b], attention, meta, None, fused=fused)

            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                run()  # compiles every kernel before capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = run()  # (b, V)
            pool = graph.pool()
            self.graphs[b] = graph

    def batch_for(self, scheduled) -> int | None:
        """The captured batch this step replays: None for a step with prompt tokens (it runs eagerly)."""
        if not all(item.num_new == 1 for item in scheduled):
            return None
        return next((b for b in self.batches if b >= len(scheduled)), None)

    def run(self, inputs) -> torch.Tensor:
        """The step's logits (R, V): its StepInputs copied into the static buffers, the graph replayed."""
        b = inputs.input_ids.shape[0]
        self.ids[:b].copy_(inputs.input_ids)
        self.positions[:b].copy_(inputs.positions)
        self.slots[:b].copy_(inputs.slot_mapping)
        self.context_lens[:b].copy_(inputs.context_lens)
        width = inputs.block_tables.shape[1]
        self.block_tables[:b, :width].copy_(inputs.block_tables)  # columns past a row's pages: never read
        self.graphs[b].replay()
        return self.outputs[b][inputs.logits_rows]


@dataclass
class _StaticInputs:
    """The fields of StepInputs a captured decode step reads, as views of the static buffers."""

    slot_mapping: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    is_decode: bool
    context_lens_list: list
