"""T1 mutants: the launch mistakes of a first kernel (explainer section 5)."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "mask_dropped",
        "1. no mask on the last block",
        "mask = offs < n  # [BLOCK]",
        "mask = offs >= 0  # [BLOCK]",
    ),
    Mutant(
        "store_unmasked",
        "1. mask on the loads but not on the store",
        "tl.store(out_ptr + offs, x + y, mask=mask)",
        "tl.store(out_ptr + offs, x + y)",
    ),
    # Reads past the end without writing there: only the grader's out-of-bounds load check sees it.
    Mutant(
        "loads_unmasked",
        "1. mask on the store but not on the loads",
        "x = tl.load(x_ptr + offs, mask=mask)",
        "x = tl.load(x_ptr + offs)",
    ),
    Mutant(
        "grid_floor",
        "2. grid rounded down (n // BLOCK)",
        "grid = (triton.cdiv(n, BLOCK),)",
        "grid = (n // BLOCK,)",
    ),
    # Every small case needs fewer than 65535 programs: only the dry run at the largest sizes sees it.
    Mutant(
        "grid_clamped_to_65535",
        "2. grid clamped to 65535 programs (the blocks past them never written)",
        "grid = (triton.cdiv(n, BLOCK),)",
        "grid = (min(triton.cdiv(n, BLOCK), 65535),)",
    ),
    # Right in the interpreter at any n: only the dry run at the largest n sees a block past 2**20.
    Mutant(
        "one_program_for_the_whole_vector",
        "2. one program whose block is as wide as the vector (BLOCK = next_power_of_2(n))",
        "return _launch(x, y, out)",
        "return _launch(x, y, out, BLOCK=triton.next_power_of_2(x.numel()))",
    ),
    Mutant(
        "offsets_missing_block_start",
        "3. offsets without pid * BLOCK",
        "offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "offs = tl.arange(0, BLOCK)",
    ),
    Mutant(
        "block_start_not_scaled",
        "3. block start pid instead of pid * BLOCK",
        "offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "offs = pid + tl.arange(0, BLOCK)",
    ),
    # Every BLOCK up to 2048 passes: each program covers its block and more.
    Mutant(
        "block_width_written_into_the_kernel",
        "3. a width written into the kernel (2048) instead of BLOCK",
        "offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "offs = pid * 2048 + tl.arange(0, 2048)",
    ),
    Mutant(
        "offsets_int32",
        "4. program id left int32",
        "pid = tl.program_id(0).to(tl.int64)",
        "pid = tl.program_id(0)",
        gpu_only=True,
    ),
    Mutant(
        "mask_off_by_one",
        "5. mask off by one (offs <= n)",
        "mask = offs < n  # [BLOCK]",
        "mask = offs <= n  # [BLOCK]",
    ),
    Mutant(
        "mask_stops_one_short",
        "5. mask off by one the other way (offs < n - 1): the last element never written",
        "mask = offs < n  # [BLOCK]",
        "mask = offs < n - 1  # [BLOCK]",
    ),
    Mutant(
        "subtracts",
        "6. another operation than x + y (x - y)",
        "tl.store(out_ptr + offs, x + y, mask=mask)",
        "tl.store(out_ptr + offs, x - y, mask=mask)",
    ),
    # Values of randn survive fp16: only sums past 65504 (bf16) or digits past 11 bits (fp32) show it.
    Mutant(
        "sum_stored_as_fp16",
        "7. a dtype written into the kernel (the sum cast to fp16 before the store)",
        "tl.store(out_ptr + offs, x + y, mask=mask)",
        "tl.store(out_ptr + offs, (x + y).to(tl.float16), mask=mask)",
    ),
]
