"""F1 benchmark: split-KV decode against L2, fixed split counts, FlashInfer and SDPA, one run.

L2's six shapes (PAGE = 16; drills/benchmarks/l2_paged_decode.py says where they come from), on which
vLLM's fixed split count had to range from 1 to 64 to be best, and PAGE = 1 at B = 64, ctx = 1024.
GB/s counts K and V read once; every ratio is to a reduction over the same bytes timed in this run.
Kernel times are CUDA-graph replays (GPU time, no Python launch overhead) for every implementation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from drills import bench
from drills.benchmarks.l2_paged_decode import (
    HKV,
    HQ,
    D,
    flashinfer_decode,
    flashinfer_note,
    gathered_sdpa,
    make_inputs,
)
from drills.compare import assert_close

SHAPES = [
    (64, 1024, 16),
    (1, 32768, 16),
    (8, 4096, 16),
    (128, 2048, 16),
    (256, 512, 16),
    (1, 4096, 16),
    (32, 3000, 16),
    (16, 8192, 32),
    (64, 1024, 1),
]  # (B, ctx, PAGE)
FIXED = (1, 4, 16, 64)

COLUMNS = [
    ("B", "B"),
    ("ctx", "ctx"),
    ("page", "PAGE"),
    ("kv_mb", "KV MB"),
    ("ceiling_gbs", "read ceiling GB/s"),
    ("plan", "plan() splits"),
    ("f1_us", "F1 us"),
    ("f1_gbs", "F1 GB/s"),
    ("f1_ceiling", "F1 / ceiling"),
    ("f1_vs_flashinfer", "F1 / FlashInfer"),
    ("f1_peak", "F1 / datasheet"),
    *[(f"fixed{s}", f"{s} split{'s' if s > 1 else ''} / ceiling") for s in FIXED],
    ("plan_vs_best", "plan / best fixed"),
    ("l2_ceiling", "L2 / ceiling"),
    ("flashinfer_ceiling", "FlashInfer / ceiling"),
    ("sdpa_ceiling", "SDPA contiguous / ceiling"),
    ("api_eager_us", "F1 API eager us"),
    ("flashinfer_eager_us", "FlashInfer run() eager us"),
    ("api_vs_flashinfer_eager", "F1 API / FlashInfer, eager time"),
    ("api_graph_us", "F1 API graph us"),
    ("api_host_us", "F1 API host us/call"),
    ("flashinfer_host_us", "FlashInfer run() host us/call"),
]


def run(impl) -> tuple[bench.Table, list[str]]:
    from drills.solutions import l2_paged_decode as l2

    table = bench.Table(COLUMNS)
    peak = bench.peak_gbs()
    flashinfer_error, ran_flashinfer = None, False
    for B, ctx, page in SHAPES:
        q, k_cache, v_cache, block_tables, context_lens = args = make_inputs(B, ctx, page)
        nbytes = 2 * B * ctx * HKV * D * q.element_size()
        scale = 1.0 / math.sqrt(D)
        out = torch.empty_like(q)
        k_contig = bench.gather_pages(k_cache, block_tables, ctx).contiguous()  # [B, Hkv, ctx, D]
        v_contig = bench.gather_pages(v_cache, block_tables, ctx).contiguous()

        def sdpa():
            return F.scaled_dot_product_attention(q[:, :, None], k_contig, v_contig, enable_gqa=True)[:, :, 0]

        expected = sdpa().float()
        ceiling = bench.read_ceiling_gbs(nbytes)
        ratio = lambda us: bench.gbs(nbytes, us) / ceiling  # noqa: E731
        plan = impl.plan(context_lens, HKV, page)
        assert_close(impl.split_kv_decode(*args, plan=plan), expected)
        row = dict(
            B=B, ctx=ctx, page=page, kv_mb=round(nbytes / 1e6), ceiling_gbs=ceiling, plan=plan.num_splits
        )
        row["f1_us"] = bench.time_us(lambda: impl._launch(*args, scale, plan, out, None), graph=True)
        row["f1_gbs"] = bench.gbs(nbytes, row["f1_us"])
        row["f1_ceiling"] = row["f1_gbs"] / ceiling
        row["f1_peak"] = row["f1_gbs"] / peak if peak else None
        api = lambda: impl.split_kv_decode(*args, plan=plan, out=out)  # noqa: E731 - as a user calls it
        row["api_eager_us"] = bench.time_us(api)
        row["api_graph_us"] = bench.time_us(api, graph=True)
        row["api_host_us"] = bench.host_us(api)
        for splits in FIXED:
            fixed = impl.plan(context_lens, HKV, page, num_splits=splits)
            assert_close(impl.split_kv_decode(*args, plan=fixed), expected)
            row[f"fixed{splits}"] = ratio(
                bench.time_us(lambda: impl._launch(*args, scale, fixed, out, None), graph=True)
            )
        row["plan_vs_best"] = row["f1_ceiling"] / max(row[f"fixed{s}"] for s in FIXED)
        if page >= 16:
            row["l2_ceiling"] = ratio(bench.time_us(lambda: l2._launch(*args, scale, out), graph=True))
        try:
            fi = flashinfer_decode(*args)
        except Exception as exc:  # FlashInfer compiles on first use; a failed build is a note
            fi, flashinfer_error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if fi is not None:
            ran_flashinfer = True
            assert_close(fi(), expected)
            row["flashinfer_ceiling"] = ratio(bench.time_us(fi, graph=True))
            row["f1_vs_flashinfer"] = row["f1_ceiling"] / row["flashinfer_ceiling"]
            row["flashinfer_eager_us"] = bench.time_us(fi)
            row["flashinfer_host_us"] = bench.host_us(fi)
            row["api_vs_flashinfer_eager"] = row["api_eager_us"] / row["flashinfer_eager_us"]
        row["sdpa_ceiling"] = ratio(bench.time_us(sdpa, graph=True))
        table.add(row)
        del args, q, k_cache, v_cache, k_contig, v_contig, out
        torch.cuda.empty_cache()

    notes = [
        f"Hq = {HQ}, Hkv = {HKV}, D = {D}, fp16, pages shuffled; GB/s counts K and V read once; the read "
        "ceiling is `x.sum()` over an fp16 buffer of the KV's size, in the same run.",
        "Kernel times are CUDA-graph replays for every implementation (GPU time, no Python launch overhead). "
        "F1 API eager us is a plain call of split_kv_decode(plan=...) (shape checks, launches, no device "
        "sync), timed as FlashInfer's run() is, plan() done before for both, L2 flushed between calls; "
        "F1 API graph us is the same call captured in a CUDA graph. Host us/call is what the calling "
        "thread pays per call (100 calls queued, median of 7).",
        "Fixed split counts are plan(num_splits=s): chunks are whole 16-token tiles, so a count the "
        "context cannot use is rounded down. L2 has no PAGE = 1 path (its tile is one page).",
    ]
    notes.append(flashinfer_note(flashinfer_error, ran_flashinfer))
    return table, notes


def plot(rows, meta, path):
    bench.plot_bars(
        rows,
        [
            ("f1_ceiling", "F1 with plan()"),
            ("l2_ceiling", "L2 (no split)"),
            ("flashinfer_ceiling", "FlashInfer"),
            ("sdpa_ceiling", "SDPA, contiguous KV"),
        ],
        [f"B={r['B']}\nctx={r['ctx']}" + ("" if r["page"] == 16 else f"\nPAGE={r['page']}") for r in rows],
        f"Split-KV decode, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="fraction of the read ceiling",
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's GB/s at B = 1, ctx = 32768 (the shape L2 leaves idle), with the
    plan impl.plan() picks, a CUDA-graph replay of the bare launches, checked against SDPA first."""
    B, ctx, page = SHAPES[1]
    q, k_cache, v_cache, block_tables, context_lens = args = make_inputs(B, ctx, page)
    plan = impl.plan(context_lens, HKV, page)
    assert_close(impl.split_kv_decode(*args, plan=plan), gathered_sdpa(*args))
    out = torch.empty_like(q)
    us = bench.time_us(lambda: impl._launch(*args, 1.0 / math.sqrt(D), plan, out, None), graph=True)
    return (
        bench.gbs(2 * B * ctx * HKV * D * q.element_size(), us),
        "GB/s",
        f"B = {B}, ctx = {ctx}, fp16, {plan.num_splits} splits",
    )


# --- The figures the explainer's sentences quote (bench.FIGURES); data is f1_split_kv_decode.bench.json


def _at(data, B: int, ctx: int, page: int = 16) -> dict:
    return next(r for r in data["rows"] if (r["B"], r["ctx"], r["page"]) == (B, ctx, page))


def _best_fixed(row: dict) -> str:
    return str(max((1, 4, 16, 64), key=lambda s: row[f"fixed{s}"]))


def _eager_gap(data) -> dict:
    """The row where the eager call exceeds its graph replay the most."""
    return max(data["rows"], key=lambda r: r["api_eager_us"] - r["api_graph_us"])


def _both(values) -> str:
    """ "0.95" when both B = 1 rows round to the same figure, else "0.95 and 0.94"."""
    a, b = values
    return a if a == b else f"{a} and {b}"


def _n(v: float) -> str:
    return bench.num(v, 1)


FIGURES = {
    "guard_cost": lambda d: bench.guard_cost_figure("f1_split_kv_decode"),
    "l2_b1_gbs": lambda d: bench.num(_at(d, 1, 32768)["l2_ceiling"] * _at(d, 1, 32768)["ceiling_gbs"]),
    "l2_b1_ceiling": lambda d: bench.num(_at(d, 1, 32768)["l2_ceiling"]),
    "l2_b64_ceiling": lambda d: bench.num(_at(d, 64, 1024)["l2_ceiling"]),
    "b1_4096_f1_us": lambda d: bench.num(_at(d, 1, 4096)["f1_us"], 0),
    "b1_4096_eager_us": lambda d: _n(_at(d, 1, 4096)["api_eager_us"]),
    "b1_4096_graph_us": lambda d: _n(_at(d, 1, 4096)["api_graph_us"]),
    "b1_4096_flashinfer_us": lambda d: _n(_at(d, 1, 4096)["flashinfer_eager_us"]),
    "b64_f1_ceiling": lambda d: bench.num(_at(d, 64, 1024)["f1_ceiling"]),
    "b64_fixed1": lambda d: bench.num(_at(d, 64, 1024)["fixed1"]),
    "b64_fixed4": lambda d: bench.num(_at(d, 64, 1024)["fixed4"]),
    "b64_fixed64": lambda d: bench.num(_at(d, 64, 1024)["fixed64"]),
    "b64_best_fixed": lambda d: _best_fixed(_at(d, 64, 1024)),
    "b1_best_fixed": lambda d: _best_fixed(_at(d, 1, 32768)),
    "f1_ceiling": lambda d: bench.span_of(r["f1_ceiling"] for r in d["rows"]),
    "vs_flashinfer": lambda d: bench.span_of(r["f1_vs_flashinfer"] for r in d["rows"]),
    "below_flashinfer": lambda d: str(sum(r["f1_vs_flashinfer"] < 1 for r in d["rows"])),
    "plan_vs_best": lambda d: bench.span_of(r["plan_vs_best"] for r in d["rows"]),
    "b1_l2": lambda d: " and ".join(bench.num(_at(d, 1, c)["l2_ceiling"]) for c in (32768, 4096)),
    "b1_f1": lambda d: _both(bench.num(_at(d, 1, c)["f1_ceiling"]) for c in (32768, 4096)),
    "page1": lambda d: bench.num(_at(d, 64, 1024, 1)["f1_ceiling"]),
    "eager_vs_flashinfer": lambda d: bench.span_of(r["api_vs_flashinfer_eager"] for r in d["rows"]),
    "eager_gap": lambda d: _n(_eager_gap(d)["api_eager_us"] - _eager_gap(d)["api_graph_us"]),
    "eager_gap_row": lambda d: (
        f"{_n(_eager_gap(d)['api_eager_us'])} against {_n(_eager_gap(d)['api_graph_us'])} µs at "
        f"B = {_eager_gap(d)['B']}, ctx = {_eager_gap(d)['ctx']}"
    ),
    "host_us": lambda d: bench.span_of(r["api_host_us"] for r in d["rows"]),
    "flashinfer_host_us": lambda d: bench.span_of(r["flashinfer_host_us"] for r in d["rows"]),
}
