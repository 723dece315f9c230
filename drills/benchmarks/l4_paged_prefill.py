"""L4 benchmark: paged prefill over a cached prefix, on the shapes an engine runs it on (pure prefill,
chunked prefill, a long prefix, and a mixed batch of prefill chunks and decode rows).

Every implementation does the same causal work, counted exactly: 4 * Hq * D * (sum over the new tokens
of the keys each one sees), so all are reported in TFLOP/s and as a fraction of the GPU's datasheet fp16
rate. Peers: FlashInfer's BatchPrefillWithPagedKVCacheWrapper on the same paged cache with its fa2 and
fa3 backends (when flashinfer imports), T5's kernel and torch SDPA (bottom-right causal) on the same KV
gathered into contiguous tensors beforehand (the gather not timed: an upper reference without paging).
On the mixed row, also the step a serving engine composes from FlashInfer: the prefill rows through
BatchPrefillWithPagedKVCacheWrapper and the decode rows through BatchDecodeWithPagedKVCacheWrapper with
tensor cores (a KV head's query heads in one tile), both writing into one output, captured as one graph;
"mixed" is judged by it.
Each output is checked against a per-sequence SDPA reference before it is timed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from drills import bench
from drills.compare import assert_close

HQ, HKV, D, PAGE = 32, 8, 128, 16
# (label, [(cached, new) per sequence])
ROWS = [
    ("pure prefill", [(0, 8192)]),
    ("chunked", [(2048, 512)] * 8),
    ("chunked", [(1024, 128)] * 32),
    ("long prefix", [(16384, 2048)] * 4),
    ("mixed", [(1024, 512)] * 4 + [(2047, 1)] * 60),  # 4 prefill chunks and 60 decode rows of ctx 2048
]

COLUMNS = [
    ("row", "row"),
    ("B", "B"),
    ("shape", "(cached, new) per sequence"),
    ("config", "BLOCK_M x BLOCK_N, warps, stages, tile"),
    ("l4_us", "L4 us"),
    ("l4_tflops", "L4 TFLOP/s"),
    ("l4_peak", "L4 / datasheet"),
    ("fa2_tflops", "FlashInfer fa2 TFLOP/s"),
    ("fa3_tflops", "FlashInfer fa3 TFLOP/s"),
    ("vs_fa3", "L4 / fa3"),
    ("vs_best", "L4 / best FlashInfer"),
    ("composed_tflops", "FlashInfer composed TFLOP/s"),
    ("vs_composed", "L4 / composed"),
    ("t5_tflops", "T5 gathered TFLOP/s"),
    ("sdpa_tflops", "SDPA gathered TFLOP/s"),
]


def causal_flops(seqs) -> float:
    """4 * Hq * D * sum over new tokens of the keys each sees: new token i after `cached` tokens sees
    cached + i + 1 keys."""
    keys = sum(new * cached + new * (new + 1) // 2 for cached, new in seqs)
    return 4.0 * HQ * D * keys


def make_inputs(seqs, dtype=torch.float16):
    """A shuffled page pool holding every sequence's cached + new tokens, and the packed new queries."""
    ctx = [cached + new for cached, new in seqs]
    pages = [math.ceil(n / PAGE) for n in ctx]
    k_cache = torch.randn(sum(pages), PAGE, HKV, D, device="cuda", dtype=dtype)  # [num_blocks, PAGE, Hkv, D]
    v_cache = torch.randn_like(k_cache)
    ids = torch.randperm(sum(pages), device="cuda").to(torch.int32)
    block_tables = torch.zeros(len(seqs), max(pages), dtype=torch.int32, device="cuda")  # [B, max_pages]
    first = 0
    for b, p in enumerate(pages):
        block_tables[b, :p] = ids[first : first + p]
        first += p
    q_lens = [new for _, new in seqs]
    cu = torch.tensor([0] + q_lens, device="cuda").cumsum(0).to(torch.int32)  # [B + 1]
    context_lens = torch.tensor(ctx, dtype=torch.int32, device="cuda")  # [B]
    q = torch.randn(sum(q_lens), HQ, D, device="cuda", dtype=dtype)  # [total_q, Hq, D]
    return q, k_cache, v_cache, block_tables, cu, context_lens


def gathered(cache, table_row, n):
    """The first n tokens of one sequence as [1, Hkv, n, D], contiguous."""
    pages = table_row[: math.ceil(n / PAGE)].long()
    return cache[pages].reshape(-1, HKV, D)[:n].transpose(0, 1)[None].contiguous()


def sdpa_bottom_right(q, k, v):
    """q [B, Hq, Nq, D], k, v [B, Hkv, Nk, D]: SDPA with the bottom-right causal mask (query i sees
    keys j <= i + Nk - Nq), GQA by enable_gqa."""
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(q.shape[2], k.shape[2])
    if k.shape[1] != q.shape[1]:  # the causal bias has no GQA path: repeat the KV heads (contiguous grouping)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def reference(q, k_cache, v_cache, block_tables, cu, context_lens):
    """[total_q, Hq, D]: each sequence through SDPA on its gathered KV (the check before timing)."""
    out = torch.empty_like(q)
    cu_list, ctx = cu.tolist(), context_lens.tolist()
    for b, n in enumerate(ctx):
        first, last = cu_list[b], cu_list[b + 1]
        qb = q[first:last].transpose(0, 1)[None]  # [1, Hq, new, D]
        kb, vb = gathered(k_cache, block_tables[b], n), gathered(v_cache, block_tables[b], n)
        out[first:last] = sdpa_bottom_right(qb, kb, vb)[0].transpose(0, 1)
    return out


def flashinfer_prefill(backend, q, k_cache, v_cache, block_tables, cu, context_lens):
    """FlashInfer's paged prefill on the same cache with the given backend ("fa2" or "fa3"), plan() done
    here, outside the timing; None when FlashInfer is not installed."""
    try:
        import flashinfer
    except ImportError:
        return None
    pages = (context_lens + PAGE - 1) // PAGE  # [B]
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), pages.cumsum(0).to(torch.int32)])
    live = torch.arange(block_tables.shape[1], device="cuda")[None, :] < pages[:, None]
    kv_indices = block_tables[live]  # [total pages], sequence by sequence, in order
    last = (context_lens - 1) % PAGE + 1  # tokens in each last page, 1..PAGE
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    wrapper.plan(
        cu,
        kv_indptr,
        kv_indices,
        last.to(torch.int32),
        HQ,
        HKV,
        D,
        PAGE,
        causal=True,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    return lambda: wrapper.run(q, (k_cache, v_cache))


def flashinfer_composed(backend, seqs, q, k_cache, v_cache, block_tables, cu, context_lens):
    """The mixed step as a serving engine sends it to FlashInfer: the sequences with more than one new
    token through BatchPrefillWithPagedKVCacheWrapper (causal, the given backend), the one-token rows
    through BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True), each writing its rows of one
    output [total new tokens, Hq, D]. The decode rows must be a trailing block of the batch (as in ROWS).
    plan() here, outside the timing; None when FlashInfer is not installed."""
    try:
        import flashinfer
    except ImportError:
        return None
    n_pre = sum(1 for _, new in seqs if new > 1)
    if any(new > 1 for _, new in seqs[n_pre:]) or n_pre in (0, len(seqs)):
        raise ValueError("the composed step wants prefill sequences first, then one-token rows")
    i32 = dict(dtype=torch.int32, device=q.device)
    pages = (context_lens + PAGE - 1) // PAGE  # [B]
    live = torch.arange(block_tables.shape[1], device=q.device)[None, :] < pages[:, None]
    last = ((context_lens - 1) % PAGE + 1).to(torch.int32)  # [B] tokens in each last page
    indptr = lambda p: torch.cat([torch.zeros(1, **i32), p.cumsum(0).to(torch.int32)])  # noqa: E731
    rows = int(cu[n_pre])  # new tokens of the prefill sequences; the decode rows follow
    mib = 1024 * 1024
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(128 * mib, dtype=torch.uint8, device=q.device), "NHD", backend=backend
    )
    prefill.plan(
        cu[: n_pre + 1],
        indptr(pages[:n_pre]),
        block_tables[:n_pre][live[:n_pre]],
        last[:n_pre],
        HQ,
        HKV,
        D,
        PAGE,
        causal=True,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 * mib, dtype=torch.uint8, device=q.device), "NHD", use_tensor_cores=True
    )
    decode.plan(
        indptr(pages[n_pre:]),
        block_tables[n_pre:][live[n_pre:]],
        last[n_pre:],
        HQ,
        HKV,
        D,
        PAGE,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    out = torch.empty_like(q)  # [total new tokens, Hq, D]
    cache = (k_cache, v_cache)
    q_pre, q_dec = q[:rows], q[rows:]  # contiguous row blocks of the packed queries

    def step():
        prefill.run(q_pre, cache, out=out[:rows])
        decode.run(q_dec, cache, out=out[rows:])
        return out

    return step


def timed_us(fn) -> float:
    """A CUDA-graph replay when fn can be captured (GPU time without Python's launch overhead), else eager."""
    try:
        return bench.time_us(fn, graph=True)
    except Exception:
        torch.cuda.synchronize()
        return bench.time_us(fn)


def run(impl) -> tuple[bench.Table, list[str]]:
    from drills.solutions import t5_flash_attention as t5

    table = bench.Table(COLUMNS)
    peak = bench.peak_tflops_fp16()
    errors = {}
    for label, seqs in ROWS:
        args = make_inputs(seqs)
        q, k_cache, v_cache, block_tables, cu, context_lens = args
        scale = 1.0 / math.sqrt(D)
        out = torch.empty_like(q)
        expected = reference(*args).float()
        assert_close(impl.paged_prefill(*args), expected)
        work = causal_flops(seqs)
        bm, bn, warps, stages, packed = impl._config(D, q.shape[0] / len(seqs))
        us = timed_us(lambda: impl._launch(*args, scale, out))
        B = len(seqs)
        shapes = sorted(set(seqs), key=seqs.index)
        row = dict(
            row=label,
            B=B,
            shape=" + ".join(f"{seqs.count(s)} x {s}" for s in shapes),
            config=f"{bm}x{bn}, {warps}, {stages}, {'packed' if packed else 'one head'}",
            l4_us=us,
            l4_tflops=bench.tflops(work, us),
        )
        row["l4_peak"] = row["l4_tflops"] / peak if peak else None
        for backend in ("fa2", "fa3"):
            try:
                fi = flashinfer_prefill(backend, *args)
                if fi is not None:
                    assert_close(fi(), expected)
                    row[f"{backend}_tflops"] = bench.tflops(work, timed_us(fi))
            except Exception as exc:  # a backend this GPU or build lacks is a note, not a crash
                errors[backend] = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                )
        if any(new == 1 for _, new in seqs):  # decode rows: the engine's composition, at its better backend
            for backend in ("fa2", "fa3"):
                try:
                    fi = flashinfer_composed(backend, seqs, *args)
                    if fi is not None:
                        assert_close(fi(), expected)
                        tf = bench.tflops(work, timed_us(fi))
                        if tf > (row.get("composed_tflops") or 0.0):
                            row["composed_tflops"], row["composed_backend"] = tf, backend
                except Exception as exc:
                    errors[f"composed {backend}"] = (
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                    )
            if row.get("composed_tflops"):
                row["vs_composed"] = row["l4_tflops"] / row["composed_tflops"]
        if row.get("fa3_tflops"):
            row["vs_fa3"] = row["l4_tflops"] / row["fa3_tflops"]
        best = max((row.get(k) or 0.0) for k in ("fa2_tflops", "fa3_tflops"))
        row["vs_best"] = row["l4_tflops"] / best if best else None
        if len(shapes) == 1:  # every sequence alike: one [B, H, N, D] batch for T5 and SDPA
            cached, new = shapes[0]
            qc = q.view(B, new, HQ, D).transpose(1, 2)  # [B, Hq, new, D]
            kc = torch.cat(
                [gathered(k_cache, block_tables[b], cached + new) for b in range(B)]
            )  # [B, Hkv, ctx, D]
            vc = torch.cat([gathered(v_cache, block_tables[b], cached + new) for b in range(B)])
            t5_out = torch.empty_like(qc)
            t5.flash_attention(qc, kc, vc, causal=True)  # compile outside the timing
            t5_us = timed_us(lambda: t5._launch(qc, kc, vc, True, scale, t5_out))
            assert_close(t5_out.transpose(1, 2).reshape(-1, HQ, D), expected)
            row["t5_tflops"] = bench.tflops(work, t5_us)
            try:
                row["sdpa_tflops"] = bench.tflops(work, timed_us(lambda: sdpa_bottom_right(qc, kc, vc)))
            except Exception as exc:  # e.g. out of memory for the repeated KV heads of the long rows
                errors["sdpa"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            del qc, kc, vc, t5_out
        table.add(row)
        del args, q, k_cache, v_cache, out, expected
        torch.cuda.empty_cache()

    notes = [
        f"Hq = {HQ}, Hkv = {HKV}, D = {D}, PAGE = {PAGE}, fp16, pages shuffled. TFLOP/s counts the causal work "
        "exactly: 4 * Hq * D * (sum over new tokens of the keys each sees); every column divides the same work.",
        "L4 us times the bare launch (`_launch`, no checks), a CUDA-graph replay; so are the peers where they "
        "can be captured. Every output is checked against SDPA on the gathered KV before it is timed.",
        "T5 and SDPA gathered: the same KV copied into contiguous [B, Hkv, ctx, D] beforehand (copy not timed), "
        "bottom-right causal; only for rows whose sequences are all alike (n/a on the mixed row).",
        flashinfer_note(errors),
        "Targets on an H200: L4 >= 0.95 x fa3 on the four prefill rows, >= 1.0 x FlashInfer composed on the "
        "mixed row.",
    ]
    if "sdpa" in errors:
        notes.append(f"SDPA gathered failed on some rows ({errors['sdpa']}): n/a there.")
    return table, notes


def flashinfer_note(errors: dict) -> str:
    try:
        import flashinfer
    except ImportError:
        return "FlashInfer: not importable in this environment, so its columns are n/a."
    failed = "; ".join(f"{b} failed ({e})" for b, e in errors.items() if b != "sdpa")
    return (
        f"FlashInfer {flashinfer.__version__}: BatchPrefillWithPagedKVCacheWrapper (NHD, causal=True), "
        "backends fa2 and fa3, plan() outside the timed call. Composed (mixed row only): the prefill rows "
        "through that wrapper, the decode rows through BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores="
        "True), one graph, at the faster prefill backend of the two" + (f"; {failed}" if failed else "") + "."
    )


def plot(rows, meta, path):
    peak = meta.get("datasheet_peak_tflops_fp16")
    bench.plot_bars(
        rows,
        [
            ("l4_tflops", "L4 (this lesson)"),
            ("fa2_tflops", "FlashInfer fa2"),
            ("fa3_tflops", "FlashInfer fa3"),
            ("composed_tflops", "FlashInfer composed (mixed)"),
            ("t5_tflops", "T5, gathered KV"),
        ],
        [f"{r['row']}\nB={r['B']}" for r in rows],
        f"Paged prefill, fp16, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="TFLOP/s",
        hline=(peak, "datasheet fp16 peak") if peak else None,
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's TFLOP/s on chunked prefill, 8 sequences of 512 new tokens after
    2048 cached ones (a CUDA-graph replay of the bare launch), checked against SDPA first."""
    _, seqs = ROWS[1]
    args = make_inputs(seqs)
    assert_close(impl.paged_prefill(*args), reference(*args).float())
    out = torch.empty_like(args[0])
    us = timed_us(lambda: impl._launch(*args, 1.0 / math.sqrt(D), out))
    return bench.tflops(causal_flops(seqs), us), "TFLOP/s", "B = 8, 2048 cached + 512 new each, fp16"


# --- The figures the explainer's sentences quote (bench.FIGURES) -------------------------------------
# data is l4_paged_prefill.bench.json; the four prefill rows come first, the mixed row last. The Hopper
# warp-specialisation figures come from l4_paged_prefill.hopper_ws.json (drills/benchmarks/l4_hopper_ws.py).


def _prefill(data) -> list[dict]:
    return [r for r in data["rows"] if r["row"] != "mixed"]


def _mixed(data) -> dict:
    return next(r for r in data["rows"] if r["row"] == "mixed")


def _rows_named(numbers: list[int]) -> str:
    """ "1, 2 and 4" / "2" / "none"."""
    words = [str(n) for n in numbers]
    if not words:
        return "none"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _ws() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parents[1] / "content" / "l4_paged_prefill.hopper_ws.json").read_text())


def _ws_rows(part: str, warps: int | None = None, **match) -> list[dict]:
    rows = _ws()[part]
    return [
        r
        for r in rows
        if (warps is None or r["config"][2] == warps) and all(r.get(k) == v for k, v in match.items())
    ]


def _ws_flag_effect(data) -> str:
    """The largest change the flag made where the pass did not apply (8 warps), in percent."""
    pairs = {}
    for part in ("t5", "paged"):
        for r in _ws_rows(part, warps=8):
            if "tflops" in r and r["variant"].startswith(("t5 loop", "PAGE")):
                pairs.setdefault((part, r["variant"], tuple(r["config"])), {})[r["warp_specialize"]] = r[
                    "tflops"
                ]
    changes = [abs(p[True] / p[False] - 1) for p in pairs.values() if len(p) == 2]
    return bench.num(100 * max(changes), 1)


def _ws_applied_at_8(data) -> str:
    applied = [r for part in ("t5", "paged") for r in _ws_rows(part, warps=8) if r.get("warp_specialized")]
    return str(len(applied)) if applied else "none"


def _ws_desc_gain(part: str, desc: str, ptr: str, config: list[int]) -> str:
    d = _ws_rows(part, variant=desc, config=config, warp_specialize=False)[0]
    p = _ws_rows(part, variant=ptr, config=config, warp_specialize=False)[0]
    return f"{bench.num(p['tflops'])} to {bench.num(d['tflops'])}"


FIGURES = {
    "guard_cost": lambda d: bench.guard_cost_figure("l4_paged_prefill"),
    "mixed_tflops": lambda d: bench.num(_mixed(d)["l4_tflops"]),
    "mixed_fa2": lambda d: bench.num(_mixed(d)["fa2_tflops"]),
    "mixed_fa3": lambda d: bench.num(_mixed(d)["fa3_tflops"]),
    "mixed_vs_best": lambda d: bench.num(_mixed(d)["vs_best"]),
    "prefill_tflops": lambda d: bench.span_of(r["l4_tflops"] for r in _prefill(d)),
    "prefill_fa2": lambda d: bench.span_of(r["fa2_tflops"] for r in _prefill(d)),
    "prefill_vs_fa3": lambda d: bench.span_of(r["vs_fa3"] for r in _prefill(d)),
    "t5_tflops": lambda d: bench.span_of(r["t5_tflops"] for r in _prefill(d)),
    "t5_vs_fa3": lambda d: bench.joined(r["t5_tflops"] / r["fa3_tflops"] for r in _prefill(d)),
    "l4_vs_t5": lambda d: bench.joined(r["l4_tflops"] / r["t5_tflops"] for r in _prefill(d)),
    "lookup_cost": lambda d: bench.num(
        100 * max(1 - r["l4_tflops"] / r["t5_tflops"] for r in _prefill(d)), 0
    ),
    "t5_misses": lambda d: _rows_named(
        [i for i, r in enumerate(_prefill(d), 1) if r["t5_tflops"] / r["fa3_tflops"] < 0.95]
    ),
    "l4_misses": lambda d: _rows_named([i for i, r in enumerate(_prefill(d), 1) if r["vs_fa3"] < 0.95]),
    "mixed_target": lambda d: (
        "not measured yet (the composed column is new)"
        if _mixed(d).get("vs_composed") is None
        else "met"
        if _mixed(d)["vs_composed"] >= 1.0
        else "not met"
    ),
    "mixed_composed": lambda d: _opt(_mixed(d).get("composed_tflops")),
    "mixed_vs_composed": lambda d: _opt(_mixed(d).get("vs_composed")),
    "fa3_gap": lambda d: bench.span_of((100 * (1 / r["vs_fa3"] - 1) for r in _prefill(d)), 0),
    "ws_triton": lambda d: _ws()["meta"]["triton"],
    "ws_applied_at_8": _ws_applied_at_8,
    "ws_flag_effect": _ws_flag_effect,
    "ws_t5_desc": lambda d: _ws_desc_gain(
        "t5", "t5 loop, tensor descriptors (in the kernel)", "t5 loop, pointer loads", [128, 128, 8, 3]
    ),
    "ws_page128_desc": lambda d: _ws_desc_gain(
        "paged", "PAGE 128, a descriptor load per page", "PAGE 128, gather per key (L4)", [128, 128, 8, 3]
    ),
    "ws_page64_desc": lambda d: _ws_desc_gain(
        "paged", "PAGE 64, a descriptor load per page", "PAGE 64, gather per key (L4)", [128, 64, 8, 3]
    ),
    "ws_page16": lambda d: bench.num(
        _ws_rows(
            "paged", variant="PAGE 16, gather per key (L4)", config=[128, 128, 8, 3], warp_specialize=False
        )[0]["tflops"]
    ),
    "ws_page16_4w": lambda d: _opt(
        next(
            (
                r.get("tflops")
                for r in _ws_rows("paged", variant="PAGE 16, gather per key (L4)", warp_specialize=False)
                if r["config"] == [128, 64, 4, 3]
            ),
            None,
        )
    ),
    "ws_page64_4w": lambda d: _ws_desc_gain(
        "paged", "PAGE 64, a descriptor load per page", "PAGE 64, gather per key (L4)", [128, 64, 4, 3]
    ),
    "ws_desc_pct": lambda d: bench.span_of(
        (
            100 * (_ws_tflops(part, desc, config) / _ws_tflops(part, ptr, config) - 1)
            for part, desc, ptr, config in (
                (
                    "t5",
                    "t5 loop, tensor descriptors (in the kernel)",
                    "t5 loop, pointer loads",
                    [128, 128, 8, 3],
                ),
                (
                    "paged",
                    "PAGE 128, a descriptor load per page",
                    "PAGE 128, gather per key (L4)",
                    [128, 128, 8, 3],
                ),
                (
                    "paged",
                    "PAGE 64, a descriptor load per page",
                    "PAGE 64, gather per key (L4)",
                    [128, 64, 8, 3],
                ),
            )
        ),
        0,
    ),
    "ws_control": lambda d: _ws_control(),
    "ws_control_gain": lambda d: _ws_control_gain(),
    "ws_control_t5": lambda d: _ws_control_t5(d),
    "ws_page16_4w_gain": lambda d: _ws_page16_4w_gain(d),
    "ws_page16_4w_spills": lambda d: str(
        next(
            r.get("spills", "n/a")
            for r in _ws_rows("paged", variant="PAGE 16, gather per key (L4)", warp_specialize=False)
            if r["config"] == [128, 64, 4, 3]
        )
    ),
    "lookup_larger_rows": lambda d: _lookup_vs_tiles(d, True),
    "tiles_larger_rows": lambda d: _lookup_vs_tiles(d, False),
    "ws_t5_err_128": lambda d: bench.num(
        _ws_rows(
            "t5",
            variant="t5 loop, tensor descriptors (in the kernel)",
            config=[128, 128, 4, 2],
            warp_specialize=True,
        )[0]["max_err"],
        0,
    ),  # fmt: skip
    "ws_smem": lambda d: _ws_smem(),
    "ws_paged_failed": lambda d: str(
        sum("PassManager" in r.get("error", "") for r in _ws_rows("paged", warps=4, warp_specialize=True))
    ),
    "ws_paged_tried": lambda d: str(len(_ws_rows("paged", warps=4, warp_specialize=True))),
    "ws_loops_at_8": lambda d: str(
        sum(len(_ws_rows(p, warps=8, warp_specialize=True)) for p in ("t5", "paged"))
    ),
}


def _lookup_vs_tiles(data, lookup_larger: bool) -> str:
    """The prefill rows where the page lookup (L4 / T5) costs more of the gap to fa3 than Triton's tiles
    without pages (T5 / fa3), or the rows where it costs less."""
    return _rows_named(
        [
            i
            for i, r in enumerate(_prefill(data), 1)
            if (r["l4_tflops"] / r["t5_tflops"] < r["t5_tflops"] / r["fa3_tflops"]) == lookup_larger
        ]
    )


def _ws_page16_4w_gain(data) -> str:
    """How much faster the 4-warp 128 x 64 tile ran the PAGE 16 gather than L4's 8-warp 128 x 128, in %."""
    rows = _ws_rows("paged", variant="PAGE 16, gather per key (L4)", warp_specialize=False)
    four = next((r.get("tflops") for r in rows if r["config"] == [128, 64, 4, 3]), None)
    eight = next((r.get("tflops") for r in rows if r["config"] == [128, 128, 8, 3]), None)
    return "n/a" if four is None or eight is None else bench.num(100 * (four / eight - 1), 0)


def _ws_control_t5(data) -> str:
    """T5's loop in the tutorial's Hopper tile (host descriptors, 128 x 64, 4 warps) as the record holds it."""
    rows = {
        r["warp_specialize"]: r
        for r in _ws_rows("t5", variant="t5 loop, tensor descriptors (host)")
        if r["config"] == [128, 64, 4, 3]
    }

    def said(r) -> str:
        return (
            f"{bench.num(r['tflops'])} TFLOP/s" if r and "tflops" in r else (r or {}).get("error", "no row")
        )

    return f"without the flag {said(rows.get(False))}, with it {said(rows.get(True))}"


def _ws_smem() -> str:
    """ "246,176 bytes of shared memory where a block may have 232,448", from the compiler's refusal: its
    hardware limit is the per-block opt-in maximum (an H100 or H200 SM has 233,472 bytes, 1 KB of which
    each block reserves)."""
    import re

    for r in _ws_rows("t5", variant="t5 loop, tensor descriptors (in the kernel)", warp_specialize=True):
        m = re.search(r"Required: (\d+), Hardware limit: (\d+)", r.get("error", ""))
        if m:
            return f"{int(m.group(1)):,} bytes of shared memory where a block may have at most {int(m.group(2)):,}"
    return "n/a"


def _opt(value) -> str:
    """A figure the record may not hold yet: n/a until a run measured it."""
    return "n/a" if value is None else bench.num(value)


def _ws_tflops(part: str, variant: str, config: list[int]) -> float:
    return _ws_rows(part, variant=variant, config=config, warp_specialize=False)[0]["tflops"]


def _ws_control_gain() -> str:
    """The upstream tutorial's kernel with the flag over without it, in percent (n/a until measured)."""
    rows = {r["warp_specialize"]: r for r in _ws().get("control", []) if r["config"] == ["autotuned"]}
    if not all("tflops" in rows.get(flag, {}) for flag in (False, True)):
        return "n/a"
    return bench.num(100 * (rows[True]["tflops"] / rows[False]["tflops"] - 1), 1)


def _ws_control() -> str:
    """What the positive control gave: the upstream tutorial's warp-specialised forward on this GPU."""
    rows = _ws().get("control")
    if not rows:
        return (
            "not measured yet: `python -m drills.benchmarks.l4_hopper_ws "
            "drills/content/l4_paged_prefill.hopper_ws.json control` runs it on the next GPU run"
        )

    def said(r) -> str:
        if "tflops" in r:
            applied = {True: ", warp-specialised", False: ", not warp-specialised"}.get(
                r.get("warp_specialized"), ""
            )
            return f"{bench.num(r['tflops'])} TFLOP/s{applied}"
        return r.get("error", "no result")

    parts = []
    for r in rows:
        flag = "with" if r["warp_specialize"] else "without"
        tile = r.get("best_config") or "x".join(str(c) for c in r["config"])
        parts.append(f"{r['variant']} {flag} the flag ({tile}): {said(r)}")
    return "; ".join(parts)


# How the kernel got here: each step's TFLOP/s on the four prefill rows, measured beside the one before
# (l4_paged_prefill.steps.json, a record of those runs: make bench does not re-run the old kernels).


def _steps() -> list[dict]:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parents[1] / "content" / "l4_paged_prefill.steps.json").read_text())[
        "steps"
    ]


def _steps_table(data) -> str:
    lines = ["| step | prefill rows | what changed |", "| --- | --- | --- |"]
    lines += [
        f"| {s['step']} | {' / '.join(str(t) for t in s['tflops'])} | {s['what_changed']} |" for s in _steps()
    ]
    return "\n" + "\n".join(lines) + "\n"


def _step_gain(step: str) -> str:
    """ "0.3 to 4.0": what one step bought on the prefill rows, in percent of the step before."""
    names = [s["step"] for s in _steps()]
    i = names.index(step)
    before, after = _steps()[i - 1]["tflops"], _steps()[i]["tflops"]
    return bench.span_of((100 * (a / b - 1) for a, b in zip(after, before)), 1)


FIGURES |= {
    "steps": _steps_table,
    "ids_ahead_gain": lambda d: _step_gain("ids a tile ahead"),
    "order_first_row": lambda d: f"{_steps()[-2]['tflops'][0]} to {_steps()[-1]['tflops'][0]}",
}
