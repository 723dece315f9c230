"""L3 reference: prefix caching with reference counts, a block manager after nano-vllm's.

Requests that begin with the same tokens (a system prompt, few-shot examples, the earlier turns of a
chat) have the same K and V for those tokens, so the paged KV cache of L1 can hold them once. Every
sequence whose block table points at a shared block counts as one reference; the block goes back to
the free list when its count reaches 0. What sharing saves:

    blocks saved = (R - 1) * floor(P / block_size)   # R requests sharing a P-token prefix
                                                     # R = 10,000, P = 1,000, block_size = 16: 619,938

There is no kernel here: this is the host-side bookkeeping that decides which physical block each
entry of a block table (L1, L2) names. Read top to bottom: the default key function, the state, then
allocate / append / free and the small helpers they share. Explainer: drills/content/l3_prefix_cache.md.
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
        # Section 3.1 "The state".
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if hash_fn is not None and not callable(hash_fn):
            raise TypeError(
                f"hash_fn must be callable as hash_fn(prev_hash, token_ids), got {type(hash_fn).__name__}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._hash_fn = _chain_hash if hash_fn is None else hash_fn

        # Per block: how many tables hold it, whose KV it holds, and its key once full.
        self._ref = [0] * num_blocks
        self._tokens = [()] * num_blocks  # the token ids whose KV the block holds, slot by slot
        self._parent = [None] * num_blocks  # the block before it in the table that filled it
        self._hash = [None] * num_blocks  # its key once full ("sealed"); None while partial
        self._hash_to_block = {}  # key -> the newest full block sealed under it
        # Blocks with ref count 0, least recently freed first: new blocks come from the front, freed ones
        # join at the back, so a freed block keeps its KV (and can be revived) as long as possible.
        # An OrderedDict also removes a revived block from the middle in O(1).
        self._free = OrderedDict.fromkeys(range(num_blocks))

        # Per sequence.
        self._tables = {}  # seq_id -> block table
        self._num_tokens = {}  # seq_id -> tokens in the sequence
        self._num_cached = {}  # seq_id -> tokens whose KV was reused at allocation

    def allocate(self, seq_id, token_ids):
        """Give a new sequence its block table, reusing the cached full blocks of its prefix.

        seq_id     a hashable id that is not allocated now
        token_ids  list or tuple of the prompt's token ids (ints), at least one
        Returns the block table as a new list: block i holds tokens [i * block_size, (i + 1) * block_size).
        Raises ValueError, changing nothing, when the free blocks do not suffice.
        """
        if _check_seq_id(seq_id) in self._tables:
            raise ValueError(f"seq_id {seq_id!r} is already allocated: free it first or use a new id")
        if not isinstance(token_ids, (list, tuple)):
            raise TypeError(f"token_ids must be a list or tuple of ints, got {type(token_ids).__name__}")
        if len(token_ids) == 0:
            raise ValueError(f"token_ids of seq_id {seq_id!r} is empty: a sequence needs at least one token")
        # One pass over the common case, plain ints (an engine's prompt step allocates thousands); the
        # loop runs only to name the culprit, with the same rule as the appended token id's check.
        if not all(type(token_id) is int for token_id in token_ids):
            for i, token_id in enumerate(token_ids):
                _check_token_id(f"token_ids[{i}]", token_id)
        bs = self.block_size
        chunks = [tuple(token_ids[i : i + bs]) for i in range(0, len(token_ids), bs)]
        # Section 3.2: only full blocks get a key; a partial block's KV is still growing.
        num_full = len(token_ids) // bs

        # Section 3.3 "Finding the cached prefix": full blocks in order, up to the first miss (a block's
        # KV depends on every token before it, so nothing after a miss can be reused).
        hits = []
        for chunk in chunks[:num_full]:
            block = self._find(chunk, hits[-1] if hits else None)
            if block is None:
                break
            hits.append(block)

        # Section 3.4 "All or nothing": count before touching anything. Reviving a freed block takes it
        # off the free list, just as a new block does.
        revived = sum(1 for block in hits if self._ref[block] == 0)
        need = len(chunks) - len(hits) + revived
        if need > len(self._free):
            raise ValueError(
                f"out of KV blocks: seq_id {seq_id!r} needs {need} free blocks, "
                f"{len(self._free)} of {self.num_blocks} are free"
            )

        table = []
        for block in hits:
            if self._ref[block] == 0:
                del self._free[block]  # section 3.5: revived, its KV still intact
            self._ref[block] += 1
            table.append(block)
        for i in range(len(hits), len(chunks)):
            block = self._take_free_block(seq_id)
            self._tokens[block] = chunks[i]
            self._parent[block] = table[-1] if table else None
            if i < num_full:
                self._seal(block)
            table.append(block)

        self._tables[seq_id] = table
        self._num_tokens[seq_id] = len(token_ids)
        self._num_cached[seq_id] = len(hits) * bs
        return list(table)

    def append(self, seq_id, token_id):
        """Append one generated token to a sequence.

        A new block is taken only when the last block is full: a full block may be shared, so it is never
        written again. A partial last block is private (it has no key, so no other sequence found it) and
        takes the token; when the token fills it, the block is sealed with its key and can be shared.
        Raises ValueError, changing nothing, when a new block is needed and none is free.
        """
        table = self._table(seq_id)
        _check_token_id("token_id", token_id)
        n = self._num_tokens[seq_id]
        # Section 3.6 "Append: grow, fill, seal".
        if n % self.block_size == 0:
            block = self._take_free_block(seq_id)
            self._parent[block] = table[-1]
            table.append(block)
        else:
            block = table[-1]
        self._tokens[block] += (token_id,)
        self._num_tokens[seq_id] = n + 1
        if len(self._tokens[block]) == self.block_size:
            self._seal(block)

    def free(self, seq_id):
        """Release a finished sequence: each block of its table loses one reference.

        A block whose count reaches 0 joins the back of the free list; it keeps its KV and its key until
        it is handed out again, so a later request with the same prefix can revive it.
        """
        table = self._table(seq_id)
        del self._tables[seq_id], self._num_tokens[seq_id], self._num_cached[seq_id]
        # Section 3.7 "Free: tail first": the tail reaches the free list (and is evicted) before the prefix
        # it extends, which other requests are the likeliest to ask for again.
        for block in reversed(table):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    def block_table(self, seq_id):
        """The sequence's block table, as a new list."""
        return list(self._table(seq_id))

    def ref_count(self, block_id):
        """How many live block tables hold block block_id (0 for a free block)."""
        if isinstance(block_id, bool) or not isinstance(block_id, int):
            raise TypeError(f"block_id must be an int, got {type(block_id).__name__}")
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block_id {block_id} is outside [0, num_blocks = {self.num_blocks})")
        return self._ref[block_id]

    @property
    def num_free_blocks(self):
        """Blocks with ref count 0: never used, or freed (their KV may still be revived)."""
        return len(self._free)

    def num_cached_tokens(self, seq_id):
        """Tokens of the sequence whose KV was reused at allocation: block_size per cached full block."""
        self._table(seq_id)
        return self._num_cached[seq_id]

    # --- helpers ------------------------------------------------------------------------------------

    def _table(self, seq_id):
        if _check_seq_id(seq_id) not in self._tables:
            raise KeyError(f"seq_id {seq_id!r} is not allocated (never allocated, or already freed)")
        return self._tables[seq_id]

    def _key(self, token_ids, parent):
        # Section 3.2: chaining the key of the block before folds every earlier token into this key.
        prev_hash = None if parent is None else self._hash[parent]
        return self._hash_fn(prev_hash, token_ids)

    def _find(self, chunk, parent):
        """The cached full block holding `chunk` right after block `parent` (None: first block), or None."""
        block = self._hash_to_block.get(self._key(chunk, parent))
        if block is None:
            return None
        # The key only names a candidate. A collision can give other tokens the same key...
        if self._tokens[block] != chunk:
            return None
        # ...or the same tokens after another prefix, whose KV differs.
        if self._parent[block] != parent:
            return None
        return block

    def _take_free_block(self, seq_id):
        """Evict the least recently freed block and hand it out empty, with ref count 1."""
        if not self._free:
            raise ValueError(
                f"out of KV blocks: seq_id {seq_id!r} needs a new block and all {self.num_blocks} are in use"
            )
        block, _ = self._free.popitem(last=False)
        # Section 3.5: its KV is about to be overwritten, so its key must stop finding it.
        if self._hash[block] is not None and self._hash_to_block.get(self._hash[block]) == block:
            del self._hash_to_block[self._hash[block]]
        self._ref[block] = 1
        self._tokens[block], self._parent[block], self._hash[block] = (), None, None
        return block

    def _seal(self, block):
        """A block has just become full: key it, so later sequences can find it (the newest block wins)."""
        key = self._key(self._tokens[block], self._parent[block])
        self._hash[block] = key
        self._hash_to_block[key] = block
