"""The graph runner: engine steps captured once as CUDA graphs, then replayed with each step's inputs.

DecodeGraphs: a decode step has the same shapes every time for a given batch, which is what a CUDA
graph needs, and at small batch it is bound by its kernel launches: a replay issues them all at once.
One graph is captured per batch size in GRAPH_BATCHES up to max_num_seqs; a step replays the next size
up, padded by prepare_inputs(pad_to=...) with rows the kernels skip.

PromptGraphs: a step with prompt tokens that fills the scheduler's token budget exactly (chunked
prefill fills it while prompts wait) has the same token count every time, and L4's grid needs only
shapes. One graph per batch size is captured for that token count, attention included; a step pads
its batch with sequences of no tokens, which L4 skips. Other steps with prompt tokens run eagerly.
"""

from __future__ import annotations

import contextlib
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
        self.batches = _batches(max_num_seqs)
        top = self.batches[-1]
        pages = -(-max_model_len // block_size)
        self.ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.slots = torch.full((top,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(top, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(top, pages, dtype=torch.int32, device=device)
        self.graphs, self.outputs = {}, {}
        with _capturing():
            self._capture(model, attention, max_model_len, fused)

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

            self.graphs[b], self.outputs[b] = _capture_one(run, pool)  # outputs (b, V)
            pool = self.graphs[b].pool()

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


class PromptGraphs:
    """Steps with prompt tokens of exactly `tokens` new tokens, captured as CUDA graphs, attention (L4's
    paged_prefill) included: one graph per batch size in GRAPH_BATCHES up to max_num_seqs.

    An eager prompt step issues some 300 launches from Python, and the GPU finishes each soon after it
    is launched: the step takes the host's time. Its shapes are fixed by its token count T and its
    batch B, and L4's launch reads no value on the host (its grid is T // BLOCK_Q + B tiles), so one
    token count, the scheduler's budget, which every step fills while prompts wait, serves most of them.
    A step of B sequences replays the graph of the next batch size up: the padding sequences have no
    tokens (cu_seqlens_q stays at T), which L4 skips, and no logits row.

    model          model.Llama on a CUDA device
    attention      the engine's attention.KernelAttention (its cache is the one the graphs write and read)
    max_model_len  the longest context (the block tables' width); a batch smaller than
                   tokens / max_model_len never holds `tokens` and gets no graph
    tokens         the token count captured: EngineConfig.max_num_batched_tokens
    fused          capture the forward through fused.py's kernels
    """

    def __init__(
        self,
        model,
        attention,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        tokens: int,
        fused: bool = False,
    ):
        device = model.device
        self.tokens = T = tokens
        pages = -(-max_model_len // block_size)
        least = -(-T // max_model_len)  # fewer sequences than this cannot hold T tokens
        self.batches = [b for b in _batches(max_num_seqs) if b >= least]
        top = self.batches[-1] if self.batches else 0
        self.ids = torch.zeros(T, dtype=torch.int64, device=device)
        self.positions = torch.zeros(T, dtype=torch.int64, device=device)
        self.slots = torch.full((T,), -1, dtype=torch.int64, device=device)
        self.cu_seqlens = torch.zeros(top + 1, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(top, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(top, pages, dtype=torch.int32, device=device)
        self.logits_rows = torch.zeros(top, dtype=torch.int64, device=device)  # always rows < T
        self.graphs, self.outputs = {}, {}
        if self.batches:
            with _capturing():
                self._capture(model, attention, fused)

    def _capture(self, model, attention, fused: bool) -> None:
        T, pool = self.tokens, None
        for b in reversed(self.batches):  # largest first, so the smaller ones reuse its memory pool
            # While capturing, the kernels run once for real on these values: a valid step of T tokens
            # spread over min(b, T) sequences (each at most max_model_len, since b >= least), no slot
            # stored (-1), every table row on block 0, the rest padding.
            n = min(b, T)
            lens = [T // n + (i < T % n) for i in range(n)] + [0] * (b - n)
            cu = [0]
            for k in lens:
                cu.append(cu[-1] + k)
            self.cu_seqlens[: b + 1].copy_(torch.tensor(cu, dtype=torch.int32))
            self.context_lens[:b].copy_(torch.tensor(lens, dtype=torch.int32))
            meta = _StaticInputs(
                slot_mapping=self.slots,
                context_lens=self.context_lens[:b],
                block_tables=self.block_tables[:b],
                is_decode=False,
                context_lens_list=lens,
                cu_seqlens_q=self.cu_seqlens[: b + 1],
            )
            attention.begin_step(meta)

            def run(b=b, meta=meta):
                rows = self.logits_rows[:b]
                return forward(model, self.ids, self.positions, attention, meta, rows, fused=fused)

            self.graphs[b], self.outputs[b] = _capture_one(run, pool)  # outputs (b, V)
            pool = self.graphs[b].pool()
        self.block_tables.zero_()

    def batch_for(self, scheduled) -> int | None:
        """The captured batch this step replays: None unless it has prompt tokens and exactly `tokens`
        new tokens (decode steps have their own graphs)."""
        if not self.batches or all(item.num_new == 1 for item in scheduled):
            return None
        if sum(item.num_new for item in scheduled) != self.tokens:
            return None
        return next((b for b in self.batches if b >= len(scheduled)), None)

    def run(self, inputs, batch: int) -> torch.Tensor:
        """The step's logits (R, V): its StepInputs (not padded) copied into the static buffers, the
        graph of `batch` sequences replayed."""
        B, R = inputs.context_lens.shape[0], inputs.logits_rows.shape[0]
        self.ids.copy_(inputs.input_ids)
        self.positions.copy_(inputs.positions)
        self.slots.copy_(inputs.slot_mapping)
        self.cu_seqlens[: B + 1].copy_(inputs.cu_seqlens_q)
        if batch > B:
            self.cu_seqlens[B + 1 : batch + 1].fill_(self.tokens)  # padding: no tokens, never read further
        self.context_lens[:B].copy_(inputs.context_lens)
        width = inputs.block_tables.shape[1]
        self.block_tables[:B, :width].copy_(inputs.block_tables)  # columns past a row's pages: never read
        # Rows past R keep an earlier step's rows (all < T): their logits are computed and cut below.
        self.logits_rows[:R].copy_(inputs.logits_rows)
        self.graphs[batch].replay()
        # A copy: the next replay of this graph overwrites its output while the caller may still hold it.
        return self.outputs[batch][:R].clone()


def _batches(max_num_seqs: int) -> list[int]:
    """GRAPH_BATCHES up to max_num_seqs, then max_num_seqs itself if it is not one of them."""
    batches = [b for b in GRAPH_BATCHES if b <= max_num_seqs] or [max_num_seqs]
    if batches[-1] < max_num_seqs:
        batches.append(max_num_seqs)
    return batches


@contextlib.contextmanager
def _capturing():
    """Around a set of captures: a full collection first (no dead cycle left to free CUDA memory, pinned
    memory or events mid-capture), the collector paused while they run, and a sync once they are done."""
    gc.collect()
    with collector.paused():
        yield
    torch.cuda.synchronize()


def _capture_one(run, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """run() captured as a graph in `pool` (None: a new one), after one eager run on a side stream that
    compiles every kernel first. Returns the graph and the output tensor its replays write."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


@dataclass
class _StaticInputs:
    """The fields of StepInputs a captured step reads, as views of the static buffers."""

    slot_mapping: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    is_decode: bool
    context_lens_list: list
    cu_seqlens_q: torch.Tensor | None = None  # prompt steps only (L4 reads it; F1 does not)
