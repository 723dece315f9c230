"""What the device guards cost (drills/device_errors.py), on each guarded lesson's own benchmark shapes.

Each reference kernel takes GUARD as a constexpr: False compiles the guard away. For every shape of
L1's, L2's, F1's and L4's benchmark, the bare launch (`_launch`) is timed with the guard and without, in
the same run, eager and as a CUDA-graph replay (bench.guard_cost), and the record goes to
drills/content/device_guards.bench.json, which the explainers' guard paragraphs quote. Run by
`make guards` (with the memcheck of every bad value); it needs a CUDA GPU. Nothing runs on import.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from drills import bench, lessons
from drills.benchmarks import f1_split_kv_decode as f1_bench
from drills.benchmarks import l1_paged_kv_cache as l1_bench
from drills.benchmarks import l2_paged_decode as l2_bench
from drills.benchmarks import l4_paged_prefill as l4_bench
from drills.solutions import f1_split_kv_decode as f1
from drills.solutions import l1_paged_kv_cache as l1
from drills.solutions import l2_paged_decode as l2
from drills.solutions import l4_paged_prefill as l4


def _row(stem: str, shape: str, launch) -> dict:
    cost = bench.guard_cost(launch)
    row = dict(lesson=stem, shape=shape)
    for mode, c in cost.items():
        row[f"{mode}_us"], row[f"{mode}_unguarded_us"], row[f"{mode}_ratio"] = (
            c["guarded_us"],
            c["unguarded_us"],
            c["ratio"],
        )
    print(f"{stem} {shape}: eager {row['eager_ratio']:.3f}, graph {row['graph_ratio']:.3f}", flush=True)
    return row


def l1_rows() -> list[dict]:
    H, D, PAGE = l1_bench.HKV, l1_bench.D, l1_bench.PAGE
    k_cache = torch.zeros(l1_bench.NUM_BLOCKS, PAGE, H, D, dtype=torch.float16, device="cuda")
    v_cache = torch.zeros_like(k_cache)  # [num_blocks, PAGE, Hkv, D]
    rows = []
    for N in l1_bench.N_LIST:
        key = torch.randn(N, H, D, dtype=torch.float16, device="cuda")  # [N, Hkv, D]
        value = torch.randn_like(key)
        slots = torch.randperm(l1_bench.NUM_BLOCKS * PAGE, device="cuda")[:N]
        rows.append(
            _row("l1_paged_kv_cache", f"N={N}", lambda g: l1._launch(key, value, k_cache, v_cache, slots, g))
        )
    return rows


def l2_rows() -> list[dict]:
    rows = []
    for B, ctx in l2_bench.SHAPES:
        args = l2_bench.make_inputs(B, ctx)
        out = torch.empty_like(args[0])
        scale = 1.0 / math.sqrt(l2_bench.D)
        rows.append(
            _row("l2_paged_decode", f"B={B} ctx={ctx}", lambda g: l2._launch(*args, scale, out, guard=g))
        )
        del args, out
    return rows


def f1_rows() -> list[dict]:
    rows = []
    for B, ctx, page in f1_bench.SHAPES:
        args = f1_bench.make_inputs(B, ctx, page)
        out = torch.empty_like(args[0])
        scale = 1.0 / math.sqrt(f1_bench.D)
        plan = f1.plan(args[4], f1_bench.HKV, page)
        rows.append(
            _row(
                "f1_split_kv_decode",
                f"B={B} ctx={ctx} page={page}",
                lambda g: f1._launch(*args, scale, plan, out, None, guard=g),
            )
        )
        del args, out
    return rows


def l4_rows() -> list[dict]:
    rows = []
    for label, seqs in l4_bench.ROWS:
        args = l4_bench.make_inputs(seqs)
        out = torch.empty_like(args[0])
        scale = 1.0 / math.sqrt(l4_bench.D)
        shape = f"{label}: {len(seqs)} seqs"
        rows.append(_row("l4_paged_prefill", shape, lambda g: l4._launch(*args, scale, out, guard=g)))
        del args, out
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("the guards' cost is timed on a CUDA GPU")
        return 2
    print(f"{torch.cuda.get_device_name()}: the device guards' cost, guarded / unguarded", flush=True)
    rows = l1_rows() + l2_rows() + f1_rows() + l4_rows()
    data = {"meta": bench.stamp(), "rows": rows}
    path = Path(bench.__file__).parent / "content" / bench.GUARDS_JSON
    path.write_text(json.dumps(data, indent=1) + "\n")
    for stem in sorted({r["lesson"] for r in rows}):
        bench.refresh_figures(lessons.find(stem))  # their guard paragraphs quote this record
    worst = max(max(r["eager_ratio"], r["graph_ratio"]) for r in rows)
    print(
        f"wrote {path.name}: {len(rows)} shapes, worst ratio {worst:.3f}; refreshed the explainers' figures"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
