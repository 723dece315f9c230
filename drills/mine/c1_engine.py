"""C1, your file: the engine around the kernels, a scheduler and the inputs of each step.

Fill in the methods of `Scheduler` that hold a TODO (schedule, _reserve_slots, preempt, postprocess)
and `prepare_inputs`; the request's parameters and state (SamplingParams, Sequence, Scheduled,
StepInputs) and Scheduler.__init__/add are given. Read drills/content/c1_engine.md first: every TODO
names the section that teaches it. Grade with `make test L=c1`. Start by deleting the two
`raise NotImplementedError` lines, in Scheduler.__init__ and in prepare_inputs.

A step holds a token budget. Decode rows cost one token each; prompts cost what is not already cached:

    256 requests sharing a 300-token system prompt, block size 16:
    without prefix caching: 256 * (300 + 100) = 102,400 prefill tokens
    with it: 400 + 255 * (300 - 288 + 100) = 28,960   (the first computes all; 288 = 18 full blocks cached)

The engine (drills/engine/engine.py) calls Scheduler.schedule(), prepare_inputs(), the model, then
Scheduler.postprocess() once per step; `make chat` and the notebook run your file once it passes.
"""

from __future__ import annotations

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
        raise NotImplementedError(
            "c1 is not started: fill in the Scheduler methods and prepare_inputs in drills/mine/c1_engine.py, then delete this line (read drills/content/c1_engine.md)"
        )
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
        # TODO(section 3.2 "Running first"): start from a budget of max_num_batched_tokens and walk
        # self.running in order while budget is left. Give each sequence a slot for every token
        # (_reserve_slots); when that preempted the sequence itself, it left the list: look at the same
        # index again. Remember whether anything was preempted in this step (self.running got shorter).
        # Schedule min(its tokens not computed yet, budget) and take them from the budget.

        # TODO(section 3.3 "Admission"): then, unless something was preempted in this step, take
        # waiting sequences in arrival order while budget is left and fewer than max_num_seqs run.
        # Without chunked_prefill a prompt that does not fit the budget whole waits. L3's allocate
        # raises ValueError when the free blocks are short: then the sequence waits too. An admitted
        # sequence leaves the queue, becomes RUNNING at the end of self.running with a slot for every
        # token, and is scheduled for min(its tokens not computed yet, budget).

        # TODO(section 3.4 "Prefix hits that are really there"): before scheduling it, set its
        # num_computed: the hit blocks (num_cached_tokens // block_size) count only from the start of
        # its table up to the first one not in self.computed_blocks (remove the blocks past the hits
        # from that set first: they are handed out fresh), and never more than num_tokens - 1 tokens
        # (the last one must run to sample). num_cached records the same number.
        # Return the scheduled list, running sequences first.
        pass

    def _reserve_slots(self, seq: Sequence) -> bool:
        """Give every token of `seq` a slot in its block table, preempting the newest running sequences
        while a new block is needed and none is free. False when `seq` itself had to be preempted."""
        # TODO(section 3.5 "Preemption"): while seq has fewer slots than tokens: when the next slot
        # opens a new block (num_slots a multiple of block_size) and no block is free, preempt the
        # newest running sequence (self.running[-1]) and try again; if the victim was seq itself,
        # return False. Otherwise hand the token at position num_slots to L3's append, drop a block it
        # just handed out from self.computed_blocks (it holds stale K and V), and count the slot.
        # Return True once every token has a slot.
        pass

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and put it first in line; it is recomputed when readmitted
        (its tokens so far become its prompt, and the prefix cache likely still holds most of them)."""
        # TODO(section 3.5 "Preemption"): take seq out of self.running and free its blocks; it waits
        # again (WAITING) with nothing computed and no slots; count the preemption on the sequence and
        # on the scheduler; it goes to the front of the waiting queue.
        pass

    def postprocess(self, scheduled: list[Scheduled], sampled: list[int | None]) -> list[Sequence]:
        """Book a finished step: the K and V it wrote, the token each sampling sequence drew (sampled[i]
        for scheduled[i], None where it samples nothing), and the sequences that end. Returns those
        that finished, their blocks already freed."""
        # TODO(section 3.6 "After the step"): for each scheduled item and its entry of sampled: its
        # num_computed grows by num_new; the blocks of its table that this step filled to the end go
        # into self.computed_blocks. An item that does not sample (a chunk short of the prompt's end)
        # is done. Otherwise append the token to its output; it finishes on eos_id (unless
        # ignore_eos) or at max_tokens output tokens: FINISHED, out of self.running, its blocks freed,
        # and in the returned list.
        pass


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


def prepare_inputs(scheduled: list[Scheduled], block_manager, device="cpu", pad_to=None) -> StepInputs:
    """The tensors the model and the kernels read for `scheduled` (built on the host, copied once).

    pad_to  for a decode step run as a CUDA graph captured for a larger batch: add padding sequences up
            to pad_to (one token each, slot -1, context length 0, a table row of zeros), which the
            kernels skip; their logits rows are not sampled
    """
    raise NotImplementedError(
        "c1 is not started: fill in the Scheduler methods and prepare_inputs in drills/mine/c1_engine.py, then delete this line (read drills/content/c1_engine.md)"
    )
    # TODO(section 4.1 "Slots"): for each scheduled item, its new tokens are the positions
    # num_computed .. num_computed + num_new - 1: the token id, the position, and the slot
    # block_table[p // PAGE] * PAGE + p % PAGE, or -1 for a slot an earlier row of this step writes.

    # TODO(section 4.2 "Lengths and cu_seqlens"): cu_seqlens_q is the running sum of num_new from 0;
    # context_lens counts the tokens in the cache once this step's K and V are stored; one block table
    # row per sequence, padded with 0 to the longest (at least one column).

    # TODO(section 4.3 "Logits rows"): a sequence that samples gives its last new row to logits_rows
    # and its index in `scheduled` to sample_index. is_decode: every sequence computes one token.

    # TODO(section 4.4 "Padding rows for CUDA graphs"): with pad_to, a decode step gets padding
    # sequences up to pad_to (token 0, position 0, slot -1, one query row, context length 0, an empty
    # table row); a step that is not decode, or has more than pad_to sequences, raises ValueError.
    # Return StepInputs with every tensor built on the host and copied to `device` once; query_lens
    # and context_lens_list are python lists, num_seqs counts the real sequences.
    pass
