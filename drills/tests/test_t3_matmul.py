"""Grader for T3, tiled matmul. Each test is named for the mistake it catches.

Run: make test L=t3 (your drills/mine) or make test L=t3 IMPL=solutions. Every input is a view into a
larger NaN-filled buffer, so reading past any edge of A or B brings NaN into the result; every output
is a view into a canary-filled buffer, so storing past any edge of C overwrites a canary.
"""
from __future__ import annotations

import pytest
import torch

from drills.compare import assert_close, assert_untouched, mismatch
from drills.tests import seeded
from drills.tests.launches import assert_runs_a_triton_kernel

DIMS = ("m", "n")  # how a mismatch names its position in C
PAD = 256  # NaN rows and columns after every input: more than any block reaches past an edge
CANARY = 1234.5  # exactly representable in fp16 and bf16
MARGIN = 256  # canary rows and columns on every side of C: more than any block reaches past an edge


def poisoned(rows, cols, dtype, device, seed, transposed=False, col_step=1):
    """Random [rows, cols] values in a view of a NaN-filled buffer that has PAD spare rows and columns.

    transposed: the transpose of a [cols, rows] view (strides (1, row length)), as `x.t()` gives.
    col_step: take every col_step-th column of the buffer (a strided view, stride col_step)."""
    gen = torch.Generator().manual_seed(seeded(seed))
    r, c = (cols, rows) if transposed else (rows, cols)
    buffer = torch.full((r + PAD, c * col_step + PAD), float("nan"), dtype=dtype, device=device)
    view = buffer[:r, : c * col_step : col_step]  # [r, c]
    view.copy_(torch.randn(r, c, generator=gen).to(dtype))
    return view.t() if transposed else view


def reference(a, b):
    """fp32 oracle (computed in fp64, so no TF32 or summation order can blur it): [M, N]."""
    return (a.double() @ b.double()).float()


def run_into_canary(impl, a, b, out_transposed=False):
    """matmul(a, b, out=view) with the view inside a canary-filled buffer, MARGIN spare rows and columns
    on every side; checks that matmul returns the view and that nothing outside it changed."""
    M, N = a.shape[0], b.shape[1]
    rows, cols = (N, M) if out_transposed else (M, N)
    buffer = torch.full((rows + 2 * MARGIN, cols + 2 * MARGIN), CANARY, dtype=a.dtype, device=a.device)
    inner = buffer[MARGIN:MARGIN + rows, MARGIN:MARGIN + cols]
    out = inner.t() if out_transposed else inner  # [M, N]
    returned = impl.matmul(a, b, out=out)
    assert isinstance(returned, torch.Tensor) and returned.data_ptr() == out.data_ptr(), \
        "matmul must write into the `out` it is given and return it"
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
    keep[MARGIN:MARGIN + rows, MARGIN:MARGIN + cols] = True
    assert_untouched(buffer, CANARY, keep, "the buffer around out (a store past M or N?)",
                     ("row+256", "col+256"))
    return out


def check(impl, a, b, out_transposed=False, **tol):
    out = run_into_canary(impl, a, b, out_transposed)
    assert_close(out, reference(a, b), DIMS, **tol)
    return out


def inputs(M, N, K, device, seed, dtype=torch.float16, **layout):
    a = poisoned(M, K, dtype, device, seed, layout.get("a_transposed", False), layout.get("a_step", 1))
    b = poisoned(K, N, dtype, device, seed + 1, layout.get("b_transposed", False), layout.get("b_step", 1))
    return a, b


def gpu_only(runtime, shapes):
    return [] if runtime.interpreter else shapes


# --- Section 2 "By hand" ------------------------------------------------------------------------------


def test_by_hand_37x100x61_every_edge_partial(impl, runtime):
    """The explainer's example: with 32 x 32 x 32 blocks, the last tile row holds 5 real rows, the last
    tile column 4 real columns, and the second K step 29 real k (3 masked)."""
    a, b = inputs(37, 100, 61, runtime.device, seed=37)
    check(impl, a, b)


# The launch order of the explainer's table: 5 x 4 tiles, GROUP_M = 2; program i computes ORDER[i].
ORDER = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3),
         (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2), (2, 3), (3, 3),
         (4, 0), (4, 1), (4, 2), (4, 3)]


@pytest.mark.parametrize("programs", [3, 6, 8, 17, 20])
def test_programs_visit_tiles_in_grouped_order(impl, runtime, programs):
    """Launch matmul_kernel itself with only the first `programs` programs of the explainer's 5 x 4 tile
    grid (16 x 16 tiles, GROUP_M = 2; C is 69 x 64, so tile row 4 holds 5 real rows): exactly the tiles
    ORDER[:programs] must be written, and written right. Row-major order, or a last group taken as
    GROUP_M rows long, writes other tiles."""
    M, N, K, T = 69, 64, 40, 16
    a, b = inputs(M, N, K, runtime.device, seed=5)
    buffer = torch.full((M + 2 * MARGIN, N + 2 * MARGIN), CANARY, dtype=a.dtype, device=a.device)
    c = buffer[MARGIN:MARGIN + M, MARGIN:MARGIN + N]  # [M, N]
    impl.matmul_kernel[(programs,)](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=T, BLOCK_N=T, BLOCK_K=T, GROUP_M=2,
    )
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
    keep[MARGIN:MARGIN + M, MARGIN:MARGIN + N] = True
    assert_untouched(buffer, CANARY, keep, "the buffer around C", ("row+256", "col+256"))
    written = {(i, j) for i in range(5) for j in range(4)
               if (c[i * T:(i + 1) * T, j * T:(j + 1) * T] != CANARY).any()}
    expected = set(ORDER[:programs])
    assert written == expected, (
        f"the first {programs} programs wrote tiles {sorted(written)}; grouped order (GROUP_M = 2) "
        f"gives {sorted(expected)} (missing {sorted(expected - written)}, extra {sorted(written - expected)})")
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
    a, b = inputs(M, N, K, runtime.device, seed=7)
    a[:, 0], b[0, :] = 32.0, 64.0
    a[:, 1:], b[1:, :] = 1.0 / 16, 1.0 / 16
    out = check(impl, a, b, rtol=1e-3, rel=1e-3)
    assert (out == 2052).all(), f"expected exactly 2052 everywhere, got values from {out.min()} to {out.max()}"


# --- Section 5 "Pitfalls" -----------------------------------------------------------------------------


@pytest.mark.parametrize("K", [1, 15, 16, 17, 33, 61, 100])
def test_k_edge_is_masked(impl, runtime, K):
    """K not a multiple of BLOCK_K: the last K step reaches into NaN, which must be masked off in both A
    and B (0 * NaN is NaN, so masking one operand is not enough)."""
    a, b = inputs(20, 24, K, runtime.device, seed=K)
    check(impl, a, b)


@pytest.mark.parametrize("M,N,K", [(33, 31, 16), (1, 1, 16), (65, 47, 40), (100, 1, 7)])
def test_store_masked_at_m_and_n_edges(impl, runtime, M, N, K):
    """M and N not multiples of the block: a store without the (m < M) & (n < N) mask writes rows and
    columns past C, into the canary around it."""
    a, b = inputs(M, N, K, runtime.device, seed=M + N)
    check(impl, a, b)


def test_k_longer_than_one_block(impl, runtime):
    """Many K steps: the pointers must advance by BLOCK_K along K (stride_ak for A, stride_bk for B)."""
    K = 300 if runtime.interpreter else 2500
    a, b = inputs(40, 70, K, runtime.device, seed=3)
    check(impl, a, b)


@pytest.mark.parametrize("M,N,K", [(37, 100, 61), (1, 16, 1), (129, 257, 65), (5, 300, 33), (1, 1, 1)])
def test_non_power_of_two_shapes(impl, runtime, M, N, K):
    a, b = inputs(M, N, K, runtime.device, seed=M * 7 + N)
    check(impl, a, b)


def test_large_non_power_of_two_shapes(impl, runtime):
    """GPU only: shapes that use the large block configuration, with every edge partial."""
    if runtime.interpreter:
        pytest.skip("GPU only: these shapes use the GPU's large block configuration; the interpreter "
                    "would take minutes")
    for M, N, K in [(1031, 1100, 1000), (2049, 1537, 640), (4096, 4096, 4096)]:
        a, b = inputs(M, N, K, runtime.device, seed=M)
        check(impl, a, b)


@pytest.mark.parametrize("M", [129, 300, 577])
def test_every_tile_computed_when_last_group_is_short(impl, runtime, M):
    """Tile rows not a multiple of GROUP_M (5, 10 and 19 tile rows of 32 with GROUP_M = 4 on the CPU;
    10 rows of 64 with GROUP_M = 8 at M = 577 on a GPU): the last group is shorter, and a mapping that
    assumes GROUP_M rows there leaves tiles unwritten (still canary)."""
    a, b = inputs(M, 100, 40, runtime.device, seed=M)
    check(impl, a, b)
    if not runtime.interpreter:  # 10 tile rows of 128 with GROUP_M = 8, large configuration
        a, b = inputs(1157, 1100, 200, runtime.device, seed=M + 1)
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
    a, b = inputs(37, 45, 70, runtime.device, seed=11, **LAYOUTS[layout])
    check(impl, a, b)


def test_output_strides_are_respected(impl, runtime):
    """out as a transposed view (strides (1, M + 2 * MARGIN)): the store must use stride_cm and stride_cn."""
    a, b = inputs(37, 45, 70, runtime.device, seed=13)
    check(impl, a, b, out_transposed=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dtypes(impl, runtime, dtype):
    """The output has the inputs' dtype, rounded from fp32 once."""
    if dtype == torch.bfloat16 and runtime.interpreter:
        pytest.skip("bf16 runs on a GPU only: the Triton interpreter's tl.dot returns garbage for bf16 "
                    "(seen in Triton 3.6 and 3.9)")
    M, N, K = (37, 100, 61) if runtime.interpreter else (1031, 1100, 1000)
    a, b = inputs(M, N, K, runtime.device, seed=17, dtype=dtype)
    out = check(impl, a, b)
    assert out.dtype == dtype


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
    "out_wrong_shape": (lambda a, b: dict(out=torch.empty(a.shape[0], b.shape[1] + 1, dtype=a.dtype,
                                                          device=a.device)), ValueError, "out must"),
    "out_rank_3": (lambda a, b: dict(out=torch.empty(1, a.shape[0], b.shape[1], dtype=a.dtype,
                                                     device=a.device)), ValueError, "out must"),
    "out_float32": (lambda a, b: dict(out=torch.empty(a.shape[0], b.shape[1], device=a.device)),
                    TypeError, "out must"),
    "out_other_device": (lambda a, b: dict(out=torch.empty(a.shape[0], b.shape[1], dtype=a.dtype,
                                                           device="meta")), ValueError, "out is on meta"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    a, b = inputs(37, 45, 61, runtime.device, seed=19)
    args = dict(a=a, b=b)
    args.update(spoil(a, b))
    with pytest.raises(error, match=names):
        impl.matmul(**args)


def test_launcher_rejects_offsets_past_int32(impl, runtime):
    """A view whose last element sits 2**31 elements or more from its first cannot be addressed with the
    kernel's int32 offsets: rejected, not silently wrapped."""
    if runtime.interpreter:
        pytest.skip("GPU only: the test allocates a 4 GB buffer for the view")
    a = torch.empty_strided((2, 16), (2**31, 1), dtype=torch.float16, device=runtime.device)  # [2, 16]
    b = torch.zeros(16, 8, dtype=torch.float16, device=runtime.device)
    with pytest.raises(ValueError, match="a spans"):
        impl.matmul(a, b)


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: matmul must compute them with your Triton kernel, not with
    torch (a @ b, or a copy of the grader's oracle)."""
    a, b = inputs(37, 45, 61, runtime.device, seed=31)
    assert_runs_a_triton_kernel(impl, lambda: impl.matmul(a, b), "matmul")


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_a_dropped_k_term(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros C and a C that misses the
    last k term (a K mask off by one), and passes the oracle rounded to fp16."""
    a, b = inputs(37, 100, 61, runtime.device, seed=23)
    ref = reference(a, b)
    assert mismatch(torch.zeros_like(ref).half(), ref) is not None
    assert mismatch(reference(a[:, :-1], b[:-1]).half(), ref) is not None
    assert mismatch(ref.half(), ref) is None


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, matmul allocates [M, N] in the inputs' dtype. M and N are multiples of every block
    size used here, so a kernel that forgets the store mask (reported by the canary tests above) does
    not also write past this allocation and crash the run."""
    a, b = inputs(64, 64, 61, runtime.device, seed=29)
    out = impl.matmul(a, b)
    assert out.shape == (64, 64) and out.dtype == a.dtype and out.device == a.device
    assert_close(out, reference(a, b), DIMS)
