"""L5 benchmark: one kernel for prefill and decode rows with sliding windows and sinks, against its band's
ceiling, FlashInfer's window_left and L4, in one run.

Shapes. gpt-oss (openai/gpt-oss, gpt_oss/torch/model.py: 64 query heads, 8 KV heads, head dim 64, a
128-token sliding window on every other layer, a learned sink logit per head): an 8k-token prompt, a
2048-token chunk over a 30k prefix (32k context), 64 decode rows at 32k, and 64 decode rows at 128 (what
the windowed decode at 32k should cost: its band is 128 keys). Mistral-7B v0.1's window (4096 tokens;
Hq 32, Hkv 8, D 128) on a 32k context: a chunk and 64 decode rows. The gpt-oss full layers (no window,
no sinks), where L4 runs the same work.

The band's ceiling, per row: K and V of the keys some new token of a sequence sees are read once
(2 * Hkv * D * 2 bytes a key, per sequence: min(ctx, window + q_len - 1) keys), q read and out written
once; the FLOPs are 4 * Hq * D * (sum over new tokens of the keys each sees). The ceiling time is the
larger of bytes / (a reduction's GB/s over the same bytes, this run) and FLOPs / the datasheet fp16 rate;
"L5 / ceiling" is that time over L5's. FlashInfer (when it imports): BatchPrefillWithPagedKVCacheWrapper
with window_left = window - 1 (its window counts the keys left of the query), fa2 and fa3 backends; it has
no sinks there, so on rows with sinks it runs the window alone. Every output is checked against an fp32
torch reference before it is timed. Kernel times are CUDA-graph replays of the bare launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drills import bench
from drills.compare import assert_close

PAGE = 16
GPT_OSS = (64, 8, 64)  # (Hq, Hkv, D)
MISTRAL = (32, 8, 128)


@dataclass(frozen=True)
class Row:
    label: str
    heads: tuple[int, int, int]  # (Hq, Hkv, D)
    seqs: tuple[tuple[int, int], ...]  # (cached, new) per sequence
    window: int | None
    sinks: bool


def _many(n, seq):
    return (seq,) * n


ROWS = [
    Row("gpt-oss prefill 8k", GPT_OSS, ((0, 8192),), 128, True),
    Row("gpt-oss chunk over 32k", GPT_OSS, ((30720, 2048),), 128, True),
    Row("gpt-oss 64 decodes at 32k", GPT_OSS, _many(64, (32767, 1)), 128, True),
    Row("gpt-oss 64 decodes at 128", GPT_OSS, _many(64, (127, 1)), 128, True),
    Row("window 4096 chunk over 32k", MISTRAL, ((30720, 2048),), 4096, False),
    Row("window 4096, 64 decodes at 32k", MISTRAL, _many(64, (32767, 1)), 4096, False),
    Row("full prefill 8k", GPT_OSS, ((0, 8192),), None, False),
    Row("full chunk over 32k", GPT_OSS, ((30720, 2048),), None, False),
    Row("full 64 decodes at 32k", GPT_OSS, _many(64, (32767, 1)), None, False),
]

COLUMNS = [
    ("row", "row"),
    ("shape", "Hq/Hkv/D, window, sinks"),
    ("splits", "plan() splits"),
    ("l5_us", "L5 us"),
    ("l5_tflops", "L5 TFLOP/s"),
    ("l5_gbs", "L5 band GB/s"),
    ("ceiling_us", "band ceiling us"),
    ("l5_ceiling", "L5 / ceiling"),
    ("fa2_us", "FlashInfer fa2 us"),
    ("fa3_us", "FlashInfer fa3 us"),
    ("vs_flashinfer", "L5 / best FlashInfer"),
    ("l4_us", "L4 us"),
    ("vs_l4", "L5 / L4"),
]


def keys_seen(seqs, window) -> int:
    """Sum over new tokens of the keys each sees: the token at position p sees min(p + 1, window)."""
    total = 0
    for cached, new in seqs:
        for_all = sum(min(cached + i + 1, window or cached + i + 1) for i in range(new))
        total += for_all
    return total


def band_keys(seqs, window) -> int:
    """Keys some new token of each sequence sees, summed: what a kernel must read at least once."""
    return sum(min(cached + new, (window or cached + new) + new - 1) for cached, new in seqs)


def work(row: Row) -> tuple[float, int]:
    """(FLOPs, bytes) of the row's band: 4 Hq D per key seen; K and V of the band once, q and out once."""
    Hq, Hkv, D = row.heads
    flops = 4.0 * Hq * D * keys_seen(row.seqs, row.window)
    total_q = sum(new for _, new in row.seqs)
    nbytes = 2 * band_keys(row.seqs, row.window) * Hkv * D * 2 + 2 * total_q * Hq * D * 2
    return flops, nbytes


def make_inputs(row: Row, dtype=torch.float16, device="cuda"):
    """A shuffled page pool holding every sequence's cached + new tokens, the packed new queries and the
    sinks (or None)."""
    Hq, Hkv, D = row.heads
    ctx = [cached + new for cached, new in row.seqs]
    pages = [math.ceil(n / PAGE) for n in ctx]
    k_cache = torch.randn(sum(pages), PAGE, Hkv, D, device=device, dtype=dtype)  # [num_blocks, PAGE, Hkv, D]
    v_cache = torch.randn_like(k_cache)
    ids = torch.randperm(sum(pages), device=device).to(torch.int32)
    block_tables = torch.zeros(len(ctx), max(pages), dtype=torch.int32, device=device)  # [B, max_pages]
    first = 0
    for b, p in enumerate(pages):
        block_tables[b, :p] = ids[first : first + p]
        first += p
    q_lens = [new for _, new in row.seqs]
    cu = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)  # [B + 1]
    context_lens = torch.tensor(ctx, dtype=torch.int32, device=device)  # [B]
    q = torch.randn(sum(q_lens), Hq, D, device=device, dtype=dtype)  # [total_q, Hq, D]
    sinks = torch.randn(Hq, device=device) if row.sinks else None  # [Hq] fp32
    return (q, k_cache, v_cache, block_tables, cu, context_lens), sinks


def reference(args, window, sinks, block=512):
    """[total_q, Hq, D] fp32: each sequence's new tokens, `block` at a time, against the keys of their band
    only (an 8k prompt's whole score matrix would not fit), with the sink as one more logit of value 0."""
    q, k_cache, v_cache, block_tables, cu, context_lens = args
    total_q, Hq, D = q.shape
    group = Hq // k_cache.shape[2]
    out = torch.empty(total_q, Hq, D, device=q.device)
    cu_list, ctx_list = cu.tolist(), context_lens.tolist()
    for b, ctx in enumerate(ctx_list):
        first, last = cu_list[b], cu_list[b + 1]
        prefix = ctx - (last - first)
        k_all = bench.gather_pages(k_cache, block_tables[b : b + 1], ctx)[0]  # [Hkv, ctx, D]
        v_all = bench.gather_pages(v_cache, block_tables[b : b + 1], ctx)[0]
        for r0 in range(first, last, block):
            r1 = min(r0 + block, last)
            pos = torch.arange(r0 - first, r1 - first, device=q.device) + prefix  # [rows]
            lo = 0 if window is None else max(0, prefix + r0 - first - window + 1)
            hi = prefix + r1 - first
            k = k_all[:, lo:hi].float().repeat_interleave(group, 0)  # [Hq, keys, D]
            v = v_all[:, lo:hi].float().repeat_interleave(group, 0)
            s = torch.einsum("rhd,hkd->hrk", q[r0:r1].float(), k) / math.sqrt(D)  # [Hq, rows, keys]
            j = torch.arange(lo, hi, device=q.device)[None, :]
            hidden = j > pos[:, None]
            if window is not None:
                hidden = hidden | (j <= pos[:, None] - window)
            s = s.masked_fill(hidden, float("-inf"))
            if sinks is not None:
                s = torch.cat([s, sinks[:, None, None].expand(Hq, r1 - r0, 1)], dim=-1)
                v = torch.cat([v, torch.zeros(Hq, 1, D, device=q.device)], dim=1)
            out[r0:r1] = torch.einsum("hrk,hkd->rhd", torch.softmax(s, dim=-1), v)
    return out


def flashinfer_window(backend, row: Row, args):
    """FlashInfer's paged prefill with window_left = window - 1 (no sinks: 0.2.14's wrapper has none),
    plan() here, outside the timing; None when FlashInfer is not installed."""
    try:
        import flashinfer
    except ImportError:
        return None
    q, k_cache, v_cache, block_tables, cu, context_lens = args
    Hq, Hkv, D = row.heads
    pages = (context_lens + PAGE - 1) // PAGE  # [B]
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), pages.cumsum(0).to(torch.int32)])
    live = torch.arange(block_tables.shape[1], device="cuda")[None, :] < pages[:, None]
    last = ((context_lens - 1) % PAGE + 1).to(torch.int32)  # tokens in each last page, 1..PAGE
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    wrapper.plan(
        cu,
        kv_indptr,
        block_tables[live],
        last,
        Hq,
        Hkv,
        D,
        PAGE,
        causal=True,
        window_left=-1 if row.window is None else row.window - 1,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    return lambda: wrapper.run(q, (k_cache, v_cache))


def timed_us(fn) -> float:
    """A CUDA-graph replay when fn can be captured (GPU time without Python's launch overhead), else eager."""
    try:
        return bench.time_us(fn, graph=True)
    except Exception:
        torch.cuda.synchronize()
        return bench.time_us(fn)


def _error(exc) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def run(impl) -> tuple[bench.Table, list[str]]:
    from drills.solutions import l4_paged_prefill as l4

    table = bench.Table(COLUMNS)
    peak_tf = bench.peak_tflops_fp16()
    errors = {}
    for row in ROWS:
        args, sinks = make_inputs(row)
        q = args[0]
        Hq, Hkv, D = row.heads
        scale = 1.0 / math.sqrt(D)
        out = torch.empty_like(q)
        expected = reference(args, row.window, sinks)
        plan = impl.plan(args[4], args[5], Hkv, PAGE, window=row.window)
        got = impl.unified_attention(*args, window=row.window, sinks=sinks, plan=plan)
        assert_close(got, expected)
        flops, nbytes = work(row)
        us = timed_us(
            lambda: impl._launch(
                *args, scale, out, window=row.window, sinks=sinks, num_splits=plan.num_splits
            )
        )
        ceiling_gbs = bench.read_ceiling_gbs(nbytes)
        ceiling_us = max(nbytes / ceiling_gbs / 1e3, flops / peak_tf / 1e6 if peak_tf else 0.0)
        Hq_, Hkv_, D_ = row.heads
        result = dict(
            row=row.label,
            shape=f"{Hq_}/{Hkv_}/{D_}, {row.window or 'none'}, {'yes' if row.sinks else 'no'}",
            splits=plan.num_splits,
            l5_us=us,
            l5_tflops=bench.tflops(flops, us),
            l5_gbs=bench.gbs(nbytes, us),
            ceiling_us=ceiling_us,
            l5_ceiling=ceiling_us / us,
            read_ceiling_gbs=ceiling_gbs,
            band_bytes=nbytes,
            flops=flops,
        )
        # FlashInfer runs the window alone: on rows with sinks, its output is checked against the same
        # reference without them.
        plain = expected if sinks is None else reference(args, row.window, None)
        for backend in ("fa2", "fa3"):
            try:
                fi = flashinfer_window(backend, row, args)
                if fi is not None:
                    assert_close(fi(), plain)
                    result[f"{backend}_us"] = timed_us(fi)
            except Exception as exc:  # a backend this GPU or build lacks is a note, not a crash
                errors[backend] = _error(exc)
        best = min((result.get(k) or math.inf) for k in ("fa2_us", "fa3_us"))
        result["vs_flashinfer"] = best / us if best < math.inf else None
        if row.window is None and not row.sinks:
            l4_out = torch.empty_like(q)
            assert_close(l4.paged_prefill(*args), expected)
            result["l4_us"] = timed_us(lambda: l4._launch(*args, scale, l4_out))
            result["vs_l4"] = result["l4_us"] / us
        table.add(result)
        del args, sinks, q, out, expected, plain
        torch.cuda.empty_cache()

    notes = [
        f"PAGE = {PAGE}, fp16, pages shuffled. TFLOP/s counts 4 * Hq * D * (keys each new token sees); band "
        "GB/s counts K and V of the keys some new token sees, once, plus q and out.",
        "band ceiling us: the larger of the band's bytes at a reduction's GB/s over as many bytes (this run) and "
        "its FLOPs at the datasheet fp16 rate; L5 / ceiling is that time over L5's (1.0 is the ceiling).",
        "L5 us times the bare launch (`_launch`, no checks; the split band and its merge when plan() splits), "
        "a CUDA-graph replay; so are the peers where they can be captured.",
        flashinfer_note(errors),
        "L4: paged_prefill on the rows without a window or sinks, the same work; ratios above 1 mean L5 is "
        "faster (L5 / X is X's time over L5's).",
        "Targets on an H200: >= 0.95 x the best FlashInfer on every row it runs, >= 0.95 x L4 on the rows "
        "without a window, and the windowed decode at 32k close to its band's ceiling, near the decode at 128.",
    ]
    return table, notes


def flashinfer_note(errors: dict) -> str:
    try:
        import flashinfer
    except ImportError:
        return "FlashInfer: not importable in this environment, so its columns are n/a."
    failed = "; ".join(f"{b} failed ({e})" for b, e in errors.items())
    return (
        f"FlashInfer {flashinfer.__version__}: BatchPrefillWithPagedKVCacheWrapper (NHD, causal=True, "
        "window_left = window - 1), backends fa2 and fa3, plan() outside the timed call; it has no sinks, so "
        "rows with sinks run the window alone there" + (f"; {failed}" if failed else "") + "."
    )


def plot(rows, meta, path):
    bench.plot_bars(
        rows,
        [("l5_ceiling", "L5 / band ceiling")],
        [r["row"].replace(" ", "\n", 2) for r in rows],
        f"Unified attention, fp16, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="fraction of the band's ceiling",
        hline=(1.0, "the band's ceiling"),
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's fraction of the band's ceiling on 64 gpt-oss decode rows at 32k
    with window 128 and sinks (a CUDA-graph replay of the bare launch), checked first."""
    row = ROWS[2]
    args, sinks = make_inputs(row)
    assert_close(
        impl.unified_attention(*args, window=row.window, sinks=sinks), reference(args, row.window, sinks)
    )
    out = torch.empty_like(args[0])
    us = timed_us(
        lambda: impl._launch(*args, 1.0 / math.sqrt(row.heads[2]), out, window=row.window, sinks=sinks)
    )
    flops, nbytes = work(row)
    ceiling_us = nbytes / bench.read_ceiling_gbs(nbytes) / 1e3
    return ceiling_us / us, "of the band ceiling", "gpt-oss, 64 decodes at 32k, window 128, sinks, fp16"


# --- The figures the explainer's sentences quote (bench.FIGURES); data is l5_unified_attention.bench.json


def _row(data, name: str) -> dict:
    return next(r for r in data["rows"] if r["row"] == name)


def _names_where(data, key: str, keep) -> str:
    """The rows whose key was measured and passes keep, named as the table names them; "none" if no row."""
    picked = [r["row"] for r in data["rows"] if r.get(key) is not None and keep(r[key])]
    return ", ".join(picked) if picked else "none"


def _best_fi_us(row: dict) -> float | None:
    times = [row[k] for k in ("fa2_us", "fa3_us") if row.get(k) is not None]
    return min(times) if times else None


_DECODE_32K, _DECODE_128 = "gpt-oss 64 decodes at 32k", "gpt-oss 64 decodes at 128"
FIGURES = {
    "decode_32k_us": lambda d: bench.num(_row(d, _DECODE_32K)["l5_us"], 0),
    "decode_128_us": lambda d: bench.num(_row(d, _DECODE_128)["l5_us"], 0),
    "decode_32k_ceiling": lambda d: bench.num(_row(d, _DECODE_32K)["l5_ceiling"]),
    "decode_128_ceiling": lambda d: bench.num(_row(d, _DECODE_128)["l5_ceiling"]),
    "decode_32k_fi_us": lambda d: (lambda us: bench.num(us, 0) if us else "n/a")(
        _best_fi_us(_row(d, _DECODE_32K))
    ),
    "decode_32k_vs_fi": lambda d: (lambda v: bench.num(v, 0) if v else "n/a")(
        _row(d, _DECODE_32K).get("vs_flashinfer")
    ),
    "decode_32k_fa2_us": lambda d: (
        bench.num(_row(d, _DECODE_32K)["fa2_us"], 0) if _row(d, _DECODE_32K).get("fa2_us") else "n/a"
    ),
    "full_decode_fa2_us": lambda d: (
        bench.num(_row(d, "full 64 decodes at 32k")["fa2_us"], 0)
        if _row(d, "full 64 decodes at 32k").get("fa2_us")
        else "n/a"
    ),
    "vs_l4": lambda d: bench.span_of(r["vs_l4"] for r in d["rows"] if r.get("vs_l4") is not None),
    "fi_losses": lambda d: _names_where(d, "vs_flashinfer", lambda v: v < 0.95),
    "prefill_ceiling": lambda d: bench.span_of(
        r["l5_ceiling"] for r in d["rows"] if "prefill" in r["row"] or "chunk" in r["row"]
    ),
}
