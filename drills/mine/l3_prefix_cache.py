"""L3, your file: prefix caching with reference counts, a block manager after nano-vllm's.

Fill in the methods of `BlockManager` below. Read drills/content/l3_prefix_cache.md first: every TODO
names the section that teaches it. Grade with `make test L=l3`. Start by deleting the
`raise NotImplementedError` line in `__init__`.

    blocks saved = (R - 1) * floor(P / block_size)   # R requests sharing a P-token prefix
                                                     # R = 10,000, P = 1,000, block_size = 16: 619,938

The public methods and their docstrings are the contract (`make contract` checks the class's); the
private helpers at the bottom are a suggestion: keep, change or drop them.
"""

from __future__ import annotations

from collections import OrderedDict


def _chain_hash(prev_hash, token_ids):
    # Python's tuple hash: fast, 64-bit, not collision-proof. Hits are verified, so a collision costs a share, never KV.
    return hash((prev_hash, token_ids))


# Arguments are checked before anything changes: a list seq_id or token id would otherwise fail inside a
# dict lookup or a hash, with "unhashable type" and, in append, after the token was already added.
def _check_seq_id(seq_id):
    try:
        hash(seq_id)
    except TypeError:
        raise TypeError(
            f"seq_id must be hashable (a str, an int, a tuple), got {type(seq_id).__name__} {seq_id!r}"
        ) from None
    return seq_id


def _check_token_id(name, token_id):
    if isinstance(token_id, bool) or not isinstance(token_id, int):
        raise TypeError(f"{name} must be an int token id, got {type(token_id).__name__} {token_id!r}")


class BlockManager:
    """Hands out the blocks of a paged KV cache and shares full blocks between sequences with a common prefix.

    num_blocks   blocks in the cache; a fresh manager hands out block 0 first, then 1, 2, ...
    block_size   tokens per block (PAGE in L1 and L2)
    hash_fn      hash_fn(prev_hash, token_ids) -> int: the key of a full block, where token_ids is a tuple
                 of block_size token ids and prev_hash the key of the block before it (None for a
                 sequence's first block). Injectable so that a test can force collisions.

    A block is reused only when it holds the same tokens right after the same block, so a key collision
    can cost a share but never hands a sequence another prefix's KV. Unknown seq ids raise KeyError;
    duplicate seq ids, bad arguments and running out of free blocks raise ValueError (TypeError for a
    wrong type), and a call that raises leaves the manager exactly as it was.
    """

    def __init__(self, num_blocks, block_size, hash_fn=None):
        raise NotImplementedError(
            "l3 is not started: fill in BlockManager in drills/mine/l3_prefix_cache.py, then delete this line (read drills/content/l3_prefix_cache.md)"
        )
        # TODO(section 3.1 "The state"): check num_blocks and block_size (ints >= 1: TypeError or
        # ValueError naming the argument) and hash_fn (None or callable); keep hash_fn, or _chain_hash.
        # Per block: ref count, the token ids it holds, the block before it, its key once full.
        # The key -> block table. The free list, least recently freed first, holding 0, 1, 2, ... at the
        # start (an OrderedDict can also remove from the middle). Per sequence: table, length, cached.
        pass

    def allocate(self, seq_id, token_ids):
        """Give a new sequence its block table, reusing the cached full blocks of its prefix.

        seq_id     a hashable id that is not allocated now
        token_ids  list or tuple of the prompt's token ids (ints), at least one
        Returns the block table as a new list: block i holds tokens [i * block_size, (i + 1) * block_size).
        Raises ValueError, changing nothing, when the free blocks do not suffice.
        """
        # TODO(section 3.1 "The state"): reject a seq_id that is not hashable (_check_seq_id) or already
        # allocated (ValueError naming it), token_ids that is not a list or tuple (TypeError) or is empty
        # (ValueError), and any token id that is not an int (_check_token_id(f"token_ids[{i}]", ...)).

        # TODO(section 3.2 "Keys: chained, full blocks only"): cut the prompt into chunks of block_size
        # (tuples); only the full ones may be looked up and keyed.

        # TODO(section 3.3 "Finding the cached prefix"): walk the full chunks in order, each looked up
        # right after the block found for the one before; stop at the first miss.

        # TODO(section 3.4 "All or nothing"): count the blocks this needs from the free list (new ones
        # and revived ones) and raise ValueError naming seq_id before changing anything if too few.

        # TODO(section 3.5 "Handing out a block: eviction and revival"): take each hit (reviving a freed
        # one off the free list), then new blocks for the rest: fill each, key the full ones.

        # TODO(section 3.1 "The state"): record table, length and cached tokens; return a copy.
        pass

    def append(self, seq_id, token_id):
        """Append one generated token to a sequence.

        A new block is taken only when the last block is full: a full block may be shared, so it is never
        written again. A partial last block is private (it has no key, so no other sequence found it) and
        takes the token; when the token fills it, the block is sealed with its key and can be shared.
        Raises ValueError, changing nothing, when a new block is needed and none is free.
        """
        # TODO(section 3.6 "Append: grow, fill, seal"): unknown seq_id -> KeyError, a token_id that is not
        # an int -> TypeError (_check_token_id), both before anything changes. If the last block is
        # full, take a new block (whose parent is the old last block); add the token to the last block;
        # if that fills it, key it.
        pass

    def free(self, seq_id):
        """Release a finished sequence: each block of its table loses one reference.

        A block whose count reaches 0 joins the back of the free list; it keeps its KV and its key until
        it is handed out again, so a later request with the same prefix can revive it.
        """
        # TODO(section 3.7 "Free: tail first"): unknown seq_id -> KeyError (every method taking a seq_id
        # also rejects an unhashable one with _check_seq_id: TypeError). Forget the sequence; walk
        # its table from the last block to the first, dropping each ref count; a block that reaches 0
        # goes to the back of the free list.
        pass

    def block_table(self, seq_id):
        """The sequence's block table, as a new list."""
        # TODO(section 3.1 "The state"): a copy, so that the caller cannot change the manager's table.
        pass

    def ref_count(self, block_id):
        """How many live block tables hold block block_id (0 for a free block)."""
        # TODO(section 3.1 "The state"): TypeError for a non-int, ValueError naming block_id outside
        # [0, num_blocks).
        pass

    @property
    def num_free_blocks(self):
        """Blocks with ref count 0: never used, or freed (their KV may still be revived)."""
        # TODO(section 3.1 "The state")
        pass

    def num_cached_tokens(self, seq_id):
        """Tokens of the sequence whose KV was reused at allocation: block_size per cached full block."""
        # TODO(section 3.4 "All or nothing"): KeyError for an unknown seq_id.
        pass

    # --- helpers (a suggestion) ---------------------------------------------------------------------

    def _key(self, token_ids, parent):
        # TODO(section 3.2 "Keys: chained, full blocks only"): hash_fn(key of block `parent`, token_ids),
        # with None in place of the parent's key for a sequence's first block.
        pass

    def _find(self, chunk, parent):
        """The cached full block holding `chunk` right after block `parent` (None: first block), or None."""
        # TODO(section 3.3 "Finding the cached prefix"): look the key up, then check the candidate's
        # tokens and the block before it.
        pass

    def _take_free_block(self, seq_id):
        """Evict the least recently freed block and hand it out empty, with ref count 1."""
        # TODO(section 3.5 "Handing out a block: eviction and revival"): ValueError naming seq_id when
        # none is free; forget the block's old key (unless a newer block took that key over).
        pass

    def _seal(self, block):
        """A block has just become full: key it, so later sequences can find it (the newest block wins)."""
        # TODO(section 3.2 "Keys: chained, full blocks only")
        pass
