"""T3 benchmark: fp16 matmul against torch.matmul (cuBLAS), timed in the same run on the same tensors.

FLOPs = 2 * M * N * K, so TFLOP/s = 2 * M * N * K / time. Each row times the lesson's kernel (the bare
launch, and the public function with its checks), the same kernel launched in plain row-major order
(GROUP_M = 1), and torch.matmul. The kernel's output is checked against torch's before anything is
timed, so a fast wrong answer cannot enter the table.
"""

from __future__ import annotations

import torch

from drills import bench
from drills.compare import assert_close

SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (4000, 4000, 4000)]  # (M, N, K)

COLUMNS = [
    ("shape", "M x N x K"),
    ("blocks", "blocks BM x BN x BK, GROUP_M, warps, stages"),
    ("t3_us", "T3 us"),
    ("t3_tflops", "T3 TFLOP/s"),
    ("t3_vs_cublas", "T3 / cuBLAS"),
    ("t3_peak", "T3 / datasheet"),
    ("api_us", "T3 API us (with checks)"),
    ("rowmajor_tflops", "T3 row-major TFLOP/s"),
    ("rowmajor_vs_cublas", "row-major / cuBLAS"),
    ("cublas_tflops", "cuBLAS TFLOP/s"),
    ("cublas_peak", "cuBLAS / datasheet"),
]


def describe(cfg: dict) -> str:
    return (
        f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}, {cfg['GROUP_M']}, "
        f"{cfg['num_warps']}, {cfg['num_stages']}"
    )


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_tflops_fp16()
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)  # [M, K]
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)  # [K, N]
        out = torch.empty(M, N, device="cuda", dtype=torch.float16)  # [M, N]
        flops = 2 * M * N * K
        cfg = impl._config(M, N)
        row_major = dict(cfg, GROUP_M=1)

        expected = torch.matmul(a, b).float()
        assert_close(impl.matmul(a, b), expected)
        assert_close(impl._launch(a, b, torch.empty_like(out), row_major), expected)

        row = dict(shape=f"{M} x {N} x {K}", blocks=describe(cfg))
        row["t3_us"] = bench.time_us(lambda: impl._launch(a, b, out))
        row["api_us"] = bench.time_us(lambda: impl.matmul(a, b, out=out))
        cublas_us = bench.time_us(lambda: torch.matmul(a, b, out=out))
        rowmajor_us = bench.time_us(lambda: impl._launch(a, b, out, row_major))
        row["t3_tflops"] = bench.tflops(flops, row["t3_us"])
        row["cublas_tflops"] = bench.tflops(flops, cublas_us)
        row["rowmajor_tflops"] = bench.tflops(flops, rowmajor_us)
        row["t3_vs_cublas"] = row["t3_tflops"] / row["cublas_tflops"]
        row["rowmajor_vs_cublas"] = row["rowmajor_tflops"] / row["cublas_tflops"]
        row["t3_peak"] = row["t3_tflops"] / peak if peak else None
        row["cublas_peak"] = row["cublas_tflops"] / peak if peak else None
        table.add(row)
        del a, b, out, expected
        torch.cuda.empty_cache()

    notes = [
        "fp16 inputs and output, fp32 accumulation; TFLOP/s = 2 * M * N * K / time. cuBLAS is "
        "`torch.matmul(a, b, out=out)` on the same tensors, timed in the same run.",
        f"Datasheet fraction: against {peak:g} TFLOP/s dense fp16 (bench.peak_tflops_fp16)."
        if peak
        else "Datasheet fraction: n/a, bench.PEAK_TFLOPS_FP16 does not know this GPU.",
        "T3 us times the bare launch; T3 API us adds the launcher's checks. Row-major is the same kernel "
        "and blocks with GROUP_M = 1, which visits the tiles row by row (section 3.1).",
    ]
    return table, notes


def plot(rows, meta, path):
    peak = meta.get("datasheet_peak_tflops_fp16")
    bench.plot_bars(
        rows,
        [
            ("t3_tflops", "T3 (grouped order)"),
            ("rowmajor_tflops", "T3, row-major order"),
            ("cublas_tflops", "cuBLAS (torch.matmul)"),
        ],
        [r["shape"].replace(" x ", "x") for r in rows],
        f"Matmul, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="TFLOP/s (fp16 in, fp32 accumulate)",
        hline=(peak, "datasheet peak") if peak else None,
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's TFLOP/s at 4096^3 fp16 (the bare launch, checked first)."""
    M = N = K = 4096
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)  # [M, K]
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)  # [K, N]
    out = torch.empty(M, N, device="cuda", dtype=torch.float16)  # [M, N]
    assert_close(impl.matmul(a, b), torch.matmul(a, b).float())
    return (
        bench.tflops(2 * M * N * K, bench.time_us(lambda: impl._launch(a, b, out))),
        "TFLOP/s",
        "4096^3, fp16",
    )


# --- The figures the explainer's sentences quote (bench.FIGURES); data is t3_matmul.bench.json --------


def _at(data, n: int) -> dict:
    return next(r for r in data["rows"] if r["shape"] == f"{n} x {n} x {n}")


def _f(n: int, key: str):
    return lambda d: bench.num(_at(d, n)[key])


FIGURES = {
    "t3_4096": _f(4096, "t3_tflops"),
    "cublas_4096": _f(4096, "cublas_tflops"),
    "vs_4096": _f(4096, "t3_vs_cublas"),
    "us_4096": _f(4096, "t3_us"),
    "api_4096": _f(4096, "api_us"),
    "row_4096": _f(4096, "rowmajor_tflops"),
    "t3_8192": _f(8192, "t3_tflops"),
    "vs_8192": _f(8192, "t3_vs_cublas"),
    "row_8192": _f(8192, "rowmajor_tflops"),
    "row_vs_8192": _f(8192, "rowmajor_vs_cublas"),
    "tie_2048": lambda d: (
        bench.num(_at(d, 2048)["t3_tflops"])
        if bench.num(_at(d, 2048)["t3_tflops"]) == bench.num(_at(d, 2048)["rowmajor_tflops"])
        else f"{bench.num(_at(d, 2048)['t3_tflops'])} and {bench.num(_at(d, 2048)['rowmajor_tflops'])}"
    ),
    "us_2048": _f(2048, "t3_us"),
    "api_2048": _f(2048, "api_us"),
    "t3_4000": _f(4000, "t3_tflops"),
    "vs_4000": _f(4000, "t3_vs_cublas"),
    "vs_cublas": lambda d: bench.span_of(r["t3_vs_cublas"] for r in d["rows"]),
    "cublas_peak": lambda d: bench.span_of(r["cublas_peak"] for r in d["rows"]),
    "t3_peak": lambda d: bench.span_of(r["t3_peak"] for r in d["rows"]),
}
