"""Grader for T2, fused row softmax. Each test is named for the mistake it catches.

Run: make test L=t2 (your drills/mine) or make test L=t2 IMPL=solutions. Every input is a view into a
NaN-filled buffer and every output a view into a canary-filled one, with different row strides: a load
past a row's end reads NaN, a store past it overwrites the canary, and a mixed-up stride shows.
"""

from __future__ import annotations

import pytest
import torch

from drills.compare import assert_close, assert_untouched, mismatch
from drills.grading.grader.diagnose import Mistake, returned_out_problem, returned_problem
from drills.grading.shared.bigmem import WRAP, free_bytes, rows_past_int32
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel, record_launches
from drills.tests import bf16_everywhere, empty_at_an_address, seeded, sizes

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK": (
        "test_non_power_of_two_1823x781",
        "test_padded_columns_load_as_minus_inf",
        "test_rows_longer_than_one_block",
    ),
    "ONE_BLOCK": ("test_rows_longer_than_one_block", "test_row_of_exactly_one_block", "test_rows_sum_to_one"),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}

DIMS = ("row", "col")
CANARY = 1234.5  # exactly representable in fp16, bf16 and fp32
X_PAD, OUT_PAD = 96, 64  # spare columns on each side of every row of x and of out: the row strides differ
SPILL = 1 << 15  # spare elements after the last spare row: room for a whole unmasked block
STRIDE_GAP = 2 * abs(X_PAD - OUT_PAD)  # per row: how far x's row stride and out's apart


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """The fp32 oracle: max-subtracted softmax over the last dimension (NaN for an all -inf row)."""
    x = x.float()
    m = x.amax(dim=-1, keepdim=True)  # [M, 1]
    e = torch.exp(x - m)  # [M, N]
    return e / e.sum(dim=-1, keepdim=True)


class Framed:
    """An [M, N] view one spare row and `pad` spare columns inside a buffer of `fill`, plus spare elements
    after the buffer's last row: a whole block, and M * STRIDE_GAP more, so that rows addressed with the
    other tensor's stride still land inside the buffer."""

    def __init__(self, M, N, pad, fill, dtype, device):
        self.width = N + 2 * pad
        self.flat = torch.full(
            ((M + 2) * self.width + SPILL + M * STRIDE_GAP,), fill, dtype=dtype, device=device
        )
        self.grid = self.flat[: (M + 2) * self.width].view(M + 2, self.width)  # [M + 2, N + 2 * pad]
        self.view = self.grid[1 : M + 1, pad : pad + N]  # [M, N], stride (N + 2 * pad, 1)
        self.keep = torch.zeros(self.grid.shape, dtype=torch.bool, device=device)
        self.keep[1 : M + 1, pad : pad + N] = True

    def assert_untouched(self, what):
        assert_untouched(
            self.grid, CANARY, self.keep, what, ("row+1", f"col+{(self.width - self.view.shape[1]) // 2}")
        )
        tail = self.flat[self.grid.numel() :]
        assert (tail == CANARY).all(), f"{what}: a store landed past the last row of the buffer"


def framed_input(values: torch.Tensor) -> torch.Tensor:
    M, N = values.shape
    frame = Framed(M, N, X_PAD, float("nan"), values.dtype, values.device)
    frame.view.copy_(values)
    return frame.view


def run_into_canary(impl, x):
    """softmax(x, out=...) with out a strided view into a canary buffer; nothing outside out may change."""
    M, N = x.shape
    frame = Framed(M, N, OUT_PAD, CANARY, x.dtype, x.device)
    returned = impl.softmax(x, out=frame.view)
    wrong = returned_problem("softmax", returned, (("out", x.shape, x.dtype),))
    assert wrong is None, wrong
    wrong = returned_out_problem("softmax", returned, frame.view)
    assert wrong is None, wrong
    frame.assert_untouched("the buffer around out (is every store masked, and at out's row stride?)")
    return frame.view


def check(impl, x, **tol):
    out = run_into_canary(impl, x)
    assert_close(out, softmax_reference(x), DIMS, **tol)
    return out


def randn(M, N, dtype, device, stream, scale=1.0):
    gen = torch.Generator().manual_seed(seeded(stream))
    return framed_input((scale * torch.randn(M, N, generator=gen)).to(dtype).to(device))


def long_row(impl, extra):
    """A row length past the launcher's one-block limit."""
    return 2 * impl.MAX_BLOCK + extra


# --- Section 2 "By hand": the row [2, 1, 4, 3] -------------------------------------------------------

BY_HAND = [0.087144, 0.032059, 0.643914, 0.236883]  # e^(x - 4) / 1.553001


def test_by_hand_row_2_1_4_3(impl, runtime):
    """max 4; e^(x - 4) = [0.1353, 0.0498, 1, 0.3679]; sum 1.5530; softmax [0.0871, 0.0321, 0.6439, 0.2369].
    Shifting the row by 10000 changes nothing (and overflows exp without the max)."""
    x = framed_input(
        torch.tensor([[2.0, 1.0, 4.0, 3.0], [10002.0, 10001.0, 10004.0, 10003.0]], device=runtime.device)
    )
    out = check(impl, x)
    for row in range(2):
        assert [round(v, 4) for v in out[row].tolist()] == [round(v, 4) for v in BY_HAND], out[row].tolist()


def test_by_hand_padding_in_a_block_of_8(impl, runtime):
    """The same row in a block of 8 columns: lanes 4..7 are padding. Loaded as 0 instead of -inf they
    would add 4 * e^(0 - 4) = 0.0733 to the sum (1.6263 instead of 1.5530)."""
    x = framed_input(torch.tensor([[2.0, 1.0, 4.0, 3.0]], device=runtime.device))
    frame = Framed(1, 4, OUT_PAD, CANARY, x.dtype, x.device)
    impl._launch(x, frame.view, BLOCK=8)
    frame.assert_untouched("the buffer around out (padding lanes 4..7 stored?)")
    assert_close(frame.view, torch.tensor([BY_HAND], device=runtime.device), DIMS)


def test_by_hand_two_blocks_of_2_three_passes(impl, runtime):
    """The same row in blocks of 2 columns: pass 1 finds max(2, 4) = 4, pass 2 sums 0.1851 + 1.3679 =
    1.5530, pass 3 stores. Stopping after the first block gives [0.7311, 0.2689] and no columns 2 and 3."""
    x = framed_input(torch.tensor([[2.0, 1.0, 4.0, 3.0]], device=runtime.device))
    frame = Framed(1, 4, OUT_PAD, CANARY, x.dtype, x.device)
    impl._launch(x, frame.view, BLOCK=2)
    frame.assert_untouched("the buffer around out")
    assert_close(frame.view, torch.tensor([BY_HAND], device=runtime.device), DIMS)


# --- Section 5 "Pitfalls" -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_non_power_of_two_1823x781(impl, runtime, dtype):
    """781 columns in a block of 1024: 243 padded lanes per row, 1823 rows (the interpreter takes a few
    ms a row, so it runs the first 203 rows there)."""
    M = sizes(runtime, 203, 1823)
    check(impl, randn(M, 781, dtype, runtime.device, stream=1823))


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_large_values_do_not_overflow(impl, runtime, dtype, where):
    """Values of magnitude 1e4: exp(1e4) is inf in fp32, so without subtracting the row max every row is
    inf / inf = NaN. With it, the largest entry of each row gets almost all the weight."""
    M, N = (37, 781) if where == "one_block" else (3, long_row(impl, 77))
    x = randn(M, N, torch.float32, runtime.device, stream=4, scale=1e4).clamp(-6e4, 6e4).to(dtype)
    check(impl, x)


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
def test_minus_inf_entries_get_zero_weight(impl, runtime, where):
    """-inf (a masked logit) gets weight exactly 0, in the first and last columns too."""
    M, N = (19, 300) if where == "one_block" else (3, long_row(impl, 5))
    gen = torch.Generator().manual_seed(seeded(6))
    x = torch.randn(M, N, generator=gen)
    x[torch.rand(M, N, generator=gen) < 0.3] = float("-inf")
    x[:, 0] = float("-inf")
    x[:, -1] = float("-inf")
    x = framed_input(x.to(runtime.device))
    out = check(impl, x)
    assert (out[torch.isinf(x)] == 0).all(), "a -inf entry got a non-zero weight"


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
@pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning"
)  # -inf - (-inf) in the interpreter
def test_fully_masked_row_is_nan_like_torch(impl, runtime, where):
    """A row that is -inf everywhere has no distribution: its output is NaN, as torch.softmax gives, and
    the NaN stays in that row (the rows around it are exact)."""
    M, N = (7, 100) if where == "one_block" else (3, long_row(impl, 9))
    gen = torch.Generator().manual_seed(seeded(8))
    x = torch.randn(M, N, generator=gen)
    dead = [1] if where == "long_rows" else [0, 4]
    x[dead] = float("-inf")
    x = framed_input(x.to(runtime.device))
    out = run_into_canary(impl, x)
    assert torch.isnan(torch.softmax(x[dead].float(), dim=-1)).all()  # the behaviour being matched
    assert torch.isnan(out[dead]).all(), (
        f"rows {dead} are -inf everywhere: expected NaN, as torch.softmax gives"
    )
    live = [r for r in range(M) if r not in dead]
    assert_close(out[live], softmax_reference(x[live]), DIMS)


@pytest.mark.parametrize("N", [3, 17, 781, 1025])
def test_padded_columns_load_as_minus_inf(impl, runtime, N):
    """Every real value is about -30: padded lanes loaded as 0 would be the max, and their e^0 = 1 each
    would swamp the real terms of the sum."""
    x = randn(5, N, torch.float32, runtime.device, stream=N) - 30.0
    check(impl, x)


def test_exponential_is_natural(impl, runtime):
    """The row [0, 1]: e^0 / (e^0 + e^1) = 0.268941 and e / (1 + e) = 0.731059. tl.exp2 without the
    log2(e) factor computes 2^x instead, 1/3 and 2/3: a softmax that sums to 1, only too flat."""
    x = framed_input(torch.tensor([[0.0, 1.0]], device=runtime.device))  # [1, 2]
    out = run_into_canary(impl, x)
    got = [round(v, 6) for v in out[0].tolist()]
    if abs(got[0] - 1 / 3) < 1e-4 and abs(got[1] - 2 / 3) < 1e-4:
        raise AssertionError(
            f"softmax of [0, 1] is {got}: 2^x / sum 2^x, not e^x / sum e^x; tl.exp2(z) is e^z only as "
            "tl.exp2(z * 1.4426950408889634), log2(e)"
        )
    assert_close(out, softmax_reference(x), DIMS)


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
def test_max_starts_at_minus_inf(impl, runtime, where):
    """Every value between -300 and -200: a row max that starts at 0 instead of -inf stays 0, every
    exp(x - 0) underflows to 0 in fp32 (below about -104), and the row becomes 0 / 0 = NaN."""
    M, N = (4, 300) if where == "one_block" else (2, long_row(impl, 3))
    gen = torch.Generator().manual_seed(seeded(9))
    x = framed_input((-250.0 + 50.0 * (2 * torch.rand(M, N, generator=gen) - 1)).to(runtime.device))
    check(impl, x)


@pytest.mark.parametrize("extra", [1, 77], ids=lambda e: f"2*MAX_BLOCK+{e}")
def test_rows_longer_than_one_block(impl, runtime, extra):
    """Rows of more than MAX_BLOCK columns: three blocks, the last one nearly empty. The row max sits in
    the last block (row 0), the middle block (row 1) or the first (row 2), so a max or a sum taken over
    the first block only is wrong, and so are columns never stored."""
    N = long_row(impl, extra)
    gen = torch.Generator().manual_seed(seeded(extra))
    x = torch.randn(3, N, generator=gen)
    x[0, -1], x[1, N // 2], x[2, 3] = 6.0, 6.0, 6.0
    check(impl, framed_input(x.to(runtime.device)))


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
def test_loads_stay_inside_x(impl, runtime, where):
    """x allocated to the exact element, nothing of its own after the last row's last column: a load
    left unmasked (the store's mask keeps out right) reads past the end of x, which the grader's check
    of every load lane reports as an out-of-bounds load. The other tests' x lies inside a wider buffer,
    where such a load reads the NaN padding and is never stored."""
    M, N = (3, 781) if where == "one_block" else (2, long_row(impl, 5))
    gen = torch.Generator().manual_seed(seeded(13))
    check(impl, torch.randn(M, N, generator=gen).to(runtime.device))  # [M, N], contiguous, tight


def test_row_of_exactly_one_block(impl, runtime):
    """N = MAX_BLOCK: the longest row that stays in one block, no padded lane."""
    check(impl, randn(2, impl.MAX_BLOCK, torch.float32, runtime.device, stream=12))


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
def test_rows_sum_to_one(impl, runtime, where):
    """Each row of out sums to 1: forgetting to divide by the sum leaves the sum itself in every row. Only
    the sums are checked here (every other check compares the values): a softmax of another base (exp2
    without the log2(e) factor) sums to 1 and must not be taken for a missing division."""
    M, N = (9, 500) if where == "one_block" else (2, long_row(impl, 33))
    out = run_into_canary(impl, randn(M, N, torch.float32, runtime.device, stream=10))
    assert_close(out.sum(dim=-1), torch.ones(M, device=runtime.device), ("row",))


@pytest.mark.parametrize(
    "dtype", [torch.float16, bf16_everywhere(), torch.float32], ids=["fp16", "bf16", "fp32"]
)
def test_dtypes(impl, runtime, dtype):
    M, N = sizes(runtime, (21, 1000), (4096, 3000))
    out = check(impl, randn(M, N, dtype, runtime.device, stream=14, scale=3.0))
    assert out.dtype == dtype


def test_large_batch_gpu(impl, runtime):
    """The benchmark's shapes, at full size, and a vocabulary-sized row (multi-block path)."""
    if runtime.interpreter:
        pytest.skip("GPU only: millions of rows take minutes in the interpreter")
    for M, N in [(8192, 4096), (4096, 16384), (32768, 1024), (64, 128256)]:
        check(impl, randn(M, N, torch.float16, runtime.device, stream=M + N, scale=4.0))


def test_empty_input(impl, runtime):
    """No rows, or rows of no columns: nothing to launch, an empty result (out itself, when given)."""
    for shape in [(0, 5), (5, 0)]:
        out = impl.softmax(torch.empty(shape, device=runtime.device))
        assert out.shape == shape
        # With out given, out itself comes back, empty as it is, not a tensor of the launcher's own.
        given = empty_at_an_address(shape, torch.float32, runtime.device)  # not torch.empty: see its doc
        wrong = returned_out_problem(
            "softmax", impl.softmax(torch.empty(shape, device=runtime.device), out=given), given
        )
        assert wrong is None, wrong


# --- The launcher rejects bad input before launching -----------------------------------------------


def _transposed(t):
    return t.t().contiguous().t()  # same values, columns strided


def _shifted_by_one_row(t):
    """x (a copy of t) and out, the same memory one row further on: a partial overlap."""
    buffer = torch.zeros(t.shape[0] + 1, t.shape[1], dtype=t.dtype, device=t.device)  # [M + 1, N]
    buffer[:-1] = t
    return dict(x=buffer[:-1], out=buffer[1:])


def _shifted_back_one_row(t):
    """x (a copy of t) and out, the same memory one row earlier: program r writes the row program r - 1
    reads, the partial overlap the other way round."""
    buffer = torch.zeros(t.shape[0] + 1, t.shape[1], dtype=t.dtype, device=t.device)  # [M + 1, N]
    buffer[1:] = t
    return dict(x=buffer[1:], out=buffer[:-1])


def _same_start_other_strides(t):
    """x and out start at the same address with other row strides: x is the first 64 elements of a
    buffer seen as [8, 8], out the whole buffer seen as [8, 16] with its first 8 columns. Not x itself
    (same address, same strides): row 1 of out is row 2 of x, so comparing addresses alone lets it by."""
    buffer = torch.zeros(128, dtype=t.dtype, device=t.device)
    return dict(x=buffer[:64].view(8, 8), out=buffer.view(8, 16)[:, :8])


# name -> (a bad call's arguments from a valid x, the error, what the message must name)
BAD_INPUTS = {
    "x_not_a_tensor": (lambda x: dict(x=x.tolist()), TypeError, "x"),
    "x_rank_1": (lambda x: dict(x=x[0]), ValueError, "x"),
    "x_rank_3": (lambda x: dict(x=x[None]), ValueError, "x"),
    "x_int64": (lambda x: dict(x=x.long()), TypeError, "x"),
    "x_float64": (lambda x: dict(x=x.double()), TypeError, "x"),
    "x_columns_strided": (lambda x: dict(x=_transposed(x)), ValueError, "x"),
    "out_shape": (lambda x: dict(x=x, out=torch.empty_like(x)[:, :-1]), ValueError, "out"),
    "out_dtype": (lambda x: dict(x=x, out=torch.empty_like(x).half()), TypeError, "out"),
    "out_rank_1": (lambda x: dict(x=x, out=torch.empty_like(x).view(-1)), ValueError, "out"),
    "out_columns_strided": (lambda x: dict(x=x, out=_transposed(torch.empty_like(x))), ValueError, "out"),
    "out_on_another_device": (lambda x: dict(x=x, out=torch.empty_like(x, device="meta")), ValueError, "out"),
    "x_on_a_device_the_runtime_cannot_run": (lambda x: dict(x=x.to("meta")), ValueError, "x is on meta"),
    "out_not_a_tensor": (lambda x: dict(x=x, out=x.tolist()), TypeError, "out"),
    "out_rows_overlap": (
        lambda x: dict(x=x, out=torch.empty_like(x[:1]).expand(x.shape)),
        ValueError,
        "out's rows overlap",
    ),
    # Rows one column short of apart: row r's last element is row r + 1's first (stride 0 is not all).
    "out_rows_overlap_partly": (
        lambda x: dict(
            x=x, out=torch.empty(x.numel(), device=x.device).as_strided(x.shape, (x.shape[1] - 1, 1))
        ),
        ValueError,
        "out's rows overlap",
    ),
    "out_partly_overlaps_x": (lambda x: _shifted_by_one_row(x), ValueError, "out overlaps x"),
    "out_partly_overlaps_x_from_before": (lambda x: _shifted_back_one_row(x), ValueError, "out overlaps x"),
    "out_at_x_with_other_strides": (lambda x: _same_start_other_strides(x), ValueError, "out overlaps x"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    x = torch.randn(6, 10, device=runtime.device)
    with record_launches(impl) as launches, pytest.raises(error, match=names):
        impl.softmax(**spoil(x))
    assert not launches.calls, "the error must come before any kernel is launched"


@pytest.mark.parametrize("BLOCK", [3, 0, 48, 8.0])
def test_launch_rejects_block_not_a_power_of_two(impl, runtime, BLOCK):
    """tl.arange(0, BLOCK) needs a power of two: _launch says so, naming BLOCK, before launching."""
    x = torch.randn(6, 10, device=runtime.device)
    with record_launches(impl) as launches, pytest.raises(ValueError, match="BLOCK"):
        impl._launch(x, torch.empty_like(x), BLOCK=BLOCK)
    assert not launches.calls, "the error must come before any kernel is launched"


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: softmax must compute them with your Triton kernel, not with
    torch (torch.softmax, or a copy of the grader's oracle)."""
    x = randn(8, 100, torch.float32, runtime.device, stream=20)
    assert_runs_a_triton_kernel(impl, lambda: impl.softmax(x), "softmax")


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_uniform(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros output and the uniform 1 / N
    (a softmax of a constant row), so passing the other tests means something."""
    x = randn(64, 781, torch.float16, runtime.device, stream=16, scale=2.0)
    ref = softmax_reference(x)
    assert mismatch(torch.zeros_like(x), ref) is not None
    assert mismatch(torch.full_like(x, 1 / 781), ref) is not None
    assert mismatch(ref.half(), ref) is None  # and the oracle rounded to fp16 passes


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, softmax allocates [M, N] in x's dtype. x is contiguous and N = 4096 fills its blocks
    exactly, so an unmasked store or a mixed-up row stride is reported by the canary tests above, not by
    a write past this allocation."""
    x = torch.randn(5, 4096, generator=torch.Generator().manual_seed(seeded(18))).half().to(runtime.device)
    out = impl.softmax(x)
    wrong = returned_problem("softmax", out, (("out", x.shape, x.dtype),))
    assert wrong is None, wrong
    assert out.device == x.device
    assert_close(out, softmax_reference(x), DIMS)


def test_out_may_be_x(impl, runtime):
    """In place, softmax(x, out=x): each program reads its row before it writes it."""
    x = randn(5, 300, torch.float32, runtime.device, stream=15)
    expected = softmax_reference(x)
    returned = impl.softmax(x, out=x)
    wrong = returned_problem("softmax", returned, (("out", x.shape, x.dtype),))
    assert wrong is None, wrong
    wrong = returned_out_problem("softmax", returned, x)
    assert wrong is None, wrong
    assert_close(x, expected, DIMS)


# --- Offsets past 2**31 elements, on sparse buffers -----------------------------------------------


@pytest.mark.parametrize("where", ["one_block", "long_rows"])
def test_row_offsets_widened_to_int64(impl, runtime, where):
    """Row 2 starts 2 * (2**30 + 2**20) elements into x and out, past 2**31: row * stride computed in
    int32 wraps to a negative offset, 2**31 - 2**21 elements before row 0, so that row is read from
    the wrong place and stored there too."""
    if runtime.interpreter and free_bytes() < 2**30:
        pytest.skip(
            f"needs about 1 GB of free memory for the touched pages and the interpreter; "
            f"{free_bytes() / 2**30:.1f} GB free"
        )
    N = 781 if where == "one_block" else long_row(impl, 5)
    gen = torch.Generator().manual_seed(seeded(21))
    x, _ = rows_past_int32(N, runtime.device)
    x.copy_(torch.randn(3, N, generator=gen).to(torch.float16))
    out, out_flat = rows_past_int32(N, runtime.device)
    out.fill_(CANARY)
    impl.softmax(x, out=out)
    assert (out_flat[:N] == 0).all(), (
        f"a row of out was stored {WRAP} elements before row 0: the row offset "
        "row * stride wrapped around in int32"
    )
    assert_close(out, softmax_reference(x), DIMS)


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """70,000 rows, more than the 65535 programs CUDA allows on grid axes 1 and 2 (axis 0 allows
    2**31 - 1): rows put on axis 1 launch on the CPU and fail on a GPU with "invalid argument". Run dry
    (every launch recorded and checked, none run), so 4 columns a row cost nothing."""
    x = torch.zeros(70_000, 4, device=runtime.device)  # [M, N]: M past 65535
    assert_grids_fit(impl, lambda: impl.softmax(x), "softmax of 70,000 rows")
    # One row past 2**20 columns: a block sized from N (next_power_of_2(N), uncapped) runs in the
    # interpreter at any N, but Triton compiles no block past 2**20 elements; such rows need the
    # multi-block path, which the dry run leaves to the launcher to choose.
    wide = torch.zeros(1, 2**20 + 1, device=runtime.device)  # [1, N]: N past Triton's largest block
    assert_grids_fit(impl, lambda: impl.softmax(wide), "softmax of one row of 2**20 + 1 columns")


# --- Diagnosis: which pitfall of drills/content/t2_softmax.md a pattern of results points to ---------

MISTAKES = [
    Mistake(
        1,
        fails=("test_large_values_do_not_overflow",),
        passes=("test_rows_sum_to_one", "test_padded_columns_load_as_minus_inf"),
        question="What is exp(10000) in fp32, and what does your kernel subtract from x before it "
        "exponentiates?",
        section="2",
    ),
    Mistake(
        2,
        # A load left unmasked past the row's end, its lanes never stored: only a tight x shows it.
        fails=("test_loads_stay_inside_x",),
        passes=("test_rows_sum_to_one", "test_padded_columns_load_as_minus_inf"),
        messages=(r"out of bounds load of x",),
        question="N = 2 * 16384 + 5: which columns does each of your passes load in the last block of "
        "the last row, and where do the lanes past N point?",
        section="3.2",
    ),
    Mistake(
        2,
        fails=("test_by_hand_padding_in_a_block_of_8", "test_padded_columns_load_as_minus_inf"),
        passes=("test_by_hand_row_2_1_4_3",),
        question="A row of 4 in a block of 8: what values do lanes 4 to 7 hold after your load, what do "
        "they add to the sum, and does your store write them?",
        section="2",
    ),
    Mistake(
        3,
        fails=("test_rows_sum_to_one[one_block]",),
        passes=("test_rows_sum_to_one[long_rows]", "test_large_values_do_not_overflow"),
        question="Your one-block outputs are e^(x - max): what do they sum to, and what must they sum to?",
        section="2",
    ),
    Mistake(
        3,
        fails=("test_rows_sum_to_one[long_rows]", "test_by_hand_two_blocks_of_2_three_passes"),
        passes=("test_rows_sum_to_one[one_block]", "test_large_values_do_not_overflow"),
        question="In the third pass over a long row, what do you divide each e^(x - m) by?",
        section="2",
    ),
    Mistake(
        4,
        fails=("test_rows_longer_than_one_block", "test_large_values_do_not_overflow[fp32-long_rows]"),
        passes=("test_rows_sum_to_one[one_block]",),
        question="N = 2 * 16384 + 77 and BLOCK = 16384: how many blocks do your passes visit, and which "
        "columns does your kernel store?",
        section="3.4",
    ),
    Mistake(
        4,
        # The block never capped (BLOCK = next_power_of_2(N)): every row in one block, right in the
        # interpreter at any N; only the dry run of a row past 2**20 columns sees the block a GPU refuses.
        fails=("test_grid_fits_cuda_limits_at_largest_sizes",),
        messages=(r"Triton compiles no tensor of more than 2\*\*20",),
        question="A row of 2**20 + 1 columns: how wide a block does your launcher ask for, and which path "
        "of your kernel should such a row take?",
        section="3.4",
    ),
    Mistake(
        5,
        fails=("test_by_hand_row_2_1_4_3", "test_rows_sum_to_one"),
        passes=("test_by_hand_padding_in_a_block_of_8", "test_out_is_allocated_when_not_given"),
        question="One row, or contiguous tensors, pass; views of wider buffers fail. How far apart are "
        "the rows of x, and of out, when x = big[:, :781]?",
        section="3.1",
    ),
    Mistake(
        6,
        fails=("test_row_offsets_widened_to_int64",),
        passes=("test_rows_sum_to_one",),
        messages=(r"int32|out of bounds",),
        question="Row 2 starts 2 * (2**30 + 2**20) elements into x: in which integer type does your "
        "kernel compute row * stride, and what does that type do past 2**31 - 1?",
        section="3.1",
    ),
    Mistake(
        9,
        fails=("test_exponential_is_natural",),
        passes=("test_rows_sum_to_one",),  # 2^z / sum 2^z sums to 1 as well
        messages=(r"2\^x / sum 2\^x, not e\^x",),
        question="Which exponential does your kernel take: e^z, or 2^z, and what does tl.exp2 need to "
        "give e^z?",
        section="3.3",
    ),
    Mistake(
        7,
        fails=("test_max_starts_at_minus_inf",),
        passes=("test_large_values_do_not_overflow", "test_rows_sum_to_one"),
        question="Every value of the row is below -200: what is your running max after the first pass, "
        "given the value it starts from?",
        section="3.4",
    ),
    Mistake(
        8,
        fails=("test_grid_fits_cuda_limits_at_largest_sizes",),
        messages=(r"past CUDA's limit on grid axis",),
        question="M can be 70,000: on which grid axis are your rows, and how many programs does CUDA "
        "allow on that axis?",
        section="3.1",
    ),
    Mistake(
        10,
        # Zeros where NaN belongs: the message names the NaN expected, not one the kernel produced.
        fails=("test_fully_masked_row_is_nan_like_torch",),
        passes=("test_large_values_do_not_overflow", "test_rows_sum_to_one"),
        messages=(r"expected NaN, as torch.softmax gives",),
        question="A row of x is -inf everywhere: what does torch.softmax give for it, and what does your "
        "kernel's guard make of it?",
        section="2",
    ),
    Mistake(
        11,
        # Every column written, each scaled by one wrong factor: [2, 1, 4, 3] in blocks of 2 sums to
        # 2.2707 against the lanes' maxes (4, 3), so the 4 gets 1 / 2.2707 = 0.4404, not 0.6439.
        fails=("test_by_hand_two_blocks_of_2_three_passes",),
        passes=("test_by_hand_row_2_1_4_3", "test_rows_sum_to_one[one_block]"),
        messages=(r"got 0\.440\d*, expected 0\.6439",),
        question="[2, 1, 4, 3] in blocks of 2: pass 1 leaves lanes' maxes (4, 3); against which max does "
        "your pass 2 sum each term, and which does pass 3 divide by?",
        section="3.4",
    ),
]
