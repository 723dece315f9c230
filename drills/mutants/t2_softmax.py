"""T2 mutants: the mistakes of a first reduction kernel (explainer section 5)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "no_max_subtraction", "1. no max subtraction (exp overflows)", "z = x - tl.max(x, axis=0)", "z = x"
    ),
    Mutant(
        "no_max_subtraction_long_rows",
        "1. no max subtraction, on rows longer than one block",
        "m = tl.max(m_lanes, axis=0)  # scalar",
        "m = 0.0  # scalar",
    ),
    Mutant(
        "padding_other_zero",
        "2. padded columns loaded as 0 instead of -inf",
        'other=float("-inf")).to(tl.float32)',
        "other=0.0).to(tl.float32)",
    ),
    # Masked lanes without `other` are undefined: the grader's interpreter fills them with NaN.
    Mutant(
        "padding_without_other",
        "2. padded columns loaded without `other`",
        ', other=float("-inf")).to(tl.float32)',
        ").to(tl.float32)",
    ),
    Mutant(
        "store_unmasked",
        "2. padded columns stored",
        "tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < N)",
        "tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty))",
    ),
    Mutant("no_normalisation", "3. no division by the sum", "y = num / tl.sum(num, axis=0)", "y = num"),
    # Every row in one block, the block never capped: right in the interpreter at any N; the dry run of
    # a row past 2**20 columns names the block a GPU cannot compile.
    Mutant(
        "block_never_capped",
        "4. one block per row whatever its length (BLOCK = next_power_of_2(N), no MAX_BLOCK cap)",
        "BLOCK = min(triton.next_power_of_2(N), MAX_BLOCK)",
        "BLOCK = triton.next_power_of_2(N)",
    ),
    # The store's mask keeps out right: only a tight x shows the load past the last row's end.
    Mutant(
        "third_pass_load_unmasked",
        "2. the third pass's load left unmasked (reads past the end of x)",
        "p = tl.exp(_load_block(x_row, c, N) - m) / l",
        "p = tl.exp(tl.load(x_row + c).to(tl.float32) - m) / l",
    ),
    Mutant(
        "no_normalisation_long_rows",
        "3. no division by the sum, on rows longer than one block",
        "p = tl.exp(_load_block(x_row, c, N) - m) / l",
        "p = tl.exp(_load_block(x_row, c, N) - m)",
    ),
    Mutant(
        "first_block_only",
        "4. only the first block of a long row processed",
        "ONE_BLOCK=N <= BLOCK",
        "ONE_BLOCK=True",
    ),
    Mutant(
        "long_row_tail_block_skipped",
        "4. block count rounded down (N // BLOCK)",
        "num_blocks = tl.cdiv(N, BLOCK)",
        "num_blocks = N // BLOCK",
    ),
    Mutant(
        "row_stride_assumed_n",
        "5. row stride assumed to be N",
        "x_row = x_ptr + row * stride_xm",
        "x_row = x_ptr + row * N",
    ),
    Mutant(
        "out_uses_x_stride",
        "5. out addressed with x's row stride",
        "out_row = out_ptr + row * stride_om",
        "out_row = out_ptr + row * stride_xm",
    ),
    Mutant(
        "row_offset_int32",
        "6. row index left int32",
        "row = tl.program_id(0).to(tl.int64)",
        "row = tl.program_id(0)",
    ),
    Mutant(
        "max_starts_at_zero",
        "7. running max started at 0 instead of -inf",
        'm_lanes = tl.full([BLOCK], float("-inf"), dtype=tl.float32)',
        "m_lanes = tl.zeros([BLOCK], dtype=tl.float32)",
    ),
    # One edit cannot also move the kernel's tl.program_id(0) to axis 1, so every program reads row 0
    # here and the other checks fail too: the grid check must still name the mistake first.
    Mutant(
        "rows_on_grid_axis_1",
        "8. rows on grid axis 1 (past 65535 rows a GPU refuses the launch)",
        "softmax_kernel[(M,)](",
        "softmax_kernel[(1, M)](",
    ),
    Mutant(
        "rows_clamped_to_65535",
        "8. rows clamped to 65535 programs (the rows past them never written)",
        "softmax_kernel[(M,)](",
        "softmax_kernel[(min(M, 65535),)](",
    ),
    # The rows still sum to 1: only the values show the base.
    Mutant(
        "exp2_without_log2e",
        "9. tl.exp2 where e^z belongs (no log2(e) factor)",
        "num = tl.exp(z)",
        "num = tl.exp2(z)",
    ),
    # The one-block path guarded as T4's online softmax is: a fully masked row gets zeros, not NaN.
    Mutant(
        "minus_inf_row_guarded_to_zeros",
        "10. a row of only -inf given zeros (the max guarded, the sum clamped)",
        "z = x - tl.max(x, axis=0)  # [BLOCK]\n        num = tl.exp(z)  # [BLOCK]; 0 on padded columns\n"
        "        y = num / tl.sum(num, axis=0)",
        'z = x - tl.where(tl.max(x, axis=0) == float("-inf"), 0.0, tl.max(x, axis=0))\n'
        "        num = tl.exp(z)\n        y = num / tl.maximum(tl.sum(num, axis=0), 1e-30)",
    ),
    # Pass 2 against each lane's own max: rows of one block (the other path) stay right.
    Mutant(
        "sum_against_lane_maxes",
        "11. pass 2 summed against each lane's max (m_lanes), not the row's",
        "l_lanes += tl.exp(_load_block(x_row, b * BLOCK + cols, N) - m)",
        "l_lanes += tl.exp(_load_block(x_row, b * BLOCK + cols, N) - m_lanes)",
    ),
]
