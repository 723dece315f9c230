"""T5 mutants: the mistakes of explainer section 5 (causal alignment, masks, the online softmax, exp2 and
lse, strides, grouping, empty rows, offsets, dtypes)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "causal_off_by_one",
        "1. causal mask off by one (j < i + Nk - Nq)",
        "cols[None, :] <= offs_m[:, None] + causal_shift",
        "cols[None, :] < offs_m[:, None] + causal_shift",
    ),
    Mutant(
        "causal_top_left",
        "2. causal aligned to the top left (j <= i)",
        "causal_shift = Nk - Nq",
        "causal_shift = 0",
    ),
    Mutant(
        "diagonal_blocks_unmasked",
        "3. blocks that cross the diagonal treated as fully visible",
        "tl.maximum(m0 + causal_shift + 1, 0)",
        "tl.maximum(m0 + causal_shift + BLOCK_M, 0)",
    ),
    Mutant(
        "diagonal_one_key_late",
        "3. the unmasked loop runs one key past the first row's diagonal (m0 + shift + 2)",
        "tl.maximum(m0 + causal_shift + 1, 0)",
        "tl.maximum(m0 + causal_shift + 2, 0)",
    ),
    Mutant(
        "masked_loop_one_key_short",
        "3. the masked loop stops one key before the last row's diagonal",
        "tl.maximum(m0 + BLOCK_M + causal_shift, 0)",
        "tl.maximum(m0 + BLOCK_M + causal_shift - 1, 0)",
    ),
    Mutant(
        "causal_loop_to_the_end",
        "22. every key block visited, the causal mask doing the rest (hi = Nk)",
        "hi = tl.minimum(Nk, tl.maximum(m0 + BLOCK_M + causal_shift, 0))",
        "hi = Nk",
    ),
    Mutant(
        "max_of_this_block_only",
        "23. the running max taken from the current key block alone (m_i left out of m_new)",
        "m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # [BLOCK_M]",
        "m_new = tl.max(s, 1) * qk_scale  # [BLOCK_M]",
    ),
    Mutant(
        "last_key_block_unmasked",
        "4. the last key block read and scored unmasked",
        "in_range = cols < Nk",
        "in_range = cols >= 0",
    ),
    Mutant(
        "rescale_dropped",
        "5. online softmax without the rescale (alpha = 1)",
        "alpha = tl.math.exp2(m_i - m_ref)",
        "alpha = tl.math.exp2(m_ref - m_ref)",
    ),
    Mutant("no_final_normalisation", "5. no final division by l", "out = acc / l_safe[:, None]", "out = acc"),
    Mutant(
        "scale_missing",
        "6. softmax scale forgotten (only log2(e) folded in)",
        "qk_scale = scale * 1.4426950408889634",
        "qk_scale = 1.4426950408889634",
    ),
    Mutant(
        "scale_after_the_softmax",
        "6. the scale applied to the output, after the softmax",
        "out = acc / l_safe[:, None]  # [BLOCK_M, D]",
        "out = acc / l_safe[:, None] * scale  # [BLOCK_M, D]",
    ),
    Mutant(
        "log2e_missing",
        "6. exp2 used without folding log2(e) into the scale",
        "qk_scale = scale * 1.4426950408889634",
        "qk_scale = scale",
    ),
    Mutant(
        "lse_base_2",
        "6. lse returned in base 2",
        "lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453",
        "lse = m_i + tl.math.log2(l_safe)",
    ),
    Mutant(
        "k_strides_swapped",
        "7. K read untransposed (its two strides swapped)",
        "offs_d[:, None] + offs_n[None, :] * stride_kn",
        "offs_d[:, None] * stride_kn + offs_n[None, :]",
    ),
    Mutant(
        "interleaved_grouping",
        "8. interleaved KV head grouping (h % Hkv)",
        "kvh = h // GROUP",
        "kvh = h % (H // GROUP)",
    ),
    # Right for every power-of-two group: only GROUP = 3 reads the wrong KV heads.
    Mutant(
        "group_rounded_to_pow2",
        "8. GROUP rounded up to a power of two (query heads 3-5 of H = 6, Hkv = 2 read the wrong KV head)",
        "GROUP=H // Hkv,",
        "GROUP=triton.next_power_of_2(H // Hkv),",
    ),
    Mutant(
        "empty_rows_divide_by_zero",
        "9. a row that sees no key divides 0 by 0",
        "l_safe = tl.where(l_i == 0.0, 1.0, l_i)",
        "l_safe = l_i",
    ),
    Mutant(
        "empty_rows_inf_minus_inf",
        "9. a row that sees no key computes -inf - (-inf)",
        'm_ref = tl.where(m_new == float("-inf"), 0.0, m_new)',
        "m_ref = m_new",
    ),
    Mutant(
        "rows_past_nq_stored",
        "10. rows past Nq of the last query block stored",
        "out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None]",
        "out.to(out_ptr.dtype.element_ty)",
    ),
    Mutant(
        "acc_not_rescaled", "5. acc not rescaled by alpha (l is)", "acc = acc * alpha[:, None]", "acc = acc"
    ),
    Mutant(
        "m_initialised_to_zero",
        "11. the running max starts at 0, not -inf",
        'm_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)',
        "m_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)",
    ),
    Mutant(
        "q_assumed_contiguous",
        "12. q addressed as a contiguous [B, H, Nq, D] tensor (its strides ignored)",
        "q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]",
        "q_ptr + (b * H + h) * Nq * D + offs_m[:, None] * D + offs_d[None, :]",
    ),
    Mutant(
        "k_rows_assumed_d_apart",
        "12. K's rows assumed D elements apart (stride_kn ignored in the tile)",
        "offs_d[:, None] + offs_n[None, :] * stride_kn",
        "offs_d[:, None] + offs_n[None, :] * D",
    ),
    Mutant(
        "q_load_unmasked",
        "13. q loaded without a mask (rows past Nq read)",
        "mask=row_ok[:, None], other=0.0)  # [BLOCK_M, D]",
        ")  # [BLOCK_M, D]",
    ),
    Mutant(
        "one_tile",
        "14. one tile for every key (BLOCK_N = next_pow2(Nk), the config ignored)",
        "    BLOCK_M, BLOCK_N, num_warps, num_stages = config or _config(D)\n",
        "    BLOCK_M, BLOCK_N, num_warps, num_stages = config or _config(D)\n"
        "    BLOCK_N = max(16, triton.next_power_of_2(Nk))  # one tile holds every key: a plain softmax\n",
    ),
    Mutant(
        "causal_shift_clamped",
        "15. a negative causal shift (Nq > Nk) clamped to 0",
        "causal_shift = Nk - Nq  #",
        "causal_shift = tl.maximum(Nk - Nq, 0)  #",
    ),
    Mutant(
        "full_end_not_clipped",
        "15. full_end not clipped at 0: a negative shift starts the masked loop before key 0",
        "full_end = tl.maximum(m0 + causal_shift + 1, 0) // BLOCK_N * BLOCK_N",
        "full_end = (m0 + causal_shift + 1) // BLOCK_N * BLOCK_N",
    ),
    Mutant(
        "batch_offset_int32",
        "16. the batch index left int32 (b * stride_qb wraps past 2**31)",
        "b = (pid_bh // H).to(tl.int64)",
        "b = pid_bh // H",
    ),
    Mutant(
        "head_offset_int32",
        "16. the head index left int32 (h * stride_qh wraps past 2**31)",
        "h = (pid_bh % H).to(tl.int64)",
        "h = pid_bh % H",
    ),
    Mutant(
        "p_cast_to_fp16",
        "17. p cast to tl.float16 before P V, not to v's dtype",
        "acc = tl.dot(p.to(v.dtype), v, acc)",
        "acc = tl.dot(p.to(tl.float16), v, acc)",
    ),
    Mutant(
        "out_stored_as_fp16",
        "17. out cast to tl.float16 before the store, not to out's element type",
        "out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None]",
        "out.to(tl.float16), mask=row_ok[:, None]",
    ),
    # The grid of Triton's tutorial (and of this course's reference before): one edit cannot also make
    # the kernel read pid_bh from axis 1, so heads past the first stay unwritten and other checks fail
    # too; the grid check must still name the mistake first.
    Mutant(
        "batch_heads_on_grid_axis_1",
        "18. (batch, head) on grid axis 1 (past 65535 a GPU refuses the launch)",
        "grid = (triton.cdiv(Nq, BLOCK_M) * B * H,)",
        "grid = (triton.cdiv(Nq, BLOCK_M), B * H)",
    ),
    Mutant(
        "grid_clamped_to_65535",
        "18. the grid clamped to 65535 programs (the (batch, head) pairs past them never computed)",
        "grid = (triton.cdiv(Nq, BLOCK_M) * B * H,)",
        "grid = (min(triton.cdiv(Nq, BLOCK_M) * B * H, 65535),)",
    ),
    Mutant(
        "v_walked_with_k_strides",
        "19. V walked with K's strides",
        "v_ptrs = v_ptr + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]",
        "v_ptrs = v_ptr + b * stride_kb + kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]",
    ),
    # Only the batch stride copied: the head and row strides of V are its own, so only a V whose batches
    # lie apart unlike K's shows it.
    Mutant(
        "v_batch_stride_from_k",
        "19. V's batch stride taken from K",
        "v_ptrs = v_ptr + b * stride_vb + kvh * stride_vh",
        "v_ptrs = v_ptr + b * stride_kb + kvh * stride_vh",
    ),
    Mutant(
        "head_dim_tile_capped_at_128",
        "20. the feature tile capped at 128: D = 256 is read and stored half",
        "D=D,",
        "D=min(D, 128),",
    ),
    # Batches and heads widened, rows not: only views whose tokens lie 2**30 elements apart show it.
    Mutant(
        "row_strides_left_int32",
        "16. row offsets left int32 (token index times stride_qm or stride_kn wraps past 2**31)",
        "ROWS_INT64=rows_int64,",
        "ROWS_INT64=False,",
    ),
    # The launcher's int64 decision read from q's row stride alone: only K and V far apart show it.
    Mutant(
        "rows_int64_from_q_alone",
        "16. row offsets left int32 (token index times stride_qm or stride_kn wraps past 2**31)",
        "max(q.stride(2), k.stride(2), v.stride(2), out.stride(2))",
        "max(q.stride(2), out.stride(2))",
    ),
    # The other way round, decided from K's and V's row strides alone: only q far apart shows it.
    Mutant(
        "rows_int64_from_k_and_v_alone",
        "16. row offsets left int32 (token index times stride_qm or stride_kn wraps past 2**31)",
        "max(q.stride(2), k.stride(2), v.stride(2), out.stride(2))",
        "max(k.stride(2), v.stride(2))",
    ),
    # The scores are masked after the dot: only a K with nothing after its last key shows the load.
    Mutant(
        "k_tail_loaded_unmasked",
        "4. the last key block's K loaded without a mask (its scores masked after)",
        "kt = tl.load(kt_ptrs + start_n * stride_kn, mask=in_range[None, :], other=0.0)",
        "kt = tl.load(kt_ptrs + start_n * stride_kn)",
    ),
    # Decided from the operands the kernel reads, not the one it writes: only an out view whose rows
    # lie far apart (given to _launch) shows it, its store wrapping before the tensor.
    Mutant(
        "rows_int64_without_out",
        "16. row offsets left int32 for out (ROWS_INT64 decided from q, K and V alone)",
        "max(q.stride(2), k.stride(2), v.stride(2), out.stride(2))",
        "max(q.stride(2), k.stride(2), v.stride(2))",
    ),
    # The twin of diagonal_blocks_unmasked: the masked loop stops at the FIRST row's last key, so when
    # BLOCK_M > BLOCK_N the block's later rows never see the key blocks past it.
    Mutant(
        "causal_hi_from_first_row",
        "3. the masked loop's end hi taken from the block's first row (later rows miss their keys)",
        "hi = tl.minimum(Nk, tl.maximum(m0 + BLOCK_M + causal_shift, 0))",
        "hi = tl.minimum(Nk, tl.maximum(m0 + 1 + causal_shift, 0))",
    ),
    # out is right (0) for a row that sees no key; only its lse says 0 where -inf belongs.
    Mutant(
        "empty_rows_lse_zero",
        "9. a row that sees no key gets lse 0, not -inf",
        "lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453",
        "lse = (tl.where(l_i == 0.0, 0.0, m_i) + tl.math.log2(l_safe)) * 0.6931471805599453",
    ),
    # The scaled running max compared with a raw row max, then scaled again: harmless while scores are
    # above 0, and far below them the shift drifts above every score, as a max started at 0 does.
    Mutant(
        "max_compared_with_raw_scores",
        "11. the running max compared with unscaled scores (max(m_i, max(s)) * qk_scale)",
        "m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)",
        "m_new = tl.maximum(m_i, tl.max(s, 1)) * qk_scale",
    ),
    # Bases mixed in one place: m and p in base 2, the rescale through e.
    Mutant(
        "alpha_natural_exp",
        "5. the rescale taken as e^(m_old - m_new) of base-2 maxes (tl.exp where exp2 belongs)",
        "alpha = tl.math.exp2(m_i - m_ref)",
        "alpha = tl.exp(m_i - m_ref)",
    ),
    # The default scale from the query count, not the head dim: every explicit scale is right.
    Mutant(
        "default_scale_from_nq",
        "6. the default scale taken as 1 / sqrt(Nq), not 1 / sqrt(D)",
        "scale = 1.0 / math.sqrt(q.shape[-1])",
        "scale = 1.0 / math.sqrt(q.shape[2])",
    ),
    Mutant(
        "lse_through_out_head_stride",
        "21. lse stored through out's head stride (a copy-paste of the out arguments)",
        "0 if lse is None else lse.stride(1)",
        "0 if lse is None else out.stride(1)",
    ),
    Mutant(
        "score_dot_in_fp16",
        "17. a dtype written into the kernel: q and K^T cast to tl.float16 for the score dot",
        "s = tl.dot(q, kt)",
        "s = tl.dot(q.to(tl.float16), kt.to(tl.float16))",
    ),
]
