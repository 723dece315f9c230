"""F1 mutants: the split-KV mistakes of explainer section 5, and L2's that carry over."""
from drills.mutants import Mutant

MUTANTS = [
    Mutant("empty_split_zero_over_zero", "1. an empty split divides 0 by 0",
           "o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)", "o = acc / l_i[:, None]"),
    Mutant("lse_in_base_2", "2. lse written in base 2, merged as base e",
           "(m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453",
           "(m_i + tl.log2(tl.where(seen, l_i, 1.0)))"),
    Mutant("split_ranges_overlap", "3. split ranges overlap",
           "end = tl.minimum(start + chunk, ctx)", "end = tl.minimum(start + chunk + 16, ctx)"),
    Mutant("split_ranges_leave_a_gap", "3. split ranges leave a gap",
           "start = split * chunk\n", "start = split * chunk + tl.where(split > 0, 1, 0)\n"),
    Mutant("merge_without_max_shift", "4. merge without the max shift",
           "w_a = tl.exp(lse_a - m_safe)\n    w_b = tl.exp(lse_b - m_safe)",
           "w_a = tl.exp(lse_a)\n    w_b = tl.exp(lse_b)"),
    Mutant("merge_splits_rescale_dropped", "4. split merge without rescaling the running sum",
           "w_sum = w_sum * alpha + tl.sum(w, axis=0)", "w_sum = w_sum + tl.sum(w, axis=0)"),
    Mutant("small_pages_read_as_one_page", "5. pages smaller than a tile read as if contiguous",
           "phys = tl.load(bt_row + tok // PAGE, mask=t_mask, other=0).to(tl.int64)  # [BLOCK_N]",
           "phys = tl.load(bt_row + t0 // PAGE).to(tl.int64)"),
    Mutant("interleaved_grouping", "L2 pitfall 1: interleaved head grouping",
           "q_heads = kvh * GROUP + offs_g  #", "q_heads = kvh + offs_g * tl.num_programs(1)  #"),
    Mutant("unmasked_tail", "L2 pitfall 2: no mask on the last tile",
           "t_mask = tok < end\n", "t_mask = tok >= 0\n"),
    Mutant("page_index_int32", "L2 pitfall 4: page index left int32",
           "phys = tl.load(bt_row + t0 // PAGE).to(tl.int64)", "phys = tl.load(bt_row + t0 // PAGE)", gpu_only=True),
]
