"""F2 mutants: one per pitfall of explainer section 5 (pitfall 5 has two: the merge's base and the
stages' lse base)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "suffix_starts_at_zero",
        "1. the prefix counted twice: every suffix starts at token 0",
        "start = tl.where(row_ok, plen, 0)",
        "start = tl.where(row_ok, plen * 0, 0)",
    ),
    Mutant(
        "suffix_starts_at_prefix_pages",
        "2. the suffix started at the wrong page: prefix_lens // PAGE used as a token index",
        "start = tl.where(row_ok, plen, 0)",
        "start = tl.where(row_ok, plen // PAGE, 0)",
    ),
    Mutant(
        "prefix_len_not_checked_against_page",
        "3. a prefix length that is not a page multiple accepted",
        "if n < 0 or n % page_size:",
        "if n < 0:",
    ),
    Mutant(
        "groups_of_one_left_out",
        "4. groups of one member get no tile",
        "    for g, m in sorted(members.items()):\n",
        "    for g, m in sorted((g, m) for g, m in members.items() if len(m) > 1):\n",
    ),
    Mutant(
        "merge_weights_in_base_2",
        "5. the merge weighs natural-log lse in base 2",
        "w = tl.exp(lse - m_ref)",
        "w = tl.exp2(lse - m_ref)",
    ),
    Mutant(
        "stage_lse_in_base_2",
        "5. the stages store lse in base 2 (no ln 2)",
        "(m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453",
        "(m_i + tl.log2(tl.where(seen, l_i, 1.0)))",
    ),
    Mutant(
        "tiles_mix_groups",
        "6. rows of different groups mixed in one tile: the batch's grouped sequences cut in order",
        "    for g, m in sorted(members.items()):\n",
        "    for g, m in [(min(members), [b for b, x in enumerate(groups) if x >= 0])]:\n",
    ),
    Mutant(
        "rows_mapped_to_wrong_heads",
        "7. rows mapped to the wrong heads: the head taken from r // members_per_tile",
        "head = kvh * GROUP + offs_r % GROUP  #",
        "head = kvh * GROUP + (offs_r // MEMBERS) % GROUP  #",
    ),
    Mutant(
        "padded_rows_not_masked",
        "8. the tile's padded rows not masked: a -1 member is read and written",
        "r_mask = (offs_r < MEMBERS * GROUP) & (seq >= 0) & (seq < B)",
        "r_mask = offs_r < MEMBERS * GROUP",
    ),
    Mutant(
        "prefix_chunks_overlap",
        "9. prefix chunks that overlap: every chunk reads to the prefix's end",
        "end = tl.minimum(start + chunk, plen)",
        "end = plen",
    ),
    Mutant(
        "empty_part_zero_over_zero",
        "10. an empty part divides 0 by 0",
        "o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)",
        "o = acc / l_i[:, None]",
    ),
    Mutant(
        "merge_reads_prefix_slots_of_ungrouped",
        "11. the merge reads prefix slots for a sequence in no group, which no stage wrote",
        "s_mask = (slot < num_slots) & (slot >= first_slot)",
        "s_mask = slot < num_slots",
    ),
    Mutant(
        "table_row_stride_assumed",
        "12. the table's row stride assumed: the prefix tile steps rows by max_pages",
        "block_tables_ptr + first * stride_bt,",
        "block_tables_ptr + first * max_pages,",
    ),
    Mutant(
        "members_per_tile_zero_for_wide_groups",
        "13. a GQA group wider than a tile: MAX_ROWS // GROUP rounds down to 0 members per tile",
        "mt = members_per_tile or max(1, MAX_ROWS // group_size)",
        "mt = members_per_tile or MAX_ROWS // group_size",
    ),
    Mutant(
        "saved_counts_every_member",
        "14. every member counted as a saving: the one read of each prefix forgotten",
        "saved = sum((len(m) - 1) * plens[g] for g, m in members.items())",
        "saved = sum(len(m) * plens[g] for g, m in members.items())",
    ),
    Mutant(
        "merge_rescale_in_base_2",
        "5. one exponential of the merge in base 2: the running sum rescaled by exp2",
        "alpha = tl.exp(m - m_ref)",
        "alpha = tl.exp2(m - m_ref)",
    ),
    # The caches share strides in every other case: only a V laid out unlike K shows the copied line.
    Mutant(
        "v_strides_taken_from_k",
        "15. V read through K's strides: the launch passes k_cache.stride() for V",
        "kv_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])",
        "kv_strides = (*k_cache.stride()[:3], *k_cache.stride()[:3])",
    ),
    Mutant(
        "head_dim_tile_capped_at_128",
        "16. the feature tile capped at 128: D = 256 is read and written half",
        "common = dict(PAGE=PAGE, D=D, BLOCK_N=BLOCK_N)",
        "common = dict(PAGE=PAGE, D=min(D, 128), BLOCK_N=BLOCK_N)",
    ),
    Mutant(
        "suffix_sequence_index_int32",
        "17. the sequence index left int32 in the suffix stage (b * stride_qb overflows)",
        "b = tl.program_id(0).to(tl.int64)\n    kvh = tl.program_id(1).to(tl.int64)",
        "b = tl.program_id(0)\n    kvh = tl.program_id(1).to(tl.int64)",
    ),
    Mutant(
        "prefix_member_index_int32",
        "17. the tile's member index left int32 in the prefix stage (b * stride_qb overflows)",
        "b = tl.where(r_mask, seq, 0).to(tl.int64)",
        "b = tl.where(r_mask, seq, 0)",
    ),
    # Only the PAGE < 16 path gathers one block id per token: the PAGE = 16 case cannot see it.
    Mutant(
        "gathered_block_ids_int32",
        "17. block ids gathered token by token left int32 (PAGE < 16)",
        "phys = tl.load(bt_row + tok // PAGE, mask=t_mask, other=0).to(tl.int64)",
        "phys = tl.load(bt_row + tok // PAGE, mask=t_mask, other=0)",
    ),
    Mutant(
        "empty_prefix_gets_no_tile",
        "18. a group whose prefix is 0 tokens gets no tile: the merge reads its members' unwritten slots",
        "    for g, m in sorted(members.items()):\n",
        "    for g, m in sorted((g, m) for g, m in members.items() if plens[g] > 0):\n",
    ),
    Mutant(
        "prefix_table_row_of_the_group",
        "19. the prefix tile reads the shared pages from row g, not from its first member's row",
        "block_tables_ptr + first * stride_bt,",
        "block_tables_ptr + g * stride_bt,",
    ),
    Mutant(
        "no_group_reads_the_last_prefix",
        "20. a sequence in no group given the last group's prefix length (prefix_lens[-1])",
        "plen = tl.load(prefix_lens_ptr + g, mask=g_ok & (g >= 0), other=0)",
        "plen = tl.load(prefix_lens_ptr + (g + G) % G, mask=g_ok, other=0)",
    ),
    # Only a context that fills every column of its row is at the bound.
    Mutant(
        "guard_excludes_a_full_row",
        "21. a full table row taken for an overflow: the suffix guard's bound ctx < max_pages * PAGE",
        "row_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)",
        "row_ok = (ctx >= 0) & (ctx < max_pages * PAGE)",
    ),
    Mutant(
        "lse_stored_unasked",
        "22. the suffix stage stores lse whatever WRITE_LSE says: unsplit without a prefix, it lands on out",
        "    if WRITE_LSE:\n        tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + first_slot + split, lse, mask=g_mask)",
        "    tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + first_slot + split, lse, mask=g_mask)",
    ),
    Mutant(
        "merge_stores_lse_unasked",
        "22. the merge stores lse whatever WRITE_LSE says: a cascade without return_lse, it lands on out",
        '    if WRITE_LSE:\n        lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
        '    if True:\n        lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
    ),
    Mutant(
        "max_starts_at_zero",
        "23. the running max of a stage's tiles starts at 0, not -inf",
        'm_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)',
        "m_i = tl.zeros([ROWS], dtype=tl.float32)",
    ),
    Mutant(
        "suffix_starts_on_a_tile_edge",
        "2. the suffix started on the tile edge before the prefix's end (plen rounded down to BLOCK_N)",
        "        start = tl.where(row_ok, plen, 0)\n",
        "        start = tl.where(row_ok, plen // BLOCK_N * BLOCK_N, 0)\n",
    ),
    Mutant(
        "cascade_without_a_min_chunk_prefix",
        "24. the planner cascades on the saving alone, a prefix shorter than MIN_CHUNK too",
        "cascade = wide and saved >= CASCADE_SHARE * sum(lens)",
        "cascade = saved >= CASCADE_SHARE * sum(lens)",
    ),
    Mutant(
        "merge_states_refuses_the_widest_head_dim",
        "16. merge_states made for D up to 128: it refuses D = 256, which the lesson admits",
        "if not (validate.is_pow2(D) and D <= 256):",
        "if not (validate.is_pow2(D) and D <= 128):",
    ),
    Mutant(
        "suffix_lse_stored_from_slot_0",
        "26. the suffix stage stores split s's lse at slot s, over the prefix's, not at first_slot + s",
        "tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + first_slot + split, lse, mask=g_mask)",
        "tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + split, lse, mask=g_mask)",
    ),
    Mutant(
        "cascade_share_compared_strictly",
        "24. the planner cascades only above three quarters, not at exactly three quarters",
        "cascade = wide and saved >= CASCADE_SHARE * sum(lens)",
        "cascade = wide and saved > CASCADE_SHARE * sum(lens)",
    ),
    Mutant(
        "min_chunk_prefix_compared_strictly",
        "24. the planner wants a prefix longer than MIN_CHUNK, not at least MIN_CHUNK",
        "wide = any(len(m) > 1 and plens[g] >= MIN_CHUNK for g, m in members.items())",
        "wide = any(len(m) > 1 and plens[g] > MIN_CHUNK for g, m in members.items())",
    ),
    Mutant(
        "members_per_tile_not_capped",
        "24. members_per_tile not capped at the largest group",
        "    mt = min(mt, max(len(m) for m in members.values()))\n",
        "",
    ),
    Mutant(
        "prefix_stage_four_programs_per_sm",
        "24. the prefix stage cut for four programs per SM, as the suffix stage",
        "per_sm=PREFIX_PER_SM,",
        "per_sm=4,",
    ),
    Mutant(
        "suffix_stage_cut_for_the_tiles",
        "24. the suffix stage cut for tiles x Hkv programs, not B x Hkv",
        "s_count, s_chunk = _split(max_suffix, len(lens) * num_kv_heads",
        "s_count, s_chunk = _split(max_suffix, len(tiles) * num_kv_heads",
    ),
    Mutant(
        "tiles_padded_with_sequence_0",
        "8. the planner pads a group's last tile with 0 (sequence 0) instead of -1",
        "[-1] * (mt - len(m[i : i + mt]))",
        "[0] * (mt - len(m[i : i + mt]))",
    ),
    Mutant(
        "longest_suffix_from_the_longest_context",
        "25. the longest suffix taken as max(context_lens) - max(prefix_lens)",
        "max_suffix = max(n - s for n, s in zip(lens, starts))",
        "max_suffix = max(0, max(lens) - max_prefix)",
    ),
    Mutant(
        "pages_of_8_read_as_one_page",
        "27. small pages read as one page: one block id per tile from PAGE = 8",
        "if PAGE >= BLOCK_N:\n            phys = tl.load(bt_row + t0 // PAGE).to(tl.int64) + tl.zeros",
        "if PAGE >= 8:\n            phys = tl.load(bt_row + t0 // PAGE).to(tl.int64) + tl.zeros",
    ),
    Mutant(
        "tile_width_taken_as_16",
        "27. the tile's width taken as 16 keys: one block id per tile from PAGE = 16, where the prefix tile is wider",
        "if PAGE >= BLOCK_N:\n            phys = tl.load(bt_row + t0 // PAGE).to(tl.int64) + tl.zeros",
        "if PAGE >= 16:\n            phys = tl.load(bt_row + t0 // PAGE).to(tl.int64) + tl.zeros",
    ),
    Mutant(
        "pv_product_in_fp16",
        "28. a dtype written into the kernel: p and V narrowed to fp16 for the P V product",
        "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
        "acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))",
    ),
    Mutant(
        "prefix_chunk_runs_past_the_prefix",
        "9. a prefix chunk not cut at the prefix's end: it reads the first member's own tokens",
        "end = tl.minimum(start + chunk, plen)",
        "end = start + chunk",
    ),
    Mutant(
        "group_0_taken_for_no_group",
        "29. group 0 taken for no group: the merge reads prefix slots where prefix_group[b] > 0",
        "first_slot = tl.where(tl.load(prefix_group_ptr + b) >= 0, 0, num_prefix)",
        "first_slot = tl.where(tl.load(prefix_group_ptr + b) > 0, 0, num_prefix)",
    ),
    Mutant(
        "merge_sum_not_rescaled",
        "5. the merge's running sum not rescaled when a later tile of slots raises the max",
        "w_sum = w_sum * alpha + tl.sum(w, axis=0)",
        "w_sum = w_sum + tl.sum(w, axis=0)",
    ),
    Mutant(
        "wide_prefix_of_a_lone_member",
        "24. rule 1's MIN_CHUNK prefix taken from a group of one member",
        "wide = any(len(m) > 1 and plens[g] >= MIN_CHUNK for g, m in members.items())",
        "wide = any(plens[g] >= MIN_CHUNK for g, m in members.items())",
    ),
    Mutant(
        "members_per_tile_capped_at_every_member",
        "24. members_per_tile capped at every grouped sequence, not at the largest group",
        "mt = min(mt, max(len(m) for m in members.values()))",
        "mt = min(mt, sum(len(m) for m in members.values()))",
    ),
    Mutant(
        "tile_seqs_loaded_for_every_row",
        "8. the tile's padded rows not masked: tile_seqs loaded unmasked for all ROWS rows",
        "seq = tl.load(tile_seqs_ptr + t * MEMBERS + member, mask=offs_r < MEMBERS * GROUP, other=-1)",
        "seq = tl.load(tile_seqs_ptr + t * MEMBERS + member)",
    ),
    Mutant(
        "running_max_from_one_tile",
        "30. the running max taken from each key tile alone, not kept across tiles",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "m_new = tl.max(s, axis=1)",
    ),
    Mutant(
        "prefix_len_of_the_tile",
        "31. the prefix kernel reads prefix_lens[t] for tile t, not its group's",
        "plen = tl.load(prefix_lens_ptr + g, mask=(g >= 0) & (g < G), other=-1)",
        "plen = tl.load(prefix_lens_ptr + t, mask=t < G, other=0)",
    ),
    Mutant(
        "suffix_splits_from_token_0",
        "32. suffix splits cut from token 0 and clipped to start after the prefix",
        "    s0 = start + split * chunk\n    o, lse, bad_page, bad_id = _attend_tiles(\n        q,\n        k_cache_ptr,\n"
        "        v_cache_ptr,\n        block_tables_ptr + b * stride_bt,\n        kvh,\n        s0,\n"
        "        tl.minimum(s0 + chunk, ctx),",
        "    s0 = tl.maximum(start, split * chunk)\n    o, lse, bad_page, bad_id = _attend_tiles(\n        q,\n"
        "        k_cache_ptr,\n        v_cache_ptr,\n        block_tables_ptr + b * stride_bt,\n        kvh,\n"
        "        s0,\n        tl.minimum(split * chunk + chunk, ctx),",
    ),
    Mutant(
        "max_prefix_of_every_group",
        "33. the plan's max_prefix taken over every group, memberless ones included",
        "    max_prefix = max(plens[g] for g in members)\n",
        "    max_prefix = max(plens)\n",
    ),
    Mutant(
        "fallback_told_to_cascade",
        "34. the suffix stage told to cascade in a plan that does not",
        "CASCADE=cplan.cascade",
        "CASCADE=True",
    ),
    Mutant(
        "saved_share_as_a_ratio",
        "35. rule 1's saved share computed as a ratio, dividing by the batch's token count",
        "        cascade = wide and saved >= CASCADE_SHARE * sum(lens)\n",
        "        share = saved / sum(lens)\n        cascade = wide and share >= CASCADE_SHARE\n",
    ),
    Mutant(
        "merge_max_of_one_tile",
        "36. the merge's running max taken from each tile of slots alone",
        "m_new = tl.maximum(m, tl.max(lse, axis=0))",
        "m_new = tl.max(lse, axis=0) + tl.zeros([1], dtype=tl.float32)",
    ),
    Mutant(
        "tiles_cut_from_runs",
        "37. tiles cut from runs of consecutive sequences of a group, not from the group's members",
        "    for g, m in sorted(members.items()):\n        for i in range(0, len(m), mt):\n"
        "            tiles.append(m[i : i + mt] + [-1] * (mt - len(m[i : i + mt])))\n            tile_group.append(g)\n",
        "    for b, g in enumerate(groups):\n        if g < 0:\n            continue\n"
        "        if tiles and tile_group[-1] == g and -1 in tiles[-1] and groups[b - 1] == g:\n"
        "            tiles[-1][tiles[-1].index(-1)] = b\n        else:\n"
        "            tiles.append([b] + [-1] * (mt - 1))\n            tile_group.append(g)\n",
    ),
    # Right wherever a row's first tile of slots holds a part: two empty parts and a padding row see it.
    Mutant(
        "merge_max_unguarded_while_empty",
        "10. the merge's weights measured from a max of -inf while every slot read is empty (NaN)",
        'm_ref = tl.where(m_new == float("-inf"), 0.0, m_new)',
        "m_ref = m_new",
    ),
    # Only the 65-slot checks have a second tile of slots.
    Mutant(
        "merge_reads_one_tile_of_slots",
        "36. the merge reads its first tile of slots only, no loop over the rest",
        "for s0 in range(0, num_slots, BLOCK_S):",
        "for s0 in range(0, BLOCK_S, BLOCK_S):",
    ),
    # The empty prefix passes: only a chunk that starts inside a prefix and runs past it shows it.
    Mutant(
        "prefix_chunk_cut_only_past_the_prefix",
        "9. the chunks past the prefix skipped, but the last one not cut at the prefix's end",
        "end = tl.minimum(start + chunk, plen)",
        "end = tl.where(start < plen, start + chunk, start)",
    ),
    # Right wherever every range is one whole tile (the 65-slot checks).
    Mutant(
        "tail_keys_scored_0",
        "38. a key tile's tail keys masked to a score of 0 instead of -inf",
        's = tl.where(t_mask[None, :], s, float("-inf"))',
        "s = tl.where(t_mask[None, :], s, 0.0)",
    ),
    Mutant(
        "score_dot_in_fp16",
        "28. a dtype written into the kernel: q and K cast to tl.float16 for the score dot",
        "s = tl.dot(q, tl.trans(k)) * qk_scale",
        "s = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16))) * qk_scale",
    ),
]
