"""T1 benchmark: vector add against torch's `x + y` on large vectors.

Both move the same bytes, 3 * n * element_size (read x and y, write out), so both are reported in GB/s
and as a fraction of a device-to-device copy that moves as many bytes, timed in the same run. The
kernel's output is checked against torch's before anything is timed. A small sweep over BLOCK and
num_warps is kept in the JSON (and the best one named in the table), so the launcher's default can be
judged against its neighbours.
"""

from __future__ import annotations

import torch

from drills import bench
from drills.compare import assert_close

SHAPES = [(2**24, torch.float16), (2**28, torch.float16), (2**26, torch.float32)]  # (n, dtype)
DEVICE = "cuda"
SWEEP = [(1024, 4), (2048, 4), (4096, 4), (4096, 8)]  # (BLOCK, num_warps)

COLUMNS = [
    ("n", "n"),
    ("dtype", "dtype"),
    ("mb", "MB moved"),
    ("ceiling_gbs", "copy ceiling GB/s"),
    ("t1_us", "T1 us"),
    ("t1_gbs", "T1 GB/s"),
    ("t1_ceiling", "T1 / ceiling"),
    ("t1_peak", "T1 / datasheet"),
    ("api_us", "T1 API us (with checks)"),
    ("torch_gbs", "torch x + y GB/s"),
    ("torch_ceiling", "torch / ceiling"),
    ("vs_torch", "T1 / torch"),
    ("best", "best of sweep (BLOCK x warps: GB/s)"),
]


def check_against_torch(out, ref):
    # One add, correctly rounded by both, so the results are bit-equal unless the kernel is wrong;
    # only then pay for the full comparison, which says where.
    if not torch.equal(out, ref):
        assert_close(out, ref.float())


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_gbs()
    for n, dtype in SHAPES:
        x = torch.randn(n, device=DEVICE, dtype=dtype)  # [n]
        y = torch.randn(n, device=DEVICE, dtype=dtype)  # [n]
        out = torch.empty_like(x)  # [n]
        nbytes = 3 * n * x.element_size()
        check_against_torch(impl.vector_add(x, y), x + y)

        row = dict(
            n=n,
            dtype=str(dtype).replace("torch.", ""),
            mb=round(nbytes / 1e6),
            ceiling_gbs=bench.copy_ceiling_gbs(nbytes // 2),
        )  # a copy reading half moves them all
        row["t1_us"] = bench.time_us(lambda: impl._launch(x, y, out))
        row["t1_gbs"] = bench.gbs(nbytes, row["t1_us"])
        row["t1_ceiling"] = row["t1_gbs"] / row["ceiling_gbs"]
        row["t1_peak"] = row["t1_gbs"] / peak if peak else None
        row["api_us"] = bench.time_us(lambda: impl.vector_add(x, y, out=out))
        row["torch_gbs"] = bench.gbs(nbytes, bench.time_us(lambda: x + y))
        row["torch_ceiling"] = row["torch_gbs"] / row["ceiling_gbs"]
        row["vs_torch"] = row["t1_gbs"] / row["torch_gbs"]

        launches = {
            f"{block}x{warps}": (
                lambda block=block, warps=warps: impl._launch(x, y, out, BLOCK=block, num_warps=warps)
            )
            for block, warps in SWEEP
        }
        row["sweep_gbs"], row["best"] = bench.sweep_gbs(
            nbytes, launches, out, lambda got: check_against_torch(got, x + y)
        )
        table.add(row)
        del x, y, out
        torch.cuda.empty_cache()

    notes = [
        "GB/s counts 3 * n * element_size (x and y read once, out written once); the copy ceiling is "
        "`dst.copy_(src)` moving as many bytes, same run.",
        "T1 us times the launch alone (BLOCK 2048, 4 warps, the launcher's default); T1 API us adds "
        "vector_add's checks. torch is `x + y`, which also allocates its output (from the caching allocator).",
        "best of sweep: the fastest (BLOCK, num_warps) of "
        + ", ".join(f"{b}x{w}" for b, w in SWEEP)
        + "; every sweep result is in t1_vector_add.bench.json under sweep_gbs.",
    ]
    return table, notes


def plot(rows, meta, path):
    labels = [f"n=2^{r['n'].bit_length() - 1}\n{r['dtype']}" for r in rows]
    bench.plot_bars(
        rows,
        [("t1_ceiling", "T1 (this lesson)"), ("torch_ceiling", "torch x + y")],
        labels,
        f"Vector add, {meta['gpu']}, {meta['date']}",
        path,
        "fraction of the copy ceiling",
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's GB/s on the table's middle shape (the bare launch, checked first)."""
    n = 2**28
    x = torch.randn(n, device=DEVICE, dtype=torch.float16)  # [n]
    y = torch.randn(n, device=DEVICE, dtype=torch.float16)  # [n]
    out = torch.empty_like(x)  # [n]
    check_against_torch(impl.vector_add(x, y), x + y)
    return (
        bench.gbs(3 * n * x.element_size(), bench.time_us(lambda: impl._launch(x, y, out))),
        "GB/s",
        "n = 2^28, fp16",
    )


# --- The figures the explainer's sentences quote (bench.FIGURES); data is t1_vector_add.bench.json ---


def _at(data, n: int, dtype: str = "float16") -> dict:
    return next(r for r in data["rows"] if (r["n"], r["dtype"]) == (n, dtype))


def _f(n: int, key: str, dtype: str = "float16"):
    return lambda d: bench.num(_at(d, n, dtype)[key])


def _sweep(n: int, config: str, dtype: str = "float16"):
    return lambda d: bench.num(_at(d, n, dtype)["sweep_gbs"][config])


def _widest(data) -> dict:
    return max(data["rows"], key=lambda r: max(r["sweep_gbs"].values()) - r["t1_gbs"])


FIGURES = {
    "big_us": _f(2**28, "t1_us"),
    "big_gbs": _f(2**28, "t1_gbs"),
    "big_peak": _f(2**28, "t1_peak"),
    "big_ceiling": _f(2**28, "t1_ceiling"),
    "small_best": _sweep(2**24, "1024x4"),
    "small_gbs": _f(2**24, "t1_gbs"),
    "fp32_best": _sweep(2**26, "1024x4", "float32"),
    "fp32_gbs": _f(2**26, "t1_gbs", "float32"),
    "t1_ceiling": lambda d: bench.span_of(r["t1_ceiling"] for r in d["rows"]),
    "torch_ceiling": lambda d: bench.span_of(r["torch_ceiling"] for r in d["rows"]),
    "small_peak": _f(2**24, "t1_peak"),
    "small_copy": _f(2**24, "ceiling_gbs"),
    "big_copy": _f(2**28, "ceiling_gbs"),
    "vs_torch": lambda d: bench.span_of(r["vs_torch"] for r in d["rows"]),
    "small_api_us": _f(2**24, "api_us"),
    "small_us": _f(2**24, "t1_us"),
    "big_api_us": _f(2**28, "api_us"),
    "widest": lambda d: (
        f"{bench.num(max(_widest(d)['sweep_gbs'].values()))} against {bench.num(_widest(d)['t1_gbs'])}"
    ),
    "small_default_sweep": _sweep(2**24, "2048x4"),
}
