"""The engine loop, in the style of vLLM's and nano-vllm's LLMEngine: one step at a time.

Engine.step() is one iteration: the scheduler picks the step's tokens (C1), prepare_inputs builds the
tensors (C1), the model runs with attention through the paged cache (L1 store, L4 prefill, F1 decode),
the sampler draws a token for each sequence that reached its last token, and the scheduler books it.
A decode step on a GPU replays a CUDA graph captured for the next batch size up, and so does a step with
prompt tokens that fills the token budget exactly (graphs.py). `parts`
names the code each job uses (sources.py): yours or the reference.
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field

import torch

from drills.device_errors import describe as describe_error
from drills.device_errors import error_word
from drills.engine import fp8, sampler
from drills.engine.attention import KernelAttention, PagedKVCache, TorchPagedAttention
from drills.engine.batch import DeviceBatch
from drills.engine.config import EngineConfig
from drills.engine.graphs import DecodeGraphs, PromptGraphs
from drills.engine.model import Llama, attention_features, forward
from drills.engine.sampling_rows import SamplingRows


@dataclass
class Stats:
    """What the engine counted since it started (LLM.status() and the benchmark read them)."""

    steps: int = 0
    prefill_tokens: int = 0  # prompt tokens computed (prefix hits excluded)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    graph_steps: int = 0  # decode steps replayed as a CUDA graph
    prompt_graph_steps: int = 0  # steps with prompt tokens replayed as a CUDA graph
    cascade_steps: int = 0  # decode steps served by F2's cascade_decode
    overlap_steps: int = 0  # steps whose tokens stayed on the device while the next step was prepared
    device_input_steps: int = 0  # decode steps whose inputs DeviceBatch built on the device
    peak_blocks: int = (
        0  # the most KV blocks in use at once, after a step's scheduling (LLM.generate resets it)
    )
    seconds: float = 0.0
    decode_steps: int = 0  # steps in which every sequence computed one token
    decode_tokens: int = 0  # the tokens those steps sampled
    decode_context_tokens: int = 0  # the KV tokens those steps read, summed over their sequences
    decode_seconds: float = 0.0  # the host's time in those steps (the GPU's runs under it when overlapped)
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
        fused_store = config.fused_store_on(model.device)  # raises where asked for without its path
        windows, sinks = attention_features(model)  # layers with either run L5 (attention.py)
        self.attention = (
            KernelAttention(
                cache, parts, model.config.num_heads, fused_store=fused_store, windows=windows, sinks=sinks
            )
            if config.attention == "kernels"
            else TorchPagedAttention(cache, windows, sinks)
        )
        if getattr(cache, "fp8", False):  # an e4m3 cache: F3's store and decode, L4 on dequantized pages
            self.attention = fp8.for_cache(self.attention)
        self.eos_id = eos_id
        self.max_model_len = config.model_len(model.config)
        self.generator = generator
        self.stats = Stats()
        self.on_logits = None  # on_logits(seqs, logits (R, V)) before sampling: tests compare every step
        self._ids = itertools.count()
        self._added: dict = {}  # seq_id -> time added, until its first token
        self._counted: set = set()  # sequences whose prefix hits are in the stats
        self.fused = config.fused_on(model.device)
        self.overlap = config.overlap_on(model.device)
        # Placeholders for tokens still on the device: ids past the vocabulary, so never a real token.
        self.placeholder_base = model.config.vocab_size
        self._pending = None  # the step whose tokens are on their way to the host
        # The status a finished Sequence holds, from the module that defines it (C1's FINISHED).
        self._finished_status = getattr(sys.modules.get(parts.Sequence.__module__), "FINISHED", "finished")
        self._buffers = _Buffers(config.max_num_seqs, model.device)
        self._staging = _Staging(model.device) if self.overlap and model.device.type == "cuda" else None
        # The overlapped steps' sampling parameters, kept on the device while the step's rows stay.
        self.sampling_rows = SamplingRows(self._staging)
        self.batch = None  # steady decode steps' inputs, built on the device (config.device_inputs)
        if config.device_inputs_on(model.device):
            self.batch = DeviceBatch(
                config.max_num_seqs, self.max_model_len, cache.block_size, model.device, staging=self._staging
            )
        self.graphs = None
        if config.graphs_on(model.device):
            self.graphs = DecodeGraphs(
                model,
                self.attention,
                cache.block_size,
                self.max_model_len,
                config.max_num_seqs,
                fused=self.fused,
            )
        self.prompt_graphs = None
        if config.prompt_graphs_on(model.device):
            self.prompt_graphs = PromptGraphs(
                model,
                self.attention,
                cache.block_size,
                self.max_model_len,
                config.max_num_seqs,
                config.max_num_batched_tokens,
                fused=self.fused,
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
        return self.scheduler.has_work or self._pending is not None

    def step(self) -> list:
        """One step; returns the sequences that finished (their tokens all known on the host).

        With the overlap on (EngineConfig.overlap), every step leaves its sampled tokens on the device,
        whatever its requests' sampling and stop rules: the sampler draws on the device
        (sampler.sample_on_device), the scheduler books placeholders (vocab_size + row, never a real
        id), and the next step reads the real ids from the device where its inputs hold a placeholder.
        The host meanwhile schedules and prepares that next step while the GPU still runs this one, and
        reads this step's tokens (one pinned copy, the device error word with them) only once the next
        is queued. A request whose real token then turns out to stop it (end-of-sequence, a stop token)
        has run one step too many: that step's token is dropped, and the request finishes there, its
        blocks freed. A sequence that finished in such a step is returned by the step after, or by
        flush().
        """
        t0 = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self.scheduler.has_work:
                raise RuntimeError(
                    "the scheduler scheduled nothing while requests wait: no progress possible"
                )
            return self.flush()
        in_use = self.cache.num_blocks - self.block_manager.num_free_blocks  # the step's blocks are allocated
        self.stats.peak_blocks = max(self.stats.peak_blocks, in_use)
        cascade = self._cascade(scheduled)
        graph = self.graphs.batch_for(scheduled) if self.graphs and cascade is None else None
        prompt_graph = None
        if graph is None and cascade is None and self.prompt_graphs is not None:
            prompt_graph = self.prompt_graphs.batch_for(scheduled)  # a batch size, or None
        device = self.model.device
        inputs = None
        if self.batch is not None and cascade is None and prompt_graph is None:
            # A steady decode step: its tables are on the device already, only new block ids are sent.
            inputs = self.batch.build(scheduled, self.block_manager, pad_to=graph)
            self.stats.device_input_steps += inputs is not None
        if inputs is None:
            staged = self._staging is not None
            # Staged: built on the host, then sent in one non-blocking copy from pinned memory; a pageable
            # copy per tensor would block the host until the GPU, still running the previous step, got to it.
            inputs = self.parts.prepare_inputs(
                scheduled, self.block_manager, "cpu" if staged else device, pad_to=graph
            )
            if self.batch is not None:
                self.batch.rows_for(scheduled, inputs)  # the rows its tables go to, sent with them
            if staged:
                inputs = self._staging.send(inputs)
            if self.batch is not None:
                self.batch.register(inputs)  # the rows on the device follow prepare_inputs
        if self._pending is not None:
            # The previous step's tokens, still on the device, replace their placeholders in the inputs.
            inputs.input_ids = self._pending.resolve(inputs.input_ids, self.placeholder_base)
        if graph:
            logits = self.graphs.run(inputs)
            self.stats.graph_steps += 1
        elif prompt_graph:
            logits = self.prompt_graphs.run(inputs, prompt_graph)
            self.stats.prompt_graph_steps += 1
        else:
            self.attention.begin_step(inputs, cascade=cascade)
            self.stats.cascade_steps += cascade is not None
            logits = forward(
                self.model,
                inputs.input_ids,
                inputs.positions,
                self.attention,
                inputs,
                inputs.logits_rows,
                fused=self.fused,
            )
        seqs = [scheduled[i].seq for i in inputs.sample_index]
        if self.on_logits is not None:
            self.on_logits(seqs, logits)
        done, stops = [], []
        if self.overlap:
            pending = _Pending.launch(logits, seqs, self._buffers, device, self._draw)
            if self._pending is not None:
                done, stops = self._settle(self._pending)  # waits for the previous step only
            self._pending = pending
            self.stats.overlap_steps += 1
            tokens = [self.placeholder_base + r for r in range(len(seqs))]
        else:
            if self._pending is not None:
                done, stops = self._settle(self._pending)
            # A reference kernel's guard records a bad device value (a slot, a length, a block id) in the
            # device error word instead of reading past a tensor. Its copy is queued behind the forward,
            # so the sampler's own wait for the tokens brings it too: one wait a step.
            errors = self._buffers.copy_errors(device)
            # The step's host sync. Called through the module: a grader watches every draw by replacing
            # sampler.sample.
            tokens = sampler.sample(logits, seqs, self.generator)
            # A wrong value from the scheduler raises here, naming the argument, in the step it broke.
            self._raise_errors(errors.wait())
        sampled = [None] * len(scheduled)
        for i, token in zip(inputs.sample_index, tokens):
            sampled[i] = token
        if self._added or not inputs.is_decode or len(seqs) < len(scheduled):
            self._count_new(scheduled, seqs)
        # else every row is a decode row of a sequence that had its first token (and its prefix hits
        # counted) before: a step of 256 rows skips two loops over them
        finished = self.scheduler.postprocess(scheduled, sampled)
        if self._pending is not None and self._pending.seqs is seqs:
            self._pending.mark(seqs)  # where each placeholder sits, once postprocess appended it
            self._pending.finished = finished
            finished = []
        # The requests the previous step's real tokens stopped: booked just now for one step more (their
        # row of this step computed a token past their end), they end here instead.
        done += self._stop(stops)
        if not self.overlap and self._has_stop_ids(seqs):
            # In lockstep the tokens are real: a stop token ends its request in the step that drew it
            # (postprocess knows only the end-of-sequence token).
            stops = [
                (s, len(s.output) - 1) for s, t in zip(seqs, tokens) if not s.finished and self._stops(s, t)
            ]
            finished += self._stop(stops)
        took = time.perf_counter() - t0
        self.stats.steps += 1
        self.stats.output_tokens += len(tokens)
        self.stats.seconds += took
        if inputs.is_decode:
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(tokens)
            self.stats.decode_context_tokens += sum(inputs.context_lens_list)
            self.stats.decode_seconds += took
        return done + finished

    def _count_new(self, scheduled, seqs) -> None:
        """The stats of a step with prompt tokens: first tokens, prefix hits, prompt tokens computed."""
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

    def _raise_errors(self, word: list[int]) -> None:
        if word[0] != 0:
            error_word(self.model.device).zero_()
            raise ValueError(describe_error(word))

    def flush(self) -> list:
        """Read the tokens a step left on the device into their sequences; returns the sequences that
        finished in that step, or that its tokens stopped. Engine.run and LLM.generate call it once their
        sequences are done."""
        if self._pending is None:
            return []
        done, stops = self._settle(self._pending)
        return done + self._stop(stops)

    def abort(self, seq) -> None:
        """End a request now, wherever it is (waiting, running, or with its last token still on the
        device): its blocks are freed and its output keeps the tokens already known; a token still on
        its way to the host is dropped. A finished request is left as it is."""
        if seq.finished:
            return
        if self._pending is not None and any(s is seq for s, _ in self._pending.slots):
            _, index = next(slot for slot in self._pending.slots if slot[0] is seq)
            self._stop([(seq, index - 1)])
        else:
            self._finish(seq)

    @property
    def pending_seq_ids(self) -> set:
        """The sequences whose last output token is still a placeholder (its real id on the device)."""
        return set() if self._pending is None else {s.seq_id for s, _ in self._pending.slots}

    def _draw(self, logits, seqs) -> torch.Tensor:
        """The step's tokens (R,) int64, left on the device: no host sync. The rows' parameters stay on
        the device from one step to the next (self.sampling_rows); an all-greedy step is one argmax."""
        # Called through the module, as sampler.sample is: a test may watch every draw by replacing it.
        return sampler.sample_on_device(logits, seqs, self.generator, rows=self.sampling_rows)

    def _settle(self, pending) -> tuple[list, list]:
        """Wait for `pending`'s copy, write its tokens where its placeholders are, and raise any bad device
        value its kernels recorded (the error word came back with the tokens). Returns (the sequences
        that finished in that step, (seq, index) of each running one whose real token at output[index]
        stops it)."""
        self._pending = None if self._pending is pending else self._pending
        tokens, errors = pending.wait()
        self._raise_errors(errors)
        placeholder = self.placeholder_base - 1
        slots = {id(seq): index for seq, index in pending.slots}  # rows a stop or an abort dropped: gone
        stops = []
        for seq, token in zip(pending.seqs, tokens):
            placeholder += 1  # row r's: placeholder_base + r
            index = slots.get(id(seq))
            if index is None:
                continue
            output = seq.output
            if 0 <= index < len(output) and output[index] == placeholder:
                output[index] = token
            elif placeholder in seq.prompt:  # a preemption folded the output into the prompt
                seq.prompt[len(seq.prompt) - 1 - seq.prompt[::-1].index(placeholder)] = token
                index = None
            else:
                raise RuntimeError(
                    f"sequence {seq.seq_id!r} no longer holds the placeholder {placeholder} its step "
                    "sampled into: Sequence.output (or prompt) must keep each token where postprocess put it"
                )
            if not seq.finished and self._stops(seq, token):
                stops.append((seq, index))
        return pending.finished, stops

    def _stops(self, seq, token: int) -> bool:
        """Whether `token`, just known, ends `seq`: the scheduler's own rule (end-of-sequence unless
        ignore_eos), which it could not apply to a placeholder, and any stop token its params name."""
        if token == seq.eos_id and not seq.params.ignore_eos:
            return True
        return token in (getattr(seq.params, "stop_token_ids", None) or ())

    @staticmethod
    def _has_stop_ids(seqs) -> bool:
        """Whether any of `seqs` names stop tokens (each distinct SamplingParams looked at once)."""
        return any(getattr(p, "stop_token_ids", None) for p in _distinct_params(seqs))

    def _stop(self, stops) -> list:
        """End each (seq, index) of `stops` at output[index], its stop token: every later token (the
        placeholder of the one step it ran past its end) is dropped, and the sequence finishes, its blocks
        freed, unless postprocess finished it already (max_tokens reached in that step). Returns them."""
        ended = []
        pending = self._pending
        for seq, index in stops:
            if index is not None:
                dropped = len(seq.output) - index - 1
                del seq.output[index + 1 :]
                self.stats.output_tokens -= dropped
            if pending is not None:
                pending.slots = [slot for slot in pending.slots if slot[0] is not seq]
                pending.finished = [s for s in pending.finished if s is not seq]
            if not seq.finished:
                self._finish(seq)
            ended.append(seq)
        return ended

    def _finish(self, seq) -> None:
        """Finish a sequence the scheduler still holds, as its postprocess finishes one: out of the running
        list (its blocks freed) or of the waiting queue, status finished."""
        scheduler = self.scheduler
        if any(s is seq for s in scheduler.running):
            scheduler.running.remove(seq)
            self.block_manager.free(seq.seq_id)
        elif any(s is seq for s in scheduler.waiting):
            scheduler.waiting.remove(seq)
        seq.status = self._finished_status

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
        """Step until every sequence in `seqs` has finished, its tokens all on the host."""
        while not all(s.finished for s in seqs):
            self.step()
        self.flush()


class _Buffers:
    """Where a step's sampled ids and the device error word meet to come back in one copy: two device
    buffers of [rows + 4] int64 (the ids, then the word) and two pinned host ones, used in turn, so a
    step's copy never lands where the previous step's tokens still wait to be read. And one pinned word
    for the steps that sample on the host."""

    WORD = 4  # int64s in the device error word

    def __init__(self, rows: int, device):
        pin = device.type == "cuda"
        self.device = [torch.empty(rows + self.WORD, dtype=torch.int64, device=device) for _ in range(2)]
        self.host = [torch.empty(rows + self.WORD, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.word = torch.empty(self.WORD, dtype=torch.int64, pin_memory=pin)
        self.turn = 0

    def next(self):
        self.turn ^= 1
        return self.device[self.turn], self.host[self.turn]

    def copy_errors(self, device) -> _Copy:
        """The error word, on its way to the host behind the step's kernels."""
        self.word.copy_(error_word(device), non_blocking=True)
        return _Copy(self.word, device)


class _Copy:
    """A non-blocking device-to-host copy and the event that says it has landed."""

    def __init__(self, host, device):
        self.host = host
        self.event = None
        if device.type == "cuda":
            self.event = torch.cuda.Event()
            self.event.record()

    def wait(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class _Staging:
    """A step's input tensors, built on the host, packed into one pinned buffer and copied to the device
    in one non-blocking copy. Two host buffers are used in turn, each reused only once its last copy has
    run (an event), so the host never overwrites bytes a queued copy has yet to read."""

    ALIGN = 16  # every tensor starts 16-byte aligned on the device, as the kernels' loads assume

    def __init__(self, device, nbytes: int = 1 << 23):
        self.device = device
        self.host = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.events = [None, None]
        self.dev = torch.empty(nbytes, dtype=torch.uint8, device=device)  # in stream order: one is enough
        self.turn = 0

    def send(self, inputs):
        fields = {k: v for k, v in vars(inputs).items() if isinstance(v, torch.Tensor)}
        offsets, total = {}, 0
        for name, t in fields.items():
            offsets[name] = total
            total += -(-t.numel() * t.element_size() // self.ALIGN) * self.ALIGN
        if total > self.dev.numel() or any(t.device.type != "cpu" for t in fields.values()):
            for name, t in fields.items():  # too large for the buffers: one copy per tensor
                setattr(inputs, name, t.to(self.device, non_blocking=True))
            return inputs
        self.turn ^= 1
        host, event = self.host[self.turn], self.events[self.turn]
        if event is not None:
            event.synchronize()  # this buffer's copy of two steps ago has run
        for name, t in fields.items():
            n = t.numel() * t.element_size()
            host[offsets[name] : offsets[name] + n].copy_(t.contiguous().view(-1).view(torch.uint8))
        self.dev[:total].copy_(host[:total], non_blocking=True)
        self.events[self.turn] = torch.cuda.Event()
        self.events[self.turn].record()
        for name, t in fields.items():
            n = t.numel() * t.element_size()
            setattr(inputs, name, self.dev[offsets[name] : offsets[name] + n].view(t.dtype).view(t.shape))
        return inputs


class _Pending:
    """One step's tokens on the device, on their way to the host (one non-blocking pinned copy that
    brings the device error word with them)."""

    def __init__(self, tokens, copy, seqs):
        self.tokens, self.copy = tokens, copy
        self.seqs = seqs
        self.slots = []  # (seq, index in seq.output) of each row's placeholder
        self.finished = []  # sequences that finished in the step, returned once their tokens are known

    @classmethod
    def launch(cls, logits, seqs, buffers, device, draw):
        rows = logits.shape[0]
        packed, host = buffers.next()  # (rows_max + 4,) int64 each
        tokens = packed[:rows]  # (R,): on the device, no round trip before the next step reads them
        if rows:
            tokens.copy_(draw(logits, seqs))
        packed[rows : rows + _Buffers.WORD].copy_(error_word(device))  # the kernels' guards, with them
        host = host[: rows + _Buffers.WORD]
        host.copy_(packed[: rows + _Buffers.WORD], non_blocking=True)
        return cls(tokens, _Copy(host, device), seqs)

    def mark(self, seqs):
        # postprocess appended each placeholder as the sequence's last output token.
        self.slots = [(seq, len(seq.output) - 1) for seq in seqs]

    def resolve(self, input_ids, base: int):
        """input_ids with every placeholder (base + row) replaced by that row's token, on the device."""
        rows = (input_ids - base).clamp(0, self.tokens.shape[0] - 1)  # clamped: never read past the tokens
        return torch.where(input_ids >= base, self.tokens[rows], input_ids)

    def wait(self) -> tuple[list[int], list[int]]:
        values = self.copy.wait()
        return values[: -_Buffers.WORD], values[-_Buffers.WORD :]


def _distinct_params(seqs):
    """The SamplingParams of `seqs`, each object once: requests usually share one, so a question about
    the step's sampling costs a look at each distinct one, not one per row."""
    return {id(s.params): s.params for s in seqs}.values()


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
