"""Grader for T3, tiled matmul. Each test is named for the mistake it catches.

Run: make test L=t3 (your drills/mine) or make test L=t3 IMPL=solutions. Every input is a view into a
larger NaN-filled buffer, so reading past any edge of A or B brings NaN into the result; every output
is a view into a canary-filled buffer, so storing past any edge of C overwrites a canary.
"""

from __future__ import annotations

import pytest
import torch

from drills.compare import assert_close, assert_untouched, mismatch
from drills.grading.grader.diagnose import Mistake, returned_out_problem
from drills.grading.shared.bigmem import sparse_empty
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel, record_launches
from drills.tests import bf16_everywhere, seeded, sizes

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK_M": ("test_by_hand_37x100x61_every_edge_partial", "test_store_masked_at_m_and_n_edges"),
    "BLOCK_N": ("test_by_hand_37x100x61_every_edge_partial", "test_store_masked_at_m_and_n_edges"),
    "BLOCK_K": ("test_k_edge_is_masked", "test_k_longer_than_one_block", "test_k_loop_reaches_the_k_tail"),
    "GROUP_M": (
        "test_programs_visit_tiles_in_grouped_order",
        "test_every_tile_computed_when_last_group_is_short",
    ),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}

DIMS = ("m", "n")  # how a mismatch names its position in C
PAD = 256  # NaN rows and columns after every input: more than any block reaches past an edge
CANARY = 1234.5  # exactly representable in fp16 and bf16
MARGIN = 256  # canary rows and columns on every side of C: more than any block reaches past an edge


def poisoned(rows, cols, dtype, device, stream, transposed=False, col_step=1):
    """Random [rows, cols] values in a view of a NaN-filled buffer that has PAD spare rows and columns.

    transposed: the transpose of a [cols, rows] view (strides (1, row length)), as `x.t()` gives.
    col_step: take every col_step-th column of the buffer (a strided view, stride col_step)."""
    gen = torch.Generator().manual_seed(seeded(stream))
    r, c = (cols, rows) if transposed else (rows, cols)
    buffer = torch.full((r + PAD, c * col_step + PAD), float("nan"), dtype=dtype, device=device)
    view = buffer[:r, : c * col_step : col_step]  # [r, c]
    view.copy_(torch.randn(r, c, generator=gen).to(dtype))
    return view.t() if transposed else view


def reference(a, b):
    """fp32 oracle (computed in fp64, so no TF32 or summation order can blur it): [M, N]."""
    return (a.double() @ b.double()).float()


# How out lies in its canary buffer: (buffer rows, buffer columns, the [M, N] view of the buffer).
OUT_LAYOUTS = {
    "plain": (lambda M, N: (M, N), lambda x, M, N: x[MARGIN : MARGIN + M, MARGIN : MARGIN + N]),
    "transposed": (lambda M, N: (N, M), lambda x, M, N: x[MARGIN : MARGIN + N, MARGIN : MARGIN + M].t()),
    "strided_columns": (
        lambda M, N: (M, 2 * N),
        lambda x, M, N: x[MARGIN : MARGIN + M, MARGIN : MARGIN + 2 * N : 2],
    ),
}


def run_into_canary(impl, a, b, out_layout="plain"):
    """matmul(a, b, out=view) with the view inside a canary-filled buffer, MARGIN spare rows and columns
    on every side (and, for strided columns, a canary between every two columns); checks that matmul
    returns the view and that nothing outside it changed."""
    M, N = a.shape[0], b.shape[1]
    size, view_of = OUT_LAYOUTS[out_layout]
    rows, cols = size(M, N)
    buffer = torch.full((rows + 2 * MARGIN, cols + 2 * MARGIN), CANARY, dtype=a.dtype, device=a.device)
    out = view_of(buffer, M, N)  # [M, N]
    returned = impl.matmul(a, b, out=out)
    wrong = returned_out_problem("matmul", returned, out)
    assert wrong is None, wrong
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
    view_of(keep, M, N).fill_(True)
    assert_untouched(
        buffer,
        CANARY,
        keep,
        "the buffer around out (a store past M or N, or at the wrong stride?)",
        ("row+256", "col+256"),
    )
    return out


def check(impl, a, b, out_layout="plain", **tol):
    out = run_into_canary(impl, a, b, out_layout)
    assert_close(out, reference(a, b), DIMS, **tol)
    return out


def inputs(M, N, K, device, stream, dtype=torch.float16, **layout):
    a = poisoned(M, K, dtype, device, stream, layout.get("a_transposed", False), layout.get("a_step", 1))
    b = poisoned(K, N, dtype, device, stream + 1, layout.get("b_transposed", False), layout.get("b_step", 1))
    return a, b


def gpu_only(runtime, shapes):
    return [] if runtime.interpreter else shapes


# --- Section 2 "By hand" ------------------------------------------------------------------------------


def test_by_hand_37x100x61_every_edge_partial(impl, runtime):
    """The explainer's example: with 32 x 32 x 32 blocks, the last tile row holds 5 real rows, the last
    tile column 4 real columns, and the second K step 29 real k (3 masked)."""
    a, b = inputs(37, 100, 61, runtime.device, stream=37)
    check(impl, a, b)


# The launch order of the explainer's table: 5 x 4 tiles, GROUP_M = 2; program i computes ORDER[i].
ORDER = [
    (0, 0),
    (1, 0),
    (0, 1),
    (1, 1),
    (0, 2),
    (1, 2),
    (0, 3),
    (1, 3),
    (2, 0),
    (3, 0),
    (2, 1),
    (3, 1),
    (2, 2),
    (3, 2),
    (2, 3),
    (3, 3),
    (4, 0),
    (4, 1),
    (4, 2),
    (4, 3),
]


@pytest.mark.parametrize("programs", [3, 6, 8, 17, 20])
def test_programs_visit_tiles_in_grouped_order(impl, runtime, programs):
    """Launch matmul_kernel itself with only the first `programs` programs of the explainer's 5 x 4 tile
    grid (16 x 16 tiles, GROUP_M = 2; C is 69 x 64, so tile row 4 holds 5 real rows): exactly the tiles
    ORDER[:programs] must be written, and written right. Row-major order, or a last group taken as
    GROUP_M rows long, writes other tiles."""
    M, N, K, T = 69, 64, 40, 16
    a, b = inputs(M, N, K, runtime.device, stream=5)
    buffer = torch.full((M + 2 * MARGIN, N + 2 * MARGIN), CANARY, dtype=a.dtype, device=a.device)
    c = buffer[MARGIN : MARGIN + M, MARGIN : MARGIN + N]  # [M, N]
    impl.matmul_kernel[(programs,)](
        a,
        b,
        c,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        BLOCK_M=T,
        BLOCK_N=T,
        BLOCK_K=T,
        GROUP_M=2,
    )
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
    keep[MARGIN : MARGIN + M, MARGIN : MARGIN + N] = True
    assert_untouched(buffer, CANARY, keep, "the buffer around C", ("row+256", "col+256"))
    written = {
        (i, j)
        for i in range(5)
        for j in range(4)
        if (c[i * T : (i + 1) * T, j * T : (j + 1) * T] != CANARY).any()
    }
    expected = set(ORDER[:programs])
    assert written == expected, (
        f"the first {programs} programs wrote tiles {sorted(written)}; grouped order (GROUP_M = 2) "
        f"gives {sorted(expected)} (missing {sorted(expected - written)}, extra {sorted(written - expected)})"
    )
    ref = reference(a, b)
    for i, j in expected:
        rows, cols = slice(i * T, (i + 1) * T), slice(j * T, (j + 1) * T)
        assert_close(c[rows, cols], ref[rows, cols], DIMS)


def test_accumulates_in_fp32(impl, runtime):
    """The explainer's numbers: k = 0 contributes 32 * 64 = 2048 to every element, then 1024 terms of
    (1/16) * (1/16) = 1/256 each bring it to exactly 2052. In fp16, 2048 + 1/256 rounds back to 2048
    (neighbours are 2 apart there), so an fp16 accumulator returns 2048. The tolerance here is tight:
    a 0.2% loss must fail."""
    M, N, K = 33, 40, 1025
    a, b = inputs(M, N, K, runtime.device, stream=7)
    a[:, 0], b[0, :] = 32.0, 64.0
    a[:, 1:], b[1:, :] = 1.0 / 16, 1.0 / 16
    out = check(impl, a, b, rtol=1e-3, rel=1e-3)
    assert (out == 2052).all(), (
        f"expected exactly 2052 everywhere, got values from {out.min()} to {out.max()}"
    )


def test_each_k_step_is_summed_in_fp32(impl, runtime):
    """k = 0 contributes +2048 and k = K - 1 contributes -2048 to every element, and the 1023 terms
    between them 1/256 each: C is exactly 1023/256 = 3.996..., which fp16 holds. A K step whose dot is
    rounded to fp16 before it joins an fp32 sum (out_dtype=tl.float16) loses the small terms of the
    step that holds the +2048 (2048 + 31/256 rounds to 2048), which test_accumulates_in_fp32 cannot
    see: there the result is near 2052, where fp16's own spacing of 2 hides the loss."""
    M, N, K = 33, 40, 1025
    a, b = inputs(M, N, K, runtime.device, stream=8)
    a[:, 1:-1], b[1:-1, :] = 1.0 / 16, 1.0 / 16
    a[:, 0], a[:, -1], b[0, :], b[-1, :] = 32.0, -32.0, 64.0, 64.0
    out = check(impl, a, b, rtol=1e-3, rel=1e-3)
    assert (out == 1023 / 256).all(), (
        f"expected exactly 1023/256 = 3.99609375 everywhere, got values from {out.min()} to {out.max()}"
    )


# --- Section 5 "Pitfalls" -----------------------------------------------------------------------------


@pytest.mark.parametrize("K", [1, 15, 16, 17, 33, 61, 100])
def test_k_edge_is_masked(impl, runtime, K):
    """K not a multiple of BLOCK_K: the last K step reaches into NaN, which must be masked off in both A
    and B (0 * NaN is NaN, so masking one operand is not enough)."""
    a, b = inputs(20, 24, K, runtime.device, stream=K)
    check(impl, a, b)


@pytest.mark.parametrize("K", [1, 61])
def test_k_loop_reaches_the_k_tail(impl, runtime, K):
    """K not a multiple of BLOCK_K: a K loop of K // BLOCK_K steps reads nothing past K, so no NaN shows
    it, and it drops the last K % BLOCK_K terms of every dot product (all of them when K < BLOCK_K:
    C = 0). A finite C that equals the sum over the first k < K only is named as such."""
    a, b = inputs(20, 24, K, runtime.device, stream=K + 7)
    out = run_into_canary(impl, a, b)
    if torch.isfinite(out).all():
        for short in range(0, K, 16):  # every K step of a tl.dot is a multiple of 16 wide
            part = reference(a[:, :short], b[:short])  # [20, 24]; zeros when short = 0
            if torch.allclose(out.float(), part, atol=0.01, rtol=0.01):
                pytest.fail(
                    f"C equals the sum over k < {short} only, of K = {K}: the K loop stops before the last "
                    f"{K - short} k (a loop of K // BLOCK_K steps?)"
                )
    assert_close(out, reference(a, b), DIMS)


@pytest.mark.parametrize("M,N,K", [(33, 31, 16), (1, 1, 16), (65, 47, 40), (100, 1, 7)])
def test_store_masked_at_m_and_n_edges(impl, runtime, M, N, K):
    """M and N not multiples of the block: a store without the (m < M) & (n < N) mask writes rows and
    columns past C, into the canary around it."""
    a, b = inputs(M, N, K, runtime.device, stream=M + N)
    check(impl, a, b)


def test_shapes_that_are_exact_multiples_of_the_tiles(impl, runtime):
    """M = 256, N = 128, K = 64: a whole number of tiles in each configuration the CPU and the GPU's
    small shapes use (32 and 64 wide), no edge partial; on the CPU, two full groups of GROUP_M = 4 tile
    rows. A tile count written N // BLOCK_N + 1 (cdiv by habit of adding one) is right at every partial
    edge and one too many here: the first group's programs then reach a column past N, and the second
    group runs out of programs before its last column (the canary where C was never written)."""
    a, b = inputs(256, 128, 64, runtime.device, stream=53)
    check(impl, a, b)


def test_k_longer_than_one_block(impl, runtime):
    """Many K steps: the pointers must advance by BLOCK_K along K (stride_ak for A, stride_bk for B)."""
    K = sizes(runtime, 300, 2500)
    a, b = inputs(40, 70, K, runtime.device, stream=3)
    check(impl, a, b)


@pytest.mark.parametrize("M,N,K", [(37, 100, 61), (1, 16, 1), (129, 257, 65), (5, 300, 33), (1, 1, 1)])
def test_non_power_of_two_shapes(impl, runtime, M, N, K):
    a, b = inputs(M, N, K, runtime.device, stream=M * 7 + N)
    check(impl, a, b)


def test_large_non_power_of_two_shapes(impl, runtime):
    """GPU only: shapes that use the large block configuration, with every edge partial."""
    if runtime.interpreter:
        pytest.skip(
            "GPU only: these shapes use the GPU's large block configuration; the interpreter "
            "would take minutes"
        )
    for M, N, K in [(1031, 1100, 1000), (2049, 1537, 640), (4096, 4096, 4096)]:
        a, b = inputs(M, N, K, runtime.device, stream=M)
        check(impl, a, b)


@pytest.mark.parametrize("M", [129, 300, 577])
def test_every_tile_computed_when_last_group_is_short(impl, runtime, M):
    """Tile rows not a multiple of GROUP_M (5, 10 and 19 tile rows of 32 with GROUP_M = 4 on the CPU;
    10 rows of 64 with GROUP_M = 8 at M = 577 on a GPU): the last group is shorter, and a mapping that
    assumes GROUP_M rows there leaves tiles unwritten (still canary)."""
    a, b = inputs(M, 100, 40, runtime.device, stream=M)
    check(impl, a, b)
    if not runtime.interpreter:  # 10 tile rows of 128 with GROUP_M = 8, large configuration
        a, b = inputs(1157, 1100, 200, runtime.device, stream=M + 1)
        check(impl, a, b)


LAYOUTS = {
    "a_transposed": dict(a_transposed=True),
    "b_transposed": dict(b_transposed=True),
    "both_transposed": dict(a_transposed=True, b_transposed=True),
    "a_strided_columns": dict(a_step=3),
    "b_strided_columns": dict(b_step=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_strides_are_respected(impl, runtime, layout):
    """A and B as transposed or strided views: a kernel that assumes a stride of 1 anywhere (or uses one
    matrix's stride for another dimension) reads the wrong elements."""
    a, b = inputs(37, 45, 70, runtime.device, stream=11, **LAYOUTS[layout])
    check(impl, a, b)


@pytest.mark.parametrize("out_layout", ["transposed", "strided_columns"])
def test_output_strides_are_respected(impl, runtime, out_layout):
    """out as a transposed view (strides (1, M + 2 * MARGIN)) or every other column of a wider buffer
    (strides (2 * N + 2 * MARGIN, 2)): the store must use stride_cm and stride_cn."""
    a, b = inputs(37, 45, 70, runtime.device, stream=13)
    check(impl, a, b, out_layout=out_layout)


def test_loads_stay_inside_a_and_b(impl, runtime):
    """A and B allocated to the exact element, nothing of theirs after the last row or column, and M and
    N not multiples of any block: loading rows past M or columns past N (without the % M wrap or a mask)
    reads outside both, which the grader's check of every load lane reports as an out-of-bounds load,
    even though those rows and columns of the tile are never stored."""
    gen = torch.Generator().manual_seed(seeded(41))
    a = torch.randn(37, 40, generator=gen).half().to(runtime.device)  # [M, K], contiguous
    b = (
        torch.randn(40, 45, generator=gen).half().t().contiguous().t().to(runtime.device)
    )  # [K, N], column-major
    check(impl, a, b)


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    """The output has the inputs' dtype, rounded from fp32 once."""
    M, N, K = sizes(runtime, (37, 100, 61), (1031, 1100, 1000))
    a, b = inputs(M, N, K, runtime.device, stream=17, dtype=dtype)
    out = check(impl, a, b)
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, bf16_everywhere()], ids=["fp16", "bf16"])
def test_out_keeps_the_range_of_its_dtype(impl, runtime, dtype):
    """Every element of A and B is m x (1 + |randn|), m = 64 for bf16 (products of about 10^4, sums over
    K = 61 of about 10^6) and m = 2 for fp16 (the same check inside fp16's range). bf16 outputs past
    65504 hold in bf16 and not in fp16: a kernel that stores acc.to(tl.float16) where C's own element
    type belongs turns them into inf, while every value inside fp16's range survives the round trip."""
    a, b = inputs(37, 45, 61, runtime.device, stream=47, dtype=dtype)
    m = 64.0 if dtype == torch.bfloat16 else 2.0
    for x in (a, b):
        x.copy_(((x.float().abs() + 1) * m).to(dtype))
    out = check(impl, a, b)
    assert out.dtype == dtype
    if dtype == torch.bfloat16:
        assert out.float().abs().max().item() > 65504, "the case should reach past fp16's range"


# --- The launcher rejects bad input before launching -----------------------------------------------


def _meta(t):
    return t.to("meta")


# name -> (how to spoil the arguments of a valid call, the error, what the message must name)
BAD_INPUTS = {
    "a_not_a_tensor": (lambda a, b: dict(a=a.tolist()), TypeError, "a must"),
    "a_rank_3": (lambda a, b: dict(a=a[None]), ValueError, "a must"),
    "b_rank_1": (lambda a, b: dict(b=b[:, 0]), ValueError, "b must"),
    "a_float32": (lambda a, b: dict(a=a.float()), TypeError, "a must"),
    "b_dtype_differs": (lambda a, b: dict(b=b.bfloat16()), TypeError, "b must"),
    "inner_dims_differ": (lambda a, b: dict(b=b[:-1]), ValueError, "inner dimension"),
    "empty_k": (lambda a, b: dict(a=a[:, :0], b=b[:0]), ValueError, "non-empty"),
    "mixed_devices": (lambda a, b: dict(b=_meta(b)), ValueError, "b is on meta"),
    "device_the_runtime_cannot_run": (lambda a, b: dict(a=_meta(a), b=_meta(b)), ValueError, "a is on meta"),
    "out_wrong_shape": (
        lambda a, b: dict(out=torch.empty(a.shape[0], b.shape[1] + 1, dtype=a.dtype, device=a.device)),
        ValueError,
        "out must",
    ),
    "out_rank_3": (
        lambda a, b: dict(out=torch.empty(1, a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)),
        ValueError,
        "out must",
    ),
    "out_float32": (
        lambda a, b: dict(out=torch.empty(a.shape[0], b.shape[1], device=a.device)),
        TypeError,
        "out must",
    ),
    "out_other_device": (
        lambda a, b: dict(out=torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="meta")),
        ValueError,
        "out is on meta",
    ),
    "out_not_a_tensor": (lambda a, b: dict(out=[[0.0] * b.shape[1]] * a.shape[0]), TypeError, "out must"),
    "out_elements_overlap": (
        lambda a, b: dict(
            out=torch.empty(1, b.shape[1], dtype=a.dtype, device=a.device).expand(a.shape[0], -1)
        ),
        ValueError,
        "out's elements overlap",
    ),
    # Strides (1, 1): element [i, j] and [i + 1, j - 1] share memory, though no stride is 0.
    "out_elements_overlap_unit_strides": (
        lambda a, b: dict(
            out=torch.empty(a.shape[0] + b.shape[1], dtype=a.dtype, device=a.device).as_strided(
                (a.shape[0], b.shape[1]), (1, 1)
            )
        ),
        ValueError,
        "out's elements overlap",
    ),
    # Strides (3, 2), neither 0 nor 1: element [i, j] and [i + 2, j - 3] share memory. A test for rows
    # (or columns) closer than their length alone misses it: the gcd of the strides decides.
    "out_elements_overlap_no_unit_stride": (
        lambda a, b: dict(
            out=torch.empty(3 * a.shape[0] + 2 * b.shape[1], dtype=a.dtype, device=a.device).as_strided(
                (a.shape[0], b.shape[1]), (3, 2)
            )
        ),
        ValueError,
        "out's elements overlap",
    ),
    "out_overlaps_a": (lambda a, b: dict(out=a[:, : b.shape[1]]), ValueError, "out overlaps a"),
    "out_overlaps_b": (lambda a, b: dict(out=b[: a.shape[0]]), ValueError, "out overlaps b"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    a, b = inputs(37, 45, 61, runtime.device, stream=19)
    args = dict(a=a, b=b)
    args.update(spoil(a, b))
    with record_launches(impl) as launches, pytest.raises(error, match=names):
        impl.matmul(**args)
    assert not launches.calls, "the error must come before any kernel is launched"


def past_int32(shape, dtype, device):
    """A view of `shape` whose rows lie 2**31 elements apart, in a sparse buffer (CPU) that costs no memory."""
    flat = sparse_empty((2**31 * (shape[0] - 1) + shape[1],), dtype, device)
    return flat.as_strided(shape, (2**31, 1))


@pytest.mark.parametrize("name", ["a", "b", "out"])
def test_launcher_rejects_offsets_past_int32(impl, runtime, name):
    """A view whose last element sits 2**31 elements or more from its first cannot be addressed with the
    kernel's int32 offsets: rejected, naming it, not silently wrapped."""
    args = dict(
        a=torch.zeros(2, 16, dtype=torch.float16, device=runtime.device),
        b=torch.zeros(16, 8, dtype=torch.float16, device=runtime.device),
    )
    shapes = dict(a=(2, 16), b=(16, 8), out=(2, 8))
    args[name] = past_int32(shapes[name], torch.float16, runtime.device)
    with record_launches(impl) as launches, pytest.raises(ValueError, match=f"{name} spans"):
        impl.matmul(**args)
    assert not launches.calls, "the error must come before any kernel is launched"


# name -> a configuration _launch must refuse, and the key its message must name
BAD_CONFIGS = {
    "block_k_8": (dict(BLOCK_K=8), "BLOCK_K"),
    "block_m_48": (dict(BLOCK_M=48), "BLOCK_M"),
    "block_n_0": (dict(BLOCK_N=0), "BLOCK_N"),
    "block_n_missing": (dict(BLOCK_N=None), "BLOCK_N"),
    "group_m_0": (dict(GROUP_M=0), "GROUP_M"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_launch_rejects_a_bad_config(impl, runtime, name):
    """Block sizes must be powers of two (tl.arange) and at least 16 (tl.dot's K on a GPU; the interpreter
    checks neither): _launch refuses others, naming the key, before launching."""
    change, key = BAD_CONFIGS[name]
    config = {k: v for k, v in {**impl._CONFIGS["interpreter"], **change}.items() if v is not None}
    a, b = inputs(37, 45, 61, runtime.device, stream=19)
    with record_launches(impl) as launches, pytest.raises(ValueError, match=key):
        impl._launch(a, b, torch.empty(37, 45, dtype=a.dtype, device=a.device), config=config)
    assert not launches.calls, "the error must come before any kernel is launched"


def test_every_configuration_has_dot_dims_of_16(impl, runtime):
    """Each configuration of the launcher's table, the GPU ones included, run here on a problem with
    every edge partial. The interpreter would run a BLOCK_K of 8 that a GPU cannot compile (section 3.5),
    so the check that each block is a power of two >= 16 is what fails here for such a table. Each
    problem is sized by its configuration: one tile row more than a group of GROUP_M and three tile
    columns, so the GPU's large configuration, whose tiles are not square (128 x 256), shows a
    BLOCK_M written where BLOCK_N belongs, which the interpreter's square 32 x 32 tiles never show."""
    for name, config in impl._CONFIGS.items():
        bm, bn, group = (config.get(key) for key in ("BLOCK_M", "BLOCK_N", "GROUP_M"))
        sized = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (bm, bn, group))
        M, N = ((group + 1) * bm - 5, 2 * bn + 3) if sized else (37, 45)  # a bad config: any shape
        a, b = inputs(M, N, 61, runtime.device, stream=43)
        out = torch.full((M, N), CANARY, dtype=a.dtype, device=a.device)
        impl._launch(a, b, out, config=config)
        problem = mismatch(out, reference(a, b), DIMS)
        # Tiles named without the config's keys: "BLOCK_K" in a message is pitfall 8's (the config check).
        assert problem is None, (
            f"configuration {name!r} ({bm} x {bn} tiles) on ({M}, 61) x (61, {N}): {problem}"
        )


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: matmul must compute them with your Triton kernel, not with
    torch (a @ b, or a copy of the grader's oracle)."""
    a, b = inputs(37, 45, 61, runtime.device, stream=31)
    assert_runs_a_triton_kernel(impl, lambda: impl.matmul(a, b), "matmul")


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_a_dropped_k_term(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros C and a C that misses the
    last k term (a K mask off by one), and passes the oracle rounded to fp16."""
    a, b = inputs(37, 100, 61, runtime.device, stream=23)
    ref = reference(a, b)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
    assert mismatch(reference(a[:, :-1], b[:-1]).half(), ref) is not None
    assert mismatch(ref.half(), ref) is None


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, matmul allocates [M, N] in the inputs' dtype. M and N are multiples of every block
    size used here, so a kernel that forgets the store mask (reported by the canary tests above) does
    not also write past this allocation and crash the run."""
    a, b = inputs(64, 64, 61, runtime.device, stream=29)
    out = impl.matmul(a, b)
    assert out.shape == (64, 64) and out.dtype == a.dtype and out.device == a.device
    assert_close(out, reference(a, b), DIMS)


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


@pytest.mark.parametrize("large", ["M", "N"])
def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime, large):
    """65537 tiles along M (or N) at the largest tile of any config (BLOCK_M = 128, BLOCK_N = 256 on a
    GPU, 32 under the interpreter): more than the 65535 programs CUDA allows on grid axes 1 and 2 (axis 0
    allows 2**31 - 1). A grid of (tiles of M, tiles of N) puts one of them on axis 1: it launches on the
    CPU and fails on a GPU with "invalid argument". Run dry (every launch recorded and checked, none
    run): K = 16, a and b are one row (column) repeated by stride 0, and C is sparse on a CPU."""
    long = 65536 * sizes(runtime, 32, 256) + 1
    M, N, K = (long, 16, 16) if large == "M" else (16, long, 16)
    a = torch.zeros(1, K, dtype=torch.float16, device=runtime.device).expand(M, K)  # [M, K], stride (0, 1)
    b = torch.zeros(K, 1, dtype=torch.float16, device=runtime.device).expand(K, N)  # [K, N], stride (1, 0)
    out = sparse_empty((M, N), torch.float16, runtime.device)  # [M, N]
    assert_grids_fit(impl, lambda: impl.matmul(a, b, out=out), f"matmul of ({M}, {K}) by ({K}, {N})")


# M = 512: 16 tile rows of 32 (the interpreter's GROUP_M = 4), 8 of 64 (a GPU's GROUP_M = 8), whole groups.
@pytest.mark.parametrize("M,N", [(512, 64), (69, 100)], ids=["tile-rows-a-multiple-of-GROUP_M", "ragged"])
def test_one_program_per_tile(impl, runtime, M, N):
    """The grid holds exactly cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) programs (run dry: recorded, none run).
    A program past the last tile falls in a group with no tile rows: rows_in_group = 0, and r % 0 is
    undefined on a GPU, where it may land on a real tile and store garbage over it. The interpreter
    computes r % 0 as 0, sends the program past M and masks all of its stores, so only the count shows it."""
    K = 16
    a = torch.zeros(M, K, dtype=torch.float16, device=runtime.device)  # [M, K]
    b = torch.zeros(K, N, dtype=torch.float16, device=runtime.device)  # [K, N]
    launches = assert_grids_fit(impl, lambda: impl.matmul(a, b), f"matmul of ({M}, {K}) by ({K}, {N})")
    for call in launches.calls:
        bm, bn = call.constexprs.get("BLOCK_M"), call.constexprs.get("BLOCK_N")
        if not (isinstance(bm, int) and isinstance(bn, int)):
            continue  # not the tile kernel (or not launched with the stub's names): nothing to count
        tiles = -(-M // bm) * -(-N // bn)
        programs = call.grid[0] * call.grid[1] * call.grid[2]
        assert programs == tiles, (
            f"{call.name} launched {programs} programs for {tiles} tiles of C ({M} x {N} in {bm} x {bn} tiles): "
            "a program past the last tile computes r % rows_in_group with rows_in_group = 0, undefined on "
            "a GPU; launch exactly one program per tile"
        )


# --- Diagnosis: which pitfall of drills/content/t3_matmul.md a pattern of results points to ----------

MISTAKES = [
    Mistake(
        1,
        fails=("test_k_edge_is_masked[1]", "test_non_power_of_two_shapes[1-1-1]"),
        messages=("NaN",),
        question="K = 61, BLOCK_K = 32: which k does your last K step load, from which of A and B, and "
        "what value do the lanes past K hold?",
        section="3.3",
    ),
    Mistake(
        14,
        # Nothing past K is read, so no NaN: C is the sum over the whole blocks of K only.
        fails=("test_k_loop_reaches_the_k_tail",),
        messages=(r"the K loop stops before",),
        question="K = 61, BLOCK_K = 32: how many steps does your K loop run, and which k does the last one "
        "load?",
        section="3.3",
    ),
    Mistake(
        2,
        fails=("test_store_masked_at_m_and_n_edges[1-1-16]",),
        messages=(r"canary elements|out of bounds store",),
        question="M = 37 and BLOCK_M = 32: which rows does the last tile row's store write, and which of "
        "them belong to C?",
        section="3.4",
    ),
    Mistake(
        3,
        fails=("test_accumulates_in_fp32",),
        passes=("test_k_edge_is_masked", "test_store_masked_at_m_and_n_edges"),
        question="What is 2048 + 0.125 in fp16, and in which dtype does your kernel keep the running sum?",
        section="2.4",
    ),
    Mistake(
        3,
        # The running sum is fp32, but each step's dot is rounded to fp16 first: only a result small
        # enough for fp16 to resolve shows what the step holding 2048 lost.
        fails=("test_each_k_step_is_summed_in_fp32",),
        passes=("test_k_edge_is_masked", "test_store_masked_at_m_and_n_edges"),
        question="Your running sum is fp32, but in which dtype does each K step's tl.dot hand its result "
        "over, and what is 2048 + 31/256 in that dtype?",
        section="2.4",
    ),
    Mistake(
        4,
        fails=("test_strides_are_respected",),
        passes=("test_non_power_of_two_shapes", "test_by_hand_37x100x61_every_edge_partial"),
        question="A [37, 61] stored transposed: where is A[5, 7], and which stride does your kernel "
        "multiply k by?",
        section="2.2",
    ),
    Mistake(
        4,
        fails=("test_output_strides_are_respected",),
        passes=("test_by_hand_37x100x61_every_edge_partial",),
        question="out may be a transposed view: which strides does your store multiply the rows and the "
        "columns of C by?",
        section="2.2",
    ),
    Mistake(
        4,
        fails=(
            "test_strides_are_respected[b_transposed]",
            "test_by_hand_37x100x61_every_edge_partial",
            "test_k_edge_is_masked[1]",
        ),
        passes=("test_non_power_of_two_shapes[1-1-1]", "test_store_masked_at_m_and_n_edges[100-1-7]"),
        question="Shapes with N = 1 pass, every other fails: which stride does your kernel multiply B's "
        "columns by?",
        section="2.2",
    ),
    Mistake(
        4,
        fails=("test_by_hand_37x100x61_every_edge_partial",),
        passes=("test_out_is_allocated_when_not_given", "test_store_masked_at_m_and_n_edges[1-1-16]"),
        messages=(r"canary elements",),
        question="A contiguous out passes, a view of a wider buffer does not: how far apart are the rows "
        "of out, and what does your store use for that distance?",
        section="2.2",
    ),
    Mistake(
        5,
        fails=("test_k_longer_than_one_block", "test_by_hand_37x100x61_every_edge_partial"),
        passes=("test_k_edge_is_masked[17]", "test_strides_are_respected[b_transposed]"),
        question="B [61, 100] row-major and BLOCK_K = 32: by how many elements must b_ptrs move for the "
        "second K step, and by how many does yours?",
        section="2.2",
    ),
    Mistake(
        6,
        fails=("test_every_tile_computed_when_last_group_is_short",),
        passes=("test_k_edge_is_masked", "test_programs_visit_tiles_in_grouped_order[3]"),
        question="5 tile rows in groups of GROUP_M = 2: how many tile rows has the last group, and how "
        "many does your pid_m mapping assume?",
        section="2.3",
    ),
    Mistake(
        7,
        fails=("test_programs_visit_tiles_in_grouped_order[3]",),
        passes=(
            "test_by_hand_37x100x61_every_edge_partial",
            "test_every_tile_computed_when_last_group_is_short",
        ),
        question="Which tiles do programs 0, 1 and 2 compute in the explainer's 5 x 4 grid with "
        "GROUP_M = 2, and which do yours?",
        section="2.3",
    ),
    Mistake(
        8,
        fails=("test_every_configuration_has_dot_dims_of_16",),
        messages=("BLOCK_K",),
        # The same look-alikes as pitfall 11's, and the config check's words besides: named before it.
        passes=(
            "test_by_hand_37x100x61_every_edge_partial",
            "test_programs_visit_tiles_in_grouped_order",
            "test_every_tile_computed_when_last_group_is_short",
            "test_non_power_of_two_shapes",
        ),
        question="Which configuration of the table has a block dimension below 16, and what does a GPU's "
        "tl.dot need for K?",
        section="3.5",
    ),
    Mistake(
        10,
        fails=("test_out_keeps_the_range_of_its_dtype[bf16]",),
        passes=("test_out_keeps_the_range_of_its_dtype[fp16]", "test_dtypes[fp16]"),
        question="Your fp16 cases pass and a bf16 one past 65504 does not: which dtype does your kernel "
        "cast acc to before the store, and what does fp16 make of a bf16 value of 300000?",
        section="3.4",
    ),
    Mistake(
        9,
        fails=("test_loads_stay_inside_a_and_b",),
        messages=("out of bounds load",),
        passes=("test_by_hand_37x100x61_every_edge_partial",),
        question="M = 37, BLOCK_M = 32: which rows of A does your last tile row load, and does A have them?",
        section="3.2",
    ),
    Mistake(
        9,
        # B's columns wrapped % M: right wherever N <= M (the store-edge cases, the exact multiples), and
        # columns past M read as column j - M where N > M. A wrong B stride fails N <= M as well.
        fails=("test_non_power_of_two_shapes[37-100-61]", "test_by_hand_37x100x61_every_edge_partial"),
        passes=(
            "test_store_masked_at_m_and_n_edges",
            "test_shapes_that_are_exact_multiples_of_the_tiles",
            "test_every_tile_computed_when_last_group_is_short",
            "test_non_power_of_two_shapes[1-1-1]",
        ),
        question="Every shape with N <= M passes and M = 37, N = 100 does not: which dimension does your "
        "kernel wrap B's columns by, and which column does column 40 become?",
        section="3.2",
    ),
    Mistake(
        13,
        fails=("test_one_program_per_tile",),
        passes=(
            "test_by_hand_37x100x61_every_edge_partial",
            "test_shapes_that_are_exact_multiples_of_the_tiles",
        ),
        messages=(r"programs for \d+ tiles of C",),
        question="M = 512 and N = 64 in 32 x 32 tiles: how many tiles of C are there, and how many "
        "programs does your grid launch?",
        section="3.1",
    ),
    Mistake(
        12,
        # Right at every partial edge: only a whole number of tiles shows a count one too many.
        fails=("test_shapes_that_are_exact_multiples_of_the_tiles",),
        passes=(
            "test_by_hand_37x100x61_every_edge_partial",
            "test_store_masked_at_m_and_n_edges",
            "test_every_tile_computed_when_last_group_is_short",
        ),
        question="M = 256, N = 128 and 32 x 32 tiles: how many tile rows and tile columns does your "
        "kernel count, and how many tiles does the grid launch programs for?",
        section="3.1",
    ),
    Mistake(
        11,
        # Only the GPU's large configuration has tiles that are not square: every other check passes.
        fails=("test_every_configuration_has_dot_dims_of_16",),
        passes=(
            "test_by_hand_37x100x61_every_edge_partial",
            "test_programs_visit_tiles_in_grouped_order",
            "test_every_tile_computed_when_last_group_is_short",
            "test_non_power_of_two_shapes",
        ),
        question="The large configuration's tiles are 128 x 256: which of your tile counts, offsets and "
        "masks along N use BLOCK_M, or along M use BLOCK_N?",
        section="3.1",
    ),
]
