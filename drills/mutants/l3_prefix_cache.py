"""L3 mutants: the block-manager mistakes of explainer section 5, one per pitfall."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "ref_not_decremented",
        "1. ref count not dropped on free",
        "            self._ref[block] -= 1\n",
        "            pass\n",
    ),
    Mutant(
        "freed_while_referenced",
        "2. a block returned to the free list while another sequence holds it",
        "            if self._ref[block] == 0:\n                self._free[block] = None",
        "            self._free[block] = None",
    ),
    Mutant(
        "hash_not_chained",
        "3. keys not chained to the block before",
        "prev_hash = None if parent is None else self._hash[parent]",
        "prev_hash = None",
    ),
    Mutant(
        "hash_chained_to_block_id",
        "3. keys chained to the block id before, not to its key",
        "prev_hash = None if parent is None else self._hash[parent]",
        "prev_hash = parent",
    ),
    Mutant(
        "append_parent_not_recorded",
        "3. a block taken by append keyed as a first block: the block before it not recorded",
        "            self._parent[block] = table[-1]\n",
        "",
    ),
    Mutant(
        "partial_block_hashed",
        "4. a partial block keyed and shared",
        "num_full = len(token_ids) // bs",
        "num_full = len(chunks)",
    ),
    Mutant(
        "token_ids_not_checked",
        "5. token ids not checked on a key hit",
        "        if self._tokens[block] != chunk:\n            return None\n",
        "",
    ),
    Mutant(
        "parent_not_checked",
        "6. the block before not checked on a key hit",
        "        if self._parent[block] != parent:\n            return None\n",
        "",
    ),
    Mutant(
        "parent_checked_by_key",
        "6. the block before compared by its key, not as a block",
        "        if self._parent[block] != parent:\n",
        "        if (None if self._parent[block] is None else self._hash[self._parent[block]]) != (\n"
        "            None if parent is None else self._hash[parent]\n"
        "        ):\n",
    ),
    Mutant(
        "failed_allocation_half_done",
        "7. a failed allocation leaves blocks taken",
        "if need > len(self._free):",
        "if False:",
    ),
    Mutant(
        "revived_not_counted",
        "8. revived blocks not counted against the free blocks",
        "need = len(chunks) - len(hits) + revived",
        "need = len(chunks) - len(hits)",
    ),
    Mutant(
        "revived_left_on_free_list",
        "9. a revived block left on the free list",
        "                del self._free[block]  # section 3.5",
        "                pass  # section 3.5",
    ),
    Mutant(
        "free_front_to_back",
        "10. free walks the table front to back (the prefix is evicted first)",
        "for block in reversed(table):",
        "for block in table:",
    ),
    Mutant(
        "append_into_full_block",
        "11. append writes into a full (maybe shared) last block",
        "if n % self.block_size == 0:",
        "if n % self.block_size == 1:",
    ),
    Mutant(
        "append_never_seals",
        "12. a block filled by append never gets its key",
        "        if len(self._tokens[block]) == self.block_size:\n            self._seal(block)\n",
        "",
    ),
    Mutant(
        "seq_id_not_checked",
        "13. arguments checked late: an unhashable seq_id",
        "if _check_seq_id(seq_id) in self._tables:",
        "if seq_id in self._tables:",
    ),
    Mutant(
        "prompt_tokens_not_checked",
        "13. arguments checked late: token ids of a prompt",
        "        if not all(type(token_id) is int for token_id in token_ids):\n"
        "            for i, token_id in enumerate(token_ids):\n"
        '                _check_token_id(f"token_ids[{i}]", token_id)\n',
        "",
    ),
    Mutant(
        "token_id_not_checked",
        "13. arguments checked late: the appended token id",
        '        _check_token_id("token_id", token_id)\n        n = self._num_tokens[seq_id]\n',
        "        n = self._num_tokens[seq_id]\n",
    ),
    Mutant(
        "bool_token_id_accepted",
        "13. arguments checked late: a bool taken for an int token id (isinstance alone)",
        "if isinstance(token_id, bool) or not isinstance(token_id, int):",
        "if not isinstance(token_id, int):",
    ),
    Mutant(
        "block_table_not_copied",
        "14. the manager's own table handed out",
        "return list(self._table(seq_id))",
        "return self._table(seq_id)",
    ),
    Mutant(
        "allocate_returns_own_table",
        "14. the manager's own table handed out (by allocate)",
        "        return list(table)\n",
        "        return table\n",
    ),
    Mutant(
        "partial_block_counted_as_cached",
        "15. a partly written block counted as cached",
        "self._num_cached[seq_id] = len(hits) * bs",
        "self._num_cached[seq_id] = len(token_ids) if len(hits) == num_full else len(hits) * bs",
    ),
    Mutant(
        "freed_block_handed_out_first",
        "16. a freed block handed out first (the free list used as a stack)",
        "            if self._ref[block] == 0:\n                self._free[block] = None",
        "            if self._ref[block] == 0:\n                self._free[block] = None\n                self._free.move_to_end(block, last=False)",
    ),
    Mutant(
        "new_blocks_popped_from_the_back",
        "16. new blocks taken from the back of the free list (a stack from the first allocation on)",
        "block, _ = self._free.popitem(last=False)",
        "block, _ = self._free.popitem(last=True)",
    ),
    Mutant(
        "evicted_block_keeps_its_record",
        "17. an evicted block keeps the tokens and key it held",
        "        self._tokens[block], self._parent[block], self._hash[block] = (), None, None\n",
        "",
    ),
    # Only two blocks sealed under one key, the older evicted, show it.
    Mutant(
        "oldest_block_keeps_its_key",
        "18. the first block sealed under a key keeps it (setdefault)",
        "self._hash_to_block[key] = block",
        "self._hash_to_block.setdefault(key, block)",
    ),
    Mutant(
        "last_full_block_of_the_prompt_unsealed",
        "19. the prompt's last block left unsealed when the prompt ends on a block edge",
        "num_full = len(token_ids) // bs",
        "num_full = (len(token_ids) - 1) // bs",
    ),
    Mutant(
        "last_free_blocks_refused",
        "20. the free blocks compared with >=: a prompt needing exactly the free blocks refused",
        "if need > len(self._free):",
        "if need >= len(self._free):",
    ),
    Mutant(
        "append_grows_the_table_before_taking",
        "7. append grows the table before taking the new block: a failed append leaves a slot behind",
        "            block = self._take_free_block(seq_id)\n            self._parent[block] = table[-1]\n            table.append(block)\n",
        "            table.append(None)\n            block = self._take_free_block(seq_id)\n            self._parent[block] = table[-2]\n            table[-1] = block\n",
    ),
    Mutant(
        "freed_block_forgets_its_key",
        "21. free() deletes a block's key when its count reaches 0: no freed block is ever revived",
        "                self._free[block] = None\n",
        "                self._free[block] = None\n                if self._hash_to_block.get(self._hash[block]) == block:\n                    del self._hash_to_block[self._hash[block]]\n",
    ),
    Mutant(
        "eviction_drops_a_newer_blocks_key",
        "18. the eviction drops the key whatever block it names now: the newer block of those tokens is lost",
        "if self._hash[block] is not None and self._hash_to_block.get(self._hash[block]) == block:",
        "if self._hash[block] is not None and self._hash[block] in self._hash_to_block:",
    ),
    Mutant(
        "revived_blocks_not_cached",
        "22. revived blocks left out of the cached tokens (only hits still held elsewhere counted)",
        "self._num_cached[seq_id] = len(hits) * bs",
        "self._num_cached[seq_id] = (len(hits) - revived) * bs",
    ),
    Mutant(
        "walk_goes_on_past_a_miss",
        "23. the prefix walk goes on past its first miss: a later block cached after the last hit is taken",
        "            if block is None:\n                break\n            hits.append(block)\n",
        "            if block is None:\n                continue\n            hits.append(block)\n",
    ),
    Mutant(
        "partial_block_keyed",
        "4. the partial last block of a prompt keyed at allocation",
        "            if i < num_full:\n                self._seal(block)\n",
        "            self._seal(block)\n",
    ),
]
