"""Grader for L3, prefix caching with reference counts. Each test is named for the mistake it catches.

Run: make test L=l3 (your drills/mine) or make test L=l3 IMPL=solutions. Pure Python: no kernel and no
tensors, so every test runs the same on a CPU and on a GPU machine.

The tests use only the manager's public API. The random-stream tests run where your code runs (one
round trip, not thousands of calls between processes) and write down every call and its answer; the
checks then run here, on that record. They also keep a model of the KV cache itself: whenever a
token's KV is not reused, the engine would write it into the slot the block table names, so the model
writes there the token's whole prefix; after every step, every live sequence must read its own prefix
back from every slot of its table. A block shared by mistake, written while shared or handed out while
still in use breaks that, whatever the ref counts say.
"""

from __future__ import annotations

import builtins
import math
import random
from collections import Counter

import pytest

from drills.grading.grader.diagnose import Mistake
from drills.tests import probe, raises_naming, seeded

A, B, C, D, E, F, G, H, X, Y = range(1, 11)  # the worked example's letters as token ids, and two more


# What a revived prefix fails, and what it passes, both where free drops the key (21) and where the
# cached count leaves revived blocks out (22): the two are told apart by the worked example's words.
REVIVAL_FAILS = (
    "test_worked_example_freed_block_is_revived",
    "test_revived_blocks_count_against_free_blocks",
    "test_revived_block_leaves_the_free_list",
    "test_evicted_block_is_not_revived",
)
REVIVAL_PASSES = (
    "test_free_drops_every_ref_count",
    "test_block_still_shared_stays_off_the_free_list",
    "test_newest_block_of_a_repeated_key_is_found",
    "test_failed_allocation_changes_nothing",
    "test_hash_chains_the_previous_block",
)
# The explainer's pitfalls (section 5) and the pattern of checks each leaves, for the diagnosis.
MISTAKES = [
    Mistake(
        7,
        fails=("test_failed_append_changes_nothing",),
        messages=(r"the failed append changed the manager",),
        question='Both blocks are taken and "s" fills its last one: what has your append() already '
        "changed when taking the new block raises?",
        section="3.6",
    ),
    Mistake(
        21,
        fails=REVIVAL_FAILS,
        passes=REVIVAL_PASSES,
        question='"s" is freed and "t" asks for the same prompt: where does your manager still find '
        "the key of s's first block after free()?",
        section="3.5",
    ),
    Mistake(
        20,
        # The learner's own out-of-blocks ValueError, raised where the blocks suffice exactly: it also
        # fails every check whose manager is filled to the last block, under other pitfalls' names.
        fails=("test_refused_allocation_of_new_blocks_changes_nothing",),
        passes=(
            "test_fresh_manager_hands_out_blocks_in_order",
            "test_worked_example_step_by_step",
            "test_worked_example_freed_block_is_revived",
            "test_block_filled_by_append_is_shared",
            "test_evicted_block_is_not_revived",
        ),
        messages=(r"when exactly 3 are free was refused",),
        question="1 of 4 blocks is taken and a prompt needs 3 new ones: how many are free, and does your "
        "allocate() compare the need with them by < or by <=?",
        section="3.4",
    ),
    Mistake(
        18,
        fails=("test_newest_block_of_a_repeated_key_is_found",),
        passes=(
            "test_block_filled_by_append_is_shared",
            "test_evicted_block_is_not_revived",
            "test_worked_example_freed_block_is_revived",
        ),
        question="Blocks 0 and 1 both hold [A, B] and are sealed under one key: which block does your "
        "dictionary name after the second seal, and what happens to the key when block 0 is evicted?",
        section="3.6",
    ),
    Mistake(
        1,
        fails=("test_free_drops_every_ref_count", "test_worked_example_step_by_step"),
        passes=("test_partial_block_is_never_shared",),
        question="After request 1 of the worked example ends, what are the ref counts of blocks 0, 1 and 2 "
        "in your manager?",
        section="2",
    ),
    Mistake(
        2,
        fails=("test_block_still_shared_stays_off_the_free_list",),
        passes=("test_free_drops_every_ref_count",),
        messages=(r"still held by the prefix|returns to the free list|revived blocks 0 and 1 are in use",),
        question="When free() drops a block's count from 2 to 1, does that block go to the free list?",
        section="3.7",
    ),
    Mistake(
        3,
        fails=("test_hash_chains_the_previous_block",),
        question="Do [C, D] after [A, B] and [C, D] after [E, F] get different keys in your manager?",
        section="3.2",
    ),
    Mistake(
        3,
        fails=("test_hash_fn_gets_the_previous_key_and_a_tuple",),
        messages=(r"must be keyed after \[A, B\]'s key|first block's key is hash_fn\(None",),
        question="What does your manager pass to hash_fn as prev_hash for [C, D] after [A, B]: the key of "
        "the block before, or something else that names it (its block id, its tokens)?",
        section="3.2",
    ),
    Mistake(
        3,
        fails=("test_block_sealed_by_append_is_keyed_after_the_block_before",),
        passes=("test_hash_chains_the_previous_block", "test_append_never_writes_into_a_full_block"),
        question="When append takes a new block, what does your manager record as the block before it, and "
        "after which key is the block keyed when it fills?",
        section="3.6",
    ),
    Mistake(
        4,
        fails=("test_hash_fn_gets_the_previous_key_and_a_tuple",),
        messages=(r"the partial block \[E\] must not be keyed",),
        question="[A, B, C, D, E] in blocks of 2: which of its blocks are full, and which does your manager "
        "key when it allocates?",
        section="3.2",
    ),
    # The walk past a miss finds a later block cached after an earlier hit: every check that shares one
    # fails with it, the one-miss case the check against the block before (6) passes.
    Mistake(
        23,
        fails=("test_the_walk_stops_at_the_first_miss",),
        passes=("test_token_ids_checked_on_a_key_hit", "test_block_before_compared_as_a_block_not_a_key"),
        question="[A, B] hits and [E, F] misses: is [C, D], cached right after [A, B] by another prompt, "
        "the KV of the [C, D] that follows [E, F]?",
        section="3.3",
    ),
    Mistake(
        22,
        # Every check that counts the cached tokens of a revived prefix fails, as when the key is dropped
        # at free (21); the worked example's own words tell them apart: its table is right here.
        fails=REVIVAL_FAILS,
        passes=REVIVAL_PASSES,
        messages=(r"revived blocks count as cached",),
        question="req3's table reuses blocks 0, 1 and 2, one of them revived from the free list: whose KV "
        "does block 2 hold, and does your count of cached tokens include it?",
        section="3.5",
    ),
    Mistake(
        4,
        fails=("test_partial_block_is_never_shared",),
        passes=("test_append_never_writes_into_a_full_block", "test_block_filled_by_append_is_shared"),
        question="Two sequences [A, B, C]: may they share the block holding [C]? Who writes its next slot?",
        section="3.2",
    ),
    Mistake(
        5,
        fails=("test_token_ids_checked_on_a_key_hit",),
        question="When a key finds a block, what tells you the block holds the tokens you looked up?",
        section="3.3",
    ),
    Mistake(
        6,
        fails=("test_same_tokens_after_another_block_are_not_shared",),
        passes=("test_token_ids_checked_on_a_key_hit", "test_the_walk_stops_at_the_first_miss"),
        question="A block holds the right tokens: what else must match before its KV is yours?",
        section="3.3",
    ),
    Mistake(
        6,
        fails=("test_block_before_compared_as_a_block_not_a_key",),
        passes=("test_same_tokens_after_another_block_are_not_shared", "test_hash_chains_the_previous_block"),
        question="Two blocks before with the same key: do they hold the same prefix? What does your hit "
        "compare, the blocks or their keys?",
        section="3.3",
    ),
    Mistake(
        7,
        fails=("test_refused_allocation_of_new_blocks_changes_nothing",),
        question="When allocate cannot get every block it needs, what has it taken before it raises?",
        section="3.4",
    ),
    Mistake(
        8,
        fails=("test_revived_blocks_count_against_free_blocks",),
        passes=("test_refused_allocation_of_new_blocks_changes_nothing", "test_free_drops_every_ref_count"),
        question="A cached block whose ref count is 0: does reusing it take a block off the free list?",
        section="3.4",
    ),
    Mistake(
        19,
        fails=("test_whole_prompt_cached_counts_every_token",),
        passes=(
            "test_block_filled_by_append_is_shared",
            "test_fresh_manager_hands_out_blocks_in_order",
            "test_free_drops_every_ref_count",
            "test_token_ids_checked_on_a_key_hit",
        ),
        messages=(r"ends on a block edge fills its last block",),
        question="A prompt of 4 tokens in blocks of 2: how many of its blocks are full, and how many does "
        "your allocate seal?",
        section="3.3",
    ),
    Mistake(
        9,
        fails=("test_revived_block_leaves_the_free_list",),
        question="After a freed block is revived, where is it: in use, on the free list, or both?",
        section="3.5",
    ),
    Mistake(
        10,
        fails=("test_free_returns_tail_blocks_first",),
        passes=("test_worked_example_freed_block_is_revived",),
        question="In which order do a freed sequence's blocks join the free list, and which is evicted first?",
        section="3.7",
    ),
    Mistake(
        11,
        fails=("test_append_never_writes_into_a_full_block",),
        question="When the last block is full (and maybe shared), where does the next token go?",
        section="3.6",
    ),
    Mistake(
        12,
        fails=("test_block_filled_by_append_is_shared",),
        passes=(
            "test_append_never_writes_into_a_full_block",
            "test_partly_written_block_is_not_counted_as_cached",
        ),
        question="When append fills a block, how does a later prompt with the same tokens find it?",
        section="3.6",
    ),
    Mistake(
        13,
        fails=("test_bad_call_raises_and_changes_nothing[seq_id_unhashable_allocate]",),
        question="What does a list seq_id do in a dict lookup, and does your error name seq_id?",
        section="3.1",
    ),
    Mistake(
        13,
        fails=("test_bad_token_ids_rejected_before_anything_changes",),
        question="When is a token id that is not an int noticed: before anything changes, or when its block "
        "is keyed?",
        section="3.1",
    ),
    Mistake(
        14,
        fails=("test_block_table_is_a_copy",),
        question="Is the list block_table (or allocate) returns the manager's own table?",
        section="3.1",
    ),
    Mistake(
        15,
        fails=("test_partly_written_block_is_not_counted_as_cached",),
        question="A prompt of 5 tokens in blocks of 2 whose 2 full blocks are cached: how many of its "
        "tokens already have their KV, and which block still waits for its KV to be computed?",
        section="3.3",
    ),
    Mistake(
        16,
        fails=("test_worked_example_freed_block_is_revived",),
        passes=(
            "test_worked_example_step_by_step",
            "test_free_drops_every_ref_count",
            "test_revived_block_leaves_the_free_list",
        ),
        question="Block 2 was freed a moment ago and block 4 has never been used: which of the two should "
        "the next new block be, and where in your free list does a freed block go?",
        section="3.5",
    ),
    Mistake(
        16,
        # New blocks popped from the back of the free list: a stack from the first allocation on, which
        # renumbers every block of every check (and fails them) before any freed block comes back.
        fails=("test_fresh_manager_hands_out_blocks_in_order", "test_worked_example_step_by_step"),
        question="A fresh manager of 8 blocks: which block does your first allocate get, and from which end "
        "of the free list do new blocks come?",
        section="3.5",
    ),
    Mistake(
        17,
        fails=("test_evicted_block_forgets_what_it_held",),
        question="When a freed block is handed out again, what does your manager still remember about the "
        "tokens it held before, and what does the next append add them to?",
        section="3.5",
    ),
]


def refs(m, num_blocks):
    return [m.ref_count(b) for b in range(num_blocks)]


def state(m, num_blocks, seq_ids):
    """Everything the public API shows: free count, every ref count, every table and cached count."""
    return (
        m.num_free_blocks,
        refs(m, num_blocks),
        {s: (m.block_table(s), m.num_cached_tokens(s)) for s in seq_ids},
    )


def same_key(prev_hash, token_ids):
    """The worst hash there is: every block collides with every other."""
    return 0


# --- Section 2 "By hand": the worked example through your manager ---------------------------------


def test_worked_example_step_by_step(impl):
    """Block size 2, base prefix [A, B, C, D], request 1 = prefix + [E, F], request 2 = prefix + [G, H]:
    every table, every ref count and the free count after each step, then request 1 ends."""
    N = 8
    m = impl.BlockManager(N, 2)

    assert m.allocate("prefix", [A, B, C, D]) == [0, 1], "step 1: the base prefix takes blocks 0 and 1"
    assert refs(m, N) == [1, 1, 0, 0, 0, 0, 0, 0] and m.num_free_blocks == 6
    assert m.num_cached_tokens("prefix") == 0, "nothing was cached before step 1"

    assert m.allocate("req1", [A, B, C, D, E, F]) == [0, 1, 2], "step 2: [A, B] and [C, D] are shared"
    assert refs(m, N) == [2, 2, 1, 0, 0, 0, 0, 0] and m.num_free_blocks == 5
    assert m.num_cached_tokens("req1") == 4, "step 2: the KV of A, B, C, D is reused"

    assert m.allocate("req2", [A, B, C, D, G, H]) == [0, 1, 3], "step 3: shared again, [G, H] is new"
    assert refs(m, N) == [3, 3, 1, 1, 0, 0, 0, 0] and m.num_free_blocks == 4
    assert m.num_cached_tokens("req2") == 4

    m.free("req1")  # step 4: blocks 2, 1, 0 lose one reference each; only block 2 reaches 0
    assert refs(m, N) == [2, 2, 0, 1, 0, 0, 0, 0], "step 4: ref counts after request 1 ends"
    assert m.num_free_blocks == 5, "step 4: block 2 (and only block 2) returns to the free list"
    with pytest.raises(KeyError):
        m.block_table("req1")

    assert m.block_table("req2") == [0, 1, 3], "step 5: request 2's final table"
    assert m.block_table("prefix") == [0, 1]


def test_worked_example_freed_block_is_revived(impl):
    """After step 4, block 2 still holds the KV of [A, B, C, D, E, F]: it waits at the back of the free
    list (an unrelated request gets block 4), and the same prompt again revives it: 6 cached tokens."""
    N = 8
    m = impl.BlockManager(N, 2)
    m.allocate("prefix", [A, B, C, D])
    m.allocate("req1", [A, B, C, D, E, F])
    m.allocate("req2", [A, B, C, D, G, H])
    m.free("req1")
    assert m.allocate("other", [X, Y]) == [4], "a freed block joins the back of the free list"
    assert m.allocate("req3", [A, B, C, D, E, F]) == [0, 1, 2], "block 2's KV is intact: revive it"
    cached = m.num_cached_tokens("req3")
    assert cached == 6, (
        f"req3 revived blocks 0, 1 and 2 (its table is right) and their KV is intact, yet "
        f"num_cached_tokens is {cached}, not 6: revived blocks count as cached"
    )
    assert refs(m, N) == [3, 3, 1, 1, 1, 0, 0, 0] and m.num_free_blocks == 3


def test_fresh_manager_hands_out_blocks_in_order(impl):
    m = impl.BlockManager(5, 2)
    assert m.allocate("a", [A]) == [0]
    assert m.allocate("b", [B, C, D]) == [1, 2]
    assert m.allocate("c", [E]) == [3]
    assert m.num_cached_tokens("b") == 0 and m.num_free_blocks == 1


# --- Section 5 "Pitfalls" ----------------------------------------------------------------------------


def test_free_drops_every_ref_count(impl):
    """Every table's blocks lose one reference on free; once every sequence ends, every block is free."""
    N = 10
    m = impl.BlockManager(N, 2)
    m.allocate("s", [A, B, C, D, E])
    m.allocate("t", [A, B, C, D, E])
    m.allocate("u", [A, B, G])
    assert refs(m, N)[:5] == [3, 2, 1, 1, 1]
    m.free("t")
    assert refs(m, N)[:5] == [2, 1, 1, 0, 1]
    for seq in ("s", "u"):
        m.free(seq)
    assert refs(m, N) == [0] * N and m.num_free_blocks == N, "blocks leaked after every sequence ended"


def test_block_still_shared_stays_off_the_free_list(impl):
    """Request 1 ends while the prefix still holds blocks 0 and 1: only block 2 may be handed out again."""
    N = 4
    m = impl.BlockManager(N, 2)
    m.allocate("prefix", [A, B, C, D])
    m.allocate("req1", [A, B, C, D, E, F])
    m.free("req1")
    assert m.num_free_blocks == 2, "blocks 0 and 1 are still held by the prefix: they are not free"
    assert m.allocate("other", [G, H, G, H]) == [3, 2]
    with pytest.raises(ValueError):
        m.allocate("one_more", [X])
    assert m.block_table("prefix") == [0, 1] and refs(m, N) == [1, 1, 1, 1]


def test_hash_chains_the_previous_block(impl):
    """[C, D] after [A, B] and [C, D] after [E, F] are different KV. With unchained keys they fight for
    one key: either the second request reuses the wrong KV, or the first one's block is lost for reuse."""
    m = impl.BlockManager(8, 2)
    assert m.allocate("x", [A, B, C, D]) == [0, 1]
    assert m.allocate("z", [E, F, C, D]) == [2, 3], "[C, D] after [E, F] must not reuse block 1"
    assert m.num_cached_tokens("z") == 0
    assert m.allocate("w", [A, B, C, D]) == [0, 1], "[A, B, C, D] again must find blocks 0 and 1"
    assert m.num_cached_tokens("w") == 4


def test_partial_block_is_never_shared(impl):
    """Two [A, B, C]: [A, B] is shared, each [C] gets its own block, because each sequence will write its
    next token into it. Once filled by append, each is sealed and found by its own continuation."""
    N = 8
    m = impl.BlockManager(N, 2)
    assert m.allocate("s", [A, B, C]) == [0, 1]
    assert m.allocate("t", [A, B, C]) == [0, 2], "the partial block [C] must not be shared"
    assert m.num_cached_tokens("t") == 2, "only full blocks count as cached"
    assert refs(m, N)[:3] == [2, 1, 1]
    m.append("s", D)
    m.append("t", E)
    assert m.block_table("s") == [0, 1] and m.block_table("t") == [0, 2]
    assert m.allocate("u", [A, B, C, D]) == [0, 1] and m.num_cached_tokens("u") == 4
    assert m.allocate("v", [A, B, C, E, X]) == [0, 2, 3] and m.num_cached_tokens("v") == 4


def test_partly_written_block_is_not_counted_as_cached(impl):
    """num_cached_tokens counts only the full blocks whose KV was reused. [A, B, C, D, E] after [A, B, C,
    D]: both full blocks hit, but [E] sits in a new block whose KV the engine must still compute, so 4
    tokens are cached, not 5; [A, B, C] reuses [A, B] only, since a lone [C] is no full block, even
    though block 1 begins with C. An engine that trusts a count of 5 skips computing E's KV."""
    m = impl.BlockManager(8, 2)
    assert m.allocate("s", [A, B, C, D]) == [0, 1]
    assert m.allocate("t", [A, B, C, D, E]) == [0, 1, 2], "[A, B] and [C, D] are shared, [E] is new"
    assert m.num_cached_tokens("t") == 4, (
        f"num_cached_tokens = {m.num_cached_tokens('t')} for [A, B, C, D, E]: the partial block [E] was "
        "just handed out, its KV not computed yet"
    )
    assert m.allocate("u", [A, B, C]) == [0, 3], "[A, B] is shared, [C] gets its own block"
    assert m.num_cached_tokens("u") == 2, (
        f"num_cached_tokens = {m.num_cached_tokens('u')} for [A, B, C]: only the full block [A, B] was reused"
    )


def test_token_ids_checked_on_a_key_hit(impl):
    """With a hash where every key collides, [C, D] finds block 0 under its key: the tokens differ
    ([A, B]), so it is a miss, not a share."""
    m = impl.BlockManager(8, 2, hash_fn=same_key)
    assert m.allocate("x", [A, B]) == [0]
    assert m.allocate("y", [C, D]) == [1], "a key collision must not share a block with other tokens"
    assert m.num_cached_tokens("y") == 0
    assert m.ref_count(0) == 1


def test_block_sealed_by_append_is_keyed_after_the_block_before(impl):
    """A block that append takes holds the tokens after the sequence's last block: [C, D] grown after
    [A, B] is keyed after [A, B]'s key, as allocate would key it. A block taken without recording the
    block before it is keyed as a first block, and a prompt that starts with [C, D] reuses its KV."""
    m = impl.BlockManager(8, 2)
    assert m.allocate("a", [A, B]) == [0]
    m.append("a", C)
    m.append("a", D)
    assert m.block_table("a") == [0, 1]
    assert m.allocate("b", [C, D]) == [2], "block 1 holds [C, D] after [A, B]: not the KV of [C, D] alone"
    assert m.num_cached_tokens("b") == 0
    # That [A, B, C, D] then finds block 1 is test_block_filled_by_append_is_shared's (pitfall 12).


def _tokens_only(prev_hash, token_ids):
    """Unchained keys: a block's key says which tokens it holds, not what came before them."""
    return hash(token_ids)


def test_block_before_compared_as_a_block_not_a_key(impl):
    """With keys of the tokens alone, blocks 1 and 4 both hold [A, B] under one key, after [E, F] and
    after [G, H]. [C, D] after block 4 finds block 2, which follows block 1: the blocks before share a
    key, not a prefix, so block 2's KV is not this prompt's. Only the block itself tells them apart."""
    m = impl.BlockManager(8, 2, hash_fn=_tokens_only)
    assert m.allocate("x", [E, F, A, B, C, D]) == [0, 1, 2]
    assert m.allocate("y", [G, H, A, B]) == [3, 4]
    table = m.allocate("z", [G, H, A, B, C, D])
    assert table == [3, 4, 5], (
        f"[G, H, A, B, C, D] got {table}: block 2 holds [C, D] after [E, F, A, B], whose [A, B] block has "
        "the same key as block 4 but another prefix"
    )
    assert m.num_cached_tokens("z") == 4


def test_same_tokens_after_another_block_are_not_shared(impl):
    """With every key colliding, [C, D] at the start of a prompt finds block 1, which holds [C, D] but
    after [A, B]: same tokens, different KV. A hit must also check the block before it."""
    m = impl.BlockManager(8, 2, hash_fn=same_key)
    assert m.allocate("x", [A, B, C, D]) == [0, 1]
    assert m.allocate("z", [C, D]) == [2], "block 1 holds [C, D] after [A, B]: not the KV of [C, D] alone"
    assert m.num_cached_tokens("z") == 0
    assert m.allocate("w", [E, F, C, D]) == [3, 4]
    assert m.num_cached_tokens("w") == 0


def test_the_walk_stops_at_the_first_miss(impl):
    """ "x" = [A, B, C, D] caches [C, D] after [A, B] (block 1). "y" = [A, B, E, F, C, D] hits [A, B],
    misses [E, F], and stops there: its [C, D] follows [E, F], whose KV no block holds, so block 1 is not
    its KV even though it holds [C, D] right after the last hit. A walk that goes on past the miss takes
    block 1 for the block after [E, F]."""
    m = impl.BlockManager(8, 2)
    assert m.allocate("x", [A, B, C, D]) == [0, 1]
    table = m.allocate("y", [A, B, E, F, C, D])
    assert table == [0, 2, 3], (
        f"[A, B, E, F, C, D] got {table}: [E, F] is a miss, so nothing after it is cached (block 1 holds "
        "[C, D] after [A, B], not after [E, F]); the walk stops at the first miss (section 3.3)"
    )
    assert m.num_cached_tokens("y") == 2
    assert m.ref_count(1) == 1


def _build_failing_case(impl):
    """Six blocks of size 2: "p" holds [0, 1]; "q" ran [A, B, E, F, G] and ended, so block 2 ([E, F]
    after [A, B]) waits in the free list with its KV. Four blocks are free."""
    m = impl.BlockManager(6, 2)
    m.allocate("p", [A, B, C, D])
    m.allocate("q", [A, B, E, F, G])
    m.free("q")
    return m


def test_failed_allocation_changes_nothing(impl):
    """A prompt needing 5 blocks (block 0 shared, block 2 revived, 4 new) when 4 are free: ValueError,
    and the manager is exactly as before: same public state, and the same answers afterwards as a twin
    that never saw the failed call."""
    m, twin = _build_failing_case(impl), _build_failing_case(impl)
    before = state(m, 6, ["p"])
    assert before[0] == 4
    with raises_naming(ValueError, "'big'"):
        m.allocate("big", [A, B, E, F, G, H, X, Y, C, D, E, F])
    assert state(m, 6, ["p"]) == before, "the failed allocation left blocks taken or counts changed"
    with pytest.raises(KeyError):
        m.block_table("big")
    for mgr in (m, twin):  # what comes next must not see any trace of the failed call
        mgr.allocate("r", [A, B, E, F, G, H])
        mgr.append("r", X)
        mgr.allocate("s", [A, B, E, F, G, H, X])
    assert state(m, 6, ["p", "r", "s"]) == state(twin, 6, ["p", "r", "s"])


def test_refused_allocation_of_new_blocks_changes_nothing(impl):
    """No cached prefix at all: a prompt needing 4 new blocks when 3 are free is refused before any block
    is taken (counting first is the whole point, revivals or not)."""
    N = 4
    m = impl.BlockManager(N, 2)
    m.allocate("a", [A, B])
    before = state(m, N, ["a"])
    with raises_naming(ValueError, "'b'"):
        m.allocate("b", [C, D, E, F, G, H, X, Y])
    assert state(m, N, ["a"]) == before, "the refused allocation took blocks"
    try:
        table = m.allocate("b", [C, D, E, F, G, H])
    except ValueError as e:
        raise AssertionError(
            f"a prompt of 3 new blocks when exactly 3 are free was refused ({e}): a prompt that needs as "
            "many blocks as are free fits, need <= free"
        ) from None
    assert table == [1, 2, 3], "3 new blocks fit exactly"


def test_revived_blocks_count_against_free_blocks(impl):
    """ "s" ends and its blocks 0 and 1 wait in the free list. A prompt that revives both and needs three
    more needs 5 of the 4 free blocks: it must be refused up front, not after reviving and taking."""
    N = 4
    m = impl.BlockManager(N, 2)
    m.allocate("s", [A, B, C, D])
    m.free("s")
    with raises_naming(ValueError, "'t'"):
        m.allocate("t", [A, B, C, D, E, F, G, H, X, Y])
    assert m.num_free_blocks == N and refs(m, N) == [0] * N, "the refused allocation took blocks"
    assert m.allocate("t", [A, B, C, D, E, F, G, H]) == [0, 1, 2, 3], "2 revived + 2 new fit exactly"
    assert m.num_cached_tokens("t") == 4


def test_revived_block_leaves_the_free_list(impl):
    """Reviving a freed block takes it off the free list: it must not be handed out again while in use."""
    N = 4
    m = impl.BlockManager(N, 2)
    m.allocate("s", [A, B, C, D])
    m.free("s")
    assert m.allocate("t", [A, B, C, D]) == [0, 1] and m.num_cached_tokens("t") == 4
    assert m.num_free_blocks == 2, "revived blocks 0 and 1 are in use, not free"
    assert m.allocate("u", [E, F, G, H]) == [2, 3]
    with pytest.raises(ValueError):
        m.allocate("v", [X])
    assert refs(m, N) == [1, 1, 1, 1]


def test_free_returns_tail_blocks_first(impl):
    """Freeing [A, B, C, D, E, F] puts block 2 (the tail) in the free list before blocks 1 and 0, so the
    next new block evicts the tail and the prefix [A, B, C, D] stays cached."""
    m = impl.BlockManager(3, 2)
    m.allocate("s", [A, B, C, D, E, F])
    m.free("s")
    assert m.allocate("u", [G, H]) == [2], "the tail block is evicted first"
    assert m.allocate("w", [A, B, C, D]) == [0, 1], "the prefix blocks were still cached"
    assert m.num_cached_tokens("w") == 4


def test_append_never_writes_into_a_full_block(impl):
    """ "p" and "q" share [A, B] and [C, D], both full. Appending to "p" must take a new block; the next
    append fills it; the one after takes another. "q" never notices."""
    N = 8
    m = impl.BlockManager(N, 2)
    m.allocate("p", [A, B, C, D])
    assert m.allocate("q", [A, B, C, D]) == [0, 1] and m.num_cached_tokens("q") == 4
    m.append("p", E)
    assert m.block_table("p") == [0, 1, 2], "a full (here shared) last block is never written: grow"
    assert m.block_table("q") == [0, 1] and refs(m, N)[:3] == [2, 2, 1]
    m.append("p", F)
    assert m.block_table("p") == [0, 1, 2], "the new block has room for a second token"
    m.append("p", G)
    assert m.block_table("p") == [0, 1, 2, 3]
    m.append("q", X)
    assert m.block_table("q") == [0, 1, 4] and refs(m, N)[:5] == [2, 2, 1, 1, 1]


def test_block_filled_by_append_is_shared(impl):
    """[A, B, C] then D appended: the block [C, D] is full, so it gets its (chained) key when it fills,
    and a later prompt [A, B, C, D, E] shares it."""
    m = impl.BlockManager(8, 2)
    assert m.allocate("s", [A, B, C]) == [0, 1]
    m.append("s", D)
    assert m.allocate("t", [A, B, C, D, E]) == [0, 1, 2]
    assert m.num_cached_tokens("t") == 4 and m.ref_count(1) == 2


def test_failed_append_changes_nothing(impl):
    N = 2
    m = impl.BlockManager(N, 2)
    m.allocate("s", [A, B])
    m.allocate("t", [C, D])
    before = state(m, N, ["s", "t"])
    with raises_naming(ValueError, "'s'"):
        m.append("s", E)
    after = state(m, N, ["s", "t"])
    assert after == before, (
        f"the failed append changed the manager: {before} became {after}. A new block is needed and none "
        "is free: the table, the token count and the last block's tokens must stay as they were"
    )
    m.free("t")
    m.append("s", E)
    assert m.block_table("s") == [0, 1]


def test_evicted_block_is_not_revived(impl):
    """Block 2 held [E, F] after [A, B, C, D], was freed, then handed to another request. Its old KV is
    gone, so [A, B, C, D, E, F] again reuses only 4 tokens, even though it gets block 2 back."""
    m = impl.BlockManager(4, 2)
    m.allocate("s", [A, B, C, D, E, F])
    m.free("s")
    assert m.allocate("u", [G, H, X, Y]) == [3, 2]
    m.free("u")
    assert m.allocate("w", [A, B, C, D, E, F]) == [0, 1, 2]
    assert m.num_cached_tokens("w") == 4, "block 2 was overwritten by [G, H, X, Y]: not cached any more"


def test_evicted_block_forgets_what_it_held(impl):
    """Block 3 held the partial [C] of "s" = [A, B, C] and waits in the free list. "t" = [A, B] revives
    block 2 and grows into block 3 with X: block 3 now holds [X] alone, and once evicted it must forget
    [C] and its old key. A block that keeps its old tokens holds [C, X] on record, is sealed under that
    key, and [A, B, C, X] would then read the KV of [A, B, X] from it."""
    m = impl.BlockManager(4, 2)
    assert m.allocate("keep", [G, H, G]) == [0, 1]
    assert m.allocate("s", [A, B, C]) == [2, 3]
    m.free("s")
    assert m.allocate("t", [A, B]) == [2] and m.num_cached_tokens("t") == 2
    m.append("t", X)
    assert m.block_table("t") == [2, 3], "t grows into block 3, the only free block"
    m.free("keep")
    table = m.allocate("u", [A, B, C, X])
    assert m.num_cached_tokens("u") == 2 and table == [2, 1], (
        f"[A, B, C, X] got {table} with {m.num_cached_tokens('u')} cached tokens: block 3 holds [X] "
        "(t's third token), not [C, X]; only [A, B] may be reused"
    )


def test_evicted_block_does_not_vouch_for_its_old_child(impl):
    """With keys that ignore the block before (every [C, D] collides), only the parent check tells [C, D]
    after [A, B] from [C, D] after [G, H]. That check is sound only if a block is never handed out while
    a child of it is still cached: freeing tail first puts block 1 in the free list before block 0, so
    block 1 is evicted first. Freed front to back, block 0 would be reused for [G, H] while block 1 still
    claimed to follow it, and [G, H, C, D] would read the KV of [A, B, C, D]."""
    m = impl.BlockManager(3, 2, hash_fn=lambda prev_hash, token_ids: hash(token_ids))
    assert m.allocate("s", [A, B, C, D]) == [0, 1]
    m.free("s")
    assert m.allocate("t", [E, F]) == [2]
    assert m.allocate("u", [G, H]) == [1], "the child (block 1) is evicted before its parent (block 0)"
    m.free("u")
    table = m.allocate("v", [G, H, C, D])
    assert m.num_cached_tokens("v") <= 2, f"[C, D] after [G, H] reused the KV of [C, D] after [A, B]: {table}"


def test_newest_block_of_a_repeated_key_is_found(impl):
    """Two blocks sealed under one key: "b" = [A] got its own block (a partial block is never shared) and
    grew into [A, B] by append while "a"'s [A, B] was cached. The key must find the newer block (section
    3.6): once "a" is freed and its block evicted, the key is dropped with it unless it points elsewhere,
    and "b"'s block, still live, is then the only copy of [A, B] left. [A, B, C] must find it and fit in
    the one free block."""
    m = impl.BlockManager(4, 2)
    assert m.allocate("a", [A, B]) == [0]
    assert m.allocate("b", [A]) == [1]
    m.append("b", B)  # block 1 fills: sealed under the same key as block 0
    m.free("a")
    assert m.allocate("x", [X]) == [2] and m.allocate("y", [Y]) == [3]
    assert m.allocate("z", [G]) == [0], "z evicts block 0, the older block of [A, B]"
    m.free("z")
    try:
        table = m.allocate("c", [A, B, C])
    except ValueError as refused:
        raise AssertionError(
            f'[A, B, C] was refused ({refused}): block 1 still holds [A, B] for "b", so [A, B] is a hit '
            "and [C] needs the one free block. Either the key still pointed at block 0, the older copy, and "
            "was dropped when block 0 was evicted (the newest block sealed under a key must win it), or the "
            "eviction of block 0 dropped the key though it named block 1 (drop it only where it names the "
            "evicted block)"
        ) from None
    assert table == [1, 0] and m.num_cached_tokens("c") == 2, (
        f"[A, B, C] got {table} with {m.num_cached_tokens('c')} cached tokens, not [1, 0] with 2: block 1, "
        "the newer block of [A, B], is the live copy"
    )


def test_hash_fn_gets_the_previous_key_and_a_tuple(impl):
    """The injectable key function is called as hash_fn(key of the block before, tuple of block_size
    token ids), with None before a first block, and never for a partial block."""
    calls = []

    def recording(prev_hash, token_ids):
        calls.append((prev_hash, token_ids))
        return hash((prev_hash, token_ids))

    m = impl.BlockManager(8, 2, hash_fn=recording)
    m.allocate("s", [A, B, C, D, E])
    assert calls, "hash_fn was never called"
    # The partial block first: keyed, it is a short tuple, which the 2-tuple check would name less well.
    assert all(t != (E,) for _, t in calls), f"the partial block [E] must not be keyed: {calls}"
    assert all(isinstance(t, tuple) and len(t) == 2 for _, t in calls), f"token_ids must be 2-tuples: {calls}"
    assert (None, (A, B)) in calls, f"the first block's key is hash_fn(None, tokens): {calls}"
    assert (hash((None, (A, B))), (C, D)) in calls, f"[C, D] must be keyed after [A, B]'s key: {calls}"


def _returned_lists(module):
    """Runs where your manager lives (a list passed between processes is a copy, so aliasing can only be
    seen there): keep the list allocate returned while the sequence grows, then mutate every list the
    manager hands out. Returns what the caller's list and the manager show afterwards."""
    m = module.BlockManager(4, 2)
    returned = m.allocate("s", [A, B, C])
    m.append("s", D)
    m.append("s", E)  # a third block: the manager's own table grows
    kept = list(returned)
    returned.append(3)
    m.block_table("s").append(3)
    m.block_table("s")[0] = 3
    return kept, list(m.block_table("s")), m.num_free_blocks


def test_block_table_is_a_copy(impl):
    """allocate and block_table return new lists: the manager's table must not change when the caller
    changes a list it got, and a list the caller kept must not grow with the sequence."""
    kept, table, free = probe(impl, _returned_lists)
    assert kept == [0, 1], (
        f"the list allocate returned changed to {kept} when the sequence grew: it is the manager's own table"
    )
    assert table == [0, 1, 2] and free == 1, (
        f"after the caller changed the lists it got, block_table says {table}: it handed out its own list"
    )


def test_whole_prompt_cached_counts_every_token(impl):
    """A prompt that is a whole number of cached blocks reuses every token (vLLM would still recompute the
    last one to get logits: section 6)."""
    m = impl.BlockManager(4, 2)
    m.allocate("s", [A, B, C, D])
    got = m.allocate("t", [A, B, C, D])
    assert got == [0, 1] and m.num_cached_tokens("t") == 4, (
        f"[A, B, C, D] again got blocks {got} with {m.num_cached_tokens('t')} tokens cached: a prompt that "
        "ends on a block edge fills its last block, which allocate must seal too"
    )


# --- Errors: unknown or duplicate ids, running out, bad arguments ---------------------------------


def _two_live(impl):
    """Three blocks, all in use: "a" = [A, B, C] holds blocks 0 and 1, "b" = [D, E] fills block 2."""
    m = impl.BlockManager(3, 2)
    m.allocate("a", [A, B, C])
    m.allocate("b", [D, E])
    return m


# name -> (the bad call, the error, what the message must name)
BAD_CALLS = {
    # [A, B] is a hit on block 0: it needs no free block, so only the duplicate check can refuse it (a
    # prompt needing a new block would be refused as out of blocks, naming 'a' too).
    "duplicate_seq_id": (lambda m: m.allocate("a", [A, B]), ValueError, "'a'"),
    "append_unknown": (lambda m: m.append("ghost", E), KeyError, "'ghost'"),
    "free_unknown": (lambda m: m.free("ghost"), KeyError, "'ghost'"),
    "block_table_unknown": (lambda m: m.block_table("ghost"), KeyError, "'ghost'"),
    "num_cached_tokens_unknown": (lambda m: m.num_cached_tokens("ghost"), KeyError, "'ghost'"),
    "allocate_out_of_blocks": (lambda m: m.allocate("c", [E, F, G]), ValueError, "'c'"),
    "append_out_of_blocks": (lambda m: m.append("b", F), ValueError, "'b'"),
    "token_ids_empty": (lambda m: m.allocate("c", []), ValueError, "token_ids"),
    "token_ids_not_a_list": (lambda m: m.allocate("c", 5), TypeError, "token_ids"),
    "ref_count_negative": (lambda m: m.ref_count(-1), ValueError, "block_id"),
    "ref_count_past_the_end": (lambda m: m.ref_count(3), ValueError, "block_id"),
    "ref_count_not_int": (lambda m: m.ref_count("0"), TypeError, "block_id"),
    "seq_id_unhashable_allocate": (lambda m: m.allocate(["c"], [E]), TypeError, "seq_id"),
    "seq_id_unhashable_append": (lambda m: m.append(["a"], E), TypeError, "seq_id"),
    "seq_id_unhashable_free": (lambda m: m.free(["a"]), TypeError, "seq_id"),
    "seq_id_unhashable_block_table": (lambda m: m.block_table(["a"]), TypeError, "seq_id"),
    "token_id_not_an_int": (lambda m: m.append("a", "E"), TypeError, "token_id"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_call_raises_and_changes_nothing(impl, name):
    """Each bad call raises an error naming the seq_id or argument, and leaves the manager as it was."""
    call, error, names = BAD_CALLS[name]
    m = _two_live(impl)
    before = state(m, 3, ["a", "b"])
    with raises_naming(error, names):
        call(m)
    assert state(m, 3, ["a", "b"]) == before


def _with_room(impl):
    """Eight blocks, "s" = [A, B, C] holding blocks 0 and 1 (block 1 partial), six free."""
    m = impl.BlockManager(8, 2)
    m.allocate("s", [A, B, C])
    return m


@pytest.mark.parametrize(
    "bad,names",
    [
        (lambda m: m.allocate("t", [A, B, C, 2.5]), r"token_ids\[3\]"),
        (lambda m: m.allocate("t", [A, B, [C], D]), r"token_ids\[2\]"),
        (lambda m: m.append("s", [D]), "token_id"),
        (lambda m: m.append("s", None), "token_id"),
        (lambda m: m.allocate("t", [A, True, C]), r"token_ids\[1\]"),
    ],
    ids=["float_in_prompt", "list_in_prompt", "list_appended", "none_appended", "bool_in_prompt"],
)
def test_bad_token_ids_rejected_before_anything_changes(impl, bad, names):
    """A token id that is not an int raises TypeError naming it, before anything changes: a list token
    would otherwise fail only when its block is keyed (a bare "unhashable type"), after the token was
    added. A bool passes isinstance(x, int) but is no token id: it is refused too. Afterwards the manager must behave exactly like a twin that never saw the bad call."""
    m, twin = _with_room(impl), _with_room(impl)
    before = state(m, 8, ["s"])
    with raises_naming(TypeError, names):
        bad(m)
    assert state(m, 8, ["s"]) == before, "the rejected call changed the manager"
    for mgr in (m, twin):  # fill block 1, grow, share: no trace of the bad call may show
        mgr.append("s", D)
        mgr.append("s", E)
        mgr.allocate("u", [A, B, C, D, E])
    assert state(m, 8, ["s", "u"]) == state(twin, 8, ["s", "u"]), "the rejected call left a trace"


def test_double_free_is_rejected(impl):
    m = impl.BlockManager(3, 2)
    m.allocate("a", [A, B])
    m.free("a")
    with raises_naming(KeyError, "'a'"):
        m.free("a")
    assert m.num_free_blocks == 3 and refs(m, 3) == [0, 0, 0]


@pytest.mark.parametrize(
    "args,error,names",
    [
        ((0, 2), ValueError, "num_blocks"),
        ((4, 0), ValueError, "block_size"),
        ((2.5, 2), TypeError, "num_blocks"),
        ((4, "2"), TypeError, "block_size"),
        ((None, 2), TypeError, "num_blocks"),
    ],
    ids=["no_blocks", "block_size_0", "num_blocks_float", "block_size_str", "num_blocks_none"],
)
def test_constructor_rejects_bad_arguments(impl, args, error, names):
    with raises_naming(error, names):
        impl.BlockManager(*args)


def test_constructor_rejects_uncallable_hash_fn(impl):
    with raises_naming(TypeError, "hash_fn"):
        impl.BlockManager(4, 2, hash_fn=42)


# --- Random request streams: the invariants, with the KV cache modelled ------------------------------


HASHES = {
    "default": None,
    "constant": same_key,
    "weak": lambda prev_hash, token_ids: (sum(token_ids) + (prev_hash or 0)) % 3,
    "unchained": lambda prev_hash, token_ids: hash(token_ids),
}


class StreamChecker:
    """Drives a manager and checks it after every call (see the module docstring)."""

    def __init__(self, m, num_blocks, block_size):
        self.m, self.N, self.bs = m, num_blocks, block_size
        self.tokens = {}  # live seq_id -> its token ids
        self.tables = {}  # live seq_id -> its block table as last seen
        self.kv = {}  # (block, slot) -> the prefix whose last token's K and V were written there
        self.events = Counter()

    def state(self):
        return state(self.m, self.N, list(self.tables))

    def write(self, seq, pos):
        block = self.tables[seq][pos // self.bs]
        self.kv[(block, pos % self.bs)] = tuple(self.tokens[seq][: pos + 1])

    def allocate(self, seq, token_ids):
        before = self.state()
        try:
            table = self.m.allocate(seq, list(token_ids))
        except ValueError:
            assert self.state() == before, f"a refused allocate of {seq!r} changed the manager"
            assert before[0] < math.ceil(len(token_ids) / self.bs), (
                f"allocate of {seq!r} refused although {before[0]} free blocks hold the whole prompt"
            )
            self.events["allocate refused"] += 1
            return None
        n, cached = len(token_ids), self.m.num_cached_tokens(seq)
        assert len(table) == math.ceil(n / self.bs), f"{seq!r}: table {table} for {n} tokens"
        assert cached % self.bs == 0 and 0 <= cached <= n // self.bs * self.bs, (
            f"{seq!r}: {cached} cached tokens is not a whole number of full blocks of the prompt"
        )
        for i, block in enumerate(table):
            if i < cached // self.bs:
                self.events["revived" if before[1][block] == 0 else "shared"] += 1
            else:
                assert before[1][block] == 0, f"{seq!r} got block {block}, which another sequence holds"
        self.tokens[seq], self.tables[seq] = list(token_ids), table
        for pos in range(cached, n):  # only tokens whose KV was not reused are computed and written
            self.write(seq, pos)
        self.check()
        return table

    def append(self, seq, token_id):
        before, old = self.state(), self.tables[seq]
        n = len(self.tokens[seq]) + 1
        try:
            self.m.append(seq, token_id)
        except ValueError:
            assert self.state() == before, f"a refused append to {seq!r} changed the manager"
            assert (n - 1) % self.bs == 0, f"append to {seq!r} refused although its last block has room"
            self.events["append refused"] += 1
            return
        table = self.m.block_table(seq)
        assert table[: len(old)] == old, f"append changed {seq!r}'s existing table {old} -> {table}"
        assert len(table) == math.ceil(n / self.bs), f"{seq!r}: table {table} for {n} tokens"
        if len(table) > len(old):
            assert before[1][table[-1]] == 0, f"{seq!r} grew into block {table[-1]}, which is in use"
            self.events["grew"] += 1
        self.tokens[seq].append(token_id)
        self.tables[seq] = table
        self.write(seq, n - 1)
        self.check()

    def free(self, seq):
        self.m.free(seq)
        del self.tokens[seq], self.tables[seq]
        self.check()
        try:
            self.m.block_table(seq)
        except KeyError:
            return
        raise AssertionError(f"block_table({seq!r}) still answers after free")

    def check(self):
        ref = refs(self.m, self.N)
        holders = Counter(b for table in self.tables.values() for b in table)
        for seq, table in self.tables.items():
            assert self.m.block_table(seq) == table, f"{seq!r}'s table changed while nobody touched it"
            assert len(set(table)) == len(table), f"{seq!r}'s table {table} holds a block twice"
        for b in range(self.N):
            assert ref[b] >= 0, f"block {b} has ref count {ref[b]}"
            assert ref[b] == holders[b], (
                f"block {b}: ref_count {ref[b]}, but {holders[b]} live tables hold it"
            )
        free = sum(r == 0 for r in ref)
        assert self.m.num_free_blocks == free, (
            f"num_free_blocks = {self.m.num_free_blocks}, but {free} blocks have ref count 0"
        )
        for seq, toks in self.tokens.items():
            for pos in range(len(toks)):
                block, slot = self.tables[seq][pos // self.bs], pos % self.bs
                if self.kv.get((block, slot)) != tuple(toks[: pos + 1]):
                    raise AssertionError(
                        f"{seq!r} reads token {pos} from block {block} slot {slot}, which holds the KV of "
                        f"{self.kv.get((block, slot))}, not of {tuple(toks[: pos + 1])}"
                    )


class _Recording:
    """Your manager, with every call and its answer written down (runs in your process). Answers are
    passed on as copies, so the record and the run see the same values."""

    def __init__(self, m, never_frees=False):
        self._m, self._never_frees, self.trace = m, never_frees, []

    def _call(self, name, *args):
        try:
            if name == "num_free_blocks":
                result = self._m.num_free_blocks
            elif name == "free" and self._never_frees:
                result = None
            else:
                result = getattr(self._m, name)(*args)
        except Exception as exc:
            self.trace.append((name, args, "raise", type(exc).__name__, str(exc)))
            raise
        result = list(result) if isinstance(result, list) else result
        self.trace.append((name, args, "return", result))
        return result

    num_free_blocks = property(lambda self: self._call("num_free_blocks"))

    def allocate(self, seq_id, token_ids):
        return self._call("allocate", seq_id, token_ids)

    def append(self, seq_id, token_id):
        return self._call("append", seq_id, token_id)

    def free(self, seq_id):
        return self._call("free", seq_id)

    def block_table(self, seq_id):
        return self._call("block_table", seq_id)

    def ref_count(self, block_id):
        return self._call("ref_count", block_id)

    def num_cached_tokens(self, seq_id):
        return self._call("num_cached_tokens", seq_id)


class _Replay(_Recording):
    """The record played back here: each call must be the next one written down, and gets its answer."""

    def __init__(self, trace):
        super().__init__(None)
        self._trace, self._next = trace, 0

    def _call(self, name, *args):
        if self._next >= len(self._trace):
            raise AssertionError(
                f"the stream stopped after {self._next} calls in your process (it raised "
                "there, or its record was cut short)"
            )
        entry = self._trace[self._next]
        self._next += 1
        if (entry[0], tuple(entry[1])) != (name, args):
            raise AssertionError(
                f"call {self._next} of the stream was {entry[0]}{tuple(entry[1])} in your "
                f"process, {name}{args} here: the record does not match the run"
            )
        if entry[2] == "raise":
            error = getattr(builtins, entry[3], None)
            if not (isinstance(error, type) and issubclass(error, Exception)):
                error = RuntimeError
            raise error(entry[4])
        return entry[3]


def _record_stream(module, num_blocks, block_size, hash_name, stream, steps, echo, never_frees=False):
    """Runs where your code runs: the stream driven against your manager, every call written down. Stops
    at the first failure; the replay below meets the same one and reports it."""
    m = module.BlockManager(num_blocks, block_size, hash_fn=HASHES[hash_name])
    recording = _Recording(m, never_frees)
    try:
        run_stream(recording, num_blocks, block_size, stream, steps, echo)
    except Exception:
        pass
    return recording.trace


def graded_stream(impl, num_blocks, block_size, hash_name, stream, steps, echo, never_frees=False):
    """The stream recorded in your process, then checked here on the record: what it saw (events)."""
    trace = probe(impl, _record_stream, num_blocks, block_size, hash_name, stream, steps, echo, never_frees)
    return run_stream(_Replay(trace), num_blocks, block_size, stream, steps, echo)


def run_stream(m, num_blocks, block_size, stream, steps, echo):
    """A seeded random stream of allocate / append / free over a 3-token vocabulary, so that equal
    blocks after different prefixes, revivals, evictions and refusals all happen. With `echo`, every
    allocation is followed by the same prompt again, which must reuse every full block."""
    rng = random.Random(seeded(stream))
    checker = StreamChecker(m, num_blocks, block_size)
    prompts = [[A, B, C, A, B, C, A]]
    next_id = 0
    for _ in range(steps):
        op = rng.random()
        live = list(checker.tables)
        if op < 0.4 or not live:
            base = rng.choice(prompts)
            cut = rng.randint(0, len(base))
            tail = [rng.choice((A, B, C)) for _ in range(rng.randint(0 if cut else 1, 4))]
            prompt = (base[:cut] + tail)[:14]
            next_id += 1
            table = checker.allocate(f"s{next_id}", prompt)
            prompts.append(prompt)
            if echo and table is not None:
                next_id += 1
                again = checker.allocate(f"s{next_id}", prompt)
                full = len(prompt) // block_size
                if again is not None:
                    assert (
                        again[:full] == table[:full]
                        and m.num_cached_tokens(f"s{next_id}") == full * block_size
                    ), (
                        f"the prompt {prompt} again, right after it was allocated, must reuse all {full} full blocks"
                    )
                    checker.free(f"s{next_id}")
        elif op < 0.75:
            seq = rng.choice(live)
            checker.append(seq, rng.choice((A, B, C)))
            prompts.append(list(checker.tokens[seq]))
        else:
            checker.free(rng.choice(live))
    for seq in list(checker.tables):
        checker.free(seq)
    assert m.num_free_blocks == num_blocks and refs(m, num_blocks) == [0] * num_blocks, (
        "every sequence has ended, yet not every block is free"
    )
    return checker.events


# What each stream must have seen, or it would not test what it claims: with a key that always collides
# the table keeps one block per key, so almost nothing is shared (a collision costs sharing, not KV).
MUST_SEE = {
    "default": ("shared", "revived", "grew", "allocate refused", "append refused"),
    "constant": ("grew", "allocate refused", "append refused"),
    "weak": ("shared", "revived", "grew", "allocate refused", "append refused"),
    "unchained": ("shared", "revived", "grew", "allocate refused", "append refused"),
}


@pytest.mark.parametrize("stream", [0, 1, 2, 3])
@pytest.mark.parametrize("hash_name", list(HASHES))
def test_random_request_streams(impl, hash_name, stream):
    """Ref count = number of live tables holding the block, never negative; num_free_blocks = blocks
    with ref count 0; tables append-only; refused calls change nothing; every sequence reads its own KV;
    every block free at the end. Block sizes 1 to 4; hashes: the default, one that always collides, a
    weak one (3 values) and one that ignores the block before (the same tokens always collide)."""
    block_size = 1 + stream
    num_blocks = 24 // block_size + 6  # tight enough that allocations are refused and blocks evicted
    events = graded_stream(
        impl,
        num_blocks,
        block_size,
        hash_name,
        stream=100 * stream + len(hash_name),
        steps=400,
        echo=hash_name == "default",
    )
    for event in MUST_SEE[hash_name]:
        assert events[event] > 0, f"this stream never saw a {event!r} event: {dict(events)}"


def test_stream_checker_rejects_a_manager_that_never_frees(impl):
    """Not a test of your manager: proves the stream checker fails a manager whose free() does nothing
    (recorded in your process, judged here), so that passing the random streams means something."""
    with pytest.raises(AssertionError):
        graded_stream(impl, 10, 2, "default", stream=5, steps=50, echo=False, never_frees=True)
