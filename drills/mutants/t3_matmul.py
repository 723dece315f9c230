"""T3 mutants: the matmul mistakes of explainer section 5, one edit of the reference each."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "k_edge_unmasked",
        "1. no mask on the K edge",
        "k_mask = offs_k < K - k * BLOCK_K",
        "k_mask = offs_k < BLOCK_K",
    ),
    Mutant(
        "k_edge_masked_in_a_only",
        "1. the K edge masked in one operand only (0 * NaN = NaN)",
        "b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)",
        "b = tl.load(b_ptrs)",
    ),
    # Masked lanes without `other` are undefined: the grader's interpreter fills them with NaN.
    Mutant(
        "k_edge_without_other",
        "1. the K edge masked without other=0",
        "a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)",
        "a = tl.load(a_ptrs, mask=k_mask[None, :])",
    ),
    Mutant(
        "store_unmasked",
        "2. no mask on the store at the M and N edges",
        "tl.store(c_ptrs, c, mask=c_mask)",
        "tl.store(c_ptrs, c)",
    ),
    Mutant(
        "fp16_accumulator",
        "3. the sum kept in fp16",
        "acc = tl.dot(a, b, acc)",
        "acc = tl.dot(a, b, acc.to(tl.float16), out_dtype=tl.float16)",
    ),
    # The running sum stays fp32: only a result small enough for fp16 to resolve shows each step's rounding.
    Mutant(
        "dot_rounded_to_fp16_each_step",
        "3. each K step's dot rounded to fp16 (out_dtype=tl.float16) before the fp32 sum",
        "acc = tl.dot(a, b, acc)",
        "acc += tl.dot(a, b, out_dtype=tl.float16).to(tl.float32)",
    ),
    Mutant(
        "stride_bk_for_bn",
        "4. one matrix's stride used for another dimension",
        "b_cols[None, :] * stride_bn",
        "b_cols[None, :] * stride_bk",
    ),
    Mutant(
        "a_assumed_contiguous",
        "4. a stride assumed to be 1 (A read as if row-major)",
        "offs_k[None, :] * stride_ak",
        "offs_k[None, :]",
    ),
    Mutant(
        "c_assumed_contiguous",
        "4. a stride assumed to be 1 (C written as if row-major)",
        "offs_n[None, :] * stride_cn",
        "offs_n[None, :]",
    ),
    Mutant(
        "c_row_stride_assumed_n",
        "4. C's row stride assumed to be N",
        "offs_m[:, None] * stride_cm",
        "offs_m[:, None] * N",
    ),
    Mutant(
        "b_advanced_along_n",
        "5. the K step advances B by BLOCK_K elements instead of BLOCK_K rows",
        "b_ptrs += BLOCK_K * stride_bk",
        "b_ptrs += BLOCK_K",
    ),
    Mutant(
        "last_group_not_shortened",
        "6. the last group taken as GROUP_M tile rows long",
        "tl.minimum(num_pid_m - first_m, GROUP_M)",
        "GROUP_M",
    ),
    Mutant(
        "row_major_order",
        "7. tiles launched in row-major order (correct, but no L2 grouping)",
        "pid_m = first_m + r % rows_in_group\n    pid_n = r // rows_in_group",
        "pid_m = pid // num_pid_n\n    pid_n = pid % num_pid_n",
    ),
    Mutant(
        "block_k_below_16",
        "8. a tl.dot K dimension below 16 (the interpreter accepts it, a GPU does not)",
        "dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32",
        "dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=8",
    ),
    # Rows past M are computed but never stored: only the grader's out-of-bounds load check sees them.
    Mutant(
        "rows_past_m_loaded",
        "9. rows past M loaded without the wrap or a mask",
        "a_rows = offs_m % M",
        "a_rows = offs_m",
    ),
    # Exact for fp16 and for every bf16 value inside fp16's range: only C past 65504 shows it.
    Mutant(
        "out_cast_to_fp16",
        "10. a dtype written into the kernel: acc stored as tl.float16, not as C's element type",
        "c = acc.to(c_ptr.dtype.element_ty)",
        "c = acc.to(tl.float16)",
    ),
    # Right on every square tile: only the large GPU configuration (128 x 256) shows it.
    Mutant(
        "tile_columns_counted_with_block_m",
        "11. BLOCK_M and BLOCK_N mixed up (num_pid_n = cdiv(N, BLOCK_M))",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "num_pid_n = tl.cdiv(N, BLOCK_M)",
    ),
    # Right at every partial edge: only shapes that are whole numbers of tiles show it.
    Mutant(
        "tile_count_one_too_many",
        "12. tile counts written N // BLOCK_N + 1 (one too many when BLOCK_N divides N)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "num_pid_n = N // BLOCK_N + 1",
    ),
    # Every store of the extra program is masked in the interpreter: only the program count shows it.
    Mutant(
        "one_program_past_the_last_tile",
        "13. a grid of one program more than there are tiles",
        'grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)',
        'grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]) + 1,)',
    ),
    # The wrap by the other dimension: right wherever N <= M.
    Mutant(
        "b_cols_wrapped_by_m",
        "9. B's columns wrapped modulo M, not N (right wherever N <= M)",
        "b_cols = offs_n % N",
        "b_cols = offs_n % M",
    ),
    # Nothing past K is read: only a finite C short of the K tail shows it.
    Mutant(
        "k_loop_floor",
        "14. the K loop runs K // BLOCK_K steps (the K tail never summed)",
        "for k in range(0, tl.cdiv(K, BLOCK_K)):",
        "for k in range(0, K // BLOCK_K):",
    ),
]
