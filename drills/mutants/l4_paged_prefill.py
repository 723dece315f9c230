"""L4 mutants: one per pitfall of explainer section 5 (causal alignment with a prefix, the varlen grid,
pages inside a key tile, grouping, int64 offsets, masks, T5's softmax mistakes, and a dtype written
into the kernel)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "key_loop_to_the_context_end",
        "37. every key of the context visited, the causal mask doing the rest (hi = ctx)",
        "hi = tl.minimum(ctx, prefix + tok0 + BLOCK_Q)",
        "hi = ctx",
    ),
    Mutant(
        "causal_top_left",
        "1. causal aligned to the top left (the prefix ignored: j <= i)",
        "prefix = ctx - q_len",
        "prefix = 0",
    ),
    Mutant(
        "rows_past_sequence_end",
        "2. rows past a sequence's end loaded and stored",
        "row_ok = (tok < q_len) & (offs_r < BLOCK_Q * HEADS)",
        "row_ok = offs_r < BLOCK_Q * HEADS",
    ),
    Mutant(
        "cu_seqlens_off_by_one",
        "3. cu_seqlens read as inclusive ends (q_len one too many)",
        "q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start",
        "q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start + 1",
    ),
    Mutant(
        "new_tokens_on_a_fresh_page",
        "4. the new tokens assumed to start on a fresh page (prefix rounded up to whole pages)",
        "prefix = ctx - q_len",
        "prefix = tl.cdiv(ctx - q_len, PAGE) * PAGE",
    ),
    Mutant(
        "one_page_per_key_tile",
        "5. one page looked up per key tile (the tile's first key's page for every key)",
        "table_ptr + cols // PAGE",
        "table_ptr + start_n // PAGE + offs_n * 0",
    ),
    Mutant(
        "interleaved_grouping",
        "6. interleaved KV head grouping (kvh + g * Hkv)",
        "kvh = head0 // GROUP",
        "kvh = head0 % (head_groups * HEADS // GROUP)",
    ),
    Mutant(
        "page_index_int32",
        "7. page index left int32",
        "phys = phys.to(tl.int64)",
        "phys = phys",
    ),
    Mutant(
        "diagonal_tiles_unmasked",
        "8. key tiles that cross the diagonal treated as fully visible",
        "full_end = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N",
        "full_end = (prefix + tok0 + BLOCK_Q) // BLOCK_N * BLOCK_N",
    ),
    Mutant(
        "keys_past_context_read",
        "9. keys past the context loaded (their table entries are garbage)",
        "in_range = cols < ctx",
        "in_range = cols >= 0",
    ),
    Mutant(
        "rescale_dropped",
        "10. online softmax without the rescale (alpha = 1)",
        "alpha = tl.math.exp2(m_i - m_new)",
        "alpha = tl.math.exp2(m_new - m_new)",
    ),
    Mutant(
        "scale_missing",
        "11. softmax scale forgotten (only log2(e) folded in)",
        "qk_scale = scale * 1.4426950408889634",
        "qk_scale = 1.4426950408889634",
    ),
    Mutant(
        "lse_base_2",
        "12. lse returned in base 2",
        "lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453",
        "lse = m_i + tl.math.log2(l_i)",
    ),
    Mutant(
        "spare_tiles_not_skipped",
        "13. spare tiles (and q_len = 0 rows) not skipped",
        "if tok0 >= q_len:\n        return\n",
        "if tok0 >= q_len:\n        pass\n",
    ),
    Mutant(
        "block_ids_of_the_previous_tile",
        "14. block ids prefetched for the current tile, used for the next (one tile late)",
        "for start_n in range(0, full_end, BLOCK_N):\n        phys_next = _block_ids(table_ptr, start_n + BLOCK_N,",
        "for start_n in range(0, full_end, BLOCK_N):\n        phys_next = _block_ids(table_ptr, start_n,",
    ),
    Mutant(
        "heads_taken_as_group",
        "15. HEADS ignored: every tile taken as packed (first query head = head group x GROUP)",
        "head0 = (pid % head_groups).to(tl.int64) * HEADS",
        "head0 = (pid % head_groups).to(tl.int64) * GROUP",
    ),
    Mutant(
        "rows_laid_out_by_group",
        "15. HEADS ignored: rows laid out for GROUP heads whatever the tile holds",
        "tok = tok0 + offs_r // HEADS",
        "tok = tok0 + offs_r // GROUP",
    ),
    Mutant(
        "v_rows_through_k_strides",
        "16. V's rows found with K's offsets when the caches' strides differ",
        "        v_rows = v_head_ptr + phys * stride_vb + slot * stride_vt",
        "        v_rows = v_head_ptr + off",
    ),
    Mutant(
        "padding_rows_stored",
        "17. the padding rows of a packed tile stored (they alias the next tile's first token)",
        "row_ok = (tok < q_len) & (offs_r < BLOCK_Q * HEADS)",
        "row_ok = tok < q_len",
    ),
    Mutant(
        "key_range_one_short",
        "18. the key range one key short (hi = prefix + tok0 + BLOCK_Q - 1)",
        "hi = tl.minimum(ctx, prefix + tok0 + BLOCK_Q)",
        "hi = tl.minimum(ctx, prefix + tok0 + BLOCK_Q - 1)",
    ),
    Mutant(
        "decode_rows_skipped",
        "19. decode rows (q_len = 1) left to another kernel: their tiles return at once",
        "    if tok0 >= q_len:\n",
        "    if tok0 >= q_len or q_len == 1:\n",
    ),
    Mutant(
        "search_fixed_6_steps",
        "20. the sequence search with a fixed number of steps (6 halvings: right up to 64 sequences)",
        "    while hi - lo > 1:\n",
        "    for _ in range(6):\n",
    ),
    Mutant(
        "search_fixed_7_steps",
        "20. the sequence search with a fixed number of steps (7 halvings: right up to 128 sequences)",
        "    while hi - lo > 1:\n",
        "    for _ in range(7):\n",
    ),
    Mutant(
        "search_fixed_8_steps",
        "20. the sequence search with a fixed number of steps (8 halvings: right up to 256 sequences)",
        "    while hi - lo > 1:\n",
        "    for _ in range(8):\n",
    ),
    Mutant(
        "v_page_offset_int32",
        "7. V's page offset left int32 when V has its own strides (K's widened)",
        "    if WIDE:\n        phys = phys.to(tl.int64)\n    slot = cols % PAGE\n"
        "    off = phys * stride_kb + slot * stride_kt\n    k_rows = k_head_ptr + off\n"
        "    if SAME_KV:\n        v_rows = v_head_ptr + off\n    else:\n"
        "        v_rows = v_head_ptr + phys * stride_vb + slot * stride_vt\n",
        "    v_phys = phys  # taken before the widening: V's offsets stay int32\n"
        "    if WIDE:\n        phys = phys.to(tl.int64)\n    slot = cols % PAGE\n"
        "    off = phys * stride_kb + slot * stride_kt\n    k_rows = k_head_ptr + off\n"
        "    if SAME_KV:\n        v_rows = v_head_ptr + off\n    else:\n"
        "        v_rows = v_head_ptr + v_phys * stride_vb + slot * stride_vt\n",
    ),
    Mutant(
        "table_load_unmasked",
        "9. the block-table load unmasked (entries past the last page, and past the table, read)",
        "    return tl.load(table_ptr + cols // PAGE, mask=cols < ctx, other=0)",
        "    return tl.load(table_ptr + cols // PAGE)",
    ),
    Mutant(
        "key_loop_skips_the_prefix",
        "21. the key loop started at the prefix's key tile (the cached prefix skipped)",
        "    phys = _block_ids(table_ptr, 0, offs_n, ctx, PAGE)\n"
        "    for start_n in range(0, full_end, BLOCK_N):\n",
        "    first_n = prefix // BLOCK_N * BLOCK_N  # the tile holding the first new token\n"
        "    phys = _block_ids(table_ptr, first_n, offs_n, ctx, PAGE)\n"
        "    for start_n in range(first_n, full_end, BLOCK_N):\n",
    ),
    Mutant(
        "lse_mixed_bases",
        "12. lse mixing bases: m (base 2) plus the natural log of l",
        "lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453",
        "lse = m_i + tl.log(l_i)",
    ),
    Mutant(
        "own_key_hidden",
        "22. each token's own key hidden (the causal mask j < pos)",
        's = tl.where(cols[None, :] <= pos[:, None], s, float("-inf"))',
        's = tl.where(cols[None, :] < pos[:, None], s, float("-inf"))',
    ),
    Mutant(
        "p_cast_to_fp16",
        "23. p cast to tl.float16 before P V, not to v's dtype",
        "acc = tl.dot(p.to(v.dtype), v, acc)",
        "acc = tl.dot(p.to(tl.float16), v, acc)",
    ),
    Mutant(
        "out_stored_as_fp16",
        "23. out cast to tl.float16 before the store, not to out's element type",
        "out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None]",
        "out.to(tl.float16), mask=row_ok[:, None]",
    ),
    Mutant(
        "search_range_one_short",
        "20. the sequence search over [0, B - 1): the last sequence is never found",
        "hi = lo + num_seqs  # the owner is in [lo, hi)",
        "hi = lo + num_seqs - 1",
    ),
    Mutant(
        "first_tile_without_the_sequence_index",
        "24. a sequence's first tile taken as cu_seqlens_q[b] // BLOCK_Q, without the + b",
        "tok0 = (tile - (q_start // BLOCK_Q + lo)) * BLOCK_Q",
        "tok0 = (tile - q_start // BLOCK_Q) * BLOCK_Q",
    ),
    Mutant(
        "table_row_stride_assumed",
        "25. block_tables' rows taken as max_pages apart (the table's width, not its row stride)",
        "table_ptr = block_tables_ptr + b * stride_bt",
        "table_ptr = block_tables_ptr + b * max_pages",
    ),
    Mutant(
        "max_starts_at_zero",
        "26. the running max initialised to 0 (L2 pitfall 10)",
        'm_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)',
        "m_i = tl.zeros([BLOCK_M], dtype=tl.float32)",
    ),
    Mutant(
        "q_rows_int32",
        "27. the packed row index left int32 (L2 pitfall 17)",
        "q_rows = (q_start + tok).to(tl.int64)",
        "q_rows = q_start + tok",
    ),
    # Every other case has D <= 128: only the widest admitted head dim shows the lost half.
    Mutant(
        "head_dim_tile_capped_at_128",
        "28. the feature tile capped at 128: D = 256 is read and written half",
        "D=D,\n        PAGE=PAGE,",
        "D=min(D, 128),\n        PAGE=PAGE,",
    ),
    Mutant(
        "same_kv_without_the_block_stride",
        "16. K's offsets shared with V whenever the strides inside a block agree (the block stride ignored)",
        "SAME_KV=k_cache.stride() == v_cache.stride(),",
        "SAME_KV=k_cache.stride()[1:] == v_cache.stride()[1:],",
    ),
    Mutant(
        "guard_bound_off_by_one",
        "29. the guard's context bound off by one: a context that fills its table row is called invalid",
        "ctx_ok = (ctx >= q_len) & (ctx <= max_pages * PAGE)",
        "ctx_ok = (ctx >= q_len) & (ctx < max_pages * PAGE)",
    ),
    # Every group up to a config's BLOCK_M fits: only GROUP = 64 in 16-row tiles shows it.
    Mutant(
        "packed_tile_not_widened",
        "30. a packed tile narrower than one token's heads (BLOCK_M not widened to next_pow2(GROUP))",
        "BLOCK_M = max(BLOCK_M, next_pow2(heads))",
        "BLOCK_M = BLOCK_M",
    ),
    Mutant(
        "out_written_through_q_strides",
        "31. out written through q's strides (stride_qt, stride_qh)",
        "out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh",
        "out_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh",
    ),
    Mutant(
        "padding_only_batch_returns_out_alone",
        "32. a batch of padding only returns out alone, where return_lse=True asks for (out, lse)",
        "return (out, lse) if return_lse else out  #",
        "return out  #",
    ),
    Mutant(
        "out_row_offset_int32",
        "27. the packed row index left int32 in the store (q_row * stride_ot overflows)",
        "out_ptr + q_rows[:, None] * stride_ot",
        "out_ptr + (q_start + tok)[:, None] * stride_ot",
    ),
    Mutant(
        "sequence_index_int32",
        "27. the sequence index left int32 (b * stride_bt overflows)",
        "b = lo.to(tl.int64)",
        "b = lo",
    ),
    Mutant(
        "head_index_int32",
        "33. the head index left int32 (kvh * stride_kh overflows)",
        "head0 = (pid % head_groups).to(tl.int64) * HEADS",
        "head0 = (pid % head_groups) * HEADS",
    ),
    Mutant(
        "log2e_forgotten",
        "11. qk_scale without log2(e): exp2 of the scaled scores",
        "qk_scale = scale * 1.4426950408889634",
        "qk_scale = scale",
    ),
    Mutant(
        "alpha_in_natural_base",
        "10. alpha = e^(m_old - m_new) on maxes kept in base 2",
        "alpha = tl.math.exp2(m_i - m_new)",
        "alpha = tl.exp(m_i - m_new)",
    ),
    Mutant(
        "search_compares_strictly",
        "20. the sequence search's comparison strict (first tile < tile): a sequence's first tile goes to "
        "the one before",
        "if tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid <= tile:",
        "if tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid < tile:",
    ),
    Mutant(
        "lse_store_without_row_mask",
        "2. lse stored without the row mask (out's store keeps it): rows past a sequence's end written",
        "tl.store(lse_ptr + q_rows * stride_lt + heads * stride_lh, lse, mask=row_ok)",
        "tl.store(lse_ptr + q_rows * stride_lt + heads * stride_lh, lse)",
    ),
    Mutant(
        "lse_through_out_strides",
        "35. lse stored through out's row stride (a copy-paste of the out arguments)",
        "0 if lse is None else lse.stride(0)",
        "0 if lse is None else out.stride(0)",
    ),
    Mutant(
        "running_max_of_raw_scores",
        "34. the running max taken of the raw scores, not in the exponent's units",
        "m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)",
        "m_new = tl.maximum(m_i, tl.max(s, 1))",
    ),
    Mutant(
        "running_max_of_each_tile_alone",
        "10. the running max taken of each key tile alone (m_new = the tile's max, not max(m_i, it))",
        "m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)",
        "m_new = tl.max(s, 1) * qk_scale",
    ),
    Mutant(
        "slot_from_the_tiles_offsets",
        "36. a key's slot taken from its place in the key tile (offs_n % PAGE), not in the sequence",
        "slot = cols % PAGE",
        "slot = offs_n % PAGE",
    ),
    # Consistent with itself, not with the grid's total_q // BLOCK_Q + B tiles: the last rows go unwritten.
    Mutant(
        "first_tiles_rounded_up",
        "24. each sequence's first tile rounded up (cdiv(cu, BLOCK_Q) + b) in the search and in tok0",
        "if tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid <= tile:\n            lo = mid\n        else:\n"
        "            hi = mid\n    b = lo.to(tl.int64)\n    q_start = tl.load(cu_seqlens_ptr + b)\n"
        "    q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start\n"
        "    tok0 = (tile - (q_start // BLOCK_Q + lo)) * BLOCK_Q",
        "if tl.cdiv(tl.load(cu_seqlens_ptr + mid), BLOCK_Q) + mid <= tile:\n            lo = mid\n"
        "        else:\n            hi = mid\n    b = lo.to(tl.int64)\n    q_start = tl.load(cu_seqlens_ptr + b)\n"
        "    q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start\n"
        "    tok0 = (tile - (tl.cdiv(q_start, BLOCK_Q) + lo)) * BLOCK_Q",
    ),
]
