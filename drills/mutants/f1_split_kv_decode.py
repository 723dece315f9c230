"""F1 mutants: one per pitfall of explainer section 6 (pitfalls 3 and 4 have two each), L2's mistakes
through the split path included."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "empty_split_zero_over_zero",
        "1. an empty split divides 0 by 0",
        "o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)",
        "o = acc / l_i[:, None]",
    ),
    Mutant(
        "lse_in_base_2",
        "2. lse written in base 2, merged as base e",
        "(m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453",
        "(m_i + tl.log2(tl.where(seen, l_i, 1.0)))",
    ),
    Mutant(
        "split_ranges_overlap",
        "3. split ranges overlap",
        "end = tl.minimum(start + chunk, ctx)",
        "end = tl.minimum(start + chunk + 16, ctx)",
    ),
    Mutant(
        "split_ranges_leave_a_gap",
        "3. split ranges leave a gap",
        "start = split * chunk\n",
        "start = split * chunk + tl.where(split > 0, 1, 0)\n",
    ),
    Mutant(
        "merge_states_without_max_shift",
        "4. merge_states weighs the parts by exp(lse), no max shift",
        "w_a = tl.exp(lse_a - m_safe)\n    w_b = tl.exp(lse_b - m_safe)",
        "w_a = tl.exp(lse_a)\n    w_b = tl.exp(lse_b)\n    m_safe = tl.zeros_like(m)",
    ),
    Mutant(
        "split_merge_without_max_shift",
        "4. the split merge weighs the splits by exp(lse), no max shift",
        "m_new = tl.maximum(m, tl.max(lse, axis=0))",
        "m_new = tl.zeros([1], dtype=tl.float32)",
    ),
    Mutant(
        "small_pages_read_as_one_page",
        "5. pages smaller than a tile read as if contiguous",
        "phys = tl.load(bt_row + tok // PAGE, mask=t_mask, other=0).to(tl.int64)  # [BLOCK_N]",
        "phys = tl.load(bt_row + t0 // PAGE).to(tl.int64)",
    ),
    Mutant(
        "merge_splits_rescale_dropped",
        "6. split merge without rescaling the running sum",
        "w_sum = w_sum * alpha + tl.sum(w, axis=0)",
        "w_sum = w_sum + tl.sum(w, axis=0)",
    ),
    Mutant(
        "interleaved_grouping",
        "7. interleaved head grouping (L2 pitfall 1)",
        "q_heads = kvh * GROUP + offs_g  #",
        "q_heads = kvh + offs_g * tl.num_programs(1)  #",
    ),
    Mutant(
        "unmasked_tail",
        "8. no mask on the last tile (L2 pitfall 2)",
        "t_mask = tok < end\n",
        "t_mask = tok >= 0\n",
    ),
    Mutant(
        "page_index_int32",
        "9. page index left int32 (L2 pitfall 4)",
        "phys = tl.load(bt_row + t0 // PAGE).to(tl.int64)",
        "phys = tl.load(bt_row + t0 // PAGE)",
    ),
    Mutant(
        "q_assumed_contiguous",
        "10. q's head stride taken as D (L2 pitfall 9)",
        "q_ptr + b * stride_qb + q_heads[:, None] * stride_qh",
        "q_ptr + b * stride_qb + q_heads[:, None] * D",
    ),
    Mutant(
        "max_starts_at_zero",
        "11. running max initialised to 0 (L2 pitfall 10)",
        'm_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)',
        "m_i = tl.zeros([GROUP_PAD], dtype=tl.float32)",
    ),
    Mutant(
        "merge_states_without_contiguous",
        "12. merge_states hands strided views to a kernel that assumes rows of D",
        "    o_a, o_b = o_a.contiguous(), o_b.contiguous()\n    lse_a, lse_b = lse_a.contiguous(), lse_b.contiguous()\n",
        "",
    ),
    Mutant(
        "merge_padding_sequence_minus_inf_minus_inf",
        "13. a padding sequence's merge computes -inf - (-inf)",
        'm_ref = tl.where(m_new == float("-inf"), 0.0, m_new)',
        "m_ref = m_new",
    ),
    Mutant(
        "merge_reads_one_tile_of_splits",
        "14. a fixed-size merge tile: only the first BLOCK_S splits merged",
        "for s0 in range(0, num_splits, BLOCK_S):",
        "for s0 in range(0, BLOCK_S, BLOCK_S):",
    ),
    Mutant(
        "merge_ignores_lse",
        "15. the split merge ignores lse: every non-empty split weighs 1",
        "w = tl.exp(lse - m_ref)",
        'w = tl.where(lse > float("-inf"), 1.0, 0.0)',
    ),
    Mutant(
        "empty_split_lse_zero",
        "1. an empty split stores lse = 0: its output 0 weighs e^0 in the merge",
        'lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))',
        "lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, 0.0)",
    ),
    Mutant(
        "chunk_not_whole_tiles",
        "16. plan() makes chunks that are not whole tiles",
        "    chunk = triton.cdiv(max_tiles, num_splits) * BLOCK_N\n",
        "    chunk = max(1, triton.cdiv(max_len, num_splits))\n",
    ),
    Mutant(
        "chunk_rounded_down",
        "16. plan() rounds the chunk down to whole tiles: more splits than asked",
        "    chunk = triton.cdiv(max_tiles, num_splits) * BLOCK_N\n",
        "    chunk = max(1, max_tiles // num_splits) * BLOCK_N\n",
    ),
    Mutant(
        "pages_of_8_read_as_one_page",
        "5. pages of 8 take the one-page-per-tile path (PAGE >= 8 where PAGE >= BLOCK_N belongs)",
        "        if PAGE >= BLOCK_N:",
        "        if PAGE >= 8:",
    ),
    Mutant(
        "sequence_index_int32",
        "17. the sequence index left int32 (L2 pitfall 17)",
        "    b = tl.program_id(0).to(tl.int64)\n    kvh = tl.program_id(1).to(tl.int64)\n    split = tl.program_id(2)\n",
        "    b = tl.program_id(0)\n    kvh = tl.program_id(1).to(tl.int64)\n    split = tl.program_id(2)\n",
    ),
    # The split kernel's b widened: only out's own far rows, stored by the merge, show it.
    Mutant(
        "merge_sequence_index_int32",
        "17. the merge kernel's sequence index left int32",
        "    b = tl.program_id(0).to(tl.int64)\n    h = tl.program_id(1).to(tl.int64)\n",
        "    b = tl.program_id(0)\n    h = tl.program_id(1)\n",
    ),
    Mutant(
        "out_stored_as_fp16",
        "18. a dtype written into the kernel: the split kernel's output stored as tl.float16",
        "tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])",
        "tl.store(o_rows, o.to(tl.float16), mask=g_mask[:, None])",
    ),
    Mutant(
        "merged_lse_log2",
        "2. the split merge's lse returned in base 2 (log2 of the weights' sum)",
        'lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
        'lse_out = tl.where(seen, m + tl.log2(w_safe), float("-inf"))',
    ),
    # Right only for a block table whose rows are max_pages apart: a view of a wider table is not.
    Mutant(
        "table_row_stride_assumed",
        "19. the block table's row stride assumed to be its width (shape[1], not stride(0))",
        "*lse_part_strides,\n            block_tables.stride(0),",
        "*lse_part_strides,\n            block_tables.shape[1],",
    ),
    # Right only for a contiguous out: the grader's out is a view into a wider canary buffer.
    Mutant(
        "out_assumed_contiguous",
        "19. out's strides assumed contiguous (Hq * D and D, not out.stride())",
        "out.stride(0),\n                out.stride(1),\n                0,",
        "Hq * D,\n                D,\n                0,",
    ),
    Mutant(
        "group_rounded_to_pow2",
        "7. GROUP rounded up to a power of two (a group of 3 reads the wrong KV heads)",
        "GROUP=group,",
        "GROUP=next_pow2(group),",
    ),
    # The caches share strides in every other case: only a V laid out unlike K shows the copied line.
    Mutant(
        "v_strides_taken_from_k",
        "20. V read through K's strides: the launch passes k_cache.stride() for V",
        "kv_args += v_cache.stride()[:3]",
        "kv_args += k_cache.stride()[:3]",
    ),
    Mutant(
        "head_dim_tile_capped_at_128",
        "21. the feature tile capped at 128: D = 256 is read and written half",
        "PAGE=PAGE,\n        D=D,\n        BLOCK_N=BLOCK_N,",
        "PAGE=PAGE,\n        D=min(D, 128),\n        BLOCK_N=BLOCK_N,",
    ),
    # Only a context that fills every column of its row is at the bound.
    Mutant(
        "guard_excludes_a_full_row",
        "22. a full table row taken for an overflow: the guard's bound ctx < max_pages * PAGE",
        "ctx_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)",
        "ctx_ok = (ctx >= 0) & (ctx < max_pages * PAGE)",
    ),
    Mutant(
        "lse_stored_unasked",
        "23. lse stored whatever WRITE_LSE says: unsplit, it lands on out",
        "    if WRITE_LSE:\n        tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + split, lse, mask=g_mask)",
        "    tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + split, lse, mask=g_mask)",
    ),
    Mutant(
        "merge_stores_lse_unasked",
        "23. the split merge stores lse whatever WRITE_LSE says: split without return_lse, it lands on out",
        '    if WRITE_LSE:\n        lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
        '    if True:\n        lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
    ),
    Mutant(
        "merge_lanes_past_the_splits_weigh_e0",
        "14. the merge tile's lanes past the last split read as lse 0, not -inf",
        'mask=s_mask, other=float("-inf")\n        )  # [BLOCK_S]',
        "mask=s_mask, other=0.0\n        )  # [BLOCK_S]",
    ),
    Mutant(
        "merge_states_both_empty_nan",
        "13. merge_states measures from a max of -inf when both parts are empty",
        'm_safe = tl.where(m == float("-inf"), 0.0, m)',
        "m_safe = m",
    ),
    Mutant(
        "split_ends_at_the_page_end",
        "8. a split ends at the end of ctx's page: the stale tail of the last page is read",
        "end = tl.minimum(start + chunk, ctx)",
        "end = tl.minimum(start + chunk, (ctx + PAGE - 1) // PAGE * PAGE)",
    ),
    Mutant(
        "plan_counts_sequences_not_programs",
        "24. the planner divides by the sequences, not by the B x Hkv programs",
        "num_splits = max(1, (4 * num_sms) // (len(lens) * num_kv_heads))",
        "num_splits = max(1, (4 * num_sms) // len(lens))",
    ),
    Mutant(
        "plan_ignores_num_sms",
        "25. the planner aims at the H200's 132 SMs whatever num_sms says",
        "num_splits = max(1, (4 * num_sms) // (len(lens) * num_kv_heads))",
        "num_splits = max(1, (4 * H200_SMS) // (len(lens) * num_kv_heads))",
    ),
    Mutant(
        "plan_two_programs_per_sm",
        "25. the planner aims at two programs per SM, not four",
        "num_splits = max(1, (4 * num_sms) // (len(lens) * num_kv_heads))",
        "num_splits = max(1, (2 * num_sms) // (len(lens) * num_kv_heads))",
    ),
    Mutant(
        "plan_without_min_chunk",
        "25. the planner's chunks not held to MIN_CHUNK tokens",
        "num_splits, max(1, triton.cdiv(max_len, MIN_CHUNK))",
        "num_splits, max(1, triton.cdiv(max_len, BLOCK_N))",
    ),
    Mutant(
        "plan_min_chunk_cuts_a_forced_count",
        "25. MIN_CHUNK applied to a forced split count too",
        "    num_splits = min(num_splits, max_tiles)\n",
        "    num_splits = min(num_splits, max_tiles, max(1, triton.cdiv(max_len, MIN_CHUNK)))\n",
    ),
    Mutant(
        "every_split_lse_in_slot_0",
        "27. the split index left out of the partial lse's address: every split stores in slot 0",
        "tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + split, lse, mask=g_mask)",
        "tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh, lse, mask=g_mask)",
    ),
    Mutant(
        "merge_states_rows_counted_as_shape0",
        "28. merge_states made for [R, D]: the rows counted as o_a.shape[0], not every row of [..., D]",
        "    R = lse_a.numel()\n",
        "    R = o_a.shape[0]\n",
    ),
    Mutant(
        "group_pad_fixed_at_16",
        "7. GROUP_PAD fixed at 16: heads 16 and up of a wider group are never computed or stored",
        "GROUP_PAD=max(16, next_pow2(group)),",
        "GROUP_PAD=16,",
    ),
    Mutant(
        "merge_states_grid_rounded_down",
        "29. merge_states' grid rounded down: the last R % BLOCK_R rows are never merged",
        "merge_states_kernel[(triton.cdiv(R, BLOCK_R),)](",
        "merge_states_kernel[(max(1, R // BLOCK_R),)](",
    ),
    Mutant(
        "plan_cut_by_the_shortest",
        "25. the planner caps the splits by the shortest sequence's tiles, not the longest's",
        "    num_splits = min(num_splits, max_tiles)\n",
        "    num_splits = min(num_splits, max(1, triton.cdiv(min(lens), BLOCK_N)))\n",
    ),
    Mutant(
        "q_padding_rows_loaded",
        "26. q's padding rows (GROUP .. GROUP_PAD - 1) loaded without the group mask",
        "q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],\n        mask=g_mask[:, None],\n        other=0.0,",
        "q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],",
    ),
    Mutant(
        "merged_lse_unmasked",
        "30. a kept guard's merged lse not masked where the row saw nothing",
        'lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
        "lse_out = m + tl.log(w_sum)",
    ),
    Mutant(
        "merge_max_from_one_tile",
        "31. the split merge's max taken from each tile alone, not kept across tiles",
        "m_new = tl.maximum(m, tl.max(lse, axis=0))",
        "m_new = tl.zeros([1], dtype=tl.float32) + tl.max(lse, axis=0)",
    ),
    Mutant(
        "split_max_from_one_tile",
        "32. the split's running max taken from each key tile alone, not kept across tiles",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "m_new = tl.max(s, axis=1)",
    ),
    Mutant(
        "padding_rows_stored",
        "33. the split's output stored for all GROUP_PAD rows, not only the GROUP heads",
        "tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])",
        "tl.store(o_rows, o.to(o_ptr.dtype.element_ty))",
    ),
    Mutant(
        "plan_kept_for_the_buffer",
        "34. plan=None reuses the plan made for the same context_lens buffer at an earlier call",
        "        plan = _make_plan(context_lens, Hkv, PAGE)\n",
        "        key = (context_lens.data_ptr(), B, Hkv, PAGE)\n"
        "        try:\n"
        "            kept = DecodePlan.kept\n"
        "        except AttributeError:\n"
        "            kept = DecodePlan.kept = {}\n"
        "        if key not in kept:\n"
        "            kept[key] = _make_plan(context_lens, Hkv, PAGE)\n"
        "        plan = kept[key]\n",
    ),
    Mutant(
        "padding_batch_planned_zero_splits",
        "35. the splits counted again without the floor of 1: a batch of padding sequences gets 0",
        "num_splits=max(1, triton.cdiv(max_len, chunk))",
        "num_splits=triton.cdiv(max_len, chunk)",
    ),
    Mutant(
        "score_dot_in_fp16",
        "18. a dtype written into the kernel: q and K cast to tl.float16 for the score dot",
        "s = tl.dot(q, tl.trans(k)) * qk_scale",
        "s = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16))) * qk_scale",
    ),
]
