"""F2 benchmark: cascade decode against F1 alone and two FlashInfer cascades, one run.

Shapes (B, shared prefix, own suffix), Hq = 32, Hkv = 8, D = 128 (Llama-3-8B's attention), PAGE = 16, fp16:
C1's traffic (a system prompt of 19 shared pages, 128 tokens of each request's own) on a bigger model,
long shared documents read by many requests (4k to 32k tokens: the setting the Hydragen paper,
arXiv 2402.05099, targets), two groups of 128 sharing 2048 tokens each, and a batch with no prefix at
all (the planner's fallback, which must cost nothing there). Every column is a CUDA-graph replay of the bare launches (GPU time).

FlashInfer, two ways (when it imports; n/a with a note when it does not):
- composed, what a serving engine writes and the column F2 is judged by: the shared level through
  BatchPrefillWithPagedKVCacheWrapper (every member's query a row of one prefill over its group's pages),
  each request's own pages through BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True), and
  flashinfer.merge_state of the two (FlashInfer's lse is base 2 on both sides), captured as one graph;
  on the no-prefix row, the decode wrapper alone over each whole table;
- multilevel: MultiLevelCascadeAttentionWrapper with two levels, every level through the prefill wrapper.

The read-once bound: the time to read each shared prefix once and each suffix once at this run's measured
read ceiling (a reduction over as many bytes, bench.read_ceiling_gbs: decode only reads, so a copy's read +
write rate is no ceiling for it), or to do the attention's FLOPs at this run's measured fp16 matmul rate,
whichever is longer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from drills import bench
from drills.compare import assert_close

HQ, HKV, D, PAGE = 32, 8, 128, 16
SHAPES = [
    (256, 304, 128, 1),
    (256, 4096, 512, 1),
    (64, 8192, 256, 1),
    (32, 32768, 1024, 1),
    (256, 2048, 512, 2),
    (64, 0, 1024, 1),
    # Around the planner's crossover: few members, or a prefix short beside the suffixes
    (2, 1024, 1024, 1),
    (8, 256, 1024, 1),
    (32, 128, 1024, 1),
]  # (B, shared prefix tokens, own suffix tokens, groups); prefix 0: no group

COLUMNS = [
    ("B", "B"),
    ("prefix", "shared prefix"),
    ("suffix", "own suffix"),
    ("label", "groups"),
    ("read_once_mb", "read-once MB"),
    ("cascade", "plan cascades"),
    ("f1_us", "F1 us"),
    ("f2_us", "F2 us"),
    ("composed_us", "FlashInfer composed us"),
    ("flashinfer_us", "FlashInfer multilevel us"),
    ("bound_us", "read-once bound us"),
    ("f2_vs_f1", "F2 / F1 (speed)"),
    ("f2_vs_composed", "F2 / FlashInfer composed (speed)"),
    ("f2_vs_flashinfer", "F2 / multilevel (speed)"),
    ("f2_vs_bound", "F2 / bound"),
    ("forced_vs_f1", "cascade forced / F1 (speed)"),
]


def make_inputs(B, prefix, suffix, groups=1, dtype=torch.float16):
    """A shuffled page pool where sequence b belongs to group b * groups // B, whose first prefix / PAGE
    table entries are that group's shared pages; then suffix / PAGE pages of its own. prefix = 0: no
    group (prefix_group -1, prefix_lens [0])."""
    p_pages, s_pages = prefix // PAGE, math.ceil(suffix / PAGE)
    shared = groups * p_pages if prefix else 0
    num_blocks = shared + B * s_pages
    k_cache = torch.randn(num_blocks, PAGE, HKV, D, device="cuda", dtype=dtype)  # [num_blocks, PAGE, Hkv, D]
    v_cache = torch.randn_like(k_cache)
    ids = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    group = torch.arange(B, device="cuda") * groups // B  # [B]
    own = ids[shared:].view(B, s_pages)
    if prefix:
        prefix_pages = ids[:shared].view(groups, p_pages)[group]  # [B, p_pages]
        block_tables = torch.cat([prefix_pages, own], dim=1).contiguous()
        prefix_group = group.to(torch.int32)
        prefix_lens = torch.full((groups,), prefix, dtype=torch.int32, device="cuda")
    else:
        block_tables = own.contiguous()
        prefix_group = torch.full((B,), -1, dtype=torch.int32, device="cuda")
        prefix_lens = torch.zeros(1, dtype=torch.int32, device="cuda")
    context_lens = torch.full((B,), prefix + suffix, dtype=torch.int32, device="cuda")
    q = torch.randn(B, HQ, D, device="cuda", dtype=dtype)  # [B, Hq, D]
    return (q, k_cache, v_cache, block_tables, context_lens), prefix_group, prefix_lens


def expected(q, k_cache, v_cache, block_tables, context_lens):
    """[B, Hq, D] fp32: every sequence's pages gathered, then SDPA (all sequences of a row are one length)."""
    ctx = int(context_lens[0])
    k = bench.gather_pages(k_cache, block_tables, ctx)  # [B, Hkv, ctx, D]
    v = bench.gather_pages(v_cache, block_tables, ctx)
    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0].float()


def flashinfer_cascade(args, prefix_group, prefix, groups):
    """FlashInfer's MultiLevelCascadeAttentionWrapper on the same paged cache, two levels (level 0 each
    group's shared pages with all its members' queries, level 1 each request's own pages), plan() done
    here, outside the timing; None when FlashInfer is not installed."""
    try:
        import flashinfer
    except ImportError:
        return None
    q, k_cache, v_cache, block_tables, context_lens = args
    B = q.shape[0]
    p_pages = prefix // PAGE
    s_pages = block_tables.shape[1] - p_pages
    dev = q.device
    i32 = dict(dtype=torch.int32, device=dev)
    per_group = B // groups
    # Level 0: group g's queries are rows [g * per_group, (g + 1) * per_group); its pages, its first member's.
    qo0 = torch.arange(0, B + 1, per_group, **i32)
    kv0 = torch.arange(0, groups * p_pages + 1, p_pages, **i32)
    idx0 = block_tables[::per_group, :p_pages].reshape(-1)
    last0 = torch.full((groups,), PAGE, **i32)
    # Level 1: one query per request, its own pages.
    qo1 = torch.arange(0, B + 1, **i32)
    kv1 = torch.arange(0, B * s_pages + 1, s_pages, **i32)
    idx1 = block_tables[:, p_pages:].reshape(-1)
    last1 = (context_lens - prefix - 1) % PAGE + 1
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
    wrapper.plan([qo0, qo1], [kv0, kv1], [idx0, idx1], [last0, last1], HQ, HKV, D, PAGE, q_data_type=q.dtype)
    cache = (k_cache, v_cache)
    return lambda: wrapper.run(q, cache)


def flashinfer_composed(args, prefix, groups):
    """The cascade a serving engine composes from FlashInfer's wrappers, as one callable (graph-captured
    whole by the caller): the shared level through BatchPrefillWithPagedKVCacheWrapper, group g's
    members' queries [g * per_group, (g + 1) * per_group) as the rows of one non-causal prefill over the
    group's pages; each request's own pages through BatchDecodeWithPagedKVCacheWrapper with tensor cores
    (a KV head's query heads in the rows of one tile); flashinfer.merge_state of the two states, whose
    lse both wrappers return in base 2 and merge_state reads in base 2. prefix = 0: the decode wrapper
    alone over each whole table. plan() here, outside the timing; None when FlashInfer does not import."""
    try:
        import flashinfer
    except ImportError:
        return None
    q, k_cache, v_cache, block_tables, context_lens = args  # q [B, Hq, D]; caches [blocks, PAGE, Hkv, D]
    B, dev = q.shape[0], q.device
    i32 = dict(dtype=torch.int32, device=dev)
    p_pages = prefix // PAGE
    s_pages = block_tables.shape[1] - p_pages
    cache = (k_cache, v_cache)
    mib = 1024 * 1024
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 * mib, dtype=torch.uint8, device=dev), "NHD", use_tensor_cores=True
    )
    decode.plan(
        torch.arange(0, B * s_pages + 1, s_pages, **i32),  # [B + 1] each request's own pages
        block_tables[:, p_pages:].reshape(-1),
        (context_lens - prefix - 1) % PAGE + 1,  # [B] tokens in each request's last page
        HQ,
        HKV,
        D,
        PAGE,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    if not prefix:
        return lambda: decode.run(q, cache)
    per_group = B // groups
    shared = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(128 * mib, dtype=torch.uint8, device=dev), "NHD"
    )
    shared.plan(
        torch.arange(0, B + 1, per_group, **i32),  # [groups + 1] each group's members' query rows
        torch.arange(0, groups * p_pages + 1, p_pages, **i32),  # [groups + 1]
        block_tables[::per_group, :p_pages].reshape(-1),  # each group's pages, from its first member
        torch.full((groups,), PAGE, **i32),  # prefixes are whole pages
        HQ,
        HKV,
        D,
        PAGE,
        causal=False,  # every member's query sees the whole prefix
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )

    def step():
        o_shared, lse_shared = shared.run(q, cache, return_lse=True)  # [B, Hq, D], [B, Hq] base 2
        o_own, lse_own = decode.run(q, cache, return_lse=True)
        return flashinfer.merge_state(o_shared, lse_shared, o_own, lse_own)[0]

    return step


def flashinfer_note(errors: dict, ran: set) -> str:
    """What the two FlashInfer columns are, or why one is n/a."""
    try:
        import flashinfer
    except ImportError:
        return "FlashInfer: not importable in this environment, so its columns are n/a."
    parts = [
        f"FlashInfer {flashinfer.__version__}, plan() outside the timed calls. Composed: the shared level "
        "through BatchPrefillWithPagedKVCacheWrapper (every member's query a row of one prefill over its "
        "group's pages), each request's own pages through BatchDecodeWithPagedKVCacheWrapper("
        "use_tensor_cores=True), flashinfer.merge_state of the two (base-2 lse on both sides), captured as "
        "one graph; on the no-prefix row the decode wrapper alone. Multilevel: MultiLevelCascadeAttentionWrapper, "
        "two levels (each group's shared pages, then each request's own), both through the prefill "
        "wrapper; n/a on the no-prefix row."
    ]
    for name, error in errors.items():
        parts.append(f"{name}: failed to build or run here ({error}), so its column is n/a.")
    for name in ("composed", "multilevel"):
        if name not in ran and name not in errors:
            parts.append(f"{name}: ran on no row.")
    return " ".join(parts)


def matmul_tflops() -> float:
    """fp16 TFLOP/s of one 8192-square torch.matmul, this run: the tensor cores' practical rate."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn_like(a)
    us = bench.time_us(lambda: a @ b, graph=True)
    return bench.tflops(2 * 8192**3, us)


def run(impl) -> tuple[bench.Table, list[str]]:
    from drills.solutions import f1_split_kv_decode as f1

    table = bench.Table(COLUMNS)
    rate = matmul_tflops()
    fi_errors, fi_ran = {}, set()
    for B, prefix, suffix, groups in SHAPES:
        args, prefix_group, prefix_lens = make_inputs(B, prefix, suffix, groups)
        q, k_cache, v_cache, block_tables, context_lens = args
        scale = 1.0 / math.sqrt(D)
        out = torch.empty_like(q)
        want = expected(*args)
        unique_tokens = (groups * prefix if prefix else 0) + B * suffix
        nbytes = 2 * unique_tokens * HKV * D * q.element_size()
        flops = 4 * B * HQ * (prefix + suffix) * D  # q.k and p.v over every key of every request
        read_gbs = bench.read_ceiling_gbs(nbytes)
        bound_us = max(nbytes / read_gbs / 1e3, flops / rate / 1e6)

        f1_plan = f1.plan(context_lens, HKV, PAGE)
        assert_close(f1.split_kv_decode(*args, plan=f1_plan), want)
        f1_us = bench.time_us(lambda: f1._launch(*args, scale, f1_plan, out, None), graph=True)

        plan = impl.plan(context_lens, prefix_group, prefix_lens, HQ, HKV, PAGE)
        assert_close(impl.cascade_decode(*args, prefix_group, prefix_lens, plan=plan, check=True), want)
        launch = lambda: impl._launch(*args, prefix_group, prefix_lens, scale, plan, out, None)  # noqa: E731
        f2_us = bench.time_us(launch, graph=True)
        forced_vs_f1 = None
        if prefix:  # the prefix stage whatever the planner says: where cascading starts to pay
            forced = impl.plan(context_lens, prefix_group, prefix_lens, HQ, HKV, PAGE, cascade=True)
            assert_close(impl.cascade_decode(*args, prefix_group, prefix_lens, plan=forced), want)
            forced_us = bench.time_us(
                lambda: impl._launch(*args, prefix_group, prefix_lens, scale, forced, out, None), graph=True
            )
            forced_vs_f1 = f1_us / forced_us
        row = dict(
            forced_vs_f1=forced_vs_f1,
            B=B,
            prefix=prefix,
            suffix=suffix,
            label=f"{groups} of {B // groups}" if prefix else "none",
            read_once_mb=round(nbytes / 1e6),
            cascade=str(plan.cascade),
            f1_us=f1_us,
            f2_us=f2_us,
            bound_us=bound_us,
            f2_vs_f1=f1_us / f2_us,
            f2_vs_bound=bound_us / f2_us,
            read_gbs=read_gbs,
            matmul_tflops=rate,
        )
        peers = [
            ("composed", "composed_us", "f2_vs_composed", lambda: flashinfer_composed(args, prefix, groups))
        ]
        if prefix:
            peers.append(
                (
                    "multilevel",
                    "flashinfer_us",
                    "f2_vs_flashinfer",
                    lambda: flashinfer_cascade(args, prefix_group, prefix, groups),
                )
            )
        for name, key, ratio, build in peers:
            try:  # FlashInfer compiles on first use; a failed build or run is a note, not a crash
                fi = build()
                if fi is None:
                    continue
                assert_close(fi(), want)
                row[key] = bench.time_us(fi, graph=True)
                row[ratio] = row[key] / f2_us
                fi_ran.add(name)
            except Exception as exc:
                fi_errors.setdefault(name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        table.add(row)
        del args, q, k_cache, v_cache, out, want
        torch.cuda.empty_cache()

    notes = [
        f"Hq = {HQ}, Hkv = {HKV}, D = {D}, PAGE = {PAGE}, fp16, pages shuffled; sequence b is in group "
        "b * groups // B, its table the group's shared pages then its own.",
        "Every time is a CUDA-graph replay of the bare launches (plan() made before); each output was "
        "checked against SDPA over the gathered pages first.",
        "Read-once bound = max(bytes of each shared prefix once and each suffix once / read ceiling, "
        "attention FLOPs / matmul rate), both measured in this run (read ceiling: a torch sum over as many "
        "fp16 bytes; matmul: one 8192-square fp16 torch.matmul). F2 / bound is the bound's time over F2's.",
        "F2 / F1 and F2 / FlashInfer are speed ratios (the other's time over F2's): above 1, F2 is faster; "
        "F2 is judged by the composed column. "
        "Cascade forced / F1 is the same with plan(cascade=True): the prefix stage even where the planner "
        "falls back to F1, which shows where cascading starts to pay.",
        flashinfer_note(fi_errors, fi_ran),
    ]
    return table, notes


def plot(rows, meta, path):
    for r in rows:  # times as fractions of the bound, so that every shape fits one axis
        r["_f1"] = r["bound_us"] / r["f1_us"]
        r["_f2"] = r["f2_vs_bound"]
        r["_fi"] = r["bound_us"] / r["flashinfer_us"] if r.get("flashinfer_us") else None
        r["_fc"] = r["bound_us"] / r["composed_us"] if r.get("composed_us") else None
    bench.plot_bars(
        rows,
        [
            ("_f2", "F2 cascade"),
            ("_f1", "F1 split-KV"),
            ("_fc", "FlashInfer composed"),
            ("_fi", "FlashInfer multilevel"),
        ],
        [
            f"B={r['B']}\n{r['prefix']}+{r['suffix']}" + ("\n2 groups" if r["label"].startswith("2") else "")
            for r in rows
        ],
        f"Cascade decode, {meta['gpu']}, {meta['date']}",
        path,
        ylabel="fraction of the read-once bound",
    )
    for r in rows:
        for k in ("_f1", "_f2", "_fi", "_fc"):
            r.pop(k, None)


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's speed over F1's at B = 256, a 4096-token shared prefix and 512 of
    each request's own, plan() choosing, checked against SDPA first."""
    from drills.solutions import f1_split_kv_decode as f1

    B, prefix, suffix, groups = SHAPES[1]
    args, prefix_group, prefix_lens = make_inputs(B, prefix, suffix, groups)
    q, _, _, _, context_lens = args
    plan = impl.plan(context_lens, prefix_group, prefix_lens, HQ, HKV, PAGE)
    assert_close(impl.cascade_decode(*args, prefix_group, prefix_lens, plan=plan), expected(*args))
    out, scale = torch.empty_like(q), 1.0 / math.sqrt(D)
    f2_us = bench.time_us(
        lambda: impl._launch(*args, prefix_group, prefix_lens, scale, plan, out, None), graph=True
    )
    f1_plan = f1.plan(context_lens, HKV, PAGE)
    f1_us = bench.time_us(lambda: f1._launch(*args, scale, f1_plan, out, None), graph=True)
    return f1_us / f2_us, "x F1", f"B = {B}, {prefix} shared + {suffix} own tokens, fp16"


# --- The figures the explainer's sentences may quote (bench.FIGURES); data is f2_cascade_decode.bench.json


def _at(data, B: int, prefix: int, suffix: int) -> dict:
    return next(r for r in data["rows"] if (r["B"], r["prefix"], r["suffix"]) == (B, prefix, suffix))


def _logical_mb(row: dict) -> float:
    """MB of K and V that F1 loads on a row: every request's whole context (section 1's formula)."""
    return 2 * row["B"] * (row["prefix"] + row["suffix"]) * HKV * D * 2 / 1e6


def _ratios(data, key: str) -> str:
    """The span of a ratio column over the rows that have it; n/a until a run measured it."""
    values = [r[key] for r in data["rows"] if r.get(key) is not None]
    return bench.span_of(values) if values else "n/a"


def _dram(part: str):
    def figure(data):
        from drills.benchmarks import f2_dram_bytes

        return getattr(f2_dram_bytes, part)(data)

    return figure


FIGURES = {
    "f1_c1_logical_mb": lambda d: bench.num(_logical_mb(_at(d, 256, 304, 128)), 0),
    "f1_c1_us": lambda d: bench.num(_at(d, 256, 304, 128)["f1_us"], 0),
    "f1_c1_logical_tbs": lambda d: bench.num(
        _logical_mb(_at(d, 256, 304, 128)) / _at(d, 256, 304, 128)["f1_us"], 2
    ),  # MB / us = TB/s
    "dram_table": _dram("table"),
    "dram_note": _dram("note"),
    "vs_composed": lambda d: _ratios(d, "f2_vs_composed"),
    "vs_multilevel": lambda d: _ratios(d, "f2_vs_flashinfer"),
    "vs_f1": lambda d: bench.span_of(r["f2_vs_f1"] for r in d["rows"] if r["prefix"]),
    "vs_bound": lambda d: bench.span_of(r["f2_vs_bound"] for r in d["rows"]),
    "c1_vs_f1": lambda d: bench.num(_at(d, 256, 304, 128)["f2_vs_f1"]),
    "c1_forced_vs_f1": lambda d: bench.num(_at(d, 256, 304, 128)["forced_vs_f1"]),
    # the forced cascade's speed over the composed FlashInfer's: forced_us = f1_us / forced_vs_f1
    "c1_forced_vs_composed": lambda d: bench.num(
        _at(d, 256, 304, 128)["composed_us"]
        * _at(d, 256, 304, 128)["forced_vs_f1"]
        / _at(d, 256, 304, 128)["f1_us"]
    ),
    "long_vs_f1": lambda d: bench.num(_at(d, 32, 32768, 1024)["f2_vs_f1"]),
    "no_prefix_vs_f1": lambda d: bench.num(_at(d, 64, 0, 1024)["f2_vs_f1"]),
    "target_vs_f1": lambda d: bench.num(_at(d, 64, 8192, 256)["f2_vs_f1"]),
    "read_ceiling_max_tbs": lambda d: bench.num(max(r["read_gbs"] for r in d["rows"]) / 1e3, 2),
    "composed_losses": lambda d: _composed(d, lambda r: r < 1.0, "f2_vs_composed"),
    "composed_wins": lambda d: _composed(d, lambda r: r >= 1.0, "f2_vs_composed"),
    "losses_suffix_share": lambda d: _over_losses(d, _suffix_share),
    "losses_f2_vs_bound": lambda d: _over_losses(d, lambda r: r["f2_vs_bound"]),
    "losses_composed_vs_bound": lambda d: _over_losses(d, lambda r: r["bound_us"] / r["composed_us"]),
    "dram_f1_long": lambda d: _dram_ratio(32, 32768, 1024, "F1"),
    "dram_f2_vs_f1": lambda d: _dram_f2_vs_f1(),
}

_DRAM_ROWS = [(256, 304, 128), (32, 32768, 1024)]  # the rows of section 1.1's table, in its order


def _groups(row: dict) -> int:
    """The number of groups sharing a prefix: the label's "2 of 128" is 2, "1 of 256" is 1."""
    return 0 if not row["prefix"] else int(row["label"].split(" of ")[0])


def _suffix_share(row: dict) -> float:
    """The requests' own tokens over the read-once tokens: each group's prefix once, each suffix once."""
    own = row["B"] * row["suffix"]
    return own / (own + _groups(row) * row["prefix"])


def _losing(data) -> list[dict]:
    """The rows where F2 is slower than FlashInfer composed (speed ratio below 1)."""
    return [r for r in data["rows"] if r.get("f2_vs_composed") is not None and r["f2_vs_composed"] < 1.0]


def _over_losses(data, value) -> str:
    rows = _losing(data)
    return bench.span_of(value(r) for r in rows) if rows else "n/a"


def _composed(data, keep, key: str) -> str:
    """ "(256, 304 + 128): 0.86, ..." for the rows whose F2 / composed passes keep; "none" if none does."""
    rows = [r for r in data["rows"] if r.get(key) is not None and keep(r[key])]
    if not rows:
        return "none"
    return ", ".join(f"({r['B']}, {r['prefix']} + {r['suffix']}): {bench.num(r[key])}" for r in rows)


def _dram_row(B: int, prefix: int, suffix: int, kernel: str) -> dict:
    from drills.benchmarks import f2_dram_bytes

    record = f2_dram_bytes._record()
    return next(
        r
        for r in record["rows"]
        if (r["B"], r["prefix"], r["suffix"], r["kernel"]) == (B, prefix, suffix, kernel)
    )


def _dram_f2_vs_f1() -> str:
    """F2's DRAM bytes over F1's on each row of section 1.1's table; n/a until the ncu record exists."""
    from drills.benchmarks import f2_dram_bytes

    if f2_dram_bytes._record() is None:
        return "n/a"
    ratios = (_dram_row(*row, "F2")["dram_mb"] / _dram_row(*row, "F1")["dram_mb"] for row in _DRAM_ROWS)
    return bench.joined(ratios, sep=" and ")


def _dram_ratio(B: int, prefix: int, suffix: int, kernel: str) -> str:
    from drills.benchmarks import f2_dram_bytes

    if f2_dram_bytes._record() is None:
        return "n/a"
    return bench.num(_dram_row(B, prefix, suffix, kernel)["dram_vs_logical"], 2)
