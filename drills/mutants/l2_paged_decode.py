"""L2 mutants: the seed's four pitfalls and the online-softmax mistakes (explainer section 5)."""
from drills.mutants import Mutant

MUTANTS = [
    Mutant("interleaved_grouping", "1. interleaved head grouping (kvh + g * Hkv)",
           "q_heads = kvh * GROUP + offs_g", "q_heads = kvh + offs_g * tl.num_programs(1)"),
    Mutant("unmasked_last_page", "2. no mask on the last page",
           "t_mask = tok < ctx ", "t_mask = tok >= 0 "),
    Mutant("masked_scores_not_minus_inf", "3. masked keys scored 0 instead of -inf",
           's = tl.where(t_mask[None, :], s, float("-inf"))', "s = s"),
    Mutant("page_index_int32", "4. page index left int32",
           "phys = tl.load(block_tables_ptr + b * stride_bt + p).to(tl.int64)",
           "phys = tl.load(block_tables_ptr + b * stride_bt + p)", gpu_only=True),
    Mutant("padding_rows_stored", "5. padding rows written back",
           "out.to(out_ptr.dtype.element_ty),\n        mask=g_mask[:, None],", "out.to(out_ptr.dtype.element_ty),"),
    Mutant("rescale_dropped", "6. missing rescale (alpha = 1)",
           "alpha = tl.exp(m_i - m_new)", "alpha = tl.exp(m_i - m_i)"),
    Mutant("no_normalisation", "7. no final normalisation by l",
           "out = acc / l_i[:, None]", "out = acc"),
    Mutant("scale_missing", "7. scale forgotten",
           "s = tl.dot(q, tl.trans(k)) * scale", "s = tl.dot(q, tl.trans(k))"),
]
