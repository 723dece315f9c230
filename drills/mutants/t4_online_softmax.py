"""T4 mutants: the online-softmax and merge mistakes of explainer section 5, one entry each."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "rescale_dropped",
        "1. the old sum is not rescaled (alpha = 1)",
        "alpha = tl.exp(m - m_ref)",
        "alpha = 1.0",
    ),
    Mutant(
        "rescale_without_exp",
        "2. l accumulated with the shift itself, not its exponential",
        "alpha = tl.exp(m - m_ref)",
        "alpha = m - m_ref",
    ),
    Mutant(
        "rescale_sign_flipped",
        "2. the rescale is exp(m_new - m_old)",
        "alpha = tl.exp(m - m_ref)",
        "alpha = tl.exp(m_ref - m)",
    ),
    Mutant(
        "terms_not_shifted",
        "3. exp(x) summed without subtracting the max",
        "l = l * alpha + tl.sum(tl.exp(x - m_ref), axis=0)",
        "l = l * alpha + tl.sum(tl.exp(x), axis=0)",
    ),
    Mutant(
        "max_not_updated", "4. the running max is never updated", "        m = m_new\n", "        m = m\n"
    ),
    Mutant(
        "m_initialised_to_zero",
        "5. the first block mishandled: m starts at 0, not -inf",
        'm = tl.full([], float("-inf"), tl.float32)',
        "m = tl.full([], 0.0, tl.float32)",
    ),
    Mutant(
        "minus_inf_not_guarded",
        "6. -inf - (-inf) while the row has shown only -inf",
        'm_ref = tl.where(m_new == float("-inf"), 0.0, m_new)',
        "m_ref = m_new",
    ),
    Mutant(
        "padding_lanes_read_zero",
        "7. lanes past the row's end read 0 instead of -inf",
        'x = tl.load(x_row + cols, mask=cols < hi, other=float("-inf"))',
        "x = tl.load(x_row + cols, mask=cols < hi, other=0.0)",
    ),
    Mutant(
        "last_block_unmasked",
        "7. the last block read without a mask",
        'x = tl.load(x_row + cols, mask=cols < hi, other=float("-inf"))',
        "x = tl.load(x_row + cols)",
    ),
    # The store is masked, so every state comes out right: only the loads past the states show it.
    Mutant(
        "merge_loads_unmasked",
        "7. the merge's last tile of states loaded without the mask",
        'm_a = tl.load(m_a_ptr + offs, mask=mask, other=float("-inf"))',
        "m_a = tl.load(m_a_ptr + offs)",
    ),
    Mutant(
        "merge_without_max_shift",
        "8. merge adds the sums without rescaling to the common max",
        "l = l_a * tl.exp(m_a - shift) + l_b * tl.exp(m_b - shift)",
        "l = l_a + l_b",
    ),
    Mutant(
        "merge_keeps_first_max",
        "8. merge keeps a's max instead of the larger one",
        "m = tl.maximum(m_a, m_b)",
        "m = m_a",
    ),
    Mutant(
        "merge_empty_states_nan",
        "9. two empty states merged through -inf - (-inf)",
        'shift = tl.where(m == float("-inf"), 0.0, m)',
        "shift = m",
    ),
    Mutant(
        "normalised_with_partial_state",
        "10. p written with a state from before the row is finished",
        "return _launch_normalize(x, m, l, out, block, splits)",
        "return _launch_normalize(x, m_part[0], l_part[0], out, block, splits)",
    ),
    Mutant(
        "not_divided_by_l",
        "11. p = exp(x - m), never divided by l",
        "p = tl.exp(x - m_row) * inv_l",
        "p = tl.exp(x - m_row)",
    ),
    Mutant(
        "empty_row_divides_by_zero",
        "6. a row of only -inf gets 0 * (1 / 0) = NaN",
        "inv_l = 1.0 / tl.maximum(l_row, 1.0)",
        "inv_l = 1.0 / l_row",
    ),
    Mutant(
        "store_past_row_end",
        "12. p stored without the mask at the row's end",
        "p.to(out_ptr.dtype.element_ty), mask=cols < hi)",
        "p.to(out_ptr.dtype.element_ty))",
    ),
    Mutant(
        "merge_through_exp_of_m",
        "13. merge weights each l by e^m, then divides by e^(max)",
        "l = l_a * tl.exp(m_a - shift) + l_b * tl.exp(m_b - shift)",
        "l = (l_a * tl.exp(m_a) + l_b * tl.exp(m_b)) / tl.exp(shift)",
    ),
    Mutant(
        "x_rows_assumed_contiguous",
        "14. x's rows assumed N elements apart (stride_xm ignored)",
        "x_row = x_ptr + row * stride_xm",
        "x_row = x_ptr + row * N",
    ),
    Mutant(
        "out_rows_assumed_contiguous",
        "14. out's rows assumed N elements apart (stride_om ignored)",
        "tl.store(out_ptr + row * stride_om + cols",
        "tl.store(out_ptr + row * N + cols",
    ),
    Mutant(
        "stats_row_offset_int32",
        "15. the row index left int32 in the statistics pass",
        "row = tl.program_id(0).to(tl.int64)\n    split = tl.program_id(1)",
        "row = tl.program_id(0)\n    split = tl.program_id(1)",
    ),
    Mutant(
        "normalize_row_offset_int32",
        "15. the row index left int32 in the pass that writes p",
        "row = tl.program_id(0).to(tl.int64)\n    lo = tl.program_id(1) * cols_per_split",
        "row = tl.program_id(0)\n    lo = tl.program_id(1) * cols_per_split",
    ),
    Mutant(
        "out_stored_as_fp16",
        "16. a dtype written into the kernel: p stored as tl.float16, not as out's element type",
        "p.to(out_ptr.dtype.element_ty)",
        "p.to(tl.float16)",
    ),
    Mutant(
        "merge_launched_as_one_program",
        "17. the merge launched as one program: only the first tile of states is merged",
        "merge_stats_kernel[(triton.cdiv(n, 1024),)]",
        "merge_stats_kernel[(1,)]",
    ),
    # Every check with one split passes: only several splits leave columns of out unwritten.
    Mutant(
        "normalize_launched_for_one_split",
        "18. the second pass launched for one split ((M, 1)): columns past the first split never written",
        "softmax_normalize_kernel[(M, splits)](",
        "softmax_normalize_kernel[(M, 1)](",
    ),
    # Right for every split count up to 16: only the 1024 splits the launcher admits show it.
    Mutant(
        "merge_rounds_fixed_at_four",
        "19. splits merged by a fixed four halvings (right up to 16 splits)",
        "while m_part.shape[0] > 1:",
        # log2(splits) halvings (splits is a power of two), but never more than four: one line, so that
        # the edit holds whatever the solution's indentation.
        "for _ in range(min(4, (m_part.shape[0] - 1).bit_length())):",
    ),
    # Splits that hold a column are right: only more splits than the row has blocks leave m unwritten.
    Mutant(
        "empty_split_stores_no_max",
        "20. an empty split leaves its max unwritten",
        "tl.store(m_ptr + split * M + row, m)",
        "tl.store(m_ptr + split * M + row, m, mask=lo < N)",
    ),
    # The merge's store unmasked (its loads masked): every state right, the store past n reported.
    Mutant(
        "merge_store_unmasked",
        "7. the merge's last tile of states stored without the mask",
        "tl.store(l_ptr + offs, l, mask=mask)",
        "tl.store(l_ptr + offs, l)",
    ),
    # Guarded on a's max alone: two empty states and an empty b are right; an empty a is not.
    Mutant(
        "merge_guard_on_one_max",
        "9. the merge's shift guarded on one state's max, not the merged one",
        'shift = tl.where(m == float("-inf"), 0.0, m)',
        'shift = tl.where(m_a == float("-inf"), 0.0, m)',
    ),
    # softmax_stats runs one program a row whatever splits says: right numbers, no split at all.
    Mutant(
        "splits_ignored",
        "21. the splits argument ignored: one program per row",
        "return _merge_splits(*_launch_stats(x, block, splits))",
        "return _merge_splits(*_launch_stats(x, block, 1))",
    ),
    Mutant(
        "rescale_in_base_2",
        "22. the rescale taken as 2^(m_old - m_new) (tl.exp2 where e^z belongs)",
        "alpha = tl.exp(m - m_ref)",
        "alpha = tl.exp2(m - m_ref)",
    ),
    Mutant(
        "merge_in_base_2",
        "22. the merge's weights taken as 2^(m - max) (tl.exp2 where e^z belongs)",
        "l = l_a * tl.exp(m_a - shift) + l_b * tl.exp(m_b - shift)",
        "l = l_a * tl.exp2(m_a - shift) + l_b * tl.exp2(m_b - shift)",
    ),
    Mutant(
        "p_in_base_2",
        "22. p taken as 2^(x - m) / l (tl.exp2 where e^z belongs)",
        "p = tl.exp(x - m_row) * inv_l",
        "p = tl.exp2(x - m_row) * inv_l",
    ),
    # Neighbouring splits paired through strided views, which the merge kernel reads as flat arrays.
    Mutant(
        "merge_of_strided_neighbours",
        "23. splits 2i and 2i + 1 merged as strided views (read flat, they pair the wrong splits)",
        "_launch_merge(m_part[:half], l_part[:half], m_part[half:], l_part[half:])",
        "_launch_merge(m_part[0::2], l_part[0::2], m_part[1::2], l_part[1::2])",
    ),
    # The states counted along the first dimension: every flat array merges right.
    Mutant(
        "merge_counts_first_dim",
        "17. the merge's n taken as m_a.shape[0], not the number of states",
        "n = m_a.numel()",
        "n = m_a.shape[0]",
    ),
    # Right for one row or one split: only several of each show the transposed layout.
    Mutant(
        "partial_states_stored_row_major",
        "24. partial states stored at [row, split], read by the merge at [split, row]",
        "    tl.store(m_ptr + split * M + row, m)\n    tl.store(l_ptr + split * M + row, l)",
        "    tl.store(m_ptr + row * tl.num_programs(1) + split, m)\n    tl.store(l_ptr + row * tl.num_programs(1) + split, l)",
    ),
    # Every one-row trace is right: only several rows with a partial last block show the overlap.
    Mutant(
        "trace_rows_counted_with_floor",
        "25. the trace's row offset counted as row * (N // BLOCK), not row * cdiv(N, BLOCK)",
        "step = row * tl.cdiv(N, BLOCK) + start // BLOCK",
        "step = row * (N // BLOCK) + start // BLOCK",
    ),
]
