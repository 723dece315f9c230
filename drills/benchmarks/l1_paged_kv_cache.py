"""L1 benchmark: store_kvcache against PyTorch's indexed assignment, on the same inputs in one run.

A store reads N rows of K and V and writes them to N random distinct slots of a large paged cache:

    bytes = 2 (K and V) * N * Hkv * D * 2 (fp16) read + the same written   # N=32768: 268 MB

Reported in GB/s and as a fraction of a device-to-device copy of the same bytes, timed in the same run.
Each implementation's cache is checked against the rows it was given before it is timed.
"""

from __future__ import annotations

import torch

from drills import bench
from drills.compare import assert_close

N_LIST = [256, 4096, 32768]  # a decode batch, a prefill chunk, a long prefill
HKV, D, PAGE = 8, 128, 16
NUM_BLOCKS = 16384  # 262144 slots: 537 MB per K or V cache in fp16, 8x the largest N

COLUMNS = [
    ("N", "N"),
    ("mb", "MB moved"),
    ("ceiling_gbs", "copy ceiling GB/s"),
    ("l1_us", "L1 us"),
    ("l1_gbs", "L1 GB/s"),
    ("l1_ceiling", "L1 / ceiling"),
    ("l1_peak", "L1 / datasheet"),
    ("api_us", "L1 API us (with checks)"),
    ("torch_us", "torch index us"),
    ("torch_gbs", "torch index GB/s"),
    ("torch_ceiling", "torch / ceiling"),
]


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_gbs()
    k_cache = torch.zeros(
        NUM_BLOCKS, PAGE, HKV, D, dtype=torch.float16, device="cuda"
    )  # [num_blocks, PAGE, Hkv, D]
    v_cache = torch.zeros_like(k_cache)
    k_rows, v_rows = k_cache.view(-1, HKV, D), v_cache.view(-1, HKV, D)  # [num_blocks * PAGE, Hkv, D]
    for N in N_LIST:
        torch.manual_seed(N)
        key = torch.randn(N, HKV, D, dtype=torch.float16, device="cuda")  # [N, Hkv, D]
        value = torch.randn_like(key)
        slot_mapping = torch.randperm(NUM_BLOCKS * PAGE, device="cuda")[:N]  # [N] int64, distinct, scattered
        read = 2 * N * HKV * D * key.element_size()
        nbytes = 2 * read  # read + written

        def l1_store():
            impl._launch(key, value, k_cache, v_cache, slot_mapping)

        def torch_store():
            k_rows[slot_mapping] = key
            v_rows[slot_mapping] = value

        for fn in (l1_store, torch_store):
            k_cache.zero_()
            v_cache.zero_()
            fn()
            assert_close(k_rows[slot_mapping], key, atol=0.0, rtol=0.0, rel=0.0)
            assert_close(v_rows[slot_mapping], value, atol=0.0, rtol=0.0, rel=0.0)

        row = dict(N=N, mb=round(nbytes / 1e6, 1), ceiling_gbs=bench.copy_ceiling_gbs(read))
        row["l1_us"] = bench.time_us(l1_store)
        row["api_us"] = bench.time_us(
            lambda: impl.store_kvcache(key, value, k_cache, v_cache, slot_mapping, check=True)
        )
        row["torch_us"] = bench.time_us(torch_store)
        row["l1_gbs"] = bench.gbs(nbytes, row["l1_us"])
        row["l1_ceiling"] = row["l1_gbs"] / row["ceiling_gbs"]
        row["l1_peak"] = row["l1_gbs"] / peak if peak else None
        row["torch_gbs"] = bench.gbs(nbytes, row["torch_us"])
        row["torch_ceiling"] = row["torch_gbs"] / row["ceiling_gbs"]
        table.add(row)
    del k_cache, v_cache, k_rows, v_rows
    torch.cuda.empty_cache()

    notes = [
        f"Hkv = {HKV}, D = {D}, PAGE = {PAGE}, fp16; N rows stored to random distinct slots of a "
        f"{NUM_BLOCKS}-block cache. GB/s counts K and V read once and written once; the copy ceiling is "
        "`dst.copy_(src)` of the bytes read, same run, counted the same way.",
        "L1 us times the kernel launch alone; L1 API us is store_kvcache(..., check=True), the launcher's "
        "checks with the slot values (range and duplicates), which cost host syncs.",
        "torch index is `k_cache.view(-1, Hkv, D)[slot_mapping] = key` and the same for V: two launches, "
        "and no way to skip padding rows (-1 would index the last slot).",
    ]
    return table, notes


def plot(rows, meta, path):
    bench.plot_bars(
        rows,
        [("l1_ceiling", "L1 store_kvcache"), ("torch_ceiling", "torch indexed assignment")],
        [f"N={r['N']}\n{r['mb']} MB" for r in rows],
        f"store_kvcache, {meta['gpu']}, {meta['date']}",
        path,
    )


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: impl's GB/s storing N = 32768 rows (the bare launch, checked first)."""
    N = N_LIST[-1]
    k_cache = torch.zeros(
        NUM_BLOCKS, PAGE, HKV, D, dtype=torch.float16, device="cuda"
    )  # [num_blocks, PAGE, Hkv, D]
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(N, HKV, D, dtype=torch.float16, device="cuda")  # [N, Hkv, D]
    value = torch.randn_like(key)
    slot_mapping = torch.randperm(NUM_BLOCKS * PAGE, device="cuda")[:N]  # [N] distinct slots
    impl.store_kvcache(key, value, k_cache, v_cache, slot_mapping)
    assert_close(k_cache.view(-1, HKV, D)[slot_mapping], key, atol=0.0, rtol=0.0, rel=0.0)
    assert_close(v_cache.view(-1, HKV, D)[slot_mapping], value, atol=0.0, rtol=0.0, rel=0.0)
    us = bench.time_us(lambda: impl._launch(key, value, k_cache, v_cache, slot_mapping))
    return bench.gbs(2 * 2 * N * HKV * D * key.element_size(), us), "GB/s", f"N = {N} rows, fp16"


# --- The figures the explainer's sentences quote (bench.FIGURES); data is l1_paged_kv_cache.bench.json


def _at(data, N: int) -> dict:
    return next(r for r in data["rows"] if r["N"] == N)


def _f(N: int, key: str):
    return lambda d: bench.num(_at(d, N)[key])


FIGURES = {
    "guard_cost": lambda d: bench.guard_cost_figure("l1_paged_kv_cache"),
    "small_api_us": _f(256, "api_us"),
    "small_us": _f(256, "l1_us"),
    "small_torch_us": _f(256, "torch_us"),
    "small_ceiling_gbs": _f(256, "ceiling_gbs"),
    "small_fraction": _f(256, "l1_ceiling"),
    "small_torch": _f(256, "torch_ceiling"),
    "large_gbs": _f(32768, "l1_gbs"),
    "large_fraction": _f(32768, "l1_ceiling"),
    "large_peak": _f(32768, "l1_peak"),
    "large_torch": _f(32768, "torch_ceiling"),
    "large_torch_us": _f(32768, "torch_us"),
    "large_us": _f(32768, "l1_us"),
    "large_api_us": _f(32768, "api_us"),
    "gbs": lambda d: ", ".join(bench.num(r["l1_gbs"]) for r in d["rows"]),
    "fractions": lambda d: bench.span_of((r["l1_ceiling"] for r in d["rows"]), sep=" and "),
}
