"""Grader for T1, vector add. Each test is named for the mistake it catches.

Run: make test L=t1 (your drills/mine) or make test L=t1 IMPL=solutions. Every output is a view into a
canary-filled buffer, so a store past element n - 1 lands in the canary instead of past an allocation;
x and y are views into NaN-filled buffers, so a load past their end reads NaN instead of faulting.
"""

from __future__ import annotations

import pytest
import torch

from drills.compare import assert_close, assert_untouched, mismatch
from drills.grading.grader.diagnose import Mistake, returned_out_problem
from drills.grading.shared.bigmem import sparse_empty
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel, record_launches
from drills.tests import bf16_everywhere, empty_at_an_address, seeded, sizes

# Each constexpr of the reference's kernels -> the tests that cross it: a size one past its tile or loop
# bound (or at its widest admitted value), a flag both ways; "grid" -> the grid check at the largest sizes.
# make contract fails on a constexpr named neither here nor in BOUNDS_GAPS ("no bound:" ones only).
BOUNDS: dict[str, tuple[str, ...]] = {
    "BLOCK": (
        "test_last_block_is_masked",
        "test_each_program_adds_its_own_block",
        "test_launch_honours_its_block",
    ),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}

DIMS = ("i",)
CANARY = 1234.5  # exactly representable in fp16, bf16 and fp32
PAD = 1 << 16  # spare elements on each side of every vector: more than any sensible BLOCK


def padded(values: torch.Tensor, fill: float) -> torch.Tensor:
    """`values` copied into the middle of a buffer of `fill`, returned as a view of length n."""
    n = values.numel()
    buffer = torch.full((n + 2 * PAD,), fill, dtype=values.dtype, device=values.device)
    buffer[PAD : PAD + n] = values
    return buffer[PAD : PAD + n]  # [n], data_ptr PAD elements into the buffer


def make_inputs(n, dtype, device, stream):
    gen = torch.Generator().manual_seed(seeded(stream))
    x = torch.randn(n, generator=gen).to(dtype).to(device)  # [n]
    y = torch.randn(n, generator=gen).to(dtype).to(device)  # [n]
    return padded(x, float("nan")), padded(y, float("nan"))


def into_canary(run, x):
    """Call `run(out)` with out a view into a canary buffer; check nothing outside out changed."""
    n = x.numel()
    buffer = torch.full((n + 2 * PAD,), CANARY, dtype=x.dtype, device=x.device)
    out = buffer[PAD : PAD + n]  # [n]
    returned = run(out)
    wrong = returned_out_problem("vector_add", returned, out)
    assert wrong is None, wrong
    keep = torch.zeros(buffer.shape, dtype=torch.bool, device=buffer.device)
    keep[PAD : PAD + n] = True
    assert_untouched(buffer, CANARY, keep, "the buffer around out (is the last block masked?)", ("i+65536",))
    return out


def check(impl, x, y):
    out = into_canary(lambda out: impl.vector_add(x, y, out=out), x)
    assert_close(out, x.float() + y.float(), DIMS)
    return out


# --- Section 2 "By hand": n = 10, BLOCK = 4 ----------------------------------------------------------


def by_hand_inputs(device):
    i = torch.arange(10, dtype=torch.float32, device=device)  # [10]
    return padded(i, float("nan")), padded(10 * i, float("nan"))  # out[i] = 11 * i


def test_by_hand_kernel_masks_lanes_10_and_11(impl, runtime):
    """The kernel alone, launched by hand on 3 programs of BLOCK = 4: program 2 owns offsets 8..11, of
    which 10 and 11 are past n = 10 and must be neither read (they hold NaN) nor written (canary)."""
    x, y = by_hand_inputs(runtime.device)

    def launch_by_hand(out):
        impl.vector_add_kernel[(3,)](x, y, out, 10, BLOCK=4)  # grid (3,), as in the explainer's table
        return out

    out = into_canary(launch_by_hand, x)
    assert out.tolist() == [11.0 * i for i in range(10)], f"expected 0, 11, ..., 99, got {out.tolist()}"


def test_by_hand_lane_11_is_masked(impl, runtime):
    """The same launch inside vectors of 12 elements, so that lane 10 (element n itself) lies in memory
    the kernel may touch and is ignored here: lane 11 must still be masked. A kernel without a mask
    fails this; a mask off by one (offs <= n) passes it and fails only the check above."""
    i = torch.arange(12, dtype=torch.float32, device=runtime.device)  # [12]
    x, y = i.clone(), 10 * i
    x[11] = y[11] = float("nan")  # read by lane 11 only if it is not masked
    out = torch.full((12,), CANARY, device=runtime.device)  # [12]
    impl.vector_add_kernel[(3,)](x, y, out, 10, BLOCK=4)
    assert out[:10].tolist() == [11.0 * i for i in range(10)], (
        f"expected 0, 11, ..., 99, got {out[:10].tolist()}"
    )
    assert out[11].item() == CANARY, f"lane 11 (past n = 10) was written: out[11] = {out[11].item()}"


def test_by_hand_loads_stop_at_element_9(impl, runtime):
    """x and y of exactly 10 elements, with nothing of theirs after element 9; out has room for 12, and
    its elements 10 and 11 are not checked here. A load without the mask reads past the end of x, which
    the grader's check of every load lane reports as an out-of-bounds load."""
    i = torch.arange(10, dtype=torch.float32, device=runtime.device)  # [10]
    x, y = i.clone(), 10 * i
    out = torch.full((12,), CANARY, device=runtime.device)  # [12]
    impl.vector_add_kernel[(3,)](x, y, out, 10, BLOCK=4)
    assert out[:10].tolist() == [11.0 * i for i in range(10)], (
        f"expected 0, 11, ..., 99, got {out[:10].tolist()}"
    )


def test_by_hand_store_stops_at_element_9(impl, runtime):
    """x and y of 12 elements, so loading lanes 10 and 11 stays inside them; out ends at element 9, with
    a canary after it. A store without the mask, or with a mask off by one (offs <= n), writes element
    10 into the canary; a kernel that masks its store but not its loads passes this one."""
    i = torch.arange(12, dtype=torch.float32, device=runtime.device)  # [12]
    x, y = i.clone(), 10 * i

    def launch_by_hand(out):
        impl.vector_add_kernel[(3,)](x, y, out, 10, BLOCK=4)
        return out

    out = into_canary(launch_by_hand, x[:10])
    assert out.tolist() == [11.0 * i for i in range(10)], f"expected 0, 11, ..., 99, got {out.tolist()}"


def test_by_hand_grid_has_three_programs(impl, runtime):
    """Your launcher with BLOCK = 4 on n = 10 must launch cdiv(10, 4) = 3 programs: with 10 // 4 = 2,
    elements 8 and 9 are never written and still hold the canary."""
    x, y = by_hand_inputs(runtime.device)
    out = into_canary(lambda out: impl._launch(x, y, out, BLOCK=4), x)
    assert out.tolist() == [11.0 * i for i in range(10)], f"expected 0, 11, ..., 99, got {out.tolist()}"


# --- Section 5 "Pitfalls" -----------------------------------------------------------------------------

# n around every power-of-two BLOCK you might choose: one short of a block, exactly one, one past it.
EDGE_SIZES = [1, 2, 3] + [b + d for b in (256, 512, 1024, 2048, 4096) for d in (-1, 0, 1)]


@pytest.mark.parametrize("n", EDGE_SIZES, ids=[f"n{n}" for n in EDGE_SIZES])
def test_last_block_is_masked(impl, runtime, n):
    """n not a multiple of BLOCK: the last program's tail lanes must not touch memory past element n - 1
    (the canary around out), and n = 1 must still launch one program."""
    check(impl, *make_inputs(n, torch.float32, runtime.device, stream=n))


@pytest.mark.parametrize("n", [98_437, 12_289, 40_000])
def test_each_program_adds_its_own_block(impl, runtime, n):
    """Many programs, n not a power of two: offsets start at pid * BLOCK (without it every program adds
    block 0), and the grid rounds up (with n // BLOCK the tail is never written)."""
    check(impl, *make_inputs(n, torch.float16, runtime.device, stream=n))


@pytest.mark.parametrize(
    "dtype", [torch.float16, bf16_everywhere(), torch.float32], ids=["fp16", "bf16", "fp32"]
)
def test_dtypes(impl, runtime, dtype):
    n = sizes(runtime, 5_000, 1_000_003)
    check(impl, *make_inputs(n, dtype, runtime.device, stream=7))


@pytest.mark.parametrize("dtype", [torch.float32, bf16_everywhere()], ids=["fp32", "bf16"])
def test_out_keeps_the_range_and_precision_of_its_dtype(impl, runtime, dtype):
    """Sums past fp16's largest value (65504) and, in fp32, digits past fp16's 11 bits: a kernel that
    computes or stores in fp16 whatever x's dtype (x.to(tl.float16), or the sum cast to fp16 before the
    store) turns the bf16 sums into inf and rounds the fp32 ones, while randn values near 1 survive it."""
    x, y = make_inputs(4_099, dtype, runtime.device, stream=29)
    x.mul_(2.0**17)  # about +-131072: fp16 overflows, bf16 and fp32 hold it
    y.mul_(2.0**17)
    check(impl, x, y)


def test_out_is_allocated_when_not_given(impl, runtime):
    """Without `out`, vector_add allocates [n] in x's dtype. n = 3 * 4096 is a multiple of every BLOCK up
    to 4096, so a missing mask is reported by the canary tests above, not by a write past this allocation."""
    x, y = make_inputs(3 * 4096, torch.float16, runtime.device, stream=11)
    out = impl.vector_add(x, y)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert_close(out, x.float() + y.float(), DIMS)


def test_out_may_alias_an_input(impl, runtime):
    """In place, x += y: every element is read before it is written, by the same program."""
    x, y = make_inputs(5_003, torch.float32, runtime.device, stream=13)
    expected = x.float() + y.float()
    returned = impl.vector_add(x, y, out=x)
    assert returned.data_ptr() == x.data_ptr()
    assert_close(x, expected, DIMS)


def test_empty_vectors(impl, runtime):
    """n = 0: nothing to launch (a grid of zero programs), an empty result."""
    x = torch.empty(0, device=runtime.device)
    out = impl.vector_add(x, x.clone())
    assert out.shape == (0,)
    # With out given, out itself comes back, empty as it is, not a tensor of the launcher's own.
    given = empty_at_an_address((0,), torch.float32, runtime.device)  # not torch.empty: see its doc
    wrong = returned_out_problem("vector_add", impl.vector_add(x, x.clone(), out=given), given)
    assert wrong is None, wrong


# --- The launcher rejects bad input before launching -----------------------------------------------


def _strided(t):
    """t's values with stride 2: a view into a buffer twice as long."""
    buffer = torch.zeros(2 * t.numel(), dtype=t.dtype, device=t.device)
    buffer[::2] = t
    return buffer[::2]


def _shifted_by_one(t, name="x", out_first=False, by=1):
    """(a copy of t as `name`, and out: the same memory one element (or `by`) further on, or with
    out_first before), a partial overlap either way round."""
    buffer = torch.zeros(t.numel() + by, dtype=t.dtype, device=t.device)
    first, second = buffer[:-by], buffer[by:]
    if out_first:
        second.copy_(t)
        return {name: second, "out": first}
    first.copy_(t)
    return {name: first, "out": second}


# name -> (how to spoil the arguments of a valid call, the error, what the message must name)
BAD_INPUTS = {
    "x_not_a_tensor": (lambda a: dict(x=a["x"].tolist()), TypeError, "x"),
    "y_a_python_float": (lambda a: dict(y=1.0), TypeError, "y"),
    "out_not_a_tensor": (lambda a: dict(out=a["x"].tolist()), TypeError, "out"),
    "x_rank_0": (lambda a: dict(x=a["x"][0], y=a["y"][0]), ValueError, "x"),
    "x_rank_2": (lambda a: dict(x=a["x"].view(2, -1), y=a["y"].view(2, -1)), ValueError, "x"),
    "x_int32": (lambda a: dict(x=a["x"].int(), y=a["y"].int()), TypeError, "x"),
    "x_float64": (lambda a: dict(x=a["x"].double(), y=a["y"].double()), TypeError, "x"),
    "y_dtype_differs": (lambda a: dict(y=a["y"].half()), TypeError, "y"),
    "y_shorter": (lambda a: dict(y=a["y"][:-1]), ValueError, "y"),
    "x_not_contiguous": (lambda a: dict(x=_strided(a["x"])), ValueError, "x"),
    "y_not_contiguous": (lambda a: dict(y=_strided(a["y"])), ValueError, "y"),
    "y_on_another_device": (lambda a: dict(y=a["y"].to("meta")), ValueError, "y"),
    "x_on_a_device_the_runtime_cannot_run": (
        lambda a: dict(x=a["x"].to("meta"), y=a["y"].to("meta")),
        ValueError,
        "x is on meta",
    ),
    "out_on_another_device": (lambda a: dict(out=a["x"].to("meta")), ValueError, "out"),
    "out_shorter": (lambda a: dict(out=a["x"][:-1].clone()), ValueError, "out"),
    "out_dtype_differs": (lambda a: dict(out=a["x"].half()), TypeError, "out"),
    "out_not_contiguous": (lambda a: dict(out=_strided(a["x"])), ValueError, "out"),
    "out_rank_2": (lambda a: dict(out=a["x"].clone().view(2, -1)), ValueError, "out"),
    "out_partly_overlaps_x": (lambda a: _shifted_by_one(a["x"]), ValueError, "out partly overlaps x"),
    # out one element before x: program p writes where program p - 1 reads, as much a hazard.
    "out_partly_overlaps_x_from_before": (
        lambda a: _shifted_by_one(a["x"], out_first=True),
        ValueError,
        "out partly overlaps x",
    ),
    "out_partly_overlaps_y": (lambda a: _shifted_by_one(a["y"], "y"), ValueError, "out partly overlaps y"),
    # 48 of 64 fp32 elements on: 192 bytes apart, more than 64, less than the 256 bytes of out, so a
    # gap in bytes compared with a length in elements lets the last 16 elements overlap.
    "out_overlaps_x_past_its_length_in_bytes": (
        lambda a: _shifted_by_one(a["x"], by=48),
        ValueError,
        "out partly overlaps x",
    ),
    "y_longer": (lambda a: dict(y=torch.cat([a["y"], a["y"][:1]])), ValueError, "y"),
    "out_longer": (lambda a: dict(out=torch.cat([a["x"], a["x"][:1]])), ValueError, "out"),
    # Empty vectors launch nothing, but their arguments are checked all the same.
    "y_dtype_differs_on_empty_x": (lambda a: dict(x=a["x"][:0], y=a["y"][:0].half()), TypeError, "y"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_launcher_rejects_bad_input(impl, runtime, name):
    """Each bad argument raises ValueError/TypeError naming it, before any kernel runs."""
    spoil, error, names = BAD_INPUTS[name]
    x, y = make_inputs(64, torch.float32, runtime.device, stream=17)
    args = dict(x=x, y=y)
    args.update(spoil(args))
    with record_launches(impl) as launches, pytest.raises(error, match=names):
        impl.vector_add(**args)
    assert not launches.calls, "the error must come before any kernel is launched"


@pytest.mark.parametrize("BLOCK", [4096, 16384])
def test_launch_honours_its_block(impl, runtime, BLOCK):
    """_launch with a BLOCK wider than the default (the benchmark tries several): three programs and a
    ragged fourth, each owning BLOCK elements. A kernel that writes a width of its own instead of BLOCK
    (pid * 2048 + tl.arange(0, 2048)) passes every BLOCK up to its width and leaves gaps past it."""
    n = 3 * BLOCK + 5
    x, y = make_inputs(n, torch.float32, runtime.device, stream=BLOCK)
    out = into_canary(lambda out: impl._launch(x, y, out, BLOCK=BLOCK), x)
    assert_close(out, x.float() + y.float(), DIMS)


@pytest.mark.parametrize("BLOCK", [3, 0, 1000, 2.0])
def test_launch_rejects_block_not_a_power_of_two(impl, runtime, BLOCK):
    """tl.arange(0, BLOCK) needs a power of two: _launch says so, naming BLOCK, before launching."""
    x, y = make_inputs(64, torch.float32, runtime.device, stream=17)
    with record_launches(impl) as launches, pytest.raises(ValueError, match="BLOCK"):
        impl._launch(x, y, torch.empty_like(x), BLOCK=BLOCK)
    assert not launches.calls, "the error must come before any kernel is launched"


# --- Your kernel does the work ------------------------------------------------------------------


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: vector_add must compute them with your Triton kernel, not with
    torch (x + y, or a copy of the grader's oracle)."""
    x, y = make_inputs(1_000, torch.float32, runtime.device, stream=23)
    assert_runs_a_triton_kernel(impl, lambda: impl.vector_add(x, y), "vector_add")


# --- The grader's own tolerance is tight enough --------------------------------------------------


def test_tolerance_rejects_zeros_and_x_alone(runtime):
    """Not a test of your kernel: proves the comparison fails an all-zeros output and x alone (y
    forgotten), so passing the other tests means something."""
    x, y = make_inputs(4_097, torch.float16, runtime.device, stream=19)
    ref = x.float() + y.float()
    assert mismatch(torch.zeros_like(x), ref) is not None
    assert mismatch(x, ref) is not None
    assert mismatch(ref.half(), ref) is None  # and the oracle rounded to fp16 passes


# --- GPU only; last in the file, because an out-of-bounds access ends the CUDA context ------------


def test_offsets_widened_to_int64(impl, runtime):
    """n > 2**31: pid * BLOCK in int32 wraps to a negative offset for the programs past element 2**31,
    which then read and write the wrong memory (or fault)."""
    if runtime.interpreter:
        pytest.skip(
            "GPU only, for time rather than memory: past 2**31 elements the grid has over a million "
            "programs of 2048, hours in the interpreter"
        )
    n = 2**31 + 2**20 + 3
    x = torch.randn(n, dtype=torch.float16, device=runtime.device)  # [n]
    y = torch.randn(n, dtype=torch.float16, device=runtime.device)
    out = torch.full((n + 1024,), CANARY, dtype=torch.float16, device=runtime.device)  # [n + 1024]
    impl.vector_add(x, y, out=out[:n])
    tail = slice(2**31 - 2**20, n)  # both sides of the int32 limit
    assert_close(out[tail], x[tail].float() + y[tail].float(), DIMS)
    assert_close(out[:4096], x[:4096].float() + y[:4096].float(), DIMS)
    assert (out[n:] == CANARY).all(), "the canary past out was overwritten"


# --- The grid fits a GPU at every size the launcher admits ------------------------------------------


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """n = 65536 * 2048 + 1: 65537 blocks of 2048, more than the 65535 programs CUDA allows on grid axes
    1 and 2 (axis 0 allows 2**31 - 1). Blocks put on axis 1 launch on the CPU and fail on a GPU with
    "invalid argument". Run dry (every launch recorded and checked, none run), on sparse buffers on a
    CPU: the 268 MB each vector would take are never touched."""
    n = 65536 * 2048 + 1
    x, y, out = (sparse_empty((n,), torch.float16, runtime.device) for _ in range(3))  # [n] each
    assert_grids_fit(impl, lambda: impl.vector_add(x, y, out=out), f"vector_add of n = {n}")


# --- Diagnosis: which pitfall of drills/content/t1_vector_add.md a pattern of results points to ----------

MISTAKES = [
    Mistake(
        1,
        fails=("test_by_hand_lane_11_is_masked", "test_last_block_is_masked[n1]"),
        # A mask mistake keeps every element inside out right: what it shows is memory past the end.
        messages=(r"canary|lane 11 \(past n = 10\) was written|out of bounds|NaN",),
        question="Program 2 of the by-hand example owns offsets 8 to 11, but n = 10: what keeps lanes 10 "
        "and 11 from writing past the end of out?",
        section="2",
    ),
    Mistake(
        1,
        fails=("test_by_hand_loads_stop_at_element_9",),
        passes=("test_by_hand_store_stops_at_element_9",),
        question="Your store stops at n, but which elements do your loads read in the last block when BLOCK "
        "does not divide n?",
        section="2",
    ),
    Mistake(
        2,
        fails=("test_by_hand_grid_has_three_programs",),
        passes=("test_by_hand_kernel_masks_lanes_10_and_11",),
        question="For n = 10 and BLOCK = 4, how many programs does your grid start, and which program "
        "writes elements 8 and 9?",
        section="2",
    ),
    Mistake(
        2,
        # The grid clamped to 65535 programs to fit a limit axis 0 does not have: only the dry run at the
        # largest sizes sees it (an axis of exactly 65535), since every small case needs fewer programs.
        fails=("test_grid_fits_cuda_limits_at_largest_sizes",),
        messages=(r"a grid clamped with min\(programs",),
        question="n = 65536 * 2048 + 1 needs 65537 programs of 2048: how many does your grid launch, and "
        "which elements do the programs it leaves out own?",
        section="3.4",
    ),
    Mistake(
        2,
        # One program for the whole vector (BLOCK = next_power_of_2(n)): right in the interpreter at any
        # n, while a GPU compiles no block past 2**20 elements; only the dry run at the largest n sees it.
        fails=("test_grid_fits_cuda_limits_at_largest_sizes",),
        messages=(r"Triton compiles no tensor of more than 2\*\*20",),
        question="n = 65536 * 2048 + 1: how wide is the block your launcher asks for, and how many "
        "programs share the work?",
        section="3.4",
    ),
    Mistake(
        3,
        fails=("test_each_program_adds_its_own_block",),
        passes=("test_last_block_is_masked[n1]",),
        question="Which elements does program 1 of the by-hand example load: where in your offsets does "
        "its program id come in, and multiplied by what?",
        section="2",
    ),
    Mistake(
        3,
        # A width of its own in the kernel: right for every BLOCK up to it, gaps past it.
        fails=("test_launch_honours_its_block",),
        passes=("test_by_hand_grid_has_three_programs", "test_each_program_adds_its_own_block"),
        question="_launch is called with BLOCK = 4096: how many elements does each of your programs add, "
        "and where in your kernel does BLOCK set that number?",
        section="3.2",
    ),
    Mistake(
        4,
        fails=("test_offsets_widened_to_int64",),
        passes=("test_last_block_is_masked",),
        question="Once n passes 2**31, in which integer type is pid * BLOCK computed, and what happens to "
        "it past 2**31 - 1?",
        section="3.1",
    ),
    Mistake(
        5,
        fails=("test_by_hand_store_stops_at_element_9",),
        passes=("test_by_hand_lane_11_is_masked",),
        question="For n = 10, the last element is out[9]: does your mask let lane 10 through?",
        section="2",
    ),
    Mistake(
        5,
        # Off by one the other way (offs < n - 1): every element right but the last, which keeps the
        # canary (the by-hand list ends in 1234.5); n = 1 writes nothing.
        fails=("test_by_hand_kernel_masks_lanes_10_and_11", "test_last_block_is_masked[n1]"),
        passes=("test_launcher_rejects_bad_input",),
        messages=(r"got \[[^\]]*, 1234\.5\]",),
        question="For n = 10, the last element is out[9]: does your mask let lane 9 through?",
        section="2",
    ),
    Mistake(
        7,
        fails=("test_out_keeps_the_range_and_precision_of_its_dtype",),
        # fp16 inputs, and the by-hand values (small integers), are exact in fp16 and pass.
        passes=(
            "test_dtypes[fp16]",
            "test_each_program_adds_its_own_block",
            "test_by_hand_kernel_masks_lanes_10_and_11",
            "test_by_hand_grid_has_three_programs",
        ),
        question="x and y hold about 131072 in bf16: which dtype does your kernel add and store them in, "
        "and what is the largest value that dtype holds?",
        section="5",
    ),
    # Every element wrong, even n = 1 and the by-hand launch of three programs: neither a mask nor the
    # grid (whose mistakes keep the elements they write right), the operation itself.
    Mistake(
        6,
        fails=("test_last_block_is_masked[n1]", "test_by_hand_kernel_masks_lanes_10_and_11"),
        messages=(r"expected 0, 11, \.\.\., 99, got",),
        question="The by-hand launch gives x = 0, 1, ..., 9 and y = 10 x: which values does your kernel "
        "store into out[1] and out[2], and which expression of x and y gives them?",
        section="2",
    ),
]
