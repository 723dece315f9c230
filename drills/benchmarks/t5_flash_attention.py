"""T5 benchmark: FlashAttention forward against torch SDPA, on (B, H, N, D) = (4, 32, 4096, 128),
(4, 32, 1024, 64) and (1, 32, 16384, 128): the shapes at which SDPA's default backend (cuDNN's fused
attention) and its FlashAttention-2 backend were timed on an H200 (torch 2.11) before this lesson was
written, and which this benchmark times again in the same run.

Every implementation does the same arithmetic, 4 * B * H * Nq * Nk * D FLOPs (half of it when causal:
only the keys at or below the diagonal count), so all are reported in TFLOP/s, next to torch SDPA with
its FlashAttention-2 backend forced and with its default backend choice, timed in the same run, and as
a fraction of the GPU's datasheet fp16 rate. Each output is checked before it is timed, so a fast wrong
answer cannot enter the table.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from drills import bench
from drills.compare import assert_close

SHAPES = [(4, 32, 4096, 128), (4, 32, 1024, 64), (1, 32, 16384, 128)]  # (B, H, N, D), Nq = Nk = N
ROWS = [(shape, causal) for shape in SHAPES for causal in (False, True)]

COLUMNS = [
    ("B", "B"),
    ("H", "H"),
    ("N", "N"),
    ("D", "D"),
    ("causal", "causal"),
    ("config", "BLOCK_M x BLOCK_N, warps, stages"),
    ("t5_us", "T5 us"),
    ("t5_tflops", "T5 TFLOP/s"),
    ("fa2_tflops", "SDPA FA2 TFLOP/s"),
    ("default_tflops", "SDPA default TFLOP/s"),
    ("default_backend", "default is"),
    ("vs_fa2", "T5 / FA2"),
    ("vs_default", "T5 / default"),
    ("t5_peak", "T5 / datasheet"),
]


def flops(B, H, N, D, causal):
    """4 * B * H * Nq * Nk * D, halved when causal (the convention of the FlashAttention papers)."""
    return 4 * B * H * N * N * D * (0.5 if causal else 1.0)


def default_backend(q, k, v, causal) -> str | None:
    """The backend SDPA picks by default for these inputs (a private torch helper, so None if it is gone)."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, is_causal=causal)
        names = {int(getattr(SDPBackend, n)): n for n in dir(SDPBackend) if n.isupper()}
        return names.get(int(choice), str(choice)).lower()
    except Exception:
        return None


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_tflops_fp16()
    for (B, H, N, D), causal in ROWS:
        gen = torch.Generator(device="cuda").manual_seed(N + D)
        # [B, H, N, D] each
        q, k, v = (
            torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3)
        )
        scale = 1.0 / math.sqrt(D)
        out = torch.empty_like(q)

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        expected = sdpa().float()  # square, so SDPA's top-left causal mask is also bottom-right
        assert_close(impl.flash_attention(q, k, v, causal=causal), expected)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            assert_close(sdpa(), expected)
            fa2_us = bench.time_us(sdpa)
        default_us = bench.time_us(sdpa)
        t5_us = bench.time_us(lambda: impl._launch(q, k, v, causal, scale, out))
        work = flops(B, H, N, D, causal)
        bm, bn, warps, stages = impl._config(D)
        row = dict(
            B=B,
            H=H,
            N=N,
            D=D,
            causal="yes" if causal else "no",
            config=f"{bm}x{bn}, {warps}, {stages}",
            t5_us=t5_us,
            t5_tflops=bench.tflops(work, t5_us),
            fa2_tflops=bench.tflops(work, fa2_us),
            default_tflops=bench.tflops(work, default_us),
            default_backend=default_backend(q, k, v, causal),
        )
        row["vs_fa2"] = row["t5_tflops"] / row["fa2_tflops"]
        row["vs_default"] = row["t5_tflops"] / row["default_tflops"]
        row["t5_peak"] = row["t5_tflops"] / peak if peak else None
        table.add(row)
        del q, k, v, out, expected
        torch.cuda.empty_cache()

    notes = [
        "fp16, Nq = Nk = N, Hkv = H; TFLOP/s counts 4 * B * H * N^2 * D, halved when causal. Every row is "
        "timed with triton.testing.do_bench (median, L2 flushed) on the same tensors.",
        "SDPA FA2 forces `sdpa_kernel(SDPBackend.FLASH_ATTENTION)`; SDPA default lets torch choose its backend "
        "(named in the 'default is' column, as `torch._fused_sdp_choice` reports it). T5 us times the bare "
        "launch (`_launch`), without the launcher's checks.",
        "Targets on an H200: T5 / FA2 >= 1.0 and T5 / default >= 0.75 on every row.",
    ]
    return table, notes


def plot(rows, meta, path):
    peak = meta.get("datasheet_peak_tflops_fp16")
    bench.plot_bars(
        rows,
        [
            ("t5_tflops", "T5 (this lesson)"),
            ("fa2_tflops", "SDPA, FlashAttention-2 backend"),
            ("default_tflops", "SDPA, default backend"),
        ],
        [f"B={r['B']} N={r['N']}\nD={r['D']} {'causal' if r['causal'] == 'yes' else 'full'}" for r in rows],
        f"FlashAttention forward, fp16, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="TFLOP/s",
        hline=(peak, "datasheet fp16 peak") if peak else None,
    )


# --- The figures the explainer's sentences quote (bench.FIGURES); data is t5_flash_attention.bench.json


def _at(data, N: int, causal: str, D: int = 128) -> dict:
    return next(r for r in data["rows"] if (r["N"], r["causal"], r["D"]) == (N, causal, D))


def _targets(data) -> str:
    met = [min(r["vs_fa2"] for r in data["rows"]) >= 1.0, min(r["vs_default"] for r in data["rows"]) >= 0.75]
    return {(True, True): "both are met", (False, False): "neither is met"}.get(
        tuple(met), "the first is met" if met[0] else "the second is met"
    )


FIGURES = {
    "full_us": lambda d: bench.num(_at(d, 4096, "no")["t5_us"]),
    "full_tflops": lambda d: bench.num(_at(d, 4096, "no")["t5_tflops"]),
    "full_peak": lambda d: bench.num(_at(d, 4096, "no")["t5_peak"]),
    "full_fa2": lambda d: bench.num(_at(d, 4096, "no")["fa2_tflops"]),
    "full_default": lambda d: bench.num(_at(d, 4096, "no")["default_tflops"]),
    "causal_us": lambda d: bench.num(_at(d, 4096, "yes")["t5_us"]),
    "causal_tflops": lambda d: bench.num(_at(d, 4096, "yes")["t5_tflops"]),
    "long_causal_tflops": lambda d: bench.num(_at(d, 16384, "yes")["t5_tflops"]),
    "long_full_tflops": lambda d: bench.num(_at(d, 16384, "no")["t5_tflops"]),
    "vs_fa2": lambda d: bench.span_of(r["vs_fa2"] for r in d["rows"]),
    "vs_default": lambda d: bench.span_of(r["vs_default"] for r in d["rows"]),
    "targets": _targets,
}
