"""L5 mutants: one per pitfall of explainer section 5 (the window's bounds, the band of a tile, the sink in
the numerator, once per split, in lse, a window counted in the chunk, and tiles before the band read)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "window_off_by_one",
        "1. a window off by one (j >= p - window: window + 1 keys)",
        "seen = seen & (cols[None, :] > win_start[:, None])",
        "seen = seen & (cols[None, :] >= win_start[:, None])",
    ),
    Mutant(
        "band_of_the_first_row",
        "2. the band's unmasked stretch computed for the tile's first row only",
        "full_lo = tl.cdiv(tl.maximum(band_hi - window, 0), BLOCK_N) * BLOCK_N",
        "full_lo = tl.cdiv(tl.maximum(prefix + tok0 + 1 - window, 0), BLOCK_N) * BLOCK_N",
    ),
    Mutant(
        "full_lo_rounded_down",
        "2. the band's unmasked stretch rounded down into the window's first tile",
        "full_lo = tl.cdiv(tl.maximum(band_hi - window, 0), BLOCK_N) * BLOCK_N",
        "full_lo = tl.maximum(band_hi - window, 0) // BLOCK_N * BLOCK_N",
    ),
    Mutant(
        "sink_in_the_numerator",
        "3. the sink added to the numerator (a key of value one)",
        "acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)",
        "acc = tl.zeros([BLOCK_M, D], dtype=tl.float32) + l_i[:, None]",
    ),
    Mutant(
        "sink_in_every_split",
        "4. the sink counted once per split of the band instead of once per row",
        "m_sink = tl.where(split == 0, sink, m_sink)",
        "m_sink = tl.where(split >= 0, sink, m_sink)",
    ),
    Mutant(
        "lse_without_the_sink",
        "5. lse without the sink",
        'lse = tl.where(seen, (m_i + tl.math.log2(l_div)) * 0.6931471805599453, float("-inf"))',
        "lse = tl.where(seen, (m_i + tl.math.log2(l_div - tl.math.exp2(m_sink - m_i))) * 0.6931471805599453, "
        'float("-inf"))',
    ),
    Mutant(
        "window_from_the_chunk",
        "6. the window counted from the token's index in its chunk, not its position",
        "win_start = pos - window",
        "win_start = tok - window",
    ),
    Mutant(
        "tiles_before_the_band_read",
        "7. tiles before the band loaded and masked (the loop starts at key 0)",
        "band_lo = tl.maximum(prefix + tok0 - window + 1, 0) // BLOCK_N * BLOCK_N",
        "band_lo = tl.maximum(prefix + tok0 - window + 1, 0) * 0",
    ),
    # Only a context that fills every column of its row is at the bound.
    Mutant(
        "guard_excludes_a_full_row",
        "8. a full table row taken for an overflow: the guard's bound ctx < max_pages * PAGE",
        "ctx_ok = (ctx >= q_len) & (ctx <= max_pages * PAGE)",
        "ctx_ok = (ctx >= q_len) & (ctx < max_pages * PAGE)",
    ),
    Mutant(
        "sink_in_natural_units",
        "9. the sink's logit left in natural units",
        "sink = tl.load(sinks_ptr + heads) * 1.4426950408889634",
        "sink = tl.load(sinks_ptr + heads)",
    ),
    Mutant(
        "sink_read_at_the_kv_head",
        "10. a sink read at the KV head",
        "sink = tl.load(sinks_ptr + heads) * 1.4426950408889634",
        "sink = tl.load(sinks_ptr + kvh) * 1.4426950408889634",
    ),
    Mutant(
        "sink_only_sets_the_max",
        "11. a sink that sets the max and not the sum",
        'l_i = tl.where(m_sink > float("-inf"), 1.0, 0.0)  # [BLOCK_M]',
        "l_i = tl.zeros([BLOCK_M], dtype=tl.float32)",
    ),
    Mutant(
        "window_bound_overflows",
        "12. a window bound that overflows int32 (j + window > p)",
        "seen = seen & (cols[None, :] > win_start[:, None])",
        "seen = seen & (cols[None, :] + (pos - win_start)[:, None] > pos[:, None])",
    ),
    Mutant(
        "merge_reads_one_tile_of_splits",
        "13. a merge that reads one tile of splits",
        "for s0 in range(0, num_splits, BLOCK_S):",
        "for s0 in range(0, BLOCK_S, BLOCK_S):",
    ),
    Mutant(
        "planner_counts_padding_rows",
        "14. a planner that counts what no program reads (padding rows as decode rows)",
        "bands = [min(n, window or n) for n, q in zip(lens, q_lens) if q == 1]",
        "bands = [min(n, window or n) for n, q in zip(lens, q_lens) if q <= 1]",
    ),
    Mutant(
        "planner_band_is_the_window",
        "14. a planner that counts what no program reads (a window past the context as the band)",
        "bands = [min(n, window or n) for n, q in zip(lens, q_lens) if q == 1]",
        "bands = [(window or n) for n, q in zip(lens, q_lens) if q == 1]",
    ),
    Mutant(
        "merge_in_base_2",
        "15. splits weighed in the wrong base",
        "alpha = tl.exp(m - m_ref)\n        w = tl.exp(lse - m_ref)",
        "alpha = tl.exp2(m - m_ref)\n        w = tl.exp2(lse - m_ref)",
    ),
    Mutant(
        "full_end_from_the_last_row",
        "2. a band computed for one row of the tile (full_end from the last row)",
        "full_end = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N",
        "full_end = (prefix + tok0 + BLOCK_Q) // BLOCK_N * BLOCK_N",
    ),
    Mutant(
        "unseen_row_measured_from_minus_inf",
        "16. a row that has seen no key measured from -inf",
        'm_ref = tl.where(m_new == float("-inf"), 0.0, m_new)\n    p = tl.math.exp2(',
        "m_ref = m_new\n    p = tl.math.exp2(",
    ),
    Mutant(
        "sink_scaled_like_a_score",
        "17. a sink scaled like a score",
        "sink = tl.load(sinks_ptr + heads) * 1.4426950408889634",
        "sink = tl.load(sinks_ptr + heads) * scale * 1.4426950408889634",
    ),
    Mutant(
        "sinks_read_as_if_contiguous",
        "18. sinks read as if contiguous",
        "sinks=None if sinks is None else sinks.contiguous(),",
        "sinks=sinks,",
    ),
    Mutant(
        "sequence_search_of_eight_halvings",
        "19. a sequence search of a fixed number of halvings",
        "    while hi - lo > 1:\n",
        "    for _ in range(8):\n",
    ),
    Mutant(
        "merge_rescale_in_base_2",
        "15. splits weighed in the wrong base (weights in e, the rescale between tiles of splits in 2)",
        "alpha = tl.exp(m - m_ref)",
        "alpha = tl.exp2(m - m_ref)",
    ),
    Mutant(
        "head_index_int32",
        "20. an index left int32: the head index (kvh * stride_kh overflows)",
        "head0 = (pid % head_groups).to(tl.int64) * HEADS",
        "head0 = (pid % head_groups) * HEADS",
    ),
    Mutant(
        "sequence_index_int32",
        "20. an index left int32: the sequence index (b * stride_bt overflows)",
        "b = lo.to(tl.int64)",
        "b = lo",
    ),
    Mutant(
        "out_row_index_int32",
        "20. an index left int32: the packed row index in the store (row * stride_ot overflows)",
        "q_rows[:, None] * stride_ot",
        "(q_start + tok)[:, None] * stride_ot",
    ),
    Mutant(
        "window_narrows_the_loop_only",
        "21. a window that narrows the key loop and masks nothing",
        "            seen = seen & (cols[None, :] > win_start[:, None])\n",
        "            seen = seen & (cols[None, :] > -1)\n",
    ),
    Mutant(
        "padding_tiles_not_skipped",
        "22. spare tiles not skipped: a q_len = 0 sequence's tile reads its garbage table row",
        "    if tok0 >= q_len:\n        return",
        "    if (tok0 >= q_len) & (q_len > 0):\n        return",
    ),
    Mutant(
        "band_lo_not_clamped",
        "23. a band that starts before key 0 (band_lo not clamped at 0)",
        "band_lo = tl.maximum(prefix + tok0 - window + 1, 0) // BLOCK_N * BLOCK_N",
        "band_lo = (prefix + tok0 - window + 1) // BLOCK_N * BLOCK_N",
    ),
    Mutant(
        "shares_counted_from_key_0",
        "24. a share of the band counted from key 0 (s0 = split * per, band_lo left out)",
        "s0 = band_lo + split * per",
        "s0 = split * per",
    ),
    Mutant(
        "band_lo_rounded_up",
        "25. the band's start rounded up to a tile: the window's first keys before it never read",
        "band_lo = tl.maximum(prefix + tok0 - window + 1, 0) // BLOCK_N * BLOCK_N",
        "band_lo = tl.cdiv(tl.maximum(prefix + tok0 - window + 1, 0), BLOCK_N) * BLOCK_N",
    ),
    Mutant(
        "lse_left_in_base_2",
        "26. lse left in base 2: m + log2(l) stored without the factor ln 2",
        'lse = tl.where(seen, (m_i + tl.math.log2(l_div)) * 0.6931471805599453, float("-inf"))',
        'lse = tl.where(seen, m_i + tl.math.log2(l_div), float("-inf"))',
    ),
    Mutant(
        "window_of_the_tile",
        "2. every row's window counted back from its tile's first row",
        "win_start = pos - window",
        "win_start = pos * 0 + (prefix + tok0) - window",
    ),
    Mutant(
        "share_not_whole_tiles",
        "27. a share of the band that is not a whole number of tiles",
        "per = tl.cdiv(tl.cdiv(band_hi - band_lo, BLOCK_N), num_splits) * BLOCK_N",
        "per = tl.cdiv(band_hi - band_lo, num_splits)",
    ),
    Mutant(
        "merge_row_int32",
        "20. an index left int32 (the merge's row, from its own program id)",
        "pid = tl.program_id(0).to(tl.int64)\n    row = pid // num_heads",
        "pid = tl.program_id(0)\n    row = pid // num_heads",
    ),
    Mutant(
        "empty_split_zero_over_zero",
        "28. an empty split that stores 0 / 0",
        "out = acc / l_div[:, None]",
        "out = acc / l_i[:, None]",
    ),
    Mutant(
        "merged_lse_in_base_2",
        "26. lse left in base 2 (the merge's: m + log2 of the weights' sum)",
        'lse_out = tl.where(seen, m + tl.log(w_div), float("-inf"))',
        'lse_out = tl.where(seen, m + tl.log2(w_div), float("-inf"))',
    ),
    Mutant(
        "merge_max_starts_at_zero",
        "29. a merge whose running max starts at 0",
        'm = tl.full([1], float("-inf"), dtype=tl.float32)\n    w_sum = tl.zeros([1], dtype=tl.float32)',
        "m = tl.zeros([1], dtype=tl.float32)\n    w_sum = tl.zeros([1], dtype=tl.float32)",
    ),
]
