"""L2 mutants: one per pitfall of explainer section 5 (pitfall 9 has two: q's strides and the cache's)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "interleaved_grouping",
        "1. interleaved head grouping (kvh + g * Hkv)",
        "q_heads = kvh * GROUP + offs_g",
        "q_heads = kvh + offs_g * tl.num_programs(1)",
    ),
    Mutant("unmasked_last_page", "2. no mask on the last page", "t_mask = tok < ctx ", "t_mask = tok >= 0 "),
    Mutant(
        "masked_scores_not_minus_inf",
        "3. masked keys scored 0 instead of -inf",
        's = tl.where(t_mask[None, :], s, float("-inf"))',
        "s = s",
    ),
    Mutant(
        "page_index_int32",
        "4. page index left int32",
        "phys = tl.load(block_tables_ptr + b * stride_bt + p).to(tl.int64)",
        "phys = tl.load(block_tables_ptr + b * stride_bt + p)",
    ),
    Mutant(
        "padding_rows_stored",
        "5. padding rows written back",
        "out.to(out_ptr.dtype.element_ty),\n        mask=g_mask[:, None],",
        "out.to(out_ptr.dtype.element_ty),",
    ),
    # Rows past Hq are masked, so no store leaves `out`, but each group's padding rows land on the next
    # group's heads: in program order the next program repairs them, in any other order it does not.
    Mutant(
        "padding_rows_over_next_group",
        "5. padding rows stored over the next group's heads",
        "out.to(out_ptr.dtype.element_ty),\n        mask=g_mask[:, None],",
        "out.to(out_ptr.dtype.element_ty),\n        mask=(q_heads < tl.num_programs(1) * GROUP)[:, None],",
    ),
    Mutant(
        "rescale_dropped",
        "6. missing rescale (alpha = 1)",
        "alpha = tl.exp(m_i - m_new)",
        "alpha = tl.full([GROUP_PAD], 1.0, dtype=tl.float32)",
    ),
    Mutant(
        "no_normalisation",
        "7. no final normalisation by l",
        "out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]",
        "out = acc",
    ),
    Mutant(
        "scale_missing",
        "8. scale forgotten",
        "s = tl.dot(q, tl.trans(k)) * scale",
        "s = tl.dot(q, tl.trans(k))",
    ),
    Mutant(
        "q_assumed_contiguous",
        "9. q's head stride taken as D",
        "q_ptr + b * stride_qb + q_heads[:, None] * stride_qh",
        "q_ptr + b * stride_qb + q_heads[:, None] * D",
    ),
    Mutant(
        "cache_assumed_contiguous",
        "9. the cache's head stride taken as D",
        "offs_t[:, None] * stride_kt + kvh * stride_kh",
        "offs_t[:, None] * stride_kt + kvh * D",
    ),
    Mutant(
        "out_through_q_strides",
        "9. out written through q's strides",
        "out_ptr + b * stride_ob + q_heads[:, None] * stride_oh",
        "out_ptr + b * stride_qb + q_heads[:, None] * stride_qh",
    ),
    Mutant(
        "out_head_stride_assumed_d",
        "9. out's head stride taken as D",
        "out_ptr + b * stride_ob + q_heads[:, None] * stride_oh",
        "out_ptr + b * stride_ob + q_heads[:, None] * D",
    ),
    Mutant(
        "table_row_stride_assumed",
        "9. the block table's row stride taken as its width",
        "phys = tl.load(block_tables_ptr + b * stride_bt + p).to(tl.int64)",
        "phys = tl.load(block_tables_ptr + b * max_pages + p).to(tl.int64)",
    ),
    Mutant(
        "heads_counted_by_group_pad",
        "1. a group's heads counted from kvh * GROUP_PAD (the padded size)",
        "q_heads = kvh * GROUP + offs_g",
        "q_heads = kvh * GROUP_PAD + offs_g",
    ),
    Mutant(
        "max_starts_at_zero",
        "10. running max initialised to 0",
        'm_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)',
        "m_i = tl.zeros([GROUP_PAD], dtype=tl.float32)",
    ),
    Mutant(
        "one_max_per_group",
        "11. one max shared by the heads of a group",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "m_new = tl.maximum(m_i, tl.max(tl.max(s, axis=1), axis=0))",
    ),
    # The max over the wrong axis: per key over the group's heads, [PAGE] where [GROUP_PAD] belongs (the
    # same shape when PAGE = 16). A tail key's column is -inf, so its row's max is too, and NaN follows.
    Mutant(
        "max_over_the_keys_axis",
        "11. running max taken over the group's heads per key (axis=0), not per head",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "m_new = tl.maximum(m_i, tl.max(s, axis=0))",
    ),
    Mutant(
        "q_load_unmasked",
        "12. q loaded without a mask (padding rows read past q)",
        "q_heads[:, None] * stride_qh + offs_d[None, :],\n        mask=g_mask[:, None],\n        other=0.0,\n    )",
        "q_heads[:, None] * stride_qh + offs_d[None, :],\n    )",
    ),
    Mutant(
        "v_load_without_other",
        "13. V load masked without other=",
        "kvh * stride_vh + offs_d[None, :],\n            mask=t_mask[:, None],\n            other=0.0,",
        "kvh * stride_vh + offs_d[None, :],\n            mask=t_mask[:, None],",
    ),
    Mutant(
        "p_not_cast_for_dot", "14. p left fp32 in tl.dot(p, v)", "tl.dot(p_.to(v.dtype), v)", "tl.dot(p_, v)"
    ),
    Mutant(
        "padding_sequence_zero_over_zero",
        "15. a padding sequence (ctx = 0) divides 0 by 0",
        "out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]",
        "out = acc / l_i[:, None]",
    ),
    Mutant(
        "rescale_on_l_only",
        "6. the rescale applied to l but not to acc",
        "acc = acc * alpha[:, None] + tl.dot(p_.to(v.dtype), v)",
        "acc = acc + tl.dot(p_.to(v.dtype), v)",
    ),
    Mutant(
        "pages_counted_rounding_down",
        "16. pages counted rounding down (the last, partly filled page never read)",
        "num_pages = tl.cdiv(ctx, PAGE)",
        "num_pages = ctx // PAGE",
    ),
    Mutant(
        "pages_counted_plus_one",
        "16. pages counted ctx // PAGE + 1 (one too many when the last page is full)",
        "num_pages = tl.cdiv(ctx, PAGE)",
        "num_pages = ctx // PAGE + 1",
    ),
    Mutant(
        "sequence_index_int32",
        "17. the sequence index left int32 (b * stride_qb overflows)",
        "b = tl.program_id(0).to(tl.int64)",
        "b = tl.program_id(0)",
    ),
    Mutant(
        "v_through_k_strides",
        "9. V loaded through K's strides (the caches' strides assumed equal)",
        "v_cache_ptr + phys * stride_vb + offs_t[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],",
        "v_cache_ptr + phys * stride_kb + offs_t[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],",
    ),
    # Right for every power-of-two group: only GROUP = 3 (Hq = 9, Hkv = 3) reads the wrong KV heads.
    Mutant(
        "group_rounded_to_pow2",
        "1. GROUP rounded up to a power of two (KV head 1 of a group of 3 takes query heads 4-7)",
        "GROUP=group,",
        "GROUP=next_pow2(group),",
    ),
    # Exact for fp16 and for every bf16 value inside fp16's range: only outputs past 65504 show it.
    Mutant(
        "out_cast_to_fp16",
        "18. a dtype written into the kernel: out stored as tl.float16, not as out's element type",
        "out.to(out_ptr.dtype.element_ty),",
        "out.to(tl.float16),",
    ),
    # Every other case has D <= 128: only the widest admitted head dim shows the lost half.
    Mutant(
        "head_dim_tile_capped_at_128",
        "19. the feature tile capped at 128: D = 256 is read and written half",
        "D=D,",
        "D=min(D, 128),",
    ),
    # Every group up to 16 fits the 16-row tile: only GROUP = 24 and 32 lose their last heads.
    Mutant(
        "group_pad_fixed_at_16",
        "20. GROUP_PAD fixed at 16: a group of 24 or 32 loses its heads past 16",
        "GROUP_PAD=max(16, next_pow2(group)),",
        "GROUP_PAD=16,",
    ),
    # Right for every group up to 32 (24 and the MQA cases of 32 included): only GROUP = 71 shows it.
    Mutant(
        "group_pad_fixed_at_32",
        "20. GROUP_PAD fixed at 32: a group of 71 (Falcon-7B) loses its heads past 32",
        "GROUP_PAD=max(16, next_pow2(group)),",
        "GROUP_PAD=32,",
    ),
    # Only a context that fills every column of its row is at the bound.
    Mutant(
        "guard_excludes_a_full_row",
        "21. a full table row taken for an overflow: the guard's bound ctx < max_pages * PAGE",
        "ctx_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)",
        "ctx_ok = (ctx >= 0) & (ctx < max_pages * PAGE)",
    ),
    # b widened for q's row only: only a block table or an out whose rows lie far apart shows it.
    Mutant(
        "table_row_offset_int32",
        "17. the sequence index left int32 (b * stride_bt overflows)",
        "phys = tl.load(block_tables_ptr + b * stride_bt + p).to(tl.int64)",
        "phys = tl.load(block_tables_ptr + b.to(tl.int32) * stride_bt + p).to(tl.int64)",
    ),
    Mutant(
        "out_row_offset_int32",
        "17. the sequence index left int32 (b * stride_ob overflows)",
        "out_ptr + b * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :],",
        "out_ptr + b.to(tl.int32) * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :],",
    ),
    Mutant(
        "kv_head_index_int32",
        "22. the KV head index left int32 (kvh * stride_kh overflows)",
        "kvh = tl.program_id(1).to(tl.int64)",
        "kvh = tl.program_id(1)",
    ),
    Mutant(
        "page_tile_capped_at_64",
        "23. the page tile capped at 64 slots: tokens 64-127 of a 128-token page get no weight",
        "t_mask = tok < ctx",
        "t_mask = (tok < ctx) & (offs_t < 64)",
    ),
    Mutant(
        "v_block_stride_of_k",
        "9. V's block found through K's block stride (phys * stride_kb in V's address line)",
        "v_cache_ptr + phys * stride_vb",
        "v_cache_ptr + phys * stride_kb",
    ),
    Mutant(
        "exp2_without_log2e",
        "8. tl.exp2 where tl.exp belongs: the scores' scale off by ln 2",
        "alpha = tl.exp(m_i - m_new)\n        p_ = tl.exp(s - m_new[:, None])",
        "alpha = tl.exp2(m_i - m_new)\n        p_ = tl.exp2(s - m_new[:, None])",
    ),
    Mutant(
        "alpha_natural_on_base2_scores",
        "6. scores in base 2 (scaled by log2(e) for tl.exp2) rescaled by a natural alpha",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))\n        alpha = tl.exp(m_i - m_new)\n"
        "        p_ = tl.exp(s - m_new[:, None])",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1) * 1.4426950408889634)\n        alpha = tl.exp(m_i - m_new)\n"
        "        p_ = tl.exp2(s * 1.4426950408889634 - m_new[:, None])",
    ),
    Mutant(
        "running_max_of_raw_scores",
        "24. the running max taken of the raw scores q . k, the exponent of the scaled ones",
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "m_new = tl.maximum(m_i, tl.max(s / scale, axis=1))",
    ),
]
