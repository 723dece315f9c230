"""Grader for L1, the paged KV cache. Each test is named for the mistake it catches.

Run: make test L=l1 (your drills/mine) or make test L=l1 IMPL=solutions. The worked example's numbers (section 2
of the explainer) are checked through your functions; every store goes into caches that sit inside a
canary-filled buffer with spare blocks on each side, so a write to any slot it does not own is seen.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from drills import validate
from drills.compare import assert_close, assert_untouched, mismatch
from drills.grading.grader.diagnose import Mistake
from drills.grading.shared.bigmem import free_bytes, sparse_empty
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel
from drills.tests import probe, raises_naming, seeded, sizes
from drills.tests.domain import Domain, checks_besides
from drills.tests.paged_kv import GARBAGE_BLOCK_IDS, far_apart, gather_kv, paged_attention_reference

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "PAGE": ("test_heads_and_dims_not_powers_of_two", "test_first_and_last_slot_of_the_cache"),
    "Hkv": ("test_heads_and_dims_not_powers_of_two",),
    "HKV_PAD": ("test_heads_and_dims_not_powers_of_two",),
    "D": ("test_heads_and_dims_not_powers_of_two",),
    "D_PAD": ("test_heads_and_dims_not_powers_of_two",),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}
BOUNDS_GAPS = {"GUARD": "no bound: the device guard's switch, on in every call but the benchmark's timing"}

CANARY = 1234.5  # exactly representable in fp16, bf16 and fp32; randn never produces it

# What store_kvcache admits, at its boundaries (any Hkv, D and PAGE; D up to the widest head dim the
# attention launchers of drills/validate.py admit): test_pairwise_domain_cases_match_the_oracle crosses
# every pair of them. Each size is one past a power of two where it can be, so HKV_PAD and D_PAD pad.
DOMAIN = Domain(
    axes=dict(
        D=(5, 40, validate.HEAD_DIM_RANGE[1]),
        Hkv=(1, 3, 8),
        PAGE=(1, 5, 16),
        dtype=(torch.float16, torch.bfloat16, torch.float32),
        rows=("contiguous", "fused_qkv", "value_own_strides", "padded_head_dim"),  # key and value
        cache=("contiguous", "layer_of_interleaved_pool", "heads_before_tokens"),
        slots=("with_padding", "cache_edges", "empty_batch"),
    ),
)
EXACT = dict(atol=0.0, rtol=0.0, rel=0.0)  # a store is a copy: every bit must arrive
CACHE_DIMS = ("block+margin", "offset", "head", "d")  # positions inside the canary buffer
ROW_DIMS = ("row", "head", "d")

# The worked example (explainer section 2): three requests, an 8-token reservation, 4-token blocks,
# and one request whose block table is [3, 1, 5].
EXAMPLE_LENGTHS = [3, 5, 2]
EXAMPLE_TABLE = [3, 1, 5]


# The explainer's pitfalls (section 5) and the pattern of checks each leaves, for the diagnosis.
MISTAKES = [
    Mistake(
        1,
        fails=("test_all_padding_batch_writes_nothing",),
        passes=("test_first_and_last_slot_of_the_cache",),
        question="What does your kernel do for a row whose slot_mapping entry is -1?",
        section="2.5",
    ),
    Mistake(
        2,
        fails=("test_slot_index_widened_to_int64",),
        passes=("test_store_then_gather_through_block_tables", "test_first_and_last_slot_of_the_cache"),
        question="In which integer type is block * stride(0) computed, and how large does it get in a cache "
        "of 2**32 elements?",
        section="3.5",
    ),
    Mistake(
        24,
        fails=("test_head_index_widened_to_int64",),
        passes=("test_slot_index_widened_to_int64", "test_cache_strides_are_used"),
        question="Head 2 of the cache starts 3 * 2**30 elements in here: in which integer type does your "
        "kernel compute the head index times stride(2)?",
        section="3.5",
    ),
    Mistake(
        13,
        fails=("test_row_index_widened_to_int64",),
        # Its row 2 is padding: a padding row written fails it too, and fails these.
        passes=(
            "test_slot_index_widened_to_int64",
            "test_strided_key_value_rows",
            "test_all_padding_batch_writes_nothing",
            "test_padding_slots_leave_the_cache_untouched",
        ),
        question="Row 3 of key starts 4.5 * 2**30 elements in: in which integer type does your kernel compute "
        "i * stride(0), for key and for value?",
        section="3.4",
    ),
    Mistake(
        14,
        fails=("test_first_and_last_slot_of_the_cache", "test_store_then_gather_through_block_tables"),
        passes=("test_worked_example_slot_mapping",),
        messages=(r"k_cache holds value's rows|v_cache holds key's rows",),
        question="Which pointer does each of your two tl.store calls write through, and which rows does "
        "each store?",
        section="3.4",
    ),
    Mistake(
        15,
        fails=("test_fresh_pool_hands_out_block_0_first", "test_worked_example_slot_mapping"),
        passes=("test_free_returns_the_block_to_the_free_list", "test_double_free_rejected"),
        question="A fresh pool of 5 blocks: which block does your first allocate() return, and from which "
        "end of the free list does it take it?",
        section="3.1",
    ),
    Mistake(
        16,
        fails=("test_release_returns_every_block",),
        # A table that miscounts its tokens as it grows fails the release check as well.
        passes=(
            "test_free_returns_the_block_to_the_free_list",
            "test_double_free_rejected",
            "test_table_grows_one_block_at_a_time",
            "test_worked_example_last_block_is_full_check",
        ),
        question="After release(), the table holds no block: how many tokens does it say it holds, and "
        "where does its next append_tokens put the first new token?",
        section="3.2",
    ),
    Mistake(
        19,
        fails=("test_a_request_of_zero_tokens_holds_no_block",),
        passes=(
            "test_worked_example_paged_waste_is_37_5_percent",
            "test_waste_of_an_empty_batch_and_exact_fits",
        ),
        question="A request of 0 tokens: how many blocks has its table taken, and how many does your "
        "waste_paged count for it?",
        section="3.3",
    ),
    Mistake(
        20,
        fails=("test_release_frees_the_last_block_first",),
        passes=("test_release_returns_every_block", "test_fresh_pool_hands_out_block_0_first"),
        question="A table holds blocks [0, 1, 2]: in which order does your release() give them back, and "
        "which of them does the allocator hand out first afterwards?",
        section="3.2",
    ),
    Mistake(
        17,
        fails=("test_lookup_outside_the_sequence_raises[10]",),
        passes=(
            "test_lookup_outside_the_sequence_raises[-1]",
            "test_worked_example_block_table_lookup_for_every_token",
        ),
        question="A sequence of 10 tokens holds tokens 0-9: does your lookup(10) raise, or does it find "
        "a slot in the free room of the last block?",
        section="2.3",
    ),
    Mistake(
        3,
        fails=("test_worked_example_slot_mapping",),
        passes=("test_free_returns_the_block_to_the_free_list",),
        question="For table [3, 1, 5] and block size 4, which slot does your BlockTable give token 9?",
        section="2.4",
    ),
    Mistake(
        3,
        fails=("test_first_and_last_slot_of_the_cache", "test_store_then_gather_through_block_tables"),
        passes=("test_worked_example_slot_mapping",),
        question="In your kernel's address, which of slot // PAGE and slot % PAGE multiplies the block "
        "stride?",
        section="3.5",
    ),
    Mistake(
        4,
        fails=("test_double_free_rejected",),
        passes=("test_free_returns_the_block_to_the_free_list",),
        question="What stops free() from putting a block on the free list that is already there?",
        section="3.1",
    ),
    Mistake(
        5,
        fails=("test_free_returns_the_block_to_the_free_list",),
        question="After free(b), where is b, and can allocate() hand it out again?",
        section="3.1",
    ),
    Mistake(
        6,
        fails=("test_worked_example_last_block_is_full_check", "test_table_grows_one_block_at_a_time"),
        question="With block size 4, is the last block full at 12 tokens? At 11? What does your check say?",
        section="2.3",
    ),
    Mistake(
        7,
        fails=("test_append_that_does_not_fit_allocates_nothing",),
        passes=("test_table_grows_one_block_at_a_time",),
        question="When append_tokens cannot get every block it needs, what has it taken before it fails?",
        section="3.2",
    ),
    Mistake(
        21,
        fails=("test_append_that_does_not_fit_allocates_nothing",),
        passes=(
            "test_table_grows_one_block_at_a_time",
            "test_out_of_blocks_is_a_clear_error",
            "test_free_returns_the_block_to_the_free_list",
        ),
        messages=(r"a growth that takes every free block",),
        question="2 blocks free and a growth that needs exactly 2 new blocks: does your append_tokens "
        "compare needed with num_free by > or by >=?",
        section="3.2",
    ),
    Mistake(
        23,
        fails=(
            "test_heads_and_dims_not_powers_of_two[Hkv65]",
            "test_heads_and_dims_not_powers_of_two[widest-tile]",
        ),
        passes=(
            "test_heads_and_dims_not_powers_of_two[Hkv8-D128]",
            "test_heads_and_dims_not_powers_of_two[Hkv6-D40-PAGE3]",
            "test_heads_and_dims_not_powers_of_two[Hkv3-D24-PAGE5]",
        ),
        question="Hkv = 65: how many heads does your head tile (HKV_PAD) hold, and which heads of a token "
        "does your store never write?",
        section="3.6",
    ),
    Mistake(
        22,
        fails=("test_blocks_is_a_copy_the_caller_cannot_change",),
        passes=("test_table_grows_one_block_at_a_time", "test_release_returns_every_block"),
        messages=(r"the table's own list was handed out",),
        question="Your `blocks` returns a list: is it the table's own list or a copy, and what happens to "
        "the table when its caller clears that list?",
        section="3.2",
    ),
    Mistake(
        8,
        fails=("test_worked_example_paged_waste_is_37_5_percent",),
        passes=("test_worked_example_contiguous_waste_is_58_33_percent",),
        question="How many 4-token blocks does a 3-token request hold: what does your count give?",
        section="2.1",
    ),
    Mistake(
        8,
        fails=("test_worked_example_contiguous_waste_is_58_33_percent",),
        question="Wasted as a fraction of what: the tokens used, or the slots allocated?",
        section="2.1",
    ),
    Mistake(
        9,
        fails=("test_heads_and_dims_not_powers_of_two",),
        passes=("test_store_then_gather_through_block_tables",),
        question="Which lanes of the [HKV_PAD, D_PAD] tile are real when Hkv or D is not a power of two, and "
        "does every store skip the others?",
        section="3.6",
    ),
    Mistake(
        9,
        fails=("test_heads_and_dims_not_powers_of_two",),
        passes=("test_strided_key_value_rows",),
        messages=(r"out of bounds load of (key|value)",),
        question="Your loads read the padded lanes too: where do lanes past Hkv or D point for the last row "
        "of key?",
        section="3.6",
    ),
    Mistake(
        10,
        fails=("test_launcher_rejects_bad_input[slot_past_the_cache]",),
        question="Which slot values must the launcher refuse before it launches?",
        section="3.7",
    ),
    Mistake(
        10,
        fails=("test_launcher_rejects_bad_input[duplicate_slot]",),
        question="What happens when two rows of one batch name the same slot?",
        section="3.7",
    ),
    Mistake(
        11,
        fails=("test_cache_strides_are_used",),
        passes=("test_all_padding_batch_writes_nothing", "test_store_then_gather_through_block_tables"),
        question="Where does slot s live in a cache whose strides are not (PAGE * Hkv * D, Hkv * D, D, 1)?",
        section="3.5",
    ),
    Mistake(
        12,
        fails=("test_strided_key_value_rows[fused_qkv]",),
        passes=("test_store_then_gather_through_block_tables",),
        question="How far apart are two rows of key when key is a view of a fused qkv tensor?",
        section="3.4",
    ),
    Mistake(
        12,
        # Heads D apart is what every fused qkv view has: only a padded head dim shows the head stride.
        fails=("test_strided_key_value_rows[padded_head_dim]",),
        passes=("test_strided_key_value_rows[fused_qkv]", "test_store_then_gather_through_block_tables"),
        question="key's heads are padded to a wider head dim here: how far apart are two heads of one row, "
        "and what does your kernel step by from one head to the next?",
        section="3.4",
    ),
    Mistake(
        12,
        fails=("test_strided_key_value_rows[value_own_strides]",),
        passes=("test_strided_key_value_rows[fused_qkv]",),
        question="Are value's rows always as far apart as key's?",
        section="3.4",
    ),
    Mistake(
        18,
        fails=("test_grid_fits_cuda_limits_at_largest_sizes",),
        messages=(r"past CUDA's limit on grid axis",),
        question="A prefill step can write 70,000 tokens: on which grid axis are your tokens, and how "
        "many programs does CUDA allow on that axis?",
        section="3.4",
    ),
]


# --- Helpers: tables from your allocator, caches inside a canary ------------------------------------


def example_table(impl, n_tokens):
    """A BlockTable that holds blocks [3, 1, 5] (the worked example's), built through your allocator: take all
    8 blocks of the worked example's 32-token pool, give back 3, 1 and 5 in that order, and grow from there."""
    alloc = impl.BlockAllocator(8)
    taken = [alloc.allocate() for _ in range(8)]
    assert sorted(taken) == list(range(8)), f"a pool of 8 blocks handed out {taken}"
    for b in EXAMPLE_TABLE:
        alloc.free(b)
    table = impl.BlockTable(alloc, 4)
    table.append_tokens(n_tokens)
    return alloc, table


def scattered_tables(impl, lens, block_size, num_blocks, stream):
    """One table per sequence, grown token by token in round-robin order (as decode steps would) from a
    pool whose free list was shuffled first, so each sequence's blocks are scattered and interleaved.
    Returns (allocator, tables, slots in batch order: sequence 0's tokens, then sequence 1's, ...)."""
    alloc = impl.BlockAllocator(num_blocks)
    order = [alloc.allocate() for _ in range(num_blocks)]
    random.Random(stream).shuffle(order)
    for b in order:
        alloc.free(b)
    tables = [impl.BlockTable(alloc, block_size) for _ in lens]
    slots = [[] for _ in lens]
    for step in range(max(lens)):
        for s, n in enumerate(lens):
            if step < n:
                slots[s] += tables[s].append_tokens(1)
    return alloc, tables, [x for row in slots for x in row]


def margin(PAGE):
    """Spare blocks on each side of a cache: enough that a slot -1, or block and offset swapped in the
    address (at most PAGE - 1 blocks too far), lands in the canary instead of outside the allocation."""
    return PAGE + 1


def canary_caches(num_blocks, PAGE, Hkv, D, dtype, device):
    """(buffer_k, buffer_v, k_cache, v_cache): each cache is buffer[M:-M], with M = margin(PAGE) spare
    blocks of canary on each side."""
    M = margin(PAGE)
    buffers = [
        torch.full((num_blocks + 2 * M, PAGE, Hkv, D), CANARY, dtype=dtype, device=device) for _ in range(2)
    ]
    return buffers[0], buffers[1], buffers[0][M:-M], buffers[1][M:-M]


def store_and_check(impl, key, value, slot_mapping, num_blocks, PAGE):
    """Call store_kvcache into canary caches, then check: every real row is in its slot, bit for bit,
    and nothing else in the buffer changed (padding rows' slots, unused slots, the spare blocks)."""
    N, Hkv, D = key.shape
    buf_k, buf_v, k_cache, v_cache = canary_caches(num_blocks, PAGE, Hkv, D, key.dtype, key.device)
    returned = impl.store_kvcache(key, value, k_cache, v_cache, slot_mapping)
    assert returned is None, "store_kvcache writes in place and returns None"
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    keep = torch.zeros(buf_k.shape, dtype=torch.bool, device=key.device)
    M = margin(PAGE)
    keep[M:-M].view(-1, Hkv, D)[slots] = True
    for name, buf, cache, src in (("k_cache", buf_k, k_cache, key), ("v_cache", buf_v, v_cache, value)):
        assert_untouched(
            buf,
            CANARY,
            keep,
            f"the buffer around {name} (a padding row written, a slot "
            "mis-addressed, or padded heads/features stored?)",
            CACHE_DIMS,
        )
        got = cache.reshape(-1, Hkv, D)[slots]
        problem = mismatch(got, src[real], ROW_DIMS, **EXACT)
        if problem is not None:
            other, other_name = (value, "value") if src is key else (key, "key")
            if torch.equal(got, other[real]):  # the two stores crossed: say so, it is no addressing bug
                problem += f"\n{name} holds {other_name}'s rows: does each store go to its own cache?"
            raise AssertionError(problem)
    return k_cache, v_cache


def random_rows(N, Hkv, D, dtype, device, stream):
    gen = torch.Generator().manual_seed(seeded(stream))
    key = torch.randn(N, Hkv, D, generator=gen).to(dtype).to(device)  # [N, Hkv, D]
    value = torch.randn(N, Hkv, D, generator=gen).to(dtype).to(device)
    return key, value


def distinct_slots(N, num_slots, device, stream):
    gen = torch.Generator().manual_seed(seeded(stream))
    return torch.randperm(num_slots, generator=gen)[:N].to(device)  # [N] int64, no repeats


# --- Section 2 "By hand": the worked example's numbers through your functions --------------------------------


def test_worked_example_contiguous_waste_is_58_33_percent(impl):
    """Requests of 3, 5 and 2 tokens, 8 slots reserved for each: 24 allocated, 14 wasted, 58.33%."""
    allocated, wasted, fraction = impl.waste_contiguous(EXAMPLE_LENGTHS, 8)
    assert (allocated, wasted) == (24, 14)
    assert fraction == pytest.approx(14 / 24) and round(100 * fraction, 2) == 58.33


def test_worked_example_paged_waste_is_37_5_percent(impl):
    """The same requests in 4-token blocks: 1 + 2 + 1 blocks = 16 slots, 6 wasted, 37.5%. Your block
    tables on the worked example's 8-block pool must hold exactly those blocks and leave 4 free."""
    allocated, wasted, fraction = impl.waste_paged(EXAMPLE_LENGTHS, 4)
    assert (allocated, wasted) == (16, 6) and fraction == pytest.approx(0.375)
    alloc = impl.BlockAllocator(8)
    tables = [impl.BlockTable(alloc, 4) for _ in EXAMPLE_LENGTHS]
    for table, n in zip(tables, EXAMPLE_LENGTHS):
        table.append_tokens(n)
    assert [len(t.blocks) for t in tables] == [1, 2, 1]
    assert alloc.num_free == 4
    assert sum(len(t.blocks) for t in tables) * 4 == allocated


def test_waste_of_an_empty_batch_and_exact_fits(impl):
    """No requests: nothing allocated and a waste fraction of 0, not 0/0. Lengths that fill their
    blocks or reservation exactly waste nothing."""
    assert impl.waste_contiguous([], 8) == (0, 0, 0.0)
    assert impl.waste_paged([], 4) == (0, 0, 0.0)
    assert impl.waste_contiguous([8, 8], 8) == (16, 0, 0.0)
    assert impl.waste_paged([4, 8, 12], 4) == (24, 0, 0.0)
    assert impl.waste_paged([1], 4) == (4, 3, 0.75)


def test_a_request_of_zero_tokens_holds_no_block(impl):
    """A request of 0 tokens (admitted, not yet prefilled) has taken no block: its table is empty until
    append_tokens gives it a token, so waste_paged counts ceil(0 / 4) = 0 blocks for it, not one. A
    contiguous cache reserves its slots up front, so there it still holds all of them."""
    assert impl.waste_paged([0, 4], 4) == (4, 0, 0.0)
    assert impl.waste_paged([0], 4) == (0, 0, 0.0)
    assert impl.waste_contiguous([0, 8], 8) == (16, 8, 0.5)
    table = impl.BlockTable(impl.BlockAllocator(2), 4)
    assert table.append_tokens(0) == [] and table.blocks == []


def test_worked_example_growth_5_to_7_keeps_its_blocks(impl):
    """Request B grows from 5 to 7 tokens: its second block has room, so no block is taken."""
    alloc = impl.BlockAllocator(8)
    table = impl.BlockTable(alloc, 4)
    table.append_tokens(5)
    before = table.blocks
    table.append_tokens(2)
    assert table.blocks == before and len(before) == 2 and alloc.num_free == 6
    assert table.num_tokens == 7
    assert impl.waste_contiguous([7], 8) == (8, 1, 1 / 8)  # still inside the 8-slot reservation


def _blocks_after_the_caller_edits_them(impl):
    """In the learner's process (the grader only ever sees copies of what crosses the process boundary):
    a 9-token table in blocks of 4, then the list `blocks` returned edited by its caller. Returns what
    the table and its pool hold afterwards, and what they held before."""
    alloc = impl.BlockAllocator(8)
    table = impl.BlockTable(alloc, 4)
    table.append_tokens(9)
    before = (list(table.blocks), table.slot(8), alloc.num_free)
    returned = table.blocks
    if isinstance(returned, list):  # a tuple or other read-only sequence cannot be edited: nothing to try
        returned.clear()
        returned.append(7)  # a block this table never took
    after = (list(table.blocks), _or_error(table.slot, 8), alloc.num_free)
    _or_error(table.release)  # a table holding [7] frees a block it never took: a double free
    return before, after, alloc.num_free


def _or_error(fn, *args):
    """fn(*args), or the name of the error it raised: an edited table may fail its own lookups."""
    try:
        return fn(*args)
    except Exception as error:
        return type(error).__name__


def test_blocks_is_a_copy_the_caller_cannot_change(impl):
    """`blocks` hands out a copy of the table: a caller (a scheduler, L2's block-table builder) that sorts,
    clears or appends to the list it got must not change which blocks the table holds or releases."""
    before, after, free_after_release = probe(impl, _blocks_after_the_caller_edits_them)
    assert after == before, (
        f"editing the list `blocks` returned (cleared, then [7]) changed the table: (blocks, slot(8), "
        f"num_free) {before} became {after}: the table's own list was handed out, not a copy of it"
    )
    assert free_after_release == 8, f"after release() the pool of 8 has {free_after_release} blocks free"


def test_worked_example_growth_5_to_9_takes_one_more_block(impl):
    """From 5 to 9 tokens: exactly one more block, the first two unchanged (nothing copied). The
    contiguous layout cannot hold 9 tokens in 8 reserved slots: waste_contiguous says so."""
    alloc = impl.BlockAllocator(8)
    table = impl.BlockTable(alloc, 4)
    table.append_tokens(5)
    before = table.blocks
    table.append_tokens(4)
    after = table.blocks
    assert len(after) == 3 and after[:2] == before and alloc.num_free == 5
    with raises_naming(ValueError, r"lengths\[1\].*realloc"):
        impl.waste_contiguous([3, 9, 2], 8)


def test_worked_example_block_table_lookup_for_every_token(impl):
    """Table [3, 1, 5], block size 4, 10 tokens: token t is in logical block t // 4, physical block
    table[t // 4], offset t % 4. Token 9 -> logical 2 -> physical 5, offset 1."""
    _, table = example_table(impl, 10)
    assert table.blocks == EXAMPLE_TABLE
    expected = [
        (0, 3, 0),
        (0, 3, 1),
        (0, 3, 2),
        (0, 3, 3),
        (1, 1, 0),
        (1, 1, 1),
        (1, 1, 2),
        (1, 1, 3),
        (2, 5, 0),
        (2, 5, 1),
    ]
    for t, want in enumerate(expected):
        got = tuple(table.lookup(t))
        assert got == want, f"lookup({t}) = {got}, expected (logical, physical, offset) = {want}"


def test_worked_example_physical_layout(impl):
    """Which tokens each physical block holds: block 3 tokens 0-3, block 1 tokens 4-7, block 5 tokens 8
    and 9 (slots 2 and 3 of block 5 are empty); blocks 0, 2 and 4 hold none of this request's tokens."""
    _, table = example_table(impl, 10)
    layout = {}
    for t in range(10):
        _, physical, offset = table.lookup(t)
        layout.setdefault(physical, []).append((offset, t))
    assert layout == {
        3: [(0, 0), (1, 1), (2, 2), (3, 3)],
        1: [(0, 4), (1, 5), (2, 6), (3, 7)],
        5: [(0, 8), (1, 9)],
    }


def test_worked_example_slot_mapping(impl):
    """slot = physical block * 4 + offset: tokens 0-9 of table [3, 1, 5] go to slots 12-15, 4-7, 20, 21.
    Swapping block and offset (offset * 4 + block) gives token 9 slot 9 instead of 21."""
    _, table = example_table(impl, 10)
    assert [table.slot(t) for t in range(10)] == [12, 13, 14, 15, 4, 5, 6, 7, 20, 21]


def test_worked_example_last_block_is_full_check(impl):
    """10 tokens in [3, 1, 5]: the last block (5) holds tokens 8 and 9 only: not full. At 12 tokens it
    is full and still 3 blocks; the 13th token takes a fourth block, which is not full."""
    alloc, table = example_table(impl, 10)
    assert table.last_block_is_full is False
    table.append_tokens(1)
    assert table.last_block_is_full is False and len(table.blocks) == 3
    table.append_tokens(1)
    assert table.last_block_is_full is True and table.blocks == EXAMPLE_TABLE
    alloc.free(0)  # the worked example's pool is otherwise in use: make room for a fourth block
    table.append_tokens(1)
    assert table.last_block_is_full is False and table.blocks == EXAMPLE_TABLE + [0]


def test_worked_example_decode_step_writes_slots_3_9_14(impl, runtime):
    """Section 2.5: A, B, C (3, 5, 2 tokens) on a fresh 8-block pool hold [0], [1, 2], [3]. One decode
    step appends a token to each: slots 3, 9 and 14, padded to a batch of 4 with -1. The new rows land
    at k_cache[0, 3], k_cache[2, 1] and k_cache[3, 2]; nothing else changes."""
    alloc = impl.BlockAllocator(8)
    tables = [impl.BlockTable(alloc, 4) for _ in EXAMPLE_LENGTHS]
    for table, n in zip(tables, EXAMPLE_LENGTHS):
        table.append_tokens(n)
    assert [t.blocks for t in tables] == [[0], [1, 2], [3]]
    step = [t.append_tokens(1) for t in tables]
    assert step == [[3], [9], [14]]
    key, value = random_rows(4, 2, 16, torch.float16, runtime.device, stream=16)
    slot_mapping = _slots(runtime.device, 3, 9, 14, -1)
    k_cache, v_cache = store_and_check(impl, key, value, slot_mapping, 8, 4)
    for row, (block, offset) in enumerate([(0, 3), (2, 1), (3, 2)]):
        assert_close(k_cache[block, offset], key[row], ("head", "d"), **EXACT)
        assert_close(v_cache[block, offset], value[row], ("head", "d"), **EXACT)


# --- Section 3.1 "The allocator" ----------------------------------------------------------------------


def test_fresh_pool_hands_out_block_0_first(impl):
    alloc = impl.BlockAllocator(5)
    assert alloc.num_free == 5
    assert [alloc.allocate() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert alloc.num_free == 0


def test_out_of_blocks_is_a_clear_error(impl):
    """The (num_blocks + 1)-th allocation raises RuntimeError saying the pool is out of blocks, and
    leaves the pool as it was."""
    alloc = impl.BlockAllocator(3)
    for _ in range(3):
        alloc.allocate()
    with raises_naming(RuntimeError, "(?i)out of"):
        alloc.allocate()
    assert alloc.num_free == 0
    alloc.free(1)
    assert alloc.allocate() == 1


def test_double_free_rejected(impl):
    """Freeing a block twice would put it on the free list twice, and two sequences would later share
    it, overwriting each other's KV. The second free raises ValueError and changes nothing."""
    alloc = impl.BlockAllocator(4)
    a, b = alloc.allocate(), alloc.allocate()
    alloc.free(a)
    with raises_naming(ValueError, "(?i)double free|already free"):
        alloc.free(a)
    assert alloc.num_free == 3
    with raises_naming(ValueError, "(?i)double free|already free"):
        alloc.free(3)  # never allocated: free already
    got = [alloc.allocate() for _ in range(3)]
    assert sorted(got + [b]) == [0, 1, 2, 3], f"the pool handed out {got} besides {b}: a block came out twice"


def test_free_returns_the_block_to_the_free_list(impl):
    """A freed block is allocatable again: free() must put it back, not only forget it."""
    alloc = impl.BlockAllocator(4)
    blocks = [alloc.allocate() for _ in range(4)]
    alloc.free(blocks[2])
    assert alloc.num_free == 1
    assert alloc.allocate() == blocks[2]
    for b in blocks:
        alloc.free(b)
    assert alloc.num_free == 4
    assert sorted(alloc.allocate() for _ in range(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("block", [-1, 4, 100, True])  # True: an int to isinstance, block 1 to range()
def test_free_rejects_blocks_outside_the_pool(impl, block):
    alloc = impl.BlockAllocator(4)
    alloc.allocate()
    alloc.allocate()  # blocks 0 and 1 in use: free(True) taken for free(1) would succeed
    with raises_naming(ValueError, str(block)):
        alloc.free(block)
    assert alloc.num_free == 2


# --- Section 3.2 "The block table" ----------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_table_grows_one_block_at_a_time(impl, block_size):
    """Token by token from 0 to 13 tokens: ceil(n / block_size) blocks, a new block exactly when the
    previous one is full, and the blocks already held never change."""
    alloc = impl.BlockAllocator(16)
    table = impl.BlockTable(alloc, block_size)
    assert table.blocks == [] and table.num_tokens == 0 and table.last_block_is_full is False
    held = []
    for n in range(1, 14):
        table.append_tokens(1)
        blocks = table.blocks
        assert len(blocks) == math.ceil(n / block_size), f"{n} tokens in blocks of {block_size}: {blocks}"
        assert blocks[: len(held)] == held, "a block already held changed"
        held = blocks
        assert table.last_block_is_full is (n % block_size == 0), f"last_block_is_full wrong at {n} tokens"
    assert alloc.num_free == 16 - len(held)


def test_append_tokens_returns_the_new_slots(impl):
    """append_tokens(n) returns the n new tokens' slots, which is the slot_mapping of that step."""
    _, table = example_table(impl, 0)
    assert table.append_tokens(0) == []
    assert table.append_tokens(6) == [12, 13, 14, 15, 4, 5]
    assert table.append_tokens(4) == [6, 7, 20, 21]
    assert table.blocks == EXAMPLE_TABLE


def test_append_that_does_not_fit_allocates_nothing(impl):
    """Two free blocks of 4 cannot hold 9 more tokens: RuntimeError, and the table and the pool are
    exactly as before (no half-grown sequence holding blocks it cannot use)."""
    alloc = impl.BlockAllocator(3)
    table = impl.BlockTable(alloc, 4)
    table.append_tokens(3)
    with raises_naming(RuntimeError, "(?i)out of|not enough|free"):
        table.append_tokens(10)  # 13 tokens need 4 blocks; 3 exist
    assert table.num_tokens == 3 and len(table.blocks) == 1 and alloc.num_free == 2
    try:
        table.append_tokens(9)  # 12 tokens: exactly 3 blocks
    except RuntimeError as refused:
        raise AssertionError(
            "3 tokens in 1 block, 2 blocks free: 9 more tokens need exactly 2 new blocks, a growth that takes "
            f"every free block, and it fits: {refused}"
        ) from None
    assert alloc.num_free == 0 and table.last_block_is_full is True


def test_release_returns_every_block(impl):
    """release() gives every block of the table back; they are free (freeing one again is a double
    free), other tables keep theirs, and the emptied table can grow again."""
    alloc = impl.BlockAllocator(6)
    a, b = impl.BlockTable(alloc, 4), impl.BlockTable(alloc, 4)
    a.append_tokens(9)  # 3 blocks
    b.append_tokens(5)  # 2 blocks
    assert alloc.num_free == 1
    a_blocks, b_blocks = a.blocks, b.blocks
    a.release()
    assert a.blocks == [] and a.num_tokens == 0 and alloc.num_free == 4
    with raises_naming(ValueError, "(?i)double free|already free"):
        alloc.free(a_blocks[0])
    assert b.blocks == b_blocks
    a.append_tokens(16)  # 4 blocks: everything left
    assert not set(a.blocks) & set(b_blocks) and alloc.num_free == 0


def test_release_frees_the_last_block_first(impl):
    """release() gives the blocks back last block first (section 3.2, as nano-vllm's deallocate): the free
    list is FIFO, so a sequence's first block, the one a prefix cache most likely shares, is handed out
    again last. A pool of 4, a table of 12 tokens in blocks 0, 1, 2, released: the four allocations that
    follow return 3 (never used), then 2, 1 and 0."""
    alloc = impl.BlockAllocator(4)
    table = impl.BlockTable(alloc, 4)
    table.append_tokens(12)
    assert table.blocks == [0, 1, 2]
    table.release()
    got = [alloc.allocate() for _ in range(4)]
    assert got == [3, 2, 1, 0], (
        f"after release() of blocks [0, 1, 2], allocate() hands out {got}, not [3, 2, 1, 0]: release() "
        "must free the last block first (section 3.2)"
    )


@pytest.mark.parametrize("t", [10, 11, -1])
def test_lookup_outside_the_sequence_raises(impl, t):
    """Token 10 does not exist in a 10-token sequence, even though block 5 has room for it."""
    _, table = example_table(impl, 10)
    with pytest.raises(IndexError):
        table.lookup(t)
    with pytest.raises(IndexError):
        table.slot(t)


@pytest.mark.parametrize(
    "make",
    [
        lambda impl: impl.BlockAllocator(0),
        lambda impl: impl.BlockAllocator(-3),
        lambda impl: impl.BlockTable(impl.BlockAllocator(2), 0),
        lambda impl: impl.BlockTable(impl.BlockAllocator(2), 4).append_tokens(-1),
        lambda impl: impl.waste_contiguous([3, 5], 0),
        lambda impl: impl.waste_paged([3, 5], 0),
        lambda impl: impl.waste_paged([3, -5], 4),
        # isinstance(True, int) holds: a bool is no size, and a check by isinstance alone lets it by as 1.
        lambda impl: impl.BlockAllocator(True),
        lambda impl: impl.BlockTable(impl.BlockAllocator(2), True),
        lambda impl: impl.BlockTable(impl.BlockAllocator(2), 4).append_tokens(True),
        lambda impl: impl.waste_paged([3, True], 4),
    ],
    ids=[
        "pool_of_0",
        "pool_negative",
        "block_size_0",
        "append_negative",
        "reserved_0",
        "paged_block_size_0",
        "negative_length",
        "pool_of_True",
        "block_size_True",
        "append_True",
        "length_True",
    ],
)
def test_bad_sizes_rejected(impl, make):
    with pytest.raises(ValueError):
        make(impl)


# --- Section 3.4-3.6: the kernel ----------------------------------------------------------------------


def test_store_then_gather_through_block_tables(impl, runtime):
    """Sequences of 7, 16, 1 and 22 tokens (block size 16 here, as L2 uses), grown from your allocator
    with scattered blocks; one batched store; gathering each sequence back through its block table gives
    exactly its key and value rows."""
    lens = sizes(runtime, [7, 16, 1, 22], [700, 16, 1, 2049, 333])
    PAGE, Hkv, D = 16, 2, 64
    num_blocks = sum(math.ceil(n / PAGE) for n in lens) + 3
    _, tables, slots = scattered_tables(impl, lens, PAGE, num_blocks, stream=1)
    key, value = random_rows(sum(lens), Hkv, D, torch.float16, runtime.device, stream=1)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=runtime.device)
    k_cache, v_cache = store_and_check(impl, key, value, slot_mapping, num_blocks, PAGE)
    start = 0
    for table, n in zip(tables, lens):
        row = torch.tensor(table.blocks, device=runtime.device)
        assert_close(gather_kv(k_cache, row, n), key[start : start + n], ROW_DIMS, **EXACT)
        assert_close(gather_kv(v_cache, row, n), value[start : start + n], ROW_DIMS, **EXACT)
        start += n


def test_padding_slots_leave_the_cache_untouched(impl, runtime):
    """-1 marks a padding row (a batch padded to a fixed size): it writes nothing. Padding first, in the
    middle, last, and several in a row; slot 0 (block 0, offset 0) is a real slot in the same batch."""
    PAGE, Hkv, D, num_blocks = 4, 2, 32, 6
    slots = [-1, 5, 0, -1, -1, 23, 9, -1]
    key, value = random_rows(len(slots), Hkv, D, torch.float16, runtime.device, stream=2)
    store_and_check(impl, key, value, torch.tensor(slots, device=runtime.device), num_blocks, PAGE)


def test_all_padding_batch_writes_nothing(impl, runtime):
    key, value = random_rows(5, 2, 32, torch.float16, runtime.device, stream=3)
    store_and_check(impl, key, value, torch.full((5,), -1, dtype=torch.int64, device=runtime.device), 3, 4)


def test_empty_batch_is_a_no_op(impl, runtime):
    key, value = random_rows(0, 2, 32, torch.float16, runtime.device, stream=4)
    store_and_check(impl, key, value, torch.empty(0, dtype=torch.int64, device=runtime.device), 3, 4)


def test_first_and_last_slot_of_the_cache(impl, runtime):
    """Slot 0 and slot num_blocks * PAGE - 1: the two edges of the cache, next to the spare blocks."""
    PAGE, Hkv, D, num_blocks = 5, 2, 16, 3
    key, value = random_rows(2, Hkv, D, torch.float16, runtime.device, stream=5)
    slots = torch.tensor([num_blocks * PAGE - 1, 0], device=runtime.device)
    store_and_check(impl, key, value, slots, num_blocks, PAGE)


@pytest.mark.parametrize(
    "Hkv,D,PAGE",
    [(3, 24, 5), (1, 128, 16), (6, 40, 3), (8, 128, 16), (2, 256, 16), (65, 200, 2), (128, 256, 3)],
    ids=["Hkv3-D24-PAGE5", "Hkv1-D128", "Hkv6-D40-PAGE3", "Hkv8-D128", "Hkv2-D256", "Hkv65", "widest-tile"],
)
def test_heads_and_dims_not_powers_of_two(impl, runtime, Hkv, D, PAGE):
    """Hkv and D padded up to powers of two for tl.arange: the padded heads and features must be masked
    on the store, or they land on the next slot's heads (or past the cache: the spare block sees it).
    Hkv = 65 pads past 64 heads, and 128 x 256 is the widest tile the launcher admits: a head tile fixed
    at the 8 KV heads of a GQA model stores only the first 8."""
    num_blocks = sizes(runtime, 7, 1000)  # at least N slots for every PAGE here
    N = sizes(runtime, 12, 1000)
    key, value = random_rows(N, Hkv, D, torch.float16, runtime.device, stream=Hkv * D)
    last = num_blocks * PAGE - 1  # the very last slot: unmasked padding there spills past the cache
    inner = 1 + distinct_slots(N - 2, last - 1, runtime.device, stream=D)  # distinct, in [1, last)
    slots = torch.cat([_slots(runtime.device, 0), inner, _slots(runtime.device, last)])
    store_and_check(impl, key, value, slots, num_blocks, PAGE)


def _strided_rows(layout, N, Hkv, D, device, stream):
    """key and value [N, Hkv, D] as views whose strides are not those of a contiguous tensor."""
    gen = torch.Generator().manual_seed(seeded(stream))
    Hq = 8
    qkv = torch.randn(N, Hq + 2 * Hkv, D, generator=gen).half().to(device)  # [N, Hq + 2 Hkv, D]
    key, value = qkv[:, Hq : Hq + Hkv], qkv[:, Hq + Hkv :]  # [N, Hkv, D] views, stride(0) = (Hq + 2 Hkv) * D
    if layout == "value_own_strides":  # key still a view of qkv, value a plain contiguous tensor
        value = value.clone()
    elif layout == "padded_head_dim":  # heads D + 8 apart: stride(1) is not D either
        padded = torch.randn(2, N, Hkv, D + 8, generator=gen).half().to(device)  # [2, N, Hkv, D + 8]
        key, value = padded[0, ..., :D], padded[1, ..., :D]
    return key, value


@pytest.mark.parametrize("layout", ["fused_qkv", "value_own_strides", "padded_head_dim"])
def test_strided_key_value_rows(impl, runtime, layout):
    """key and value are usually views into one fused qkv projection [N, Hq + 2 * Hkv, D]: their rows are
    (Hq + 2 * Hkv) * D apart, not Hkv * D. Read each with its own strides: value's may differ from key's
    (value_own_strides), and heads need not be D apart (padded_head_dim)."""
    N, Hkv, D, PAGE, num_blocks = sizes(runtime, 9, 300), 2, 32, 4, sizes(runtime, 5, 200)
    key, value = _strided_rows(layout, N, Hkv, D, runtime.device, stream=6)
    assert not key.is_contiguous() and (layout == "value_own_strides") == (value.stride() != key.stride())
    store_and_check(
        impl, key, value, distinct_slots(N, num_blocks * PAGE, runtime.device, stream=6), num_blocks, PAGE
    )


# name -> (the pool's shape, how k_cache and v_cache [num_blocks, PAGE, Hkv, D] are cut from it). Each
# cache starts and ends inside the pool, not at its edge, so that a mis-addressed row lands in canary.
CACHE_LAYOUTS = {
    # layer 1 of a [layers, num_blocks, 2, PAGE, Hkv, D] pool, each block's K page beside its V page
    "layer_of_interleaved_pool": (
        lambda nb, P, H, D: (3, nb, 2, P, H, D),
        lambda pool: (pool[1, :, 0], pool[1, :, 1]),
    ),
    # heads before tokens inside a block (FlashInfer's HND): stride(1) = D, stride(2) = PAGE * D
    "heads_before_tokens": (
        lambda nb, P, H, D: (4, nb, H, P, D),
        lambda pool: (pool[1].transpose(1, 2), pool[2].transpose(1, 2)),
    ),
}


def store_into_pool(impl, key, value, slots, num_blocks, PAGE, layout):
    """store_kvcache into k_cache and v_cache cut from a canary pool by CACHE_LAYOUTS[layout]; check every
    real row arrived bit for bit in its slot and nothing else in the pool changed."""
    N, Hkv, D = key.shape
    shape, cut = CACHE_LAYOUTS[layout]
    pool = torch.full(shape(num_blocks, PAGE, Hkv, D), CANARY, dtype=key.dtype, device=key.device)
    k_cache, v_cache = cut(pool)  # [num_blocks, PAGE, Hkv, D] views, not contiguous
    impl.store_kvcache(key, value, k_cache, v_cache, slots)
    real = slots >= 0
    block, offset = slots[real] // PAGE, slots[real] % PAGE
    keep = torch.zeros(pool.shape, dtype=torch.bool, device=key.device)
    for cache, keep_view, src in zip((k_cache, v_cache), cut(keep), (key, value)):
        keep_view[block, offset] = True  # writes through the view into keep
        assert_close(cache[block, offset], src[real], ROW_DIMS, **EXACT)
    assert_untouched(
        pool,
        CANARY,
        keep,
        f"the pool holding k_cache and v_cache ({layout}): rows stored as if "
        "the cache were contiguous, or a padding row written?",
    )


@pytest.mark.parametrize("layout", list(CACHE_LAYOUTS))
def test_cache_strides_are_used(impl, runtime, layout):
    """A cache need not be contiguous: address slot s as block * stride(0) + offset * stride(1) + h *
    stride(2), with the cache's own strides. The whole pool is canary, so a row stored where a contiguous
    cache would have it shows up as an overwritten canary (and a missing row)."""
    N, PAGE, Hkv, D, num_blocks = sizes(runtime, 10, 2000), 4, 2, 32, sizes(runtime, 6, 1024)
    key, value = random_rows(N, Hkv, D, torch.float16, runtime.device, stream=18)
    slots = distinct_slots(N, num_blocks * PAGE, runtime.device, stream=18)
    slots[::4] = -1
    store_into_pool(impl, key, value, slots, num_blocks, PAGE, layout)


def laid_out_rows(key, value, layout):
    """key and value [N, Hkv, D] as the views `layout` names (see _strided_rows), same values and dtype."""
    N, Hkv, D = key.shape
    nan = dict(fill_value=float("nan"), dtype=key.dtype, device=key.device)
    if layout == "fused_qkv":  # views of one [N, 8 + 2 Hkv, D] projection: rows (8 + 2 Hkv) D apart
        qkv = torch.full((N, 8 + 2 * Hkv, D), **nan)
        key, value = qkv[:, 8 : 8 + Hkv].copy_(key), qkv[:, 8 + Hkv :].copy_(value)
    elif layout == "value_own_strides":  # key a view of a projection, value contiguous
        qkv = torch.full((N, 8 + Hkv, D), **nan)
        key = qkv[:, 8:].copy_(key)
    elif layout == "padded_head_dim":  # heads D + 8 apart
        padded = torch.full((2, N, Hkv, D + 8), **nan)
        key, value = padded[0, ..., :D].copy_(key), padded[1, ..., :D].copy_(value)
    return key, value


PAIRWISE = "test_pairwise_domain_cases_match_the_oracle"


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Cases drawn from DOMAIN so that every pair of its boundary values meets in one case (D = 256 at
    PAGE = 1, three KV heads in a heads-before-tokens pool, fused-qkv rows in fp32...): a store right on
    each bound alone can still be wrong where two meet. A failure names the case's values."""

    def run(c):
        D, Hkv, PAGE = c["D"], c["Hkv"], c["PAGE"]
        num_blocks = 3
        last = num_blocks * PAGE - 1
        slots = {
            "with_padding": [-1, last, 0, -1] + list(range(1, min(last, 3))),
            "cache_edges": [0, last],
            "empty_batch": [],
        }[c["slots"]]
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=runtime.device)
        key, value = random_rows(len(slots), Hkv, D, c["dtype"], runtime.device, stream=407)
        key, value = laid_out_rows(key, value, c["rows"])
        if c["cache"] == "contiguous":
            store_and_check(impl, key, value, slot_mapping, num_blocks, PAGE)
        else:
            store_into_pool(impl, key, value, slot_mapping, num_blocks, PAGE, c["cache"])

    DOMAIN.check_each(DOMAIN.cases(stream=407), run)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"]
)
def test_dtypes(impl, runtime, dtype):
    """A copy in any dtype: bit for bit (bf16 runs in the interpreter too: no tl.dot here)."""
    N, Hkv, D, PAGE, num_blocks = sizes(runtime, 10, 4096), 2, 64, 16, sizes(runtime, 2, 1024)
    key, value = random_rows(N, Hkv, D, dtype, runtime.device, stream=7)
    store_and_check(
        impl, key, value, distinct_slots(N, num_blocks * PAGE, runtime.device, stream=7), num_blocks, PAGE
    )


def test_random_slots_in_a_large_cache(impl, runtime):
    """Many tokens to random distinct slots, some of them padding: the benchmark's pattern, checked."""
    N, Hkv, D, PAGE, num_blocks = sizes(runtime, 24, 8192), 8, 128, 16, sizes(runtime, 4, 4096)
    key, value = random_rows(N, Hkv, D, torch.float16, runtime.device, stream=8)
    slots = distinct_slots(N, num_blocks * PAGE, runtime.device, stream=8)
    slots[::5] = -1
    store_and_check(impl, key, value, slots, num_blocks, PAGE)


def test_paged_decode_reads_what_store_kvcache_wrote(impl, runtime):
    """The lessons connect: prefill sequences into a NaN-filled cache with your tables and store_kvcache,
    then one decode step (one new token each, padded batch, two sequences crossing a block boundary),
    then L2's paged_decode over your block tables. It must equal the fp32 oracle of
    drills/tests/paged_kv.py on a cache built by plain PyTorch indexing from the same rows."""
    PAGE, Hq, Hkv, D = 16, 8, 2, 64
    lens = sizes(runtime, [37, 16, 1, 48], [1000, 16, 1, 2047, 512])
    num_blocks = sum(math.ceil((n + 1) / PAGE) for n in lens) + 4
    dev = runtime.device
    _, tables, slots = scattered_tables(impl, lens, PAGE, num_blocks, stream=9)
    key, value = random_rows(sum(lens), Hkv, D, torch.float16, dev, stream=9)
    shape = (num_blocks, PAGE, Hkv, D)
    buf_k, buf_v, k_cache, v_cache = canary_caches(*shape, torch.float16, dev)
    k_cache.fill_(float("nan"))  # never-written slots are NaN: paged_decode must not read them
    v_cache.fill_(float("nan"))
    impl.store_kvcache(key, value, k_cache, v_cache, torch.tensor(slots, device=dev))

    # Decode step: the new token of each sequence, padded to a batch of B + 2 rows with -1.
    step = [t.append_tokens(1)[0] for t in tables]  # 16 -> 17 and 48 -> 49 tokens: a new block each
    new_k, new_v = random_rows(len(lens) + 2, Hkv, D, torch.float16, dev, stream=10)
    step_mapping = torch.tensor(step[:2] + [-1] + step[2:] + [-1], device=dev)
    new_rows = [0, 1] + list(range(3, len(lens) + 1))  # the real rows of new_k, in sequence order
    impl.store_kvcache(new_k, new_v, k_cache, v_cache, step_mapping)

    # The oracle's cache: plain indexing from the same rows, never touching your kernel.
    all_slots = torch.tensor(slots + step, device=dev)
    k_ref = torch.full(shape, float("nan"), dtype=torch.float16, device=dev)
    v_ref = torch.full(shape, float("nan"), dtype=torch.float16, device=dev)
    k_ref.view(-1, Hkv, D)[all_slots] = torch.cat([key, new_k[new_rows]])
    v_ref.view(-1, Hkv, D)[all_slots] = torch.cat([value, new_v[new_rows]])

    context_lens = torch.tensor([t.num_tokens for t in tables], dtype=torch.int32, device=dev)
    max_pages = max(len(t.blocks) for t in tables) + 1
    block_tables = torch.tensor(
        [t.blocks + [GARBAGE_BLOCK_IDS[i % 4]] * (max_pages - len(t.blocks)) for i, t in enumerate(tables)],
        dtype=torch.int32,
        device=dev,
    )
    q = random_rows(len(lens), Hq, D, torch.float16, dev, stream=11)[0]  # [B, Hq, D]
    M = margin(PAGE)
    inside = torch.zeros(buf_k.shape, dtype=torch.bool, device=dev)
    inside[M:-M] = True
    assert_untouched(buf_k, CANARY, inside, "the spare blocks around k_cache", CACHE_DIMS)
    assert_untouched(buf_v, CANARY, inside, "the spare blocks around v_cache", CACHE_DIMS)
    # Imported here, not at the top: the learner's process imports this module for its probes, and a
    # learner's file may import no reference.
    from drills.solutions.l2_paged_decode import paged_decode

    out = paged_decode(q, k_cache, v_cache, block_tables, context_lens)
    ref, _ = paged_attention_reference(q, k_ref, v_ref, block_tables, context_lens)
    assert_close(out, ref, ("b", "head", "d"))


def test_slot_index_widened_to_int64(impl, runtime):
    """Blocks whose first element lies past 2**32: block * stride(0) in int32 wraps around and the row
    lands in a low block of the same cache (blocks 0-3 here) instead of its own. Each cache holds 2**32
    elements (8.6 GB in fp16); on the CPU it is a sparse file, and only the pages this test writes (the
    first and the last 4 blocks) take memory."""
    PAGE, Hkv, D = 16, 1, 128
    first = 2**32 // (PAGE * Hkv * D)  # the first block whose offset is 2**32 elements
    num_blocks = first + 4
    if runtime.interpreter:
        if free_bytes() < 2**30:
            pytest.skip(
                f"needs about 1 GB of free memory for the pages it writes, {free_bytes() / 2**30:.2f} GB free"
            )
    elif torch.cuda.mem_get_info()[0] < 2 * num_blocks * PAGE * Hkv * D * 2 + 2**30:
        pytest.skip(f"needs 18 GB of free GPU memory, {torch.cuda.mem_get_info()[0] / 1e9:.1f} GB free")
    caches = [sparse_empty((num_blocks, PAGE, Hkv, D), torch.float16, runtime.device) for _ in range(2)]
    for cache in caches:  # the only pages the test touches
        cache[:4].fill_(CANARY)
        cache[first:].fill_(CANARY)
    N = 37
    key, value = random_rows(N, Hkv, D, torch.float16, runtime.device, stream=12)
    local = distinct_slots(N, 4 * PAGE, runtime.device, stream=12)  # slots inside the last 4 blocks
    impl.store_kvcache(key, value, caches[0], caches[1], first * PAGE + local)
    keep = torch.zeros((4, PAGE, Hkv, D), dtype=torch.bool, device=runtime.device)
    keep.view(-1, Hkv, D)[local] = True
    nothing = torch.zeros_like(keep)
    for name, cache, src in (("k_cache", caches[0], key), ("v_cache", caches[1], value)):
        tail = cache[first:]  # [4, PAGE, Hkv, D], starting 2**32 elements in
        assert_close(tail.reshape(-1, Hkv, D)[local], src, ROW_DIMS, **EXACT)
        assert_untouched(tail, CANARY, keep, f"the last 4 blocks of {name}", CACHE_DIMS)
        assert_untouched(
            cache[:4], CANARY, nothing, f"blocks 0-3 of {name} (int32 offsets wrapped around?)", CACHE_DIMS
        )
    del caches, tail
    if not runtime.interpreter:
        torch.cuda.empty_cache()


def test_row_index_widened_to_int64(impl, runtime):
    """key and value are views whose rows lie 1.5 * 2**30 and 1.75 * 2**30 elements apart (each its own
    stride, under 2**31): row 3 of each starts past 2**32, so i * stride in int32 wraps around to a low
    row of the same buffer (zeros) instead of row 3. Row 2 is padding (slot -1): its wrapped offset would
    be negative. The buffers are sparse files on a CPU (only the rows written take memory)."""
    Hkv, D, PAGE, num_blocks = 2, 64, 4, 3
    strides = (3 * 2**29, 7 * 2**28)  # key's rows, value's rows: both fit in int32, 3 rows of each do not
    rows = (0, 1, 3)  # the real rows; row 2 is padding
    need = sum(3 * s + Hkv * D for s in strides) * 2  # bytes the two buffers span
    if runtime.interpreter:
        if free_bytes() < 2**30:
            pytest.skip(
                f"needs about 1 GB of free memory for the pages it writes, {free_bytes() / 2**30:.2f} GB free"
            )
    elif torch.cuda.mem_get_info()[0] < need + 2**30:
        pytest.skip(
            f"needs {need / 1e9:.0f} GB of free GPU memory, {torch.cuda.mem_get_info()[0] / 1e9:.1f} GB free"
        )
    src_k, src_v = random_rows(4, Hkv, D, torch.float16, runtime.device, stream=14)
    views = []
    for stride, src in zip(strides, (src_k, src_v)):
        flat = sparse_empty((3 * stride + Hkv * D,), torch.float16, runtime.device)
        if not runtime.interpreter:
            flat[: 3 * stride - 2**32 + Hkv * D].zero_()  # torch.empty on a GPU: wrapped row 3 reads 0
        view = flat.as_strided((4, Hkv, D), (stride, D, 1))  # [4, Hkv, D], row i at i * stride
        for i in rows:
            view[i] = src[i]
        views.append(view)
    key, value = views
    assert key.stride(0) != value.stride(0) and 3 * min(strides) > 2**32 > max(strides) < 2**31
    store_and_check(impl, key, value, _slots(runtime.device, 7, 2, -1, 9), num_blocks, PAGE)
    del views, key, value, view, flat
    if not runtime.interpreter:
        torch.cuda.empty_cache()


def test_head_index_widened_to_int64(impl, runtime):
    """k_cache and v_cache keep each KV head's pages in a region of its own, 1.5 * 2**30 elements apart (a
    head-major pool seen as [num_blocks, PAGE, Hkv, D]: heads before blocks, a layout the spec admits; the
    stride fits in int32). Head 2 starts 3 * 2**30 elements in, so tl.arange's int32 head index times
    stride(2) wraps to -2**30, before the cache, and head 2 is never stored. Sparse files on a CPU."""
    N, PAGE, Hkv, D, num_blocks = 6, 4, 3, 32, 3
    key, value = random_rows(N, Hkv, D, torch.float16, runtime.device, stream=19)
    pool = torch.full((num_blocks, PAGE, Hkv, D), CANARY, dtype=key.dtype, device=runtime.device)
    k_cache, v_cache = (far_apart(pool, runtime, dim=2) for _ in range(2))
    assert 2 * k_cache.stride(2) >= 2**31 > k_cache.stride(2)
    slots = _slots(runtime.device, 7, 0, -1, 11, 4, 2)
    impl.store_kvcache(key, value, k_cache, v_cache, slots)
    real = slots >= 0
    block, offset = slots[real] // PAGE, slots[real] % PAGE
    for cache, src in ((k_cache, key), (v_cache, value)):
        assert_close(cache[block, offset], src[real], ROW_DIMS, **EXACT)
        cache[block, offset] = CANARY
        assert (cache == CANARY).all(), "a slot other than the tokens' own was written"
    del k_cache, v_cache


# --- Section 3.7 "The launcher's checks" --------------------------------------------------------------


def _slots(dev, *values):
    return torch.tensor(values, dtype=torch.int64, device=dev)


def _shifted_by_one_block(cache):
    """A view of cache's buffer with its shape and strides, one block further on: it shares all but one
    block with cache (the canary margin holds the extra block)."""
    return cache.as_strided(cache.shape, cache.stride(), cache.storage_offset() + cache.stride(0))


def _every_other(slots):
    """The same values as a strided view (stride 2) of a buffer whose other entries are valid slots too,
    so a kernel that reads entry i at slot_mapping + i stores rows at the wrong slots without an error."""
    wide = torch.stack([slots, torch.arange(8, 8 + len(slots), device=slots.device)], dim=1).flatten()  # [2N]
    return wide[::2]


# name -> (how to spoil the arguments of a valid call, the error, what the message must name)
def _widened(args, dim, size):
    """key, value and both caches with dimension `dim` of the rows (1: Hkv, 2: D) grown to `size`."""
    rows = {
        n: args[n].new_zeros(*args[n].shape[:dim], size, *args[n].shape[dim + 1 :]) for n in ("key", "value")
    }
    caches = {
        n: args[n].new_zeros(*args[n].shape[: dim + 1], size, *args[n].shape[dim + 2 :])
        for n in ("k_cache", "v_cache")
    }
    return rows | caches


BAD_INPUTS = {
    "check_not_a_bool": (lambda a, dev: dict(check="always"), TypeError, "check"),
    "key_not_a_tensor": (lambda a, dev: dict(key=a["key"].tolist()), TypeError, "key"),
    "key_rank": (lambda a, dev: dict(key=a["key"][0]), ValueError, "key"),
    "key_dtype_fp64": (lambda a, dev: dict(key=a["key"].double()), TypeError, "key"),
    "value_dtype": (lambda a, dev: dict(value=a["value"].float()), TypeError, "value"),
    "k_cache_dtype": (lambda a, dev: dict(k_cache=a["k_cache"].float()), TypeError, "k_cache"),
    "v_cache_dtype": (lambda a, dev: dict(v_cache=a["v_cache"].float()), TypeError, "v_cache"),
    "v_cache_rank": (lambda a, dev: dict(v_cache=a["v_cache"][0]), ValueError, "v_cache"),
    "value_shape": (lambda a, dev: dict(value=a["value"][:, :1]), ValueError, "value"),
    "value_rows": (lambda a, dev: dict(value=a["value"][:4]), ValueError, "value"),
    "value_head_dim": (lambda a, dev: dict(value=a["value"][..., :8]), ValueError, "value"),
    # Past the widest [Hkv, D] tile the launcher admits: one token's heads would not fit one program.
    "head_dim_past_256": (lambda a, dev: _widened(a, 2, 257), ValueError, "D"),
    "kv_heads_past_128": (lambda a, dev: _widened(a, 1, 129), ValueError, "Hkv"),
    "cache_heads_mismatch": (
        lambda a, dev: {n: a[n][:, :, :1] for n in ("k_cache", "v_cache")},
        ValueError,
        "k_cache",
    ),
    "cache_head_dim_mismatch": (
        lambda a, dev: {n: a[n][..., :8] for n in ("k_cache", "v_cache")},
        ValueError,
        "k_cache",
    ),
    "v_cache_shape": (lambda a, dev: dict(v_cache=a["v_cache"][:2]), ValueError, "v_cache"),
    "v_cache_strides": (
        lambda a, dev: dict(v_cache=a["v_cache"].transpose(0, 1).contiguous().transpose(0, 1)),
        ValueError,
        "v_cache",
    ),
    "key_last_dim_strided": (
        lambda a, dev: dict(key=a["key"].transpose(1, 2).contiguous().transpose(1, 2)),
        ValueError,
        "key",
    ),
    "v_cache_is_k_cache": (lambda a, dev: dict(v_cache=a["k_cache"]), ValueError, "v_cache"),
    "v_cache_overlaps_k_cache": (
        lambda a, dev: dict(v_cache=_shifted_by_one_block(a["k_cache"])),
        ValueError,
        "v_cache",
    ),
    "caches_expanded": (
        lambda a, dev: {n: a[n][:1].expand(a[n].shape) for n in ("k_cache", "v_cache")},
        ValueError,
        "k_cache",
    ),
    "slot_mapping_int32": (
        lambda a, dev: dict(slot_mapping=a["slot_mapping"].int()),
        TypeError,
        "slot_mapping",
    ),
    "slot_mapping_2d": (
        lambda a, dev: dict(slot_mapping=a["slot_mapping"][:, None]),
        ValueError,
        "slot_mapping",
    ),
    "slot_mapping_wrong_length": (
        lambda a, dev: dict(slot_mapping=a["slot_mapping"][:4]),
        ValueError,
        "slot_mapping",
    ),
    "slot_mapping_strided": (
        lambda a, dev: dict(slot_mapping=_every_other(a["slot_mapping"])),
        ValueError,
        "slot_mapping",
    ),
    "slot_past_the_cache": (
        lambda a, dev: dict(slot_mapping=_slots(dev, 3, 16, 0, 15, 7)),
        ValueError,
        r"slot_mapping\[1\]",
    ),
    "slot_below_minus_one": (
        lambda a, dev: dict(slot_mapping=_slots(dev, 3, -1, 0, -2, 7)),
        ValueError,
        r"slot_mapping\[3\]",
    ),
    "duplicate_slot": (
        lambda a, dev: dict(slot_mapping=_slots(dev, 3, -1, 7, 15, 7)),
        ValueError,
        "slot_mapping",
    ),
    "mixed_devices": (
        lambda a, dev: dict(slot_mapping=a["slot_mapping"].to("meta")),
        ValueError,
        "slot_mapping",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs: the caches must
    still be all canary afterwards."""
    spoil, error, names = BAD_INPUTS[name]
    key, value = random_rows(5, 2, 16, torch.float16, runtime.device, stream=13)
    buf_k, buf_v, k_cache, v_cache = canary_caches(4, 4, 2, 16, torch.float16, runtime.device)
    args = dict(
        key=key,
        value=value,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=_slots(runtime.device, 3, -1, 0, 15, 7),
    )
    impl.store_kvcache(**args)  # the unspoiled call is valid
    buf_k.fill_(CANARY)
    buf_v.fill_(CANARY)
    args["check"] = True  # slot values too: on a GPU they are checked only when asked
    args.update(spoil(args, runtime.device))
    with raises_naming(error, names):
        impl.store_kvcache(**args)
    nothing = torch.zeros(buf_k.shape, dtype=torch.bool, device=buf_k.device)
    assert_untouched(buf_k, CANARY, nothing, "k_cache after a rejected call", CACHE_DIMS)
    assert_untouched(buf_v, CANARY, nothing, "v_cache after a rejected call", CACHE_DIMS)


def test_duplicate_padding_is_fine(impl, runtime):
    """-1 may repeat (every padding row is -1); only real slots must be distinct."""
    key, value = random_rows(4, 2, 16, torch.float16, runtime.device, stream=14)
    store_and_check(impl, key, value, _slots(runtime.device, -1, 2, -1, -1), 2, 4)


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right cache is not enough: store_kvcache must write it with your Triton kernel, not with
    torch's indexed assignment (k_cache.view(-1, Hkv, D)[slot_mapping] = key)."""
    PAGE, Hkv, D, num_blocks = 4, 2, 32, 6
    key, value = random_rows(5, Hkv, D, torch.float16, runtime.device, stream=17)
    k_cache, v_cache = canary_caches(num_blocks, PAGE, Hkv, D, torch.float16, runtime.device)[2:]
    slots = torch.tensor([3, 9, -1, 14, 0], device=runtime.device)
    assert_runs_a_triton_kernel(
        impl, lambda: impl.store_kvcache(key, value, k_cache, v_cache, slots), "store_kvcache"
    )


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """70,000 tokens in one call (a long prefill, or a batch of them), more than the 65535 programs CUDA
    allows on grid axes 1 and 2 (axis 0 allows 2**31 - 1): tokens put on axis 1 launch on the CPU and
    fail on a GPU with "invalid argument". Run dry (every launch recorded and checked, none run), with
    rows of one head of 16 features, all padding, so the tiny cache holds every slot."""
    N, PAGE, Hkv, D = 70_000, 16, 1, 16
    key = torch.zeros(N, Hkv, D, dtype=torch.float16, device=runtime.device)  # [N, Hkv, D]
    value = torch.zeros_like(key)
    k_cache = torch.zeros(
        1, PAGE, Hkv, D, dtype=torch.float16, device=runtime.device
    )  # [blocks, PAGE, Hkv, D]
    v_cache = torch.zeros_like(k_cache)
    slots = torch.full((N,), -1, dtype=torch.int64, device=runtime.device)  # [N], every row padding
    assert_grids_fit(
        impl,
        lambda: impl.store_kvcache(key, value, k_cache, v_cache, slots),
        "store_kvcache of 70,000 tokens",
    )


# --- The grader's own checks are strict enough ----------------------------------------------------------


def test_checks_reject_zeros_a_shifted_slot_and_one_stray_write(runtime):
    """Not a test of your code: the exact comparison fails an all-zeros cache and rows stored one slot
    off, and the canary check fails a single stray element, so passing the tests above means something."""
    key, _ = random_rows(6, 2, 16, torch.float16, runtime.device, stream=15)
    assert mismatch(torch.zeros_like(key), key, **EXACT) is not None
    assert mismatch(key.roll(1, dims=0), key, **EXACT) is not None
    assert mismatch(key.clone(), key, **EXACT) is None
    buf = torch.full((3, 4, 2, 16), CANARY, dtype=torch.float16, device=runtime.device)
    buf[0, 3, 1, 15] = 0.0
    with pytest.raises(AssertionError, match="canary"):
        assert_untouched(buf, CANARY, torch.zeros(buf.shape, dtype=torch.bool, device=buf.device), "buf")


# The check of generated combinations is defined after MISTAKES above: its look-alikes are every other check.
MISTAKES += [
    Mistake(
        12,
        # Every bound holds alone and a combination of them does not: the message names the case.
        fails=(PAIRWISE,),
        passes=checks_besides(globals(), PAIRWISE),
        question="Every single-bound check passes and one generated case does not: its message names its "
        "D, Hkv, PAGE, dtype, row and cache layouts and slots; which of these does your kernel handle only "
        "one at a time (a stride taken from another tensor, a padded size where the real one belongs)?",
        section="3.4",
    ),
]
