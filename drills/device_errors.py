"""The device-side error word: how a kernel reports a bad device value without a host sync.

A launcher called without `check` never reads lengths, slots or block ids on the host (that read is a
sync, and impossible inside CUDA-graph capture), so the reference kernels guard themselves: every load
and store is masked to the tensors they were given, a row whose inputs are invalid is written as zeros
(lse -inf), and the first bad value met is recorded here. The word is four int64 per device, allocated
once, so its address is fixed and a captured graph's replays record into the same word:

    word[0]  the error's code (0: none; CODES below says which lesson and argument)
    word[1]  where: the sequence, slot or token index the bad value belongs to
    word[2]  the bad value itself
    word[3]  how many programs found one (only the first is described)

raise_device_errors() is the one place that reads it, and so the one place that syncs: the engine calls
it once per step, where sampling syncs anyway; the graders call it after every default-path call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# code -> (lesson, argument, what was wrong). The kernels pass the code as a literal (a Triton kernel
# cannot read a Python dict); tests/test_device_guards.py checks that every literal is listed here.
CODES: dict[int, tuple[str, str, str]] = {
    11: (
        "L1 store_kvcache",
        "slot_mapping",
        "slot_mapping[{index}] = {value} is outside [-1, num_blocks * PAGE): the token was not stored",
    ),
    21: (
        "L2 paged_decode",
        "context_lens",
        "context_lens[{index}] = {value} is negative or longer than block_tables' row holds",
    ),
    22: (
        "L2 paged_decode",
        "block_tables",
        "sequence {index} reads block id {value}, outside [0, num_blocks)",
    ),
    31: (
        "F1 split_kv_decode",
        "context_lens",
        "context_lens[{index}] = {value} is negative or longer than block_tables' row holds",
    ),
    32: (
        "F1 split_kv_decode",
        "block_tables",
        "sequence {index} reads block id {value}, outside [0, num_blocks)",
    ),
    33: (
        "F1 split_kv_decode",
        "context_lens",
        "context_lens[{index}] = {value} is longer than the plan's num_splits * chunk tokens (plan for the "
        "longest length the step or graph will see)",
    ),
    34: ("F1 merge_states", "lse_a", "lse_a[{index}] (flat index) is NaN or +inf"),
    35: ("F1 merge_states", "lse_b", "lse_b[{index}] (flat index) is NaN or +inf"),
    41: (
        "L4 paged_prefill",
        "cu_seqlens_q",
        "sequence {index} has {value} query tokens: cu_seqlens_q must not decrease, start at 0 and end at "
        "q's token count",
    ),
    42: (
        "L4 paged_prefill",
        "context_lens",
        "context_lens[{index}] = {value} is shorter than the sequence's query tokens or longer than "
        "block_tables' row holds",
    ),
    43: (
        "L4 paged_prefill",
        "block_tables",
        "sequence {index} reads block id {value}, outside [0, num_blocks)",
    ),
    51: (
        "F2 cascade_decode",
        "prefix_lens",
        "prefix_lens[{index}] = {value} is negative, no whole number of pages, longer than block_tables' row "
        "holds or than the plan's prefix chunks cover",
    ),
    52: (
        "F2 cascade_decode",
        "block_tables",
        "the shared prefix of sequence {index}'s group reads block id {value}, outside [0, num_blocks)",
    ),
    53: (
        "F2 cascade_decode",
        "context_lens",
        "context_lens[{index}] = {value} is negative or longer than block_tables' row holds",
    ),
    54: ("F2 cascade_decode", "prefix_group", "prefix_group[{index}] = {value} is outside [-1, G)"),
    55: (
        "F2 cascade_decode",
        "prefix_lens",
        "sequence {index}'s group has prefix_lens = {value}: negative, no whole number of pages, or longer "
        "than its context_lens",
    ),
    56: (
        "F2 cascade_decode",
        "context_lens",
        "context_lens[{index}] = {value} leaves more tokens after the prefix than the plan's suffix splits "
        "cover (plan for these lengths)",
    ),
    57: (
        "F2 cascade_decode",
        "block_tables",
        "sequence {index} reads block id {value}, outside [0, num_blocks)",
    ),
    61: (
        "C1 prepare_inputs (the engine's fused RoPE)",
        "positions",
        "positions[{index}] = {value} is outside the RoPE table [0, max_position)",
    ),
    62: (
        "C1 prepare_inputs (the engine's fused RoPE and K/V store)",
        "slot_mapping",
        "slot_mapping[{index}] = {value} is outside [-1, num_blocks * PAGE): the token was not stored",
    ),
    71: (
        "L5 unified_attention",
        "cu_seqlens_q",
        "sequence {index} has {value} query tokens: cu_seqlens_q must not decrease, start at 0 and end at "
        "q's token count",
    ),
    72: (
        "L5 unified_attention",
        "context_lens",
        "context_lens[{index}] = {value} is shorter than the sequence's query tokens or longer than "
        "block_tables' row holds",
    ),
    73: (
        "L5 unified_attention",
        "block_tables",
        "sequence {index} reads block id {value}, outside [0, num_blocks)",
    ),
}

_WORDS: dict[torch.device, torch.Tensor] = {}


def error_word(device) -> torch.Tensor:
    """[4] int64 on `device`, zero until a kernel records an error; the same tensor on every call.
    Launchers call it per launch with a tensor's own .device, so that case is a dict lookup (< 0.2 us)."""
    word = _WORDS.get(device)
    if word is None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        word = _WORDS.get(device)
        if word is None:
            # A normal tensor even when first asked for inside inference_mode (the engine's forward):
            # an inference tensor could not be cleared in place outside it.
            with torch.inference_mode(False):
                word = torch.zeros(4, dtype=torch.int64, device=device)
        _WORDS[device] = word
    return word


def describe(word: list[int]) -> str:
    code, index, value, count = word
    lesson, argument, what = CODES.get(code, ("a kernel", "an argument", "error code {code}"))
    more = f" ({count - 1} more programs found bad values too)" if count > 1 else ""
    return f"{lesson}: {argument}: " + what.format(index=index, value=value, code=code) + more


def raise_device_errors(device=None) -> None:
    """Raise ValueError naming the argument (and the lesson) if a kernel recorded a bad device value since
    the last call, and clear the word; do nothing when all was well. Syncs with `device` (default: every
    device that has a word); call it where the host waits anyway, never while a graph is captured."""
    devices = [torch.device(device)] if device is not None else list(_WORDS)
    for dev in devices:
        word = _WORDS.get(dev) if dev.type != "cuda" or dev.index is not None else error_word(dev)
        if word is None:
            continue
        if word.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("raise_device_errors() reads the device: call it after the graph is captured")
        values = word.tolist()  # the sync
        if values[0] != 0:
            word.zero_()
            raise ValueError(describe(values))


@triton.jit
def record_error(err_ptr, bad, code: tl.constexpr, index, value):
    """If `bad` (a scalar), record (code, index, value) unless another program got there first, and count.
    The compare-and-swap makes the first recorder the only one that writes the description."""
    if bad:
        # Compare and value typed as the word: a compiled atomic_cas takes three operands of one type.
        none = tl.full([], 0, tl.int64)
        old = tl.atomic_cas(err_ptr, none, none + code)
        if old == 0:
            tl.store(err_ptr + 1, index.to(tl.int64))
            tl.store(err_ptr + 2, value.to(tl.int64))
        tl.atomic_add(err_ptr + 3, none + 1)


@triton.jit
def scan_block_ids(row_ptr, num_pages, num_blocks, CHUNK: tl.constexpr = 128):
    """(how many, the largest) of the block ids row_ptr[0:num_pages] outside [0, num_blocks), read CHUNK
    at a time before the kernel's own page loop: a guard inside that loop sits on the path from each
    block id to its K and V loads. Measured on an H200 (make guards, and variants timed beside it): in
    L4 the test inside the loops cost 8-22%, this scan 1-7%; in L2 both cost about 7% where one or
    eight sequences each walk a long row, and a CHUNK of 1024 cost more than 128. The row must be
    contiguous (the launchers check it)."""
    offs = tl.arange(0, CHUNK)
    n_bad = tl.full([], 0, tl.int32)
    largest = tl.full([], -(2**62), tl.int64)  # below every int32 id, so a bad -1 still shows
    for p0 in range(0, num_pages, CHUNK):
        pages = p0 + offs  # [CHUNK]
        ids = tl.load(row_ptr + pages, mask=pages < num_pages, other=0).to(tl.int64)
        bad = (pages < num_pages) & ((ids < 0) | (ids >= num_blocks))
        n_bad += tl.sum(bad.to(tl.int32), axis=0)
        largest = tl.maximum(largest, tl.max(tl.where(bad, ids, -(2**62)), axis=0))
    return n_bad, largest
