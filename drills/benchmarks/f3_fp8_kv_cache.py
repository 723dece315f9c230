"""F3 benchmark: decode over an e4m3 cache against F1 over fp16 and FlashInfer over the same e4m3 cache.

F1's rows that matter for a KV cache's bytes (PAGE = 16, Hq = 32, Hkv = 8, D = 128, L2's model shape):
B = 1 at 32k and 8 x 4k, where K and V are nearly all the bytes a step reads; 64 x 1k, 128 x 2k and
256 x 512, where a serving step also reads the weights (not timed here: the table is attention alone).
GB/s counts K and V read once, in the cache's own dtype; every ratio is to a ceiling measured in this
run over the same number of bytes: a reduction (x.sum()) and a device-to-device copy of the e4m3 bytes.
Kernel times are CUDA-graph replays (GPU time, no Python launch overhead) for every implementation.
Peers: FlashInfer's BatchDecodeWithPagedKVCacheWrapper (plan(kv_data_type=torch.float8_e4m3fn), then
run(q, (k_cache, v_cache), k_scale=, v_scale=): one float scale per tensor); F1 (drills/solutions).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from drills import bench
from drills.benchmarks.l2_paged_decode import HKV, HQ, D, make_inputs
from drills.compare import assert_close

SHAPES = [(1, 32768), (8, 4096), (64, 1024), (128, 2048), (256, 512)]  # (B, ctx), PAGE = 16
PAGE = 16
E4M3 = torch.float8_e4m3fn
DEVICE = "cuda"  # a dry run of the bookkeeping on a CPU sets "cpu" (and small inputs through _inputs)


def _inputs(B, ctx):
    return make_inputs(B, ctx, PAGE)  # q [B, Hq, D], caches [blocks, PAGE, Hkv, D] fp16, tables, lens


COLUMNS = [
    ("B", "B"),
    ("ctx", "ctx"),
    ("kv_mb", "e4m3 KV MB"),
    ("ceiling_gbs", "read ceiling GB/s"),
    ("copy_gbs", "e4m3 copy GB/s"),
    ("plan", "plan() splits"),
    ("f3_us", "F3 per tensor us"),
    ("f3_gbs", "F3 per tensor GB/s"),
    ("f3_ceiling", "F3 per tensor / ceiling"),
    ("f3_head_us", "F3 per head us"),
    ("f3_head_ceiling", "F3 per head / ceiling"),
    ("f1_us", "F1 fp16 us"),
    ("f3_vs_f1", "F1 fp16 us / F3 us"),
    ("flashinfer_us", "FlashInfer e4m3 us"),
    ("f3_vs_flashinfer", "FlashInfer us / F3 us"),
    ("store_us", "F3 store of B tokens us"),
]


def kv_bytes(B: int, ctx: int, element_size: int) -> int:
    """K and V of every sequence, read once: the bytes a decode step's attention must move."""
    return 2 * B * ctx * HKV * D * element_size


def quantize(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The lesson's store rule in torch: e4m3 of clamp(x / scale), scale [1] or [Hkv] (one per KV head)."""
    return (cache.float() / scale.reshape(-1, 1)).clamp(-448.0, 448.0).to(E4M3)


def dequantize(cache8: torch.Tensor, scale: torch.Tensor, dtype=torch.float16) -> torch.Tensor:
    return (cache8.float() * scale.reshape(-1, 1)).to(dtype)


def expected_output(q, k_cache, v_cache, block_tables, ctx):
    """softmax(q K^T / sqrt(D)) V over caches given in q's dtype (the dequantized ones): SDPA over
    contiguous gathered copies, every sequence ctx tokens. [B, Hq, D] fp32."""
    k = bench.gather_pages(k_cache, block_tables, ctx)  # [B, Hkv, ctx, D]
    v = bench.gather_pages(v_cache, block_tables, ctx)
    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0].float()


def flashinfer_fp8_decode(q, k8, v8, block_tables, context_lens, k_scale: float, v_scale: float):
    """FlashInfer's paged decode over the e4m3 cache, tensor-core path first, then the CUDA-core one
    (plan() here, outside the timing). Returns (callable, which path) or (None, why)."""
    try:
        import flashinfer
    except ImportError:
        return None, "not importable"
    B, pages = block_tables.shape
    page = k8.shape[1]
    indptr = torch.arange(0, B * pages + 1, pages, dtype=torch.int32, device=DEVICE)  # [B + 1]
    indices = block_tables.reshape(-1)
    last = (context_lens - 1) % page + 1
    errors = []
    for tensor_cores in (True, False):
        try:
            workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=DEVICE)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=tensor_cores
            )
            wrapper.plan(indptr, indices, last, HQ, HKV, D, page, q_data_type=q.dtype, kv_data_type=E4M3)
            fn = lambda w=wrapper: w.run(q, (k8, v8), k_scale=k_scale, v_scale=v_scale)  # noqa: E731
            fn()
            return fn, f"use_tensor_cores={tensor_cores}"
        except Exception as exc:  # a path this build lacks: try the other, say why in the notes
            errors.append(
                f"use_tensor_cores={tensor_cores}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            )
    return None, "; ".join(errors)


def run(impl) -> tuple[bench.Table, list[str]]:
    from drills.solutions import f1_split_kv_decode as f1

    table = bench.Table(COLUMNS)
    flashinfer_how = set()
    for B, ctx in SHAPES:
        q, k16, v16, block_tables, context_lens = _inputs(B, ctx)
        scale = 1.0 / math.sqrt(D)
        nbytes = kv_bytes(B, ctx, 1)
        out = torch.empty_like(q)
        row = dict(B=B, ctx=ctx, kv_mb=round(nbytes / 1e6))
        row["ceiling_gbs"] = bench.read_ceiling_gbs(nbytes)
        src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
        dst = torch.empty_like(src)
        row["copy_gbs"] = (
            nbytes / bench.time_us(lambda: dst.copy_(src), graph=True) / 1e3
        )  # bytes read per us
        del src, dst
        plan = impl.plan(context_lens, HKV, PAGE)
        row["plan"] = plan.num_splits
        ratio = lambda us: bench.gbs(nbytes, us) / row["ceiling_gbs"]  # noqa: E731

        for per_head, key in ((False, "f3"), (True, "f3_head")):
            ks, vs = impl.compute_scales(k16, v16, per_head=per_head)
            k8, v8 = quantize(k16, ks), quantize(v16, vs)
            want = expected_output(q, dequantize(k8, ks), dequantize(v8, vs), block_tables, ctx)
            assert_close(impl.fp8_decode(q, k8, v8, block_tables, context_lens, ks, vs, plan=plan), want)
            us = bench.time_us(
                lambda: impl._launch(q, k8, v8, block_tables, context_lens, ks, vs, scale, plan, out, None),
                graph=True,
            )
            row[f"{key}_us"] = us
            row[f"{key}_ceiling"] = ratio(us)
            if not per_head:
                row["f3_gbs"] = bench.gbs(nbytes, us)
                per_tensor = (k8, v8, ks, vs, want)
        k8, v8, ks, vs, want = per_tensor

        f1_plan = f1.plan(context_lens, HKV, PAGE)
        assert_close(
            f1.split_kv_decode(q, k16, v16, block_tables, context_lens, plan=f1_plan),
            expected_output(q, k16, v16, block_tables, ctx),
        )
        row["f1_us"] = bench.time_us(
            lambda: f1._launch(q, k16, v16, block_tables, context_lens, scale, f1_plan, out, None), graph=True
        )
        row["f3_vs_f1"] = row["f1_us"] / row["f3_us"]

        fi, how = flashinfer_fp8_decode(q, k8, v8, block_tables, context_lens, float(ks), float(vs))
        flashinfer_how.add(how)
        if fi is not None:
            assert_close(fi(), want)
            row["flashinfer_us"] = bench.time_us(fi, graph=True)
            row["f3_vs_flashinfer"] = row["flashinfer_us"] / row["f3_us"]

        # The store a decode step makes: one new token per sequence, quantized into its slot.
        key = torch.randn(B, HKV, D, dtype=torch.float16, device=DEVICE)
        slots = (
            block_tables[:, -1].long() * PAGE + (ctx - 1) % PAGE
        ).contiguous()  # each sequence's last slot
        impl.store_kvcache_fp8(key, key, k8, v8, slots, ks, vs, check=True)
        row["store_us"] = bench.time_us(
            lambda: impl._launch_store(key, key, k8, v8, slots, ks, vs), graph=True
        )
        table.add(row)
        del q, k16, v16, k8, v8, out, per_tensor, want
        torch.cuda.empty_cache()

    notes = [
        f"Hq = {HQ}, Hkv = {HKV}, D = {D}, PAGE = {PAGE}, q fp16, K and V standard normal, pages shuffled. "
        "F3 reads K and V as e4m3 (1 byte), F1 as fp16 (2 bytes); GB/s counts the e4m3 bytes, read once.",
        "Read ceiling: x.sum() over an fp16 buffer of the e4m3 KV's byte count; e4m3 copy GB/s: a "
        "device-to-device copy of that many bytes, counted as bytes read per second. Both in the same run.",
        "Scales from compute_scales (the amax rule), per tensor ([1]) and per KV head ([Hkv]); every output "
        "is checked against SDPA over the dequantized cache before it is timed.",
        "FlashInfer: " + ("; ".join(sorted(flashinfer_how)) or "n/a") + ". It takes one float k_scale and "
        "v_scale per call, so it runs the per-tensor cache only.",
        "Kernel times are CUDA-graph replays for every implementation. The store column quantizes one new "
        "token per sequence into the e4m3 cache (a decode step's store), also a graph replay.",
    ]
    try:
        import flashinfer

        notes.append(f"FlashInfer {flashinfer.__version__}.")
    except ImportError:
        pass
    return table, notes


def plot(rows, meta, path):
    bench.plot_bars(
        rows,
        [
            ("f3_ceiling", "F3, e4m3, per-tensor scales"),
            ("f3_head_ceiling", "F3, e4m3, per-head scales"),
        ],
        [f"B={r['B']}\nctx={r['ctx']}" for r in rows],
        f"Decode over an e4m3 KV cache, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="fraction of the read ceiling",
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's GB/s of e4m3 KV at B = 1, ctx = 32768, per-tensor scales, checked
    against SDPA over the dequantized cache, then a CUDA-graph replay of the bare launches."""
    B, ctx = SHAPES[0]
    q, k16, v16, block_tables, context_lens = _inputs(B, ctx)
    ks, vs = impl.compute_scales(k16, v16)
    k8, v8 = quantize(k16, ks), quantize(v16, vs)
    plan = impl.plan(context_lens, HKV, PAGE)
    want = expected_output(q, dequantize(k8, ks), dequantize(v8, vs), block_tables, ctx)
    assert_close(impl.fp8_decode(q, k8, v8, block_tables, context_lens, ks, vs, plan=plan), want)
    out = torch.empty_like(q)
    us = bench.time_us(
        lambda: impl._launch(
            q, k8, v8, block_tables, context_lens, ks, vs, 1.0 / math.sqrt(D), plan, out, None
        ),
        graph=True,
    )
    return (
        bench.gbs(kv_bytes(B, ctx, 1), us),
        "GB/s",
        f"B = {B}, ctx = {ctx}, e4m3 KV, {plan.num_splits} splits",
    )


# --- The figures the explainer's sentences quote (bench.FIGURES); data is f3_fp8_kv_cache.bench.json


def _at(data, B: int, ctx: int) -> dict:
    return next(r for r in data["rows"] if (r["B"], r["ctx"]) == (B, ctx))


def _with(data, key: str) -> list[dict]:
    """The rows that measured key (FlashInfer's columns are absent where it did not import)."""
    return [r for r in data["rows"] if r.get(key) is not None]


def _rows_where(data, key: str, keep) -> str:
    """The (B, ctx) of the rows whose key passes keep, as a sentence lists them; "none" when no row does."""
    picked = [f"({r['B']}, {r['ctx']:,})" for r in _with(data, key) if keep(r[key])]
    return ", ".join(picked) if picked else "none"


FIGURES = {
    "vs_f1": lambda d: bench.span_of(r["f3_vs_f1"] for r in d["rows"]),
    "ceiling": lambda d: bench.span_of(r["f3_ceiling"] for r in d["rows"]),
    "head_ceiling": lambda d: bench.span_of(r["f3_head_ceiling"] for r in d["rows"]),
    "vs_flashinfer": lambda d: (
        bench.span_of(r["f3_vs_flashinfer"] for r in _with(d, "f3_vs_flashinfer"))
        if _with(d, "f3_vs_flashinfer")
        else "n/a"
    ),
    "flashinfer_losses": lambda d: _rows_where(d, "f3_vs_flashinfer", lambda v: v < 1.0),
    "worst_row_ceiling": lambda d: bench.num(min(r["f3_ceiling"] for r in d["rows"])),
    "worst_ceiling_row": lambda d: _rows_where(
        d, "f3_ceiling", lambda v: v == min(r["f3_ceiling"] for r in d["rows"])
    ),
    "long_us": lambda d: bench.num(_at(d, 1, 32768)["f3_us"], 0),
    "long_f1_us": lambda d: bench.num(_at(d, 1, 32768)["f1_us"], 0),
    "store_max_us": lambda d: bench.num(max(r["store_us"] for r in d["rows"]), 1),
}
