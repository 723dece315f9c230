"""The engine loop, in the style of vLLM's and nano-vllm's LLMEngine: one step at a time.

Engine.step() is one iteration: the scheduler picks the step's tokens (C1), prepare_inputs builds the
tensors (C1), the model runs with attention through the paged cache (L1 store, L4 prefill, F1 decode),
the sampler draws a token for each sequence that reached its last token, and the scheduler books it.
A decode step on a GPU replays a CUDA graph captured for the next batch size up (graphs.py). `parts`
names the code each job uses (sources.py): yours or the reference.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from drills.device_errors import raise_device_errors
from drills.engine import sampler
from drills.engine.attention import KernelAttention, PagedKVCache, TorchPagedAttention
from drills.engine.config import EngineConfig
from drills.engine.graphs import DecodeGraphs
from drills.engine.model import Llama, forward


@dataclass
class Stats:
    """What the engine counted since it started (LLM.status() and the benchmark read them)."""

    steps: int = 0
    prefill_tokens: int = 0  # prompt tokens computed (prefix hits excluded)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    graph_steps: int = 0
    cascade_steps: int = 0  # decode steps served by F2's cascade_decode
    peak_blocks: int = (
        0  # the most KV blocks in use at once, after a step's scheduling (LLM.generate resets it)
    )
    seconds: float = 0.0
    first_token_s: list = field(default_factory=list)  # per request, from add_request to its first token

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Engine:
    """Scheduler + inputs + model + sampler, one step at a time.

    model          model.Llama (weights on the engine's device, in the model's dtype)
    parts          a namespace with Scheduler, Sequence, prepare_inputs and, for attention="kernels",
                   store_kvcache, paged_prefill, plan, split_kv_decode (sources.load())
    block_manager  an L3 BlockManager over the cache's blocks
    cache          the PagedKVCache those blocks index
    config         EngineConfig (its defaults when None): the attention path, the scheduler's limits,
                   the longest request, CUDA graphs
    eos_id         the end-of-sequence token (None: every request runs to max_tokens)
    generator      draws of the requests whose SamplingParams give no random_state
    """

    def __init__(
        self,
        model: Llama,
        parts,
        block_manager,
        cache: PagedKVCache,
        config: EngineConfig | None = None,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
    ):
        config = config or EngineConfig()
        self.config = config
        self.model, self.parts, self.block_manager, self.cache = model, parts, block_manager, cache
        self.scheduler = parts.Scheduler(
            block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            chunked_prefill=config.chunked_prefill,
        )
        self.attention = (
            KernelAttention(cache, parts, model.config.num_heads)
            if config.attention == "kernels"
            else TorchPagedAttention(cache)
        )
        self.eos_id = eos_id
        self.max_model_len = config.model_len(model.config)
        self.generator = generator
        self.stats = Stats()
        self.on_logits = None  # on_logits(seqs, logits (R, V)) before sampling: tests compare every step
        self._ids = itertools.count()
        self._added: dict = {}  # seq_id -> time added, until its first token
        self._counted: set = set()  # sequences whose prefix hits are in the stats
        self.graphs = None
        if config.graphs_on(model.device):
            self.graphs = DecodeGraphs(
                model, self.attention, cache.block_size, self.max_model_len, config.max_num_seqs
            )

    def add_request(self, prompt_ids: list[int], params) -> object:
        """Queue one prompt (token ids); returns its Sequence. Refused (ValueError) when it could never
        run: longer than the model's context or than the whole KV pool."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: a request needs at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"context of {self.max_model_len} tokens"
            )
        seq = self.parts.Sequence(next(self._ids), prompt_ids, params, self.eos_id)
        self.scheduler.add(seq)
        self._added[seq.seq_id] = time.perf_counter()
        self.stats.prompt_tokens += len(prompt_ids)
        return seq

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list:
        """One step; returns the sequences that finished in it."""
        t0 = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self.scheduler.has_work:
                raise RuntimeError(
                    "the scheduler scheduled nothing while requests wait: no progress possible"
                )
            return []
        in_use = self.cache.num_blocks - self.block_manager.num_free_blocks  # the step's blocks are allocated
        self.stats.peak_blocks = max(self.stats.peak_blocks, in_use)
        cascade = self._cascade(scheduled)
        graph = self.graphs.batch_for(scheduled) if self.graphs and cascade is None else None
        device = self.model.device
        inputs = self.parts.prepare_inputs(scheduled, self.block_manager, device, pad_to=graph)
        if graph:
            logits = self.graphs.run(inputs)
            self.stats.graph_steps += 1
        else:
            self.attention.begin_step(inputs, cascade=cascade)
            self.stats.cascade_steps += cascade is not None
            logits = forward(
                self.model, inputs.input_ids, inputs.positions, self.attention, inputs, inputs.logits_rows
            )
        seqs = [scheduled[i].seq for i in inputs.sample_index]
        if self.on_logits is not None:
            self.on_logits(seqs, logits)
        # The one host sync of the step. Called through the module: a grader watches every draw by
        # replacing sampler.sample.
        tokens = sampler.sample(logits, seqs, self.generator)
        # A reference kernel's guard records a bad device value (a slot, a length, a block id) in the
        # device error word instead of reading past a tensor; read it here, where the GPU has just been
        # waited for: a wrong value from the scheduler raises, naming the argument, within the step.
        raise_device_errors(device)
        sampled = [None] * len(scheduled)
        for i, token in zip(inputs.sample_index, tokens):
            sampled[i] = token
        now = time.perf_counter()
        for seq in seqs:
            added = self._added.pop(seq.seq_id, None)
            if added is not None:
                self.stats.first_token_s.append(now - added)
        for item in scheduled:
            if item.seq.seq_id not in self._counted:  # first scheduled since added: its prefix hits
                self._counted.add(item.seq.seq_id)
                self.stats.cached_tokens += item.seq.num_cached
            decode_row = item.num_new == 1 and item.seq.output and item.samples
            if not decode_row:
                self.stats.prefill_tokens += item.num_new
        finished = self.scheduler.postprocess(scheduled, sampled)
        self.stats.steps += 1
        self.stats.output_tokens += len(tokens)
        self.stats.seconds += time.perf_counter() - t0
        return finished

    def _cascade(self, scheduled):
        """(F2's plan, prefix_group, prefix_lens) for a decode step whose sequences share their first
        pages, where F2's planner finds that reading them once pays; else None (F1 serves the step)."""
        if not (self.config.cascade and isinstance(self.attention, KernelAttention)):
            return None
        if not all(item.num_new == 1 for item in scheduled):
            return None
        tables = [self.block_manager.block_table(item.seq.seq_id) for item in scheduled]
        lens = [item.seq.num_computed + 1 for item in scheduled]  # the step's token stored first
        groups, prefix_lens = shared_prefixes(tables, lens, self.cache.block_size)
        if not prefix_lens:
            return None
        cplan = self.attention.cascade_plan(lens, groups, prefix_lens)
        return None if cplan is None else (cplan, groups, prefix_lens)

    def run(self, seqs) -> None:
        """Step until every sequence in `seqs` has finished."""
        while not all(s.finished for s in seqs):
            self.step()


def shared_prefixes(tables: list[list[int]], lens: list[int], page: int) -> tuple[list[int], list[int]]:
    """Sequences grouped by their first block, and each group's shared pages, in tokens:
    (prefix_group [B], prefix_lens [G]) as F2's cascade_decode takes them.

    The members of a group share the longest run of identical block ids at the start of their tables,
    cut to whole pages every member has filled (the prefix cache shares full blocks only), as vLLM's
    get_num_common_prefix_blocks finds the blocks all running requests hold. A sequence alone in its
    group, or whose group shares no whole page, gets -1.
    """
    by_first: dict[int, list[int]] = {}
    for i, table in enumerate(tables):
        if table:
            by_first.setdefault(table[0], []).append(i)
    groups, prefix_lens = [-1] * len(tables), []
    for members in by_first.values():
        if len(members) < 2:
            continue
        first = tables[members[0]]
        n = min(min(len(tables[i]) for i in members), min(lens[i] for i in members) // page)
        for i in members[1:]:
            t = tables[i]
            k = 0
            while k < n and t[k] == first[k]:
                k += 1
            n = k
        if n == 0:
            continue
        for i in members:
            groups[i] = len(prefix_lens)
        prefix_lens.append(n * page)
    return groups, prefix_lens
