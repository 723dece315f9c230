"""C1 reference: the engine around the kernels. A scheduler decides what each step computes, and
prepare_inputs turns that decision into the tensors the kernels read (L1's slots, L4's cu_seqlens and
context lengths, the block tables of L2/F1/L4).

A step holds a token budget. Decode rows cost one token each; prompts cost what is not already cached:

    256 requests sharing a 300-token system prompt, block size 16:
    without prefix caching: 256 * (300 + 100) = 102,400 prefill tokens
    with it: 400 + 255 * (300 - 288 + 100) = 28,960   (the first computes all; 288 = 18 full blocks cached)

Read top to bottom: the request's parameters and state (given), the scheduler (admission with prefix
hits, the token budget and chunked prefill, preemption by recomputation, bookkeeping after a step),
then prepare_inputs. The model, the kernels and sampling are in drills/engine/; the engine in
drills/engine/engine.py calls Scheduler.schedule(), prepare_inputs(), the model, then
Scheduler.postprocess() once per step. Explainer: drills/content/c1_engine.md.
"""

from __future__ import annotations

import array
import math
from collections import deque
from dataclasses import dataclass

import torch

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples, as vLLM's and nano-vllm's SamplingParams.

    temperature  0 is greedy (argmax); otherwise logits / temperature before the softmax
    top_k        keep the top_k likeliest tokens (-1 or 0: all)
    top_p        then keep the smallest set of the likeliest tokens whose probabilities sum to at least
                 top_p of what top_k kept (1.0: all)
    min_p        then keep the tokens at least min_p times as likely as the likeliest (0.0: all)
    max_tokens   new tokens at most (the stop token counts)
    random_state an int: this request draws from its own random stream (sampler.Stream: that number and
                 how many tokens it has drawn), so its tokens are reproducible whatever the batch;
                 None: from the engine's generator
    ignore_eos   keep going past the end-of-sequence token (benchmarks: every request gives max_tokens)
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    random_state: int | None = None
    ignore_eos: bool = False
    top_k: int = -1
    min_p: float = 0.0

    def __post_init__(self):
        # NaN and +-inf pass comparisons silently (inf >= 0 holds; temperature inf makes every token
        # equally likely), so a non-finite number is refused first, whichever field it is given for.
        for name in ("temperature", "top_p", "max_tokens", "random_state", "ignore_eos", "top_k", "min_p"):
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise TypeError(f"top_p must be a number, got {type(self.top_p).__name__}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {type(self.max_tokens).__name__}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        rs = self.random_state
        if rs is not None and (isinstance(rs, bool) or not isinstance(rs, int)):
            raise TypeError(f"random_state must be an int or None, got {type(rs).__name__}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an int, got {type(self.top_k).__name__}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or at least 1, got {self.top_k}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, (int, float)):
            raise TypeError(f"min_p must be a number, got {type(self.min_p).__name__}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")


class Sequence:
    """One request as the scheduler sees it: its tokens and how many of them have K and V in the cache.

    tokens = prompt + output. num_computed counts the tokens whose K and V a finished step wrote (or the
    prefix cache supplied); the next step computes tokens[num_computed : num_computed + n]. num_slots
    counts the tokens the block table has room for (all of them once the step is scheduled).
    """

    def __init__(self, seq_id, prompt: list[int], params: SamplingParams, eos_id: int | None = None):
        self.seq_id = seq_id
        self.prompt = list(prompt)
        self.output: list[int] = []
        self.params = params
        self.eos_id = eos_id
        self.status = WAITING
        self.num_computed = 0  # tokens whose K and V are in the cache
        self.num_slots = 0  # tokens the block table holds a slot for
        self.num_cached = 0  # prompt tokens found in the prefix cache at the last admission
        self.preemptions = 0
        self.generator = None  # the sampler's Stream (draws so far) when params.random_state is set

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    def __repr__(self):
        return (
            f"Sequence({self.seq_id!r}, {self.status}, tokens={self.num_tokens}, "
            f"computed={self.num_computed}, output={len(self.output)})"
        )


def _token_at(seq: Sequence, p: int) -> int:
    """seq.tokens[p], without building the list prompt + output that seq.tokens returns (about 500
    ints for a decode row, which reads one)."""
    k = len(seq.prompt)
    return seq.prompt[p] if p < k else seq.output[p - k]


@dataclass
class Scheduled:
    """One sequence's share of a step: its next `num_new` tokens are computed."""

    seq: Sequence
    num_new: int

    @property
    def samples(self) -> bool:
        """The step reaches the sequence's last token, so its logits give the next token (a prefill chunk
        that stops short of the prompt's end samples nothing)."""
        return self.seq.num_computed + self.num_new == self.seq.num_tokens


class Scheduler:
    """Decides, step by step, which tokens of which requests the model computes.

    block_manager           L3's BlockManager (allocate, append, free, block_table, num_cached_tokens,
                            num_free_blocks, block_size, num_blocks)
    max_num_seqs            sequences in one step at most (the batch the CUDA graphs are captured for)
    max_num_batched_tokens  tokens in one step at most: the token budget
    chunked_prefill         a prompt longer than what is left of the budget is computed in chunks over
                            several steps; without it a prompt waits until it fits whole, and add()
                            refuses a request whose prompt + max_tokens - 1 exceeds the budget (a
                            preempted request is recomputed whole, its output so far included)

    Policy (section 3): running sequences first, oldest first (decode rows and unfinished prompts), then
    waiting ones in arrival order while the budget, the batch and the free blocks allow. A decode row
    that needs a block when none is free preempts the newest running sequence: its blocks are freed and
    it waits at the front of the queue, to be recomputed (its prefix likely still cached).
    """

    def __init__(self, block_manager, max_num_seqs=256, max_num_batched_tokens=2048, chunked_prefill=True):
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = bool(chunked_prefill)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is the first to be preempted
        # Blocks whose every slot holds K and V that a finished step wrote. L3 keys a full block when it is
        # allocated, before its K and V exist, so a prefix hit is usable only up to the first block not here.
        self.computed_blocks: set[int] = set()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a request. One that could never fit the pool, even alone, is refused here."""
        need = seq.num_tokens + seq.params.max_tokens - len(seq.output)
        capacity = self.block_manager.num_blocks * self.block_size
        if need > capacity:
            raise ValueError(
                f"request {seq.seq_id!r} needs up to {need} tokens of KV (prompt {seq.num_tokens} + "
                f"max_tokens {seq.params.max_tokens}), more than the whole pool holds ({capacity})"
            )
        # Without chunks, every step computes a sequence's tokens not yet computed whole, and a request
        # preempted after its (max_tokens - 1)-th token is recomputed from need - 1 tokens.
        if not self.chunked_prefill and need - 1 > self.max_num_batched_tokens:
            raise ValueError(
                f"request {seq.seq_id!r} has {seq.num_tokens} prompt tokens and max_tokens "
                f"{seq.params.max_tokens}: recomputed after a preemption it needs up to {need - 1} tokens "
                f"in one step, more than max_num_batched_tokens = {self.max_num_batched_tokens}: "
                "enable chunked_prefill"
            )
        seq.status = WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        """The next step: each scheduled sequence with its number of new tokens, running ones first.

        Afterwards every scheduled sequence has a slot for each of its tokens (num_slots == num_tokens)
        and num_computed + num_new <= num_tokens. An empty list means nothing can run (no work).
        """
        budget = self.max_num_batched_tokens
        scheduled: list[Scheduled] = []
        preempted = False

        # Section 3.2 "Running first": a decode row needs one token, an unfinished prompt its next chunk.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            before = len(self.running)
            if not self._reserve_slots(seq):
                preempted = True  # seq itself was the newest: it waits now
                continue
            preempted |= len(self.running) < before  # newer sequences gave their blocks to this one
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            scheduled.append(Scheduled(seq, num_new))
            budget -= num_new
            i += 1

        # Section 3.3 "Admission": in arrival order, never after a preemption in the same step (the
        # blocks just freed are for the running sequences, or the victim would be admitted again at once).
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            if not self.chunked_prefill and seq.num_tokens > budget:
                break  # it fits whole into a later step's budget (add() checked it fits an empty one)
            try:
                table = self.block_manager.allocate(seq.seq_id, seq.tokens)
            except ValueError:
                break  # not enough free blocks: running sequences finish first
            self.waiting.popleft()
            hits = self.block_manager.num_cached_tokens(seq.seq_id) // self.block_size
            # Section 3.4 "Prefix hits that are really there": blocks handed out fresh hold someone else's
            # old K and V; hits count only up to the first block whose K and V no step has written yet.
            self.computed_blocks.difference_update(table[hits:])
            usable = 0
            while usable < hits and table[usable] in self.computed_blocks:
                usable += 1
            # At least the last token is computed: its logits sample the first new token.
            seq.num_computed = min(usable * self.block_size, seq.num_tokens - 1)
            seq.num_cached = seq.num_computed
            seq.num_slots = seq.num_tokens
            seq.status = RUNNING
            self.running.append(seq)
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            scheduled.append(Scheduled(seq, num_new))
            budget -= num_new
        return scheduled

    def _reserve_slots(self, seq: Sequence) -> bool:
        """Give every token of `seq` a slot in its block table, preempting the newest running sequences
        while a new block is needed and none is free. False when `seq` itself had to be preempted."""
        num_tokens = seq.num_tokens
        while seq.num_slots < num_tokens:
            # Section 3.5 "Preemption": L3's append takes a new block when the last one is full.
            if seq.num_slots % self.block_size == 0 and self.block_manager.num_free_blocks == 0:
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    return False
                continue
            self.block_manager.append(seq.seq_id, _token_at(seq, seq.num_slots))
            if seq.num_slots % self.block_size == 0:
                # A block just handed out: whatever K and V it held belong to a token no longer there.
                self.computed_blocks.discard(self.block_manager.block_table(seq.seq_id)[-1])
            seq.num_slots += 1
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and put it first in line; it is recomputed when readmitted
        (its tokens so far become its prompt, and the prefix cache likely still holds most of them)."""
        self.running.remove(seq)
        self.block_manager.free(seq.seq_id)
        seq.status = WAITING
        seq.num_computed = 0
        seq.num_slots = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def postprocess(self, scheduled: list[Scheduled], sampled: list[int | None]) -> list[Sequence]:
        """Book a finished step: the K and V it wrote, the token each sampling sequence drew (sampled[i]
        for scheduled[i], None where it samples nothing), and the sequences that end. Returns those
        that finished, their blocks already freed."""
        finished = []
        for item, token in zip(scheduled, sampled):
            seq = item.seq
            samples = item.samples
            before = seq.num_computed
            seq.num_computed += item.num_new
            # Section 3.6 "After the step": every block the step filled now holds real K and V. Most
            # decode rows fill none, and skip the copy of their block table.
            if seq.num_computed // self.block_size > before // self.block_size:
                table = self.block_manager.block_table(seq.seq_id)
                self.computed_blocks.update(
                    table[before // self.block_size : seq.num_computed // self.block_size]
                )
            if not samples:
                continue  # a prompt chunk short of the prompt's end: no token yet
            seq.output.append(token)
            stop = token == seq.eos_id and not seq.params.ignore_eos
            if stop or len(seq.output) >= seq.params.max_tokens:
                seq.status = FINISHED
                self.running.remove(seq)
                self.block_manager.free(seq.seq_id)
                finished.append(seq)
        return finished


def _tokens_between(seq: Sequence, start: int, end: int) -> list[int]:
    """seq.tokens[start:end], read from prompt and output directly (a new list, as seq.tokens is)."""
    k = len(seq.prompt)
    if start >= k:
        return seq.output[start - k : end - k]
    if end <= k:
        return seq.prompt[start:end]
    return seq.prompt[start:] + seq.output[: end - k]


@dataclass
class StepInputs:
    """The tensors of one step, packed in scheduling order (B sequences, T new tokens, R sampling rows).

    input_ids     (T,) int64, positions (T,) int64: each new token and its position in its sequence
    slot_mapping  (T,) int64: block_table[p // PAGE] * PAGE + p % PAGE for position p; -1 on padding rows
    cu_seqlens_q  (B + 1,) int32: sequence b's new tokens are rows cu_seqlens_q[b] : cu_seqlens_q[b + 1]
    context_lens  (B,) int32: tokens in the cache once the step's K and V are stored (0 on padding rows)
    block_tables  (B, max_pages) int32, rows padded with 0 past each sequence's pages
    logits_rows   (R,) int64: the rows whose logits sample (each sampling sequence's last new token)
    sample_index  R ints: which scheduled entry each logits row belongs to
    is_decode     every real sequence computes one token: F1's decode serves the step, else L4's prefill
    query_lens, context_lens_list  host copies (python ints) of the same lengths, for the decode plan
    num_seqs      real sequences (B may include padding rows when the step runs as a CUDA graph)
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    logits_rows: torch.Tensor
    sample_index: list[int]
    is_decode: bool
    query_lens: list[int]
    context_lens_list: list[int]
    num_seqs: int


_TYPECODES = {torch.int32: "i", torch.int64: "q"}  # array's type codes of the step's dtypes


def prepare_inputs(scheduled: list[Scheduled], block_manager, device="cpu", pad_to=None) -> StepInputs:
    """The tensors the model and the kernels read for `scheduled` (built on the host, copied once).

    pad_to  for a decode step run as a CUDA graph captured for a larger batch: add padding sequences up
            to pad_to (one token each, slot -1, context length 0, a table row of zeros), which the
            kernels skip; their logits rows are not sampled
    """
    page = block_manager.block_size
    ids, positions, slots, cu, ctx, tables, rows, index = [], [], [], [0], [], [], [], []
    seen = set()  # slots written by this step
    for i, item in enumerate(scheduled):
        seq, n = item.seq, item.num_new
        start = seq.num_computed
        table = block_manager.block_table(seq.seq_id)
        ids += _tokens_between(seq, start, start + n)  # read now: tokens grow and change every step
        positions += range(start, start + n)
        # Section 4.1 "Slots": position p lives in logical block p // PAGE at offset p % PAGE.
        for p in range(start, start + n):
            slot = table[p // page] * page + p % page
            # Two sequences may recompute one shared block in the same step (section 3.4): the same
            # tokens after the same prefix, so the same K and V. One writer per slot is enough.
            slots.append(-1 if slot in seen else slot)
            seen.add(slot)
        cu.append(cu[-1] + n)
        ctx.append(start + n)  # section 4.2: the step's own tokens count, stored before they attend
        tables.append(table)
        if item.samples:
            rows.append(cu[-1] - 1)
            index.append(i)
    num_seqs = len(scheduled)
    is_decode = all(item.num_new == 1 for item in scheduled)
    if pad_to is not None:
        if not is_decode or pad_to < num_seqs:
            raise ValueError(f"pad_to={pad_to} pads decode steps of at most {pad_to} sequences")
        for _ in range(pad_to - num_seqs):
            ids.append(0)
            positions.append(0)
            slots.append(-1)
            cu.append(cu[-1] + 1)
            ctx.append(0)
            tables.append([])
    width = max(1, max(len(t) for t in tables))
    flat = []  # the block tables row by row, each padded with 0 to the widest
    for t in tables:
        flat += t
        flat += [0] * (width - len(t))

    def tensor(values, dtype):
        # array's C loop turns Python ints into machine ints about 3x faster than torch.tensor does:
        # a decode step of 256 sequences holds some 8,000 block ids, built again every step.
        host = torch.frombuffer(array.array(_TYPECODES[dtype], values), dtype=dtype) if values else None
        host = torch.empty(0, dtype=dtype) if host is None else host
        return host.to(device, non_blocking=True)

    return StepInputs(
        input_ids=tensor(ids, torch.int64),
        positions=tensor(positions, torch.int64),
        slot_mapping=tensor(slots, torch.int64),
        cu_seqlens_q=tensor(cu, torch.int32),
        context_lens=tensor(ctx, torch.int32),
        block_tables=tensor(flat, torch.int32).view(len(tables), width),
        logits_rows=tensor(rows, torch.int64),
        sample_index=index,
        is_decode=is_decode,
        query_lens=[b - a for a, b in zip(cu, cu[1:])],
        context_lens_list=ctx,
        num_seqs=num_seqs,
    )
