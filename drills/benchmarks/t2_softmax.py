"""T2 benchmark: fused row softmax against torch.softmax and the naive five-op PyTorch chain.

Every implementation is credited with the same bytes, 2 * M * N * element_size (the row read once and
written once), so all are reported in GB/s and as a fraction of a device-to-device copy that moves as
many bytes, timed in the same run. The naive chain really moves about four times that (8MN + 4M
elements); its GB/s column shows what that costs. Each output is checked against torch.softmax in fp32
before it is timed. A sweep over num_warps (and a 3-pass run with blocks of 4096) is kept in the JSON.
"""

from __future__ import annotations

import torch

from drills import bench
from drills.compare import assert_close, mismatch

DEVICE = "cuda"
# (M, N): three shapes of one block per row, then a Llama-3-sized vocabulary (three passes).
SHAPES = [(8192, 4096), (4096, 16384), (32768, 1024), (1024, 128256)]
DTYPE = torch.float16
SWEEP = [(None, 4), (None, 8), (None, 16), (4096, 8)]  # (BLOCK, num_warps); None = the launcher's BLOCK

COLUMNS = [
    ("M", "M"),
    ("N", "N"),
    ("path", "path"),
    ("mb", "MB moved"),
    ("ceiling_gbs", "copy ceiling GB/s"),
    ("t2_us", "T2 us"),
    ("t2_gbs", "T2 GB/s"),
    ("t2_ceiling", "T2 / ceiling"),
    ("t2_peak", "T2 / datasheet"),
    ("api_us", "T2 API us (with checks)"),
    ("torch_gbs", "torch.softmax GB/s"),
    ("torch_ceiling", "torch / ceiling"),
    ("vs_torch", "T2 / torch"),
    ("naive_gbs", "naive chain GB/s"),
    ("best", "best of sweep (BLOCK x warps: GB/s)"),
]


def naive_softmax(x):
    """The unfused chain, counted in elements: 5MN + 2M read, 3MN + 2M written."""
    x_max = x.amax(dim=1, keepdim=True)  # read MN, write M
    z = x - x_max  # read MN + M, write MN
    num = torch.exp(z)  # read MN, write MN
    den = num.sum(dim=1, keepdim=True)  # read MN, write M
    return num / den  # read MN + M, write MN


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_gbs()
    naive_problems = []
    for M, N in SHAPES:
        x = torch.randn(M, N, device=DEVICE, dtype=DTYPE)  # [M, N]
        out = torch.empty_like(x)  # [M, N]
        nbytes = 2 * M * N * x.element_size()
        expected = torch.softmax(x.float(), dim=-1)  # [M, N] fp32
        assert_close(impl.softmax(x), expected)
        assert_close(torch.softmax(x, dim=-1), expected)

        row = dict(
            M=M,
            N=N,
            path="one block" if N <= impl.MAX_BLOCK else "3 passes",
            mb=round(nbytes / 1e6),
            ceiling_gbs=bench.copy_ceiling_gbs(nbytes // 2),
        )  # a copy reading half moves them all
        row["t2_us"] = bench.time_us(lambda: impl._launch(x, out))
        row["t2_gbs"] = bench.gbs(nbytes, row["t2_us"])
        row["t2_ceiling"] = row["t2_gbs"] / row["ceiling_gbs"]
        row["t2_peak"] = row["t2_gbs"] / peak if peak else None
        row["api_us"] = bench.time_us(lambda: impl.softmax(x, out=out))
        row["torch_gbs"] = bench.gbs(nbytes, bench.time_us(lambda: torch.softmax(x, dim=-1)))
        row["torch_ceiling"] = row["torch_gbs"] / row["ceiling_gbs"]
        row["vs_torch"] = row["t2_gbs"] / row["torch_gbs"]
        problem = mismatch(naive_softmax(x), expected)
        if problem is None:
            row["naive_gbs"] = bench.gbs(nbytes, bench.time_us(lambda: naive_softmax(x)))
        else:  # fp16 intermediates can lose too much on long rows: a note, not a crash
            naive_problems.append(f"({M}, {N}): {problem.splitlines()[0]}")

        launches = {
            f"{block or 'default'}x{warps}": (
                lambda block=block, warps=warps: impl._launch(x, out, BLOCK=block, num_warps=warps)
            )
            for block, warps in SWEEP
        }
        # Every 8th row is enough to reject a broken setting (rows are independent programs), at an
        # eighth of the host-side comparison time.
        row["sweep_gbs"], row["best"] = bench.sweep_gbs(
            nbytes, launches, out, lambda got: assert_close(got[::8], expected[::8])
        )
        table.add(row)
        del x, out, expected
        torch.cuda.empty_cache()

    notes = [
        f"{str(DTYPE).replace('torch.', '')} in and out. GB/s counts 2 * M * N * element_size for every "
        "column (the row read once, written once); the copy ceiling is `dst.copy_(src)` moving as many bytes, "
        "same run.",
        f"T2 us times the launch alone (BLOCK = next_pow2(N) up to MAX_BLOCK = {impl.MAX_BLOCK}, 4/8/16 warps "
        "by BLOCK); T2 API us adds softmax's checks. Rows longer than MAX_BLOCK take three passes.",
        "naive chain: max, subtract, exp, sum, divide as five PyTorch ops, which move about 8MN + 4M "
        "elements; its GB/s is credited with 2MN like the others, so it reads as an effective rate.",
        "best of sweep: the fastest (BLOCK, num_warps) of "
        + ", ".join(f"{b or 'default'}x{w}" for b, w in SWEEP)
        + "; 4096x8 runs three passes over blocks of 4096 whenever N > 4096. All in t2_softmax.bench.json.",
    ]
    if naive_problems:
        notes.append(
            "naive chain not timed where its fp16 result missed the tolerance: " + "; ".join(naive_problems)
        )
    return table, notes


def plot(rows, meta, path):
    labels = [f"{r['M']} x {r['N']}\n{r['path']}" for r in rows]
    bench.plot_bars(
        rows,
        [("t2_ceiling", "T2 (this lesson)"), ("torch_ceiling", "torch.softmax")],
        labels,
        f"Row softmax, fp16, {meta['gpu']}, {meta['date']}",
        path,
        "fraction of the copy ceiling",
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's GB/s on the table's first shape (the bare launch, checked first)."""
    M, N = SHAPES[0]
    x = torch.randn(M, N, device=DEVICE, dtype=DTYPE)  # [M, N]
    out = torch.empty_like(x)  # [M, N]
    assert_close(impl.softmax(x), torch.softmax(x.float(), dim=-1))
    us = bench.time_us(lambda: impl._launch(x, out))
    return bench.gbs(2 * M * N * x.element_size(), us), "GB/s", f"{M} x {N}, fp16"


# --- The figures the explainer's sentences quote (bench.FIGURES); data is t2_softmax.bench.json -------


def _at(data, N: int) -> dict:
    return next(r for r in data["rows"] if r["N"] == N)


def _one_block(data) -> list[dict]:
    return [r for r in data["rows"] if r["path"] == "one block"]


def _f(N: int, key: str):
    return lambda d: bench.num(_at(d, N)[key])


def _sweep(N: int, config: str):
    return lambda d: bench.num(_at(d, N)["sweep_gbs"][config])


FIGURES = {
    "gbs_4096": _f(4096, "t2_gbs"),
    "naive_4096": _f(4096, "naive_gbs"),
    "long_ceiling": _f(128256, "t2_ceiling"),
    "long_torch": _f(128256, "torch_ceiling"),
    "long_vs_torch": _f(128256, "vs_torch"),
    "one_ceiling": lambda d: bench.span_of(r["t2_ceiling"] for r in _one_block(d)),
    "one_vs_torch": lambda d: bench.span_of(r["vs_torch"] for r in _one_block(d)),
    "one_torch": lambda d: bench.span_of(r["torch_ceiling"] for r in _one_block(d)),
    "one_naive": lambda d: bench.span_of(r["naive_gbs"] for r in _one_block(d)),
    "one_gbs": lambda d: bench.span_of(r["t2_gbs"] for r in _one_block(d)),
    "warps8_16384": _sweep(16384, "defaultx8"),
    "warps16_1024": _sweep(1024, "defaultx16"),
    "sweep_4096": _sweep(4096, "4096x8"),
    "long_best": _sweep(128256, "defaultx4"),
    "long_gbs": _f(128256, "t2_gbs"),
}
