"""L2 benchmark: paged decode on six (B, ctx) shapes, from B * Hkv = 8 programs (B = 1) to 2048 (B = 256):
the shapes at which vLLM's Triton decode (vllm/attention/ops/triton_decode_attention.py), FlashInfer
0.2.14's tensor-core decode (BatchDecodeWithPagedKVCacheWrapper) and torch SDPA were timed on an H200
(torch 2.11, Triton 3.6) before this lesson was written; FlashInfer and SDPA are timed again here.

Every implementation reads the same KV bytes, 2 * B * ctx * Hkv * D * 2, so all are reported in GB/s
and as a fraction of a plain reduction over a buffer of that size, timed in the same run. Each peer's
output is checked against the lesson's before it is timed, so a fast wrong answer cannot enter the table.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from drills import bench
from drills.compare import assert_close

SHAPES = [(64, 1024), (1, 32768), (8, 4096), (128, 2048), (256, 512), (1, 4096)]  # (B, ctx)
HQ, HKV, D, PAGE = 32, 8, 128, 16

COLUMNS = [
    ("B", "B"),
    ("ctx", "ctx"),
    ("kv_mb", "KV MB"),
    ("ceiling_gbs", "read ceiling GB/s"),
    ("l2_us", "L2 us"),
    ("l2_gbs", "L2 GB/s"),
    ("l2_ceiling", "L2 / ceiling"),
    ("l2_peak", "L2 / datasheet"),
    ("api_eager_us", "L2 API eager us"),
    ("flashinfer_eager_us", "FlashInfer run() eager us"),
    ("api_vs_flashinfer_eager", "L2 API / FlashInfer, eager time"),
    ("api_graph_us", "L2 API graph us"),
    ("api_host_us", "L2 API host us/call"),
    ("flashinfer_host_us", "FlashInfer run() host us/call"),
    ("flashinfer_gbs", "FlashInfer GB/s"),
    ("flashinfer_ceiling", "FlashInfer / ceiling"),
    ("sdpa_gbs", "SDPA contiguous GB/s"),
    ("sdpa_ceiling", "SDPA / ceiling"),
    ("gather_gbs", "gather + SDPA GB/s"),
]


def make_inputs(B, ctx, page=PAGE, dtype=torch.float16):
    """Random q and a shuffled page pool exactly as large as the batch needs."""
    pages = math.ceil(ctx / page)
    k_cache = torch.randn(B * pages, page, HKV, D, device="cuda", dtype=dtype)  # [num_blocks, PAGE, Hkv, D]
    v_cache = torch.randn_like(k_cache)
    block_tables = torch.randperm(B * pages, device="cuda").view(B, pages).to(torch.int32)  # [B, pages]
    context_lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(B, HQ, D, device="cuda", dtype=dtype)  # [B, Hq, D]
    return q, k_cache, v_cache, block_tables, context_lens


def flashinfer_decode(q, k_cache, v_cache, block_tables, context_lens):
    """FlashInfer's tensor-core paged decode on the same cache (plan() done here, outside the timing),
    or None when FlashInfer is not installed."""
    try:
        import flashinfer
    except ImportError:
        return None
    B, pages = block_tables.shape
    page = k_cache.shape[1]
    indptr = torch.arange(0, B * pages + 1, pages, dtype=torch.int32, device="cuda")  # [B + 1]
    indices = block_tables.reshape(-1)  # [B * pages], every page of every sequence in order
    last = (context_lens - 1) % page + 1  # tokens in each last page, 1..PAGE
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, HQ, HKV, D, page, q_data_type=q.dtype, kv_data_type=k_cache.dtype)
    return lambda: wrapper.run(q, (k_cache, v_cache))


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_gbs()
    notes = []
    have_flashinfer = True
    flashinfer_error = None
    for B, ctx in SHAPES:
        q, k_cache, v_cache, block_tables, context_lens = args = make_inputs(B, ctx)
        nbytes = 2 * B * ctx * HKV * D * q.element_size()
        out = torch.empty_like(q)
        scale = 1.0 / math.sqrt(D)

        # Contiguous copies for SDPA: [B, Hkv, ctx, D], the layout a non-paged engine would keep.
        k_contig = bench.gather_pages(k_cache, block_tables, ctx).contiguous()
        v_contig = bench.gather_pages(v_cache, block_tables, ctx).contiguous()

        def sdpa(k, v):
            return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]

        def gather_sdpa():  # the gather is timed too: it is the cost of having no paged kernel
            return sdpa(
                bench.gather_pages(k_cache, block_tables, ctx), bench.gather_pages(v_cache, block_tables, ctx)
            )

        expected = sdpa(k_contig, v_contig)
        assert_close(impl.paged_decode(*args), expected.float())
        row = dict(B=B, ctx=ctx, kv_mb=round(nbytes / 1e6), ceiling_gbs=bench.read_ceiling_gbs(nbytes))
        row["l2_us"] = bench.time_us(lambda: impl._launch(*args, scale, out), graph=True)
        api = lambda: impl.paged_decode(*args, out=out)  # noqa: E731 - the public call, as a user makes it
        row["api_eager_us"] = bench.time_us(api)
        row["api_graph_us"] = bench.time_us(api, graph=True)
        row["api_host_us"] = bench.host_us(api)
        row["l2_gbs"] = bench.gbs(nbytes, row["l2_us"])
        row["l2_ceiling"] = row["l2_gbs"] / row["ceiling_gbs"]
        row["l2_peak"] = row["l2_gbs"] / peak if peak else None

        try:
            fi = flashinfer_decode(*args)
        except (
            Exception
        ) as exc:  # it compiles its kernels on first use; a failed build is a note, not a crash
            fi, flashinfer_error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if fi is None:
            have_flashinfer = False
        else:
            assert_close(fi(), expected.float())
            row["flashinfer_gbs"] = bench.gbs(nbytes, bench.time_us(fi, graph=True))
            row["flashinfer_ceiling"] = row["flashinfer_gbs"] / row["ceiling_gbs"]
            row["flashinfer_eager_us"] = bench.time_us(fi)
            row["flashinfer_host_us"] = bench.host_us(fi)
            row["api_vs_flashinfer_eager"] = row["api_eager_us"] / row["flashinfer_eager_us"]
        row["sdpa_gbs"] = bench.gbs(nbytes, bench.time_us(lambda: sdpa(k_contig, v_contig), graph=True))
        row["sdpa_ceiling"] = row["sdpa_gbs"] / row["ceiling_gbs"]
        assert_close(gather_sdpa(), expected.float())
        row["gather_gbs"] = bench.gbs(nbytes, bench.time_us(gather_sdpa, graph=True))
        table.add(row)
        del args, q, k_cache, v_cache, k_contig, v_contig, out
        torch.cuda.empty_cache()

    notes.append(
        f"Hq = {HQ}, Hkv = {HKV}, D = {D}, PAGE = {PAGE}, fp16, pages shuffled; GB/s counts K and V "
        "read once; the read ceiling is `x.sum()` over an fp16 buffer of the KV's size, same run."
    )
    notes.append(
        "Kernel times (L2 us, and every peer's GB/s) are CUDA-graph replays: GPU time without "
        "Python's launch overhead, as serving engines run decode. L2 API eager us is a plain call of "
        "paged_decode (checks of shapes, dtypes and strides, no device sync), timed as FlashInfer's "
        "run() is, with L2 flushed between calls; L2 API graph us is the same call captured in a CUDA "
        "graph. Host us/call is what the calling thread pays per call (100 calls queued, median of 7)."
    )
    notes.append(
        "SDPA contiguous reads KV that is not paged (an upper reference); gather + SDPA copies the "
        "pages into contiguous tensors first, as one would without a paged kernel."
    )
    notes.append(flashinfer_note(flashinfer_error, have_flashinfer))
    return table, notes


def flashinfer_note(error: str | None, ran: bool) -> str:
    """The table note that says which FlashInfer ran, or why its columns are empty."""
    if error:
        return f"FlashInfer: failed to build or run here ({error}), so its columns are n/a."
    if not ran:
        return "FlashInfer: not importable in this environment, so its columns are n/a."
    import flashinfer

    return (
        f"FlashInfer {flashinfer.__version__}: BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=True, "
        "plan() outside the timed call."
    )


def plot(rows, meta, path):
    bench.plot_bars(
        rows,
        [
            ("l2_ceiling", "L2 (this lesson)"),
            ("flashinfer_ceiling", "FlashInfer"),
            ("sdpa_ceiling", "SDPA, contiguous KV"),
        ],
        [f"B={r['B']}\nctx={r['ctx']}" for r in rows],
        f"Paged decode, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="fraction of the read ceiling",
    )


def gathered_sdpa(q, k_cache, v_cache, block_tables, context_lens):
    """The expected output [B, Hq, D] fp32 of a batch whose sequences all have context_lens[0] tokens:
    pages gathered into contiguous K and V, then SDPA (how the headlines check before timing)."""
    ctx = int(context_lens[0])
    k = bench.gather_pages(k_cache, block_tables, ctx)  # [B, Hkv, ctx, D]
    v = bench.gather_pages(v_cache, block_tables, ctx)
    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0].float()


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's GB/s at B = 64, ctx = 1024 (section 1's example), a CUDA-graph
    replay of the bare launch, checked against SDPA first."""
    B, ctx = SHAPES[0]
    q, k_cache, v_cache, block_tables, context_lens = args = make_inputs(B, ctx)
    assert_close(impl.paged_decode(*args), gathered_sdpa(*args))
    out = torch.empty_like(q)
    us = bench.time_us(lambda: impl._launch(*args, 1.0 / math.sqrt(D), out), graph=True)
    return bench.gbs(2 * B * ctx * HKV * D * q.element_size(), us), "GB/s", f"B = {B}, ctx = {ctx}, fp16"


# --- The figures the explainer's sentences quote (bench.FIGURES); data is l2_paged_decode.bench.json --


def _at(data, B: int, ctx: int) -> dict:
    return next(r for r in data["rows"] if (r["B"], r["ctx"]) == (B, ctx))


FIGURES = {
    "guard_cost": lambda d: bench.guard_cost_figure("l2_paged_decode"),
    "b64_us": lambda d: bench.num(_at(d, 64, 1024)["l2_us"]),
    "b64_eager_us": lambda d: bench.num(_at(d, 64, 1024)["api_eager_us"]),
    "b64_ceiling": lambda d: bench.num(_at(d, 64, 1024)["l2_ceiling"]),
    "b64_gbs": lambda d: bench.num(_at(d, 64, 1024)["l2_gbs"]),
    "b64_peak": lambda d: bench.num(_at(d, 64, 1024)["l2_peak"]),
    "b64_flashinfer": lambda d: bench.num(_at(d, 64, 1024)["flashinfer_ceiling"]),
    "b128_ceiling": lambda d: bench.num(_at(d, 128, 2048)["l2_ceiling"]),
    "b1_gbs": lambda d: bench.num(_at(d, 1, 32768)["l2_gbs"]),
    "b1_ceiling": lambda d: bench.num(_at(d, 1, 32768)["l2_ceiling"]),
    "host_us": lambda d: bench.span_of(r["api_host_us"] for r in d["rows"]),
    "flashinfer_host_us": lambda d: bench.span_of(r["flashinfer_host_us"] for r in d["rows"]),
    "full_vs_flashinfer": lambda d: bench.span_of(
        r["api_vs_flashinfer_eager"] for r in d["rows"] if r["B"] >= 64
    ),
}


# Section 3.6's host costs per call (l2_paged_decode.host.json, a record of that run: make bench does
# not re-time them). FlashInfer's run() row is this run's, from the bench JSON, so it stays current.


def _host() -> list[dict]:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parents[1] / "content" / "l2_paged_decode.host.json").read_text())[
        "rows"
    ]


def _host_table(data) -> str:
    lines = ["| what the host does | µs per call |", "| --- | --- |"]
    lines += [f"| {r['what']} | {r['us']}{', plus ' + r['plus'] if 'plus' in r else ''} |" for r in _host()]
    lines.append(
        f"| FlashInfer's `run()` (its plan done before; section 4's run) | {FIGURES['flashinfer_host_us'](data)} |"
    )
    return "\n" + "\n".join(lines) + "\n"


FIGURES |= {"host_costs": _host_table}
