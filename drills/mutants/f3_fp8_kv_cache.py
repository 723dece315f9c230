"""F3 mutants: one per pitfall of the explainer's section 6, each a classic mistake of an e4m3 cache."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "k_scale_divides",
        "1. dividing where the rule multiplies",
        "qk = qk_scale * k_scale",
        "qk = qk_scale / k_scale",
    ),
    Mutant(
        "no_clamp_before_the_cast",
        "2. no clamp before the cast",
        "v = tl.minimum(tl.maximum(v, -448.0), 448.0)",
        "v = v",
    ),
    Mutant(
        "v_scale_in_the_softmax_scale",
        "3. v_scale folded into the softmax scale",
        "qk = qk_scale * k_scale\n    o_scale = v_scale",
        "qk = qk_scale * k_scale * v_scale\n    o_scale = 1.0",
    ),
    Mutant(
        "k_scale_after_the_softmax",
        "4. the scale applied after the softmax to K",
        "qk = qk_scale * k_scale\n    o_scale = v_scale",
        "qk = qk_scale\n    o_scale = v_scale * k_scale",
    ),
    Mutant(
        "scale_indexed_by_query_head",
        "5. a per-head scale not read at the program's KV head",
        "k_scale = tl.load(k_scale_ptr + kvh * stride_ks)\n    v_scale = tl.load(v_scale_ptr + kvh * stride_vs)",
        "k_scale = tl.load(k_scale_ptr + kvh * GROUP * stride_ks)\n"
        "    v_scale = tl.load(v_scale_ptr + kvh * GROUP * stride_vs)",
    ),
    Mutant(
        "v_scale_read_at_head_zero",
        "5. a per-head scale not read at the program's KV head",
        "v_scale = tl.load(v_scale_ptr + kvh * stride_vs)",
        "v_scale = tl.load(v_scale_ptr)",
    ),
    Mutant(
        "cast_truncates",
        "6. a cast that truncates instead of rounding",
        "normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & 0xFFF00000",
        "normal = mag & 0xFFF00000",
    ),
    Mutant(
        "e4m3fnuz_range",
        "7. e4m3fnuz assumed",
        "v = tl.minimum(tl.maximum(v, -448.0), 448.0)",
        "v = tl.minimum(tl.maximum(v, -240.0), 240.0)",
    ),
    Mutant(
        "dot_in_fp8",
        "8. the dot computed in fp8 against fp16 q",
        "s = tl.dot(q, tl.trans(k)) * qk",
        "s = tl.dot(q.to(tl.float8e4nv), tl.trans(k.to(tl.float8e4nv))).to(tl.float32) * qk",
    ),
    # Only a context that fills every column of its row is at the bound.
    Mutant(
        "guard_excludes_a_full_row",
        "9. a full table row taken for an overflow: the guard's bound ctx < max_pages * PAGE",
        "ctx_ok = (ctx >= 0) & (ctx <= max_pages * PAGE)",
        "ctx_ok = (ctx >= 0) & (ctx < max_pages * PAGE)",
    ),
    Mutant(
        "store_slot_narrowed_to_int32",
        "10. the store's offsets in int32 (the slot narrowed: block * stride(0))",
        "slot = tl.load(slot_mapping_ptr + i)  # int64, so every product below is int64 too",
        "slot = tl.load(slot_mapping_ptr + i).to(tl.int32)",
    ),
    Mutant(
        "store_row_index_int32",
        "10. the store's offsets in int32 (the row index: i * stride(0))",
        "i = tl.program_id(0).to(tl.int64)\n    slot = tl.load(slot_mapping_ptr + i)",
        "i = tl.program_id(0)\n    slot = tl.load(slot_mapping_ptr + i)",
    ),
    Mutant(
        "lse_in_base_2",
        "11. lse in base 2",
        'lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))',
        'lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))',
    ),
    Mutant(
        "keys_past_the_context_scored_zero",
        "12. keys past the context scored 0 instead of -inf",
        's = tl.where(t_mask[None, :], s, float("-inf"))',
        "s = s",
    ),
    Mutant(
        "small_pages_read_as_one",
        "13. small pages read as one page",
        "if PAGE >= BLOCK_N:",
        "if PAGE >= 1:",
    ),
    Mutant(
        "ties_away_from_zero",
        "14. ties rounded away from zero",
        "normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & 0xFFF00000",
        "normal = (mag + 0x80000) & 0xFFF00000",
    ),
    Mutant(
        "store_value_read_through_key_strides",
        "15. strides taken from another tensor, or assumed (the store's value read through key's)",
        "v = tl.load(value_ptr + i * stride_vn + offs_h[:, None] * stride_vh",
        "v = tl.load(value_ptr + i * stride_kn + offs_h[:, None] * stride_kh",
    ),
    Mutant(
        "store_cache_taken_as_contiguous",
        "15. strides taken from another tensor, or assumed (the store's block as PAGE token strides)",
        "dst = block * stride_cb + offset * stride_ct",
        "dst = slot * stride_ct",
    ),
    Mutant(
        "decode_cache_taken_as_contiguous",
        "15. strides taken from another tensor, or assumed (the decode's block as PAGE token strides)",
        "row = phys * stride_kb + (tok % PAGE) * stride_kt  # [BLOCK_N]",
        "row = (phys * PAGE + tok % PAGE) * stride_kt  # [BLOCK_N]",
    ),
    Mutant(
        "store_multiplies_by_the_reciprocal",
        "16. a division by multiplying with the reciprocal",
        "v = tl.math.div_rn(x, scale)",
        "v = x * (1.0 / scale)",
    ),
    Mutant(
        "split_end_not_cut_at_the_context",
        "12. keys past the context scored 0 instead of -inf (a split's end past the context)",
        "end = tl.minimum(start + chunk, ctx)",
        "end = start + chunk",
    ),
    Mutant(
        "k_dequantized_in_q_dtype",
        "17. k dequantized in q's dtype before the dot",
        "s = tl.dot(q, tl.trans(k)) * qk",
        "s = tl.dot(q, tl.trans((k.to(tl.float32) * k_scale).to(q.dtype))) * qk_scale",
    ),
    Mutant(
        "subnormal_step_from_2_to_the_minus_7",
        "18. subnormal codes rounded by another step",
        "r = tl.where(a < 0.015625, small, normal) | sign",
        "r = tl.where(a < 0.0078125, small, normal) | sign",
    ),
    Mutant(
        "bf16_rows_narrowed_to_fp16",
        "19. bf16 rows narrowed to fp16 before the division",
        "k8 = round_to_e4m3(k.to(tl.float32), ks[:, None])",
        "k8 = round_to_e4m3(k.to(tl.float16).to(tl.float32), ks[:, None])",
    ),
    Mutant(
        "ties_toward_zero",
        "14. ties rounded toward zero: 0x7FFFF added without the kept last bit",
        "normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & 0xFFF00000",
        "normal = (mag + 0x7FFFF) & 0xFFF00000",
    ),
    Mutant(
        "k_scale_folded_into_q",
        "17. k_scale folded into q in q's dtype: q rounded a second time before the dot",
        "s = tl.dot(q, tl.trans(k)) * qk",
        "s = tl.dot((q * k_scale).to(q.dtype), tl.trans(k)) * qk_scale",
    ),
    Mutant(
        "k_scale_read_with_v_stride",
        "5. k_scale read through v_scale's stride: per tensor beside per head reads the wrong entry",
        "k_scale = tl.load(k_scale_ptr + kvh * stride_ks)",
        "k_scale = tl.load(k_scale_ptr + kvh * stride_vs)",
    ),
    Mutant(
        "store_v_scale_read_with_k_stride",
        "5. the store reads v_scale through k_scale's stride: per tensor beside per head",
        "vs = tl.load(v_scale_ptr + offs_h * stride_vs, mask=h_mask, other=1.0)",
        "vs = tl.load(v_scale_ptr + offs_h * stride_ks, mask=h_mask, other=1.0)",
    ),
    Mutant(
        "cast_left_to_round",
        "20. the cast left to round: round_to_e4m3 returns the clamped x / scale as it is",
        "return r.to(tl.float32, bitcast=True)",
        "return v",
    ),
    Mutant(
        "scales_assumed_per_head",
        "5. the scales assumed per head: k_scale[kvh] and v_scale[kvh] without their strides",
        "k_scale = tl.load(k_scale_ptr + kvh * stride_ks)\n    v_scale = tl.load(v_scale_ptr + kvh * stride_vs)",
        "k_scale = tl.load(k_scale_ptr + kvh)\n    v_scale = tl.load(v_scale_ptr + kvh)",
    ),
    Mutant(
        "calibration_strides_assumed",
        "15. compute_scales' calibration read as if contiguous: row and head strides from the shape",
        "x.stride(0),\n            x.stride(1),",
        "Hkv * D,\n            D,",
    ),
    Mutant(
        "per_tensor_amax_of_head_0",
        "21. a per-tensor amax read from head 0 only",
        "h_hi = p + 1 if PER_HEAD else Hkv",
        "h_hi = p + 1",
    ),
    Mutant(
        "k_scale_applied_twice",
        "22. a scale applied twice: k_scale on the codes' dot and in the fold",
        "s = tl.dot(q, tl.trans(k)) * qk",
        "s = tl.dot(q, tl.trans(k)) * qk * k_scale",
    ),
    Mutant(
        "v_scale_applied_twice",
        "22. a scale applied twice: v_scale on the output twice",
        "o_scale = v_scale  # out",
        "o_scale = v_scale * v_scale  # out",
    ),
    Mutant(
        "out_stored_through_q_strides",
        "15. strides taken from another tensor, or assumed (out stored through q's strides)",
        "o_rows = o_ptr + b * stride_ob + q_heads[:, None] * stride_oh",
        "o_rows = o_ptr + b * stride_qb + q_heads[:, None] * stride_qh",
    ),
    Mutant(
        "slot_0_taken_for_padding",
        "23. slot 0 taken for a padding row",
        "if slot < 0:  # a padding row: nothing to store",
        "if slot <= 0:  # a padding row: nothing to store",
    ),
    Mutant(
        "out_row_index_int32",
        "24. the decode's indices left int32 (out's row: b * stride_ob in the split kernel's store)",
        "o_rows = o_ptr + b * stride_ob",
        "o_rows = o_ptr + b.to(tl.int32) * stride_ob",
    ),
    Mutant(
        "store_head_tile_capped_at_8",
        "25. a head tile sized for the usual model (the store's HKV_PAD capped at 8 KV heads)",
        "HKV_PAD=next_pow2(Hkv),",
        "HKV_PAD=min(next_pow2(Hkv), 8),",
    ),
    Mutant(
        "dot_operands_in_fp16",
        "26. q narrowed to fp16 for the dot (the codes widened to tl.float16, q cast to match)",
        "    k_scale = tl.load(k_scale_ptr + kvh * stride_ks)\n",
        "    q = q.to(tl.float16)  # the codes then widen to fp16 too (k.to(q.dtype))\n"
        "    k_scale = tl.load(k_scale_ptr + kvh * stride_ks)\n",
    ),
    Mutant(
        "table_rows_by_max_pages",
        "15. strides taken from another tensor, or assumed (block_tables' rows max_pages apart)",
        "bt_row = block_tables_ptr + b * stride_bt",
        "bt_row = block_tables_ptr + b * max_pages",
    ),
]
