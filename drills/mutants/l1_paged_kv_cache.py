"""L1 mutants: the pitfalls of explainer section 5, in the allocator, the block table, the waste
statistics, the kernel and the launcher's checks."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant("padding_slot_written", "1. a padding row (slot -1) written", "if slot < 0:", "if slot < -1:"),
    Mutant(
        "slot_int32",
        "2. slot arithmetic in int32",
        "slot = tl.load(slot_mapping_ptr + i)",
        "slot = tl.load(slot_mapping_ptr + i).to(tl.int32)",
    ),
    Mutant(
        "slot_block_offset_swapped",
        "3. block and offset swapped in the slot (host side)",
        "return physical * self.block_size + offset",
        "return offset * self.block_size + physical",
    ),
    Mutant(
        "address_block_offset_swapped",
        "3. block and offset swapped in the address (kernel side)",
        "dst = block * stride_cb + offset * stride_ct",
        "dst = offset * stride_cb + block * stride_ct",
    ),
    Mutant(
        "double_free_accepted",
        "4. double free accepted",
        "        if block not in self._allocated:\n"
        '            raise ValueError(f"block {block} is already free: double free")\n',
        "",
    ),
    Mutant(
        "free_list_not_restored",
        "5. free() forgets the block instead of returning it",
        "        self._free.append(block)\n",
        "",
    ),
    Mutant(
        "last_block_full_off_by_one",
        "6. last-block-full check off by one",
        "self.num_tokens == len(self._blocks) * self.block_size",
        "self.num_tokens == len(self._blocks) * self.block_size - 1",
    ),
    Mutant(
        "append_not_all_or_nothing",
        "7. a growth that does not fit leaves blocks half-allocated",
        "        if needed > self.allocator.num_free:\n",
        "        if False:\n",
    ),
    Mutant(
        "blocks_rounded_down",
        "8. blocks per request rounded down, not up",
        "math.ceil(n / block_size) for n in lengths",
        "n // block_size for n in lengths",
    ),
    Mutant(
        "waste_over_used",
        "8. waste divided by the tokens used, not the slots allocated",
        "(allocated - used) / allocated if allocated",
        "(allocated - used) / used if used",
    ),
    Mutant(
        "padded_lanes_unmasked",
        "9. padded heads and features stored",
        "mask = (offs_h < Hkv)[:, None] & (offs_d < D)[None, :]",
        "mask = (offs_h < HKV_PAD)[:, None] & (offs_d < D_PAD)[None, :]",
    ),
    Mutant(
        "padded_lanes_loaded_unmasked",
        "9. padded heads and features loaded without the mask",
        "offs_d[None, :], mask=mask)\n    v = tl.load(value_ptr + i * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)",
        "offs_d[None, :])\n    v = tl.load(value_ptr + i * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :])",
    ),
    Mutant(
        "slot_range_unchecked",
        "10. slots past the cache accepted",
        "bad = ((slot_mapping < -1) | (slot_mapping >= num_slots)).nonzero()",
        "bad = (slot_mapping < -1).nonzero()",
    ),
    Mutant(
        "duplicate_slots_accepted",
        "10. duplicate slots accepted",
        "    if len(repeated):\n",
        "    if False:\n",
    ),
    Mutant(
        "cache_assumed_contiguous",
        "11. the cache assumed contiguous",
        "dst = block * stride_cb + offset * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]",
        "dst = slot * Hkv * D + offs_h[:, None] * D + offs_d[None, :]",
    ),
    Mutant(
        "key_value_rows_assumed_contiguous",
        "12. key and value rows assumed contiguous",
        "k = tl.load(key_ptr + i * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)\n"
        "    v = tl.load(value_ptr + i * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)",
        "k = tl.load(key_ptr + i * Hkv * D + offs_h[:, None] * D + offs_d[None, :], mask=mask)\n"
        "    v = tl.load(value_ptr + i * Hkv * D + offs_h[:, None] * D + offs_d[None, :], mask=mask)",
    ),
    Mutant(
        "value_read_with_key_strides",
        "12. value read with key's strides",
        "v = tl.load(value_ptr + i * stride_vn + offs_h[:, None] * stride_vh",
        "v = tl.load(value_ptr + i * stride_kn + offs_h[:, None] * stride_kh",
    ),
    # Heads D apart holds for every fused qkv view: only a padded head dim shows it.
    Mutant(
        "key_head_stride_assumed_d",
        "12. key's heads assumed D apart (stride(1) ignored)",
        "key_ptr + i * stride_kn + offs_h[:, None] * stride_kh",
        "key_ptr + i * stride_kn + offs_h[:, None] * D",
    ),
    Mutant(
        "row_index_int32",
        "13. the row index left int32 (i * stride(0) of key and value)",
        "i = tl.program_id(0).to(tl.int64)",
        "i = tl.program_id(0)",
    ),
    Mutant(
        "value_row_index_int32",
        "13. value's row offset left int32 (key's widened)",
        "value_ptr + i * stride_vn",
        "value_ptr + i.to(tl.int32) * stride_vn",
    ),
    Mutant(
        "value_stored_into_k_cache",
        "14. V stored through k_cache's pointer",
        "tl.store(v_cache_ptr + dst, v, mask=mask)",
        "tl.store(k_cache_ptr + dst, v, mask=mask)",
    ),
    Mutant(
        "allocate_from_the_back",
        "15. blocks taken from the back of the free list",
        "block = self._free.popleft()",
        "block = self._free.pop()",
    ),
    Mutant(
        "release_keeps_the_token_count",
        "16. release() keeps the token count",
        "        self._blocks.clear()\n        self.num_tokens = 0\n",
        "        self._blocks.clear()\n",
    ),
    Mutant(
        "lookup_one_token_too_far",
        "17. lookup accepts the token one past the end",
        "if not 0 <= token_index < self.num_tokens:",
        "if not 0 <= token_index <= self.num_tokens:",
    ),
    # One edit cannot also move the kernel's tl.program_id(0) to axis 1, so every program copies row 0
    # here and the other checks fail too: the grid check must still name the mistake first.
    Mutant(
        "tokens_on_grid_axis_1",
        "18. tokens on grid axis 1 (past 65535 tokens a GPU refuses the launch)",
        "store_kvcache_kernel,\n        (N,),",
        "store_kvcache_kernel,\n        (1, N),",
    ),
    Mutant(
        "tokens_clamped_to_65535",
        "18. tokens clamped to 65535 programs (the tokens past them never stored)",
        "store_kvcache_kernel,\n        (N,),",
        "store_kvcache_kernel,\n        (min(N, 65535),),",
    ),
    # Right for every request that holds a token: only a length of 0 shows it.
    Mutant(
        "zero_tokens_take_a_block",
        "19. a request of 0 tokens given a block (max(1, ceil(n / block_size)))",
        "sum(math.ceil(n / block_size) for n in lengths)",
        "sum(max(1, math.ceil(n / block_size)) for n in lengths)",
    ),
    # Every block still comes back: only the order the allocator hands them out again shows it.
    Mutant(
        "release_frees_first_block_first",
        "20. release() frees the first block first",
        "for block in reversed(self._blocks):",
        "for block in self._blocks:",
    ),
    Mutant(
        "growth_that_fits_exactly_refused",
        "21. append_tokens refuses a growth that takes every free block (>= where > belongs)",
        "        if needed > self.allocator.num_free:\n",
        "        if needed >= self.allocator.num_free:\n",
    ),
    # Every check through the grader's process sees a copy anyway: only an edit in the learner's shows it.
    Mutant(
        "blocks_hands_out_the_table_itself",
        "22. blocks returns the table's own list, not a copy",
        "return list(self._blocks)",
        "return self._blocks",
    ),
    # Right for every GQA model of at most 8 KV heads: only a wider head count shows it.
    Mutant(
        "head_tile_capped_at_8",
        "23. a head tile capped at 8 KV heads",
        "HKV_PAD=next_pow2(Hkv),",
        "HKV_PAD=min(next_pow2(Hkv), 8),",
    ),
    Mutant(
        "head_index_int32",
        "24. the head index left int32 (h * stride_ch overflows when heads lie far apart)",
        "offs_h = tl.arange(0, HKV_PAD).to(tl.int64)",
        "offs_h = tl.arange(0, HKV_PAD)",
    ),
]
